//! Single-process generation over a chain of layer slices: the reference
//! path the sharded pipeline must reproduce token for token.

use std::path::Path;

use crate::entry::sampler::Sampler;
use crate::entry::tokenizer::Tokenizer;
use crate::model::error::{ModelError, Result};
use crate::model::{GgufFile, LayerSlice, Logits, Rows, SessionKv, SliceOutput};

/// Default KV budget per session and slice.
pub const DEFAULT_KV_BUDGET_BYTES: usize = 256 << 20;

/// A model as consecutive slices in this process.
#[derive(Debug)]
pub struct LocalModel {
    slices: Vec<LayerSlice>,
}

/// One session's caches across the slices.
#[derive(Debug, Clone)]
pub struct LocalSession {
    kvs: Vec<SessionKv>,
}

impl LocalSession {
    /// Positions cached.
    pub fn len(&self) -> usize {
        self.kvs.first().map(SessionKv::len).unwrap_or(0)
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rolls every slice back to `len` positions.
    pub fn truncate(&mut self, len: usize) {
        self.kvs.iter_mut().for_each(|k| k.truncate(len));
    }
}

impl LocalModel {
    /// Loads the model split at `boundaries` (e.g. `[10, 20]` for three slices).
    pub fn load(path: &Path, boundaries: &[usize]) -> Result<(Self, Tokenizer)> {
        let mut gguf = GgufFile::open(path)?;
        let tokenizer = Tokenizer::from_gguf(&gguf)?;
        let n_layer = crate::model::Config::from_gguf(&gguf)?.n_layer;
        let mut cuts = vec![0];
        cuts.extend_from_slice(boundaries);
        cuts.push(n_layer);
        let mut slices = Vec::new();
        for w in cuts.windows(2) {
            slices.push(LayerSlice::from_gguf(&mut gguf, w[0]..w[1])?);
        }
        Ok((Self { slices }, tokenizer))
    }

    /// The slices, first to last.
    pub fn slices(&self) -> &[LayerSlice] {
        &self.slices
    }

    /// A fresh session.
    pub fn session(&self, budget_bytes: usize) -> LocalSession {
        LocalSession { kvs: self.slices.iter().map(|s| s.new_session(budget_bytes)).collect() }
    }

    /// Context window.
    pub fn context_length(&self) -> usize {
        self.slices[0].config().context_length
    }

    /// Runs `ids` at the session's next positions; returns logits `(n, vocab)`.
    pub fn step(&self, session: &mut LocalSession, ids: &[u32]) -> Result<Rows> {
        self.step_with(session, ids, Logits::All)
    }

    /// As [`step`](Self::step), with logits for the last position only: `(1, vocab)`.
    pub fn step_last(&self, session: &mut LocalSession, ids: &[u32]) -> Result<Rows> {
        self.step_with(session, ids, Logits::Last)
    }

    fn step_with(&self, session: &mut LocalSession, ids: &[u32], logits: Logits) -> Result<Rows> {
        let start = session.len();
        let mut hidden = self.slices[0].embed(ids)?;
        for (slice, kv) in self.slices.iter().zip(session.kvs.iter_mut()) {
            match slice.forward(hidden, kv, start, logits)? {
                SliceOutput::Hidden(h) => hidden = h,
                SliceOutput::Logits(l) => return Ok(l),
            }
        }
        Err(ModelError::Invalid("the last slice has no LM head".into()))
    }
}

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

/// What was generated.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Generation {
    /// The prompt.
    pub prompt_ids: Vec<u32>,
    /// New ids (stop ids excluded).
    pub ids: Vec<u32>,
    /// New text.
    pub text: String,
}

/// Generates, calling `on_text` with each new piece of text.
pub fn generate(
    model: &LocalModel,
    tokenizer: &Tokenizer,
    sampler: &mut Sampler,
    req: &GenerateRequest,
    mut on_text: impl FnMut(&str),
) -> Result<Generation> {
    if req.prompt_ids.is_empty() {
        return Err(ModelError::Invalid("empty prompt".into()));
    }
    let ctx = model.context_length();
    if req.prompt_ids.len() >= ctx {
        return Err(ModelError::Invalid(format!(
            "prompt of {} tokens does not fit the context of {ctx}",
            req.prompt_ids.len()
        )));
    }
    let max_tokens = req.max_tokens.min(ctx - req.prompt_ids.len());
    let mut session = model.session(DEFAULT_KV_BUDGET_BYTES);
    let mut history = req.prompt_ids.clone();
    let mut ids = Vec::new();
    let mut text = String::new();
    let mut logits = model.step_last(&mut session, &req.prompt_ids)?;
    for _ in 0..max_tokens {
        let next = sampler.sample(logits.last(), &history)?;
        if tokenizer.stop_ids().contains(&next) {
            break;
        }
        ids.push(next);
        history.push(next);
        let full = tokenizer.decode(&ids)?;
        if let Some(cut) = req.stop.iter().filter_map(|s| full.find(s.as_str())).min() {
            on_text(&full[text.len().min(cut)..cut]);
            text = full[..cut].to_owned();
            break;
        }
        // Emit only complete characters (a token can end mid-UTF-8).
        if !full.ends_with('\u{FFFD}') && full.len() > text.len() && full.starts_with(&text) {
            on_text(&full[text.len()..]);
            text = full;
        }
        logits = model.step_last(&mut session, &[next])?;
    }
    let full = tokenizer.decode(&ids)?;
    if req.stop.is_empty() && full.len() > text.len() && full.starts_with(&text) {
        on_text(&full[text.len()..]);
        text = full;
    }
    Ok(Generation { prompt_ids: req.prompt_ids.clone(), ids, text })
}
