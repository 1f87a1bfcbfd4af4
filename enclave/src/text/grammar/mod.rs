//! Constrained decoding: an answer that must be JSON (any object, or valid
//! under a JSON schema) is enforced by masking, at every position, the
//! tokens that cannot continue it, before any other sampling transform.
//!
//! The engine is llguidance (the grammar library llama.cpp uses): it compiles
//! JSON schemas to an Earley parser over a lexer and computes a token mask
//! from the vocabulary's byte trie in tens of microseconds, with rollback by
//! any number of tokens, which speculation needs. outlines-core (vLLM's)
//! precompiles a regular-expression automaton per schema instead, which is
//! slower to build for large schemas and cannot express recursive ones.
//!
//! In a pipeline the mask is applied where the verdict is made, on the last
//! stage: the format travels in the link's sampling spec with the output so
//! far, and the last stage keeps one matcher per session, rolled back and
//! advanced to each frame's tokens.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{JsonCompileOptions, Matcher, ParserFactory};
use serde::{Deserialize, Serialize};

pub mod limits;

/// Largest schema accepted, in bytes of its JSON text (it travels with every
/// frame that wants a verdict).
pub const MAX_SCHEMA_BYTES: usize = 32 << 10;

/// What an answer must be.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResponseFormat {
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// JSON valid under this schema (OpenAI's `json_schema`), as compact
    /// JSON text.
    JsonSchema {
        /// The schema.
        schema: String,
    },
    /// Text in this llguidance Lark grammar (a forced tool call: the
    /// model's call syntax around JSON under the tool's parameters).
    Lark {
        /// The grammar.
        grammar: String,
    },
}

impl ResponseFormat {
    /// The canonical text the link carries.
    pub fn to_wire(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses [`to_wire`](Self::to_wire)'s text.
    pub fn from_wire(text: &str) -> Result<Self, GrammarError> {
        serde_json::from_str(text).map_err(|_| GrammarError::Malformed)
    }

    /// The grammar: JSON as OpenAI writes it (`", "` and `": "` between
    /// items, no other whitespace), so a model cannot spend its tokens on
    /// blank lines that the format would allow.
    fn grammar(&self) -> Result<TopLevelGrammar, GrammarError> {
        let mut schema = match self {
            Self::Lark { grammar } => {
                if grammar.len() > MAX_SCHEMA_BYTES {
                    return Err(GrammarError::TooLarge(grammar.len()));
                }
                return Ok(TopLevelGrammar::from_lark(grammar.clone()));
            }
            Self::JsonObject => serde_json::json!({ "type": "object" }),
            Self::JsonSchema { schema } => {
                if schema.len() > MAX_SCHEMA_BYTES {
                    return Err(GrammarError::TooLarge(schema.len()));
                }
                serde_json::from_str(schema).map_err(|e| GrammarError::NotJson(e.to_string()))?
            }
        };
        if !schema.is_object() {
            return Err(GrammarError::Compile("the schema must be a JSON object".into()));
        }
        let options = JsonCompileOptions {
            item_separator: ", ".into(),
            key_separator: ": ".into(),
            whitespace_flexible: false,
            ..JsonCompileOptions::default()
        };
        options.apply_to(&mut schema);
        Ok(TopLevelGrammar::from_json_schema(schema))
    }
}

/// Why a format cannot be enforced.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// Over [`MAX_SCHEMA_BYTES`].
    #[error("the schema is {0} bytes; at most {MAX_SCHEMA_BYTES} are accepted")]
    TooLarge(usize),
    /// Not JSON.
    #[error("the schema is not JSON: {0}")]
    NotJson(String),
    /// The engine cannot compile it (an unsupported keyword, a contradiction).
    #[error("the schema cannot be enforced: {0}")]
    Compile(String),
    /// A format on the link that does not parse.
    #[error("a malformed response format")]
    Malformed,
    /// Output the format does not allow, at this index of the output.
    #[error("output token {0} is not allowed by the response format")]
    Rejected(usize),
    /// The engine failed while running (out of its step budget).
    #[error("the response format's matcher failed")]
    Engine,
    /// Over one of the structural limits checked before compiling.
    #[error(transparent)]
    Limit(#[from] limits::LimitExceeded),
}

/// A vocabulary's grammar engine: the token trie, built once.
pub struct Grammars {
    factory: ParserFactory,
    eos: u32,
    stop_ids: Vec<u32>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").field("eos", &self.eos).finish_non_exhaustive()
    }
}

