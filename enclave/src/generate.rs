//! Single-process generation over a chain of layer slices: the reference
//! path the sharded pipeline must reproduce token for token.

pub use crate::local_model::{LocalModel, LocalSession, DEFAULT_KV_BUDGET_BYTES};
use crate::model::error::{ModelError, Result};
use crate::text::sampler::{Sampler, Seen};
use crate::text::tokenizer::Tokenizer;
use crate::text::tools::CallMarkers;

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// Prompt ids (non-empty).
    pub prompt_ids: Vec<u32>,
    /// Most new tokens.
    pub max_tokens: usize,
    /// Strings that end generation (not included in the text).
    pub stop: Vec<String>,
}

/// A generated token's raw log-probability and its top alternatives
/// (OpenAI's `logprobs`), as the last stage computed them.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TokenLogprob {
    /// The token.
    pub token: u32,
    /// Its log-probability under the model (raw log-softmax).
    pub logprob: f32,
    /// The most likely tokens at its position and theirs, most likely first
    /// (as many as the request's `top_logprobs`).
    pub top: Vec<(u32, f32)>,
}

/// What was generated.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Generation {
    /// The prompt.
    pub prompt_ids: Vec<u32>,
    /// New ids (stop ids excluded).
    pub ids: Vec<u32>,
    /// New text.
    pub text: String,
    /// Speculative decoding counts, when the session speculated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculation: Option<crate::speculate::SpecStats>,
    /// Per id, when the request asked for log-probabilities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// Per prompt id after the first, its log-probability given those before
    /// it, when the request scored its prompt (`echo` with `logprobs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Vec<TokenLogprob>>,
}

/// Generated ids turned into text as they come: pieces are emitted only
/// when they end on a whole character, and stop strings cut the text.
#[derive(Debug)]
pub struct TextStream<'t> {
    tokenizer: &'t Tokenizer,
    stop: Vec<String>,
    ids: Vec<u32>,
    text: String,
    /// Where tool calls begin, when the request offered tools: the text is
    /// then read with special tokens written out, and stops streaming where
    /// a call begins.
    calls: Option<CallMarkers>,
    /// A call began: nothing more streams.
    held: bool,
}

/// What one more token did to the text.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TextStep {
    /// New text to emit (possibly empty).
    pub piece: String,
    /// A stop string was reached: generation ends here.
    pub stopped: bool,
}

impl<'t> TextStream<'t> {
    /// A stream ending at any of `stop`.
    pub fn new(tokenizer: &'t Tokenizer, stop: Vec<String>) -> Self {
        Self { tokenizer, stop, ids: Vec::new(), text: String::new(), calls: None, held: false }
    }

    /// Streams only the text before a tool call (`calls`: where calls
    /// begin), with special tokens written out.
    pub fn with_calls(mut self, calls: Option<CallMarkers>) -> Self {
        self.calls = calls;
        self
    }

    fn decode(&self) -> Result<String> {
        match self.calls {
            Some(_) => self.tokenizer.decode_with_special(&self.ids),
            None => self.tokenizer.decode(&self.ids),
        }
    }

    /// Where a call begins in `full` (or may be beginning: the answer so
    /// far is blank or a prefix of a start marker), and how many bytes at
    /// its end may grow into a marker.
    fn call_start(&self, full: &str) -> (Option<usize>, usize) {
        let Some(c) = &self.calls else { return (None, 0) };
        let mut at = c.anywhere.iter().filter_map(|m| full.find(m.as_str())).min();
        let trimmed = full.trim_start();
        if !c.at_start.is_empty() && self.text.trim().is_empty() {
            if c.at_start.iter().any(|m| trimmed.starts_with(m.as_str())) {
                // The call is the answer, leading blanks included.
                at = Some(0);
            } else if c.at_start.iter().any(|m| m.starts_with(trimmed)) {
                // Blank so far, or the beginning of a marker: wait.
                return (at, full.len());
            }
        }
        (at, held_back(full, &c.anywhere))
    }

    /// Adds a generated id (not a stop id).
    pub fn push(&mut self, id: u32) -> Result<TextStep> {
        self.ids.push(id);
        let full = self.decode()?;
        let (call, marker_tail) = self.call_start(&full);
        if let Some(cut) = self.stop.iter().filter_map(|s| full.find(s.as_str())).min() {
            if self.held || call.is_some_and(|at| at <= cut) {
                self.held = true;
                return Ok(TextStep { piece: String::new(), stopped: true });
            }
            let piece = full[self.text.len().min(cut)..cut].to_owned();
            self.text = full[..cut].to_owned();
            return Ok(TextStep { piece, stopped: true });
        }
        if self.held {
            return Ok(TextStep::default());
        }
        if let Some(at) = call {
            // A call begins here: the text before it goes out, then nothing.
            self.held = true;
            let at = at.max(self.text.len());
            let piece = if full.starts_with(&self.text) { full[self.text.len()..at].to_owned() } else { String::new() };
            self.text = full[..at].to_owned();
            return Ok(TextStep { piece, stopped: false });
        }
        // Emit only complete characters (a token can end mid-UTF-8), and
        // hold back an ending that may grow into a stop string or a call.
        let ready = full.len() - held_back(&full, &self.stop).max(marker_tail);
        if !full.ends_with('\u{FFFD}') && ready > self.text.len() && full.starts_with(&self.text) {
            let piece = full[self.text.len()..ready].to_owned();
            self.text = full[..ready].to_owned();
            return Ok(TextStep { piece, stopped: false });
        }
        Ok(TextStep::default())
    }

