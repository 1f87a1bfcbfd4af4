//! Single-process generation over a chain of layer slices: the reference
//! path the sharded pipeline must reproduce token for token.

pub use crate::local_model::{LocalModel, LocalSession, DEFAULT_KV_BUDGET_BYTES};
use crate::model::error::{ModelError, Result};
use crate::text::sampler::{Sampler, Seen};
use crate::text::tokenizer::Tokenizer;

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
}

/// Generated ids turned into text as they come: pieces are emitted only
/// when they end on a whole character, and stop strings cut the text.
#[derive(Debug)]
pub struct TextStream<'t> {
    tokenizer: &'t Tokenizer,
    stop: Vec<String>,
    ids: Vec<u32>,
    text: String,
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
        Self { tokenizer, stop, ids: Vec::new(), text: String::new() }
    }

    /// Adds a generated id (not a stop id).
    pub fn push(&mut self, id: u32) -> Result<TextStep> {
        self.ids.push(id);
        let full = self.tokenizer.decode(&self.ids)?;
        if let Some(cut) = self.stop.iter().filter_map(|s| full.find(s.as_str())).min() {
            let piece = full[self.text.len().min(cut)..cut].to_owned();
            self.text = full[..cut].to_owned();
            return Ok(TextStep { piece, stopped: true });
        }
        // Emit only complete characters (a token can end mid-UTF-8), and
        // hold back an ending that may grow into a stop string.
        let ready = full.len() - held_back(&full, &self.stop);
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
    pub fn finish(mut self, stopped: bool) -> Result<(String, Vec<u32>, String)> {
        let full = self.tokenizer.decode(&self.ids)?;
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
    mut on_text: impl FnMut(&str),
) -> Result<Generation> {
    let max_tokens = check_request(req, model.context_length())?;
    let mut session = model.session(DEFAULT_KV_BUDGET_BYTES);
    let mut history = req.prompt_ids.clone();
    let mut stream = TextStream::new(tokenizer, req.stop.clone());
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
    Ok(Generation { prompt_ids: req.prompt_ids.clone(), ids, text, speculation: None, logprobs: None })
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