impl Grammars {
    /// The engine for a vocabulary ([`Vocabulary`]: a tokenizer's, or what
    /// a format worker process receives). Its errors name no tokens:
    /// matcher state never reaches a log or an error message.
    pub fn from_vocabulary(vocabulary: &Vocabulary) -> Result<Self, GrammarError> {
        let words = &vocabulary.words;
        let info = TokRxInfo::new(words.len() as u32, vocabulary.eos);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, words)));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| GrammarError::Compile(e.to_string()))?;
        factory.quiet();
        factory.limits_mut().verbose_errors = false;
        Ok(Self { factory, eos: vocabulary.eos, stop_ids: vocabulary.stop_ids.clone() })
    }

    /// A matcher for `format`, at the start of the output. The structural
    /// limits ([`limits`]) are checked first;
    /// the compile itself is bounded only by the engine's fuel, so callers
    /// outside a budgeted job run only formats such a job has passed.
    pub fn compile(&self, format: &ResponseFormat) -> Result<Constrained, GrammarError> {
        limits::check(format)?;
        let parser = self.factory.create_parser(format.grammar()?).map_err(|e| GrammarError::Compile(e.to_string()))?;
        let mut matcher = Matcher::new(Ok(parser));
        if matcher.is_error() {
            return Err(GrammarError::Compile(matcher.get_error().unwrap_or_default()));
        }
        // Fail at compile time, not at the first token.
        matcher.compute_mask().map_err(|e| GrammarError::Compile(e.to_string()))?;
        Ok(Constrained { matcher, consumed: Vec::new(), eos: self.eos, stop_ids: self.stop_ids.clone() })
    }
}

/// A vocabulary as the grammar engine needs it: every token's bytes, the
/// end-of-sequence token and the other stop tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vocabulary {
    /// Each token's bytes, by id.
    pub words: Vec<Vec<u8>>,
    /// End of sequence.
    pub eos: u32,
    /// Every token that ends generation.
    pub stop_ids: Vec<u32>,
}

/// One session's position in its format: the output tokens consumed so far.
pub struct Constrained {
    matcher: Matcher,
    consumed: Vec<u32>,
    eos: u32,
    stop_ids: Vec<u32>,
}

impl std::fmt::Debug for Constrained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constrained").field("consumed", &self.consumed.len()).finish_non_exhaustive()
    }
}

impl Constrained {
    /// An independent copy in the same state (a compiled format shared by
    /// the sessions of one request starts from one compile).
    pub fn fork(&self) -> Self {
        Self {
            matcher: self.matcher.deep_clone(),
            consumed: self.consumed.clone(),
            eos: self.eos,
            stop_ids: self.stop_ids.clone(),
        }
    }

    /// Moves to just after `output`: rolls back to the longest common prefix
    /// with what was consumed, then consumes the rest.
    pub fn sync(&mut self, output: &[u32]) -> Result<(), GrammarError> {
        let common = self.consumed.iter().zip(output).take_while(|(a, b)| a == b).count();
        if common < self.consumed.len() {
            self.matcher.rollback(self.consumed.len() - common).map_err(|_| GrammarError::Engine)?;
            self.consumed.truncate(common);
        }
        for (i, &t) in output.iter().enumerate().skip(common) {
            if !self.advance(t) {
                return Err(GrammarError::Rejected(i));
            }
        }
        Ok(())
    }

    /// Consumes `token` when the format allows it next (`false`, and no
    /// change, when it does not).
    pub fn advance(&mut self, token: u32) -> bool {
        match self.matcher.try_consume_tokens(&[token]) {
            Ok(1) => {
                self.consumed.push(token);
                true
            }
            _ => false,
        }
    }

    /// Sets the logit of every token the format does not allow next to
    /// −∞. Where the format may end, the end-of-sequence token and every
    /// other stop token stay allowed; once it must end, only they do.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), GrammarError> {
        let allowed = self.matcher.compute_mask_or_eos().map_err(|_| GrammarError::Engine)?;
        let size = allowed.len();
        let ok = |t: u32| (t as usize) < size && allowed.is_allowed(t);
        let ends = ok(self.eos);
        for (t, l) in logits.iter_mut().enumerate() {
            let t = t as u32;
            if !(ok(t) || ends && self.stop_ids.contains(&t)) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }
}