    /// Ends the stream: the last piece still held back (if any), the ids and the text.
    /// A character the last token left incomplete (generation cut mid-UTF-8,
    /// at `max_tokens`) is dropped, never sent as a replacement character.
    /// Once a tool call began, nothing more is emitted and the text is the
    /// whole answer, the call included (special tokens written out).
    pub fn finish(mut self, stopped: bool) -> Result<(String, Vec<u32>, String)> {
        if self.held {
            let full = self.decode()?;
            return Ok((String::new(), self.ids, full.trim_end_matches('\u{FFFD}').to_owned()));
        }
        let full = self.decode()?;
        let full = full.trim_end_matches('\u{FFFD}');
        let mut rest = String::new();
        if !stopped && full.len() > self.text.len() && full.starts_with(&self.text) {
            rest = full[self.text.len()..].to_owned();
            self.text = full.to_owned();
        }
        Ok((rest, self.ids, self.text))
    }
}

/// Bytes at the end of `text` that begin some stop string (the longest
/// such ending): they reach the client only once no stop string can match.
fn held_back(text: &str, stop: &[String]) -> usize {
    stop.iter()
        .map(|s| (1..s.len()).rev().find(|&k| s.is_char_boundary(k) && text.ends_with(&s[..k])).unwrap_or(0))
        .max()
        .unwrap_or(0)
}

/// Checks a request against a context window; returns the token budget.
pub fn check_request(req: &GenerateRequest, context: usize) -> Result<usize> {
    if req.prompt_ids.is_empty() {
        return Err(ModelError::Invalid("empty prompt".into()));
    }
    if req.prompt_ids.len() >= context {
        return Err(ModelError::Invalid(format!(
            "prompt of {} tokens does not fit the context of {context}",
            req.prompt_ids.len()
        )));
    }
    Ok(req.max_tokens.min(context - req.prompt_ids.len()))
}

/// Generates, calling `on_text` with each new piece of text.
pub fn generate(
    model: &LocalModel,
    tokenizer: &Tokenizer,
    sampler: &mut Sampler,
    req: &GenerateRequest,
    on_text: impl FnMut(&str),
) -> Result<Generation> {
    generate_with(model, sampler, req, TextStream::new(tokenizer, req.stop.clone()), on_text)
}

/// [`generate`] with the text read by `stream` (e.g. with special tokens
/// written out, for a harmony answer sorted by channel).
pub fn generate_with(
    model: &LocalModel,
    sampler: &mut Sampler,
    req: &GenerateRequest,
    mut stream: TextStream<'_>,
    mut on_text: impl FnMut(&str),
) -> Result<Generation> {
    let tokenizer = stream.tokenizer;
    let max_tokens = check_request(req, model.context_length())?;
    let mut session = model.session(DEFAULT_KV_BUDGET_BYTES);
    let mut history = req.prompt_ids.clone();
    let mut stopped = false;
    let mut format = match &sampler.params().response_format {
        None => None,
        Some(f) => {
            let grammars = tokenizer.grammars().map_err(|e| ModelError::Invalid(e.to_string()))?;
            Some(grammars.compile(f).map_err(|e| ModelError::Invalid(e.to_string()))?)
        }
    };
    let mut logits = model.step_last(&mut session, &req.prompt_ids)?;
    for _ in 0..max_tokens {
        let output = &history[req.prompt_ids.len()..];
        let mut last = logits.last().to_vec();
        if let Some(f) = format.as_mut() {
            f.mask(&mut last).map_err(|e| ModelError::Invalid(e.to_string()))?;
        }
        let next = sampler.sample(&last, Seen { recent: &history, output })?;
        if tokenizer.stop_ids().contains(&next) {
            break;
        }
        if let Some(f) = format.as_mut() {
            if !f.advance(next) {
                return Err(ModelError::Invalid("the sampled token breaks the response format".into()));
            }
        }
        history.push(next);
        let step = stream.push(next)?;
        on_text(&step.piece);
        if step.stopped {
            stopped = true;
            break;
        }
        logits = model.step_last(&mut session, &[next])?;
    }
    let (rest, ids, text) = stream.finish(stopped)?;
    on_text(&rest);
    Ok(Generation {
        prompt_ids: req.prompt_ids.clone(),
        ids,
        text,
        speculation: None,
        logprobs: None,
        prompt_logprobs: None,
    })
}

#[cfg(test)]
mod tests {
    use super::held_back;

    #[test]
    fn an_ending_that_may_become_a_stop_string_is_held_back() {
        let stop = vec!["c d".to_owned(), "ünd".to_owned()];
        assert_eq!(held_back("abc", &stop), 1);
        assert_eq!(held_back("abc ", &stop), 2);
        assert_eq!(held_back("abc x", &stop), 0);
        // Only whole characters of the stop string count.
        assert_eq!(held_back("zü", &stop), "ü".len());
        assert_eq!(held_back("züncd", &stop), 0);
        assert_eq!(held_back("anything", &[]), 0);
    }
}
