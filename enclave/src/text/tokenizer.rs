//! The tokenizer and chat template a GGUF carries: byte-level BPE
//! (`gpt2`) rebuilt on the `tokenizers` crate, sentencepiece-style vocabularies
//! (`llama`) on [`super::spm::Spm`], templates on `minijinja`.

use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer as HfTokenizer};

use super::spm::{token_type, Spm};
use crate::model::error::{ModelError, Result};
use crate::model::GgufFile;

/// GPT-2's split, as llama.cpp writes it for gpt2-family pre-tokenizers.
const REGEX_GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama 3 style split (digits in groups of up to three).
const REGEX_LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2 split (single digits).
const REGEX_QWEN2: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn split(pattern: &str) -> Result<PreTokenizerWrapper> {
    let s = Split::new(SplitPattern::Regex(pattern.to_owned()), SplitDelimiterBehavior::Isolated, false)
        .map_err(|e| ModelError::Unsupported(format!("tokenizer regex: {e}")))?;
    Ok(s.into())
}

/// The pre-tokenizer llama.cpp uses for `tokenizer.ggml.pre`.
fn pre_tokenizer(pre: &str) -> Result<PreTokenizerWrapper> {
    let bytes_only = ByteLevel::new(false, false, false);
    Ok(match pre {
        "gpt2" | "default" => ByteLevel::new(false, false, true).into(),
        // Digits split one by one, then the GPT-2 split.
        "smollm" | "starcoder" | "refact" | "codeshell" | "command-r" => {
            Sequence::new(vec![split(r"\p{N}")?, split(REGEX_GPT2)?, bytes_only.into()]).into()
        }
        "llama-bpe" | "llama3" | "smaug-bpe" => Sequence::new(vec![split(REGEX_LLAMA3)?, bytes_only.into()]).into(),
        "qwen2" => Sequence::new(vec![split(REGEX_QWEN2)?, bytes_only.into()]).into(),
        other => return Err(ModelError::Unsupported(format!("tokenizer pre-type {other:?}"))),
    })
}

/// The text ↔ ids engine of a vocabulary type.
enum Engine {
    Bpe {
        /// Parses special-token text (`<|im_start|>`) into its id.
        with_special: Box<HfTokenizer>,
        /// Treats all text as text.
        plain: Box<HfTokenizer>,
    },
    Spm(Box<Spm>),
}

/// A model's tokenizer: text ↔ ids, special tokens, BOS/EOS.
pub struct Tokenizer {
    engine: Engine,
    eos: u32,
    bos: Option<u32>,
    add_bos: bool,
    stop_ids: Vec<u32>,
    special_ids: Vec<u32>,
    vocab: usize,
    chat_template: Option<String>,
    tokens: Vec<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("vocab", &self.vocab).field("eos", &self.eos).finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer from GGUF metadata.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let model = g.meta_str("tokenizer.ggml.model")?;
        let tokens = g.meta_strings("tokenizer.ggml.tokens")?;
        let types = g.meta_ints("tokenizer.ggml.token_type").unwrap_or_default();
        let id = |k: &str| g.meta_u64(k).ok().and_then(|v| u32::try_from(v).ok());
        // Control and user-defined tokens are matched as wholes when special
        // parsing is on, and left out of decoded text, as llama.cpp does.
        let special_ids: Vec<u32> = types
            .iter()
            .enumerate()
            .filter(|(_, t)| matches!(**t, token_type::CONTROL | token_type::USER_DEFINED))
            .map(|(i, _)| i as u32)
            .collect();
        let engine = match model {
            "gpt2" => Self::bpe(g, &tokens, &special_ids)?,
            "llama" => {
                let scores = g.meta_f32s("tokenizer.ggml.scores")?;
                let space_prefix = g.meta_bool("tokenizer.ggml.add_space_prefix").unwrap_or(true);
                let unk = id("tokenizer.ggml.unknown_token_id");
                Engine::Spm(Box::new(Spm::new(tokens.clone(), scores, types, unk, space_prefix)?))
            }
            other => {
                return Err(ModelError::Unsupported(format!(
                    "tokenizer model {other:?} (gpt2 byte-level BPE and llama sentencepiece are served)"
                )))
            }
        };
        let eos = id("tokenizer.ggml.eos_token_id").ok_or_else(|| ModelError::Malformed("no EOS token id".into()))?;
        let mut stop_ids = vec![eos];
        if let Some(eot) = id("tokenizer.ggml.eot_token_id") {
            stop_ids.push(eot);
        }
        // Chat models end a turn with <|im_end|> / <|eot_id|>; stop there too.
        for name in ["<|im_end|>", "<|eot_id|>", "<|end|>"] {
            if let Some(i) = tokens.iter().position(|t| t == name) {
                if !stop_ids.contains(&(i as u32)) {
                    stop_ids.push(i as u32);
                }
            }
        }
        let chat_template = match g.meta("tokenizer.chat_template") {
            Some(_) => Some(g.meta_str("tokenizer.chat_template")?.to_owned()),
            None => None,
        };
        // Sentencepiece vocabularies prepend BOS unless told otherwise.
        let add_bos_default = model == "llama";
        Ok(Self {
            engine,
            eos,
            bos: id("tokenizer.ggml.bos_token_id"),
            add_bos: g.meta_bool("tokenizer.ggml.add_bos_token").unwrap_or(add_bos_default),
            stop_ids,
            special_ids,
            vocab: tokens.len(),
            chat_template,
            tokens,
        })
    }

    fn bpe(g: &GgufFile, tokens: &[String], special_ids: &[u32]) -> Result<Engine> {
        let pre = g.meta_str("tokenizer.ggml.pre").unwrap_or("default").to_owned();
        let merges: Vec<(String, String)> = g
            .meta_strings("tokenizer.ggml.merges")?
            .into_iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .ok_or_else(|| ModelError::Malformed(format!("merge {m:?} has no space")))
            })
            .collect::<Result<_>>()?;
        let vocab: tokenizers::models::bpe::Vocab =
            tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| ModelError::Malformed(format!("BPE: {e}")))?;
        let mut plain = HfTokenizer::new(bpe);
        plain.with_pre_tokenizer(Some(pre_tokenizer(&pre)?));
        plain.with_decoder(Some(ByteLevel::default()));
        let mut with_special = plain.clone();
        let specials: Vec<AddedToken> = special_ids
            .iter()
            .filter_map(|&i| tokens.get(i as usize))
            // An empty special token would match everywhere (never advance).
            .filter(|t| !t.is_empty())
            .map(|t| AddedToken::from(t.clone(), true))
            .collect();
        with_special.add_special_tokens(specials).map_err(|e| ModelError::Malformed(format!("special tokens: {e}")))?;
        Ok(Engine::Bpe { with_special: Box::new(with_special), plain: Box::new(plain) })
    }

    /// Text to ids. `parse_special` matches special-token text as the
    /// token (for template text); user text alone should not.
    /// BOS is prepended when the GGUF asks for it.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        if text.is_empty() {
            return Err(ModelError::Invalid("empty prompt".into()));
        }
        let mut ids = Vec::new();
        if self.add_bos {
            ids.extend(self.bos);
        }
        ids.extend(self.encode_piece(text, parse_special)?);
        Ok(ids)
    }

    fn encode_piece(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        match &self.engine {
            Engine::Bpe { with_special, plain } => {
                let t = if parse_special { with_special } else { plain };
                let enc = t.encode(text, false).map_err(|e| ModelError::Invalid(format!("tokenize: {e}")))?;
                Ok(enc.get_ids().to_vec())
            }
            Engine::Spm(spm) => spm.encode(text, parse_special),
        }
    }

    /// A conversation as ids for generation: the chat template's own text
    /// with special tokens parsed, every message's content as plain text —
    /// so a user who types `<|im_start|>` gets those characters, not a
    /// control token.
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        if messages.is_empty() {
            return Err(ModelError::Invalid("no messages".into()));
        }
        // Render with a marker per message, then tokenize around the markers.
        let marker = |i: usize| format!("\u{F8FF}veil-message-{i}\u{F8FF}");
        if messages.iter().any(|m| m.content.contains('\u{F8FF}')) {
            return Err(ModelError::Invalid("message content holds U+F8FF, which is reserved".into()));
        }
        let marked: Vec<ChatMessage> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| ChatMessage { role: m.role.clone(), content: marker(i) })
            .collect();
        let rendered = self.render_chat(&marked)?;
        let mut ids = Vec::new();
        if self.add_bos {
            ids.extend(self.bos);
        }
        // One left-to-right scan (linear in the rendered text): each marker
        // names its message, whatever order the template put them in.
        const OPEN: &str = "\u{F8FF}veil-message-";
        let mut rest = rendered.as_str();
        while let Some(at) = rest.find(OPEN) {
            let after = &rest[at + OPEN.len()..];
            let i = after
                .find('\u{F8FF}')
                .and_then(|end| after[..end].parse::<usize>().ok().map(|i| (i, end)))
                .filter(|(i, _)| *i < messages.len());
            let Some((i, end)) = i else {
                return Err(ModelError::Invalid("the chat template mangled a message marker".into()));
            };
            if at > 0 {
                ids.extend(self.encode_piece(&rest[..at], true)?);
            }
            if !messages[i].content.is_empty() {
                ids.extend(self.encode_piece(&messages[i].content, false)?);
            }
            rest = &after[end + '\u{F8FF}'.len_utf8()..];
        }
        if !rest.is_empty() {
            ids.extend(self.encode_piece(rest, true)?);
        }
        Ok(ids)
    }

    /// Ids to text (special tokens skipped).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= self.vocab) {
            return Err(ModelError::Invalid(format!("token id {bad} is outside the vocabulary of {}", self.vocab)));
        }
        let ids: Vec<u32> = ids.iter().copied().filter(|i| !self.special_ids.contains(i)).collect();
        match &self.engine {
            Engine::Bpe { plain, .. } => {
                plain.decode(&ids, false).map_err(|e| ModelError::Invalid(format!("detokenize: {e}")))
            }
            Engine::Spm(spm) => spm.decode(&ids),
        }
    }

    /// The end-of-sequence id.
    pub fn eos(&self) -> u32 {
        self.eos
    }

    /// Ids that end generation (EOS, end-of-turn).
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// The longest text one token stands for, in bytes (at least 1): a text
    /// of more than `n × this` bytes cannot encode to `n` tokens or fewer, so
    /// it can be refused before tokenizing it.
    pub fn max_token_bytes(&self) -> usize {
        // Byte-level BPE spells a byte as up to 2 chars, sentencepiece a space as 3 bytes.
        self.tokens.iter().map(String::len).max().unwrap_or(1).max(1)
    }

    /// Renders the GGUF's chat template for `messages` with a generation prompt.
    pub fn render_chat(&self, messages: &[ChatMessage]) -> Result<String> {
        let template = self
            .chat_template
            .as_deref()
            .ok_or_else(|| ModelError::Unsupported("the model has no chat template".into()))?;
        let mut env = minijinja::Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        env.add_template("chat", template).map_err(|e| ModelError::Unsupported(format!("chat template: {e}")))?;
        let tok = |i: Option<u32>| i.and_then(|i| self.tokens.get(i as usize)).cloned().unwrap_or_default();
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => true,
            bos_token => tok(self.bos),
            eos_token => tok(Some(self.eos)),
        };
        env.get_template("chat")
            .and_then(|t| t.render(ctx))
            .map_err(|e| ModelError::Invalid(format!("chat template: {e}")))
    }
}

/// One chat message.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}
