//! The model as consecutive layer slices in one process: the reference the
//! sharded pipeline must reproduce, and the draft model's engine.

use std::path::Path;

use crate::model::error::{ModelError, Result};
use crate::model::{GgufFile, LayerSlice, Logits, Rows, SessionKv, SliceOutput};
use crate::text::tokenizer::Tokenizer;

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

    /// Rolls every slice back to `len` positions; refused, with nothing
    /// changed, below what a sliding-window layer still holds (except to 0)
    /// ([`SessionKv::min_rollback`]).
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if let Some(floor) = self.kvs.iter().map(SessionKv::min_rollback).max().filter(|f| len > 0 && len < *f) {
            return Err(ModelError::Invalid(format!(
                "cannot roll back to position {len}: sliding-window layers keep positions from {floor} on"
            )));
        }
        self.kvs.iter_mut().try_for_each(|k| k.truncate(len))
    }
}

impl LocalModel {
    /// Loads the model split at `boundaries` (e.g. `[10, 20]` for three slices).
    pub fn load(path: &Path, boundaries: &[usize]) -> Result<(Self, Tokenizer)> {
        Self::from_gguf(&mut GgufFile::open(path)?, boundaries)
    }

    /// [`load`](Self::load) from an open GGUF file.
    pub fn from_gguf(gguf: &mut GgufFile, boundaries: &[usize]) -> Result<(Self, Tokenizer)> {
        Self::from_gguf_on(gguf, boundaries, &[])
    }

    /// [`from_gguf`](Self::from_gguf) with slice `i` computing on
    /// `devices[i]` (the CPU where `devices` is shorter).
    pub fn from_gguf_on(
        gguf: &mut GgufFile,
        boundaries: &[usize],
        devices: &[crate::model::ComputeDevice],
    ) -> Result<(Self, Tokenizer)> {
        let tokenizer = Tokenizer::from_gguf(gguf)?;
        let n_layer = crate::model::Config::from_gguf(gguf)?.n_layer;
        let mut cuts = vec![0];
        cuts.extend_from_slice(boundaries);
        cuts.push(n_layer);
        if cuts.windows(2).any(|w| w[0] >= w[1]) {
            return Err(ModelError::Invalid(format!(
                "split points {boundaries:?} must be increasing layers strictly inside 0..{n_layer}"
            )));
        }
        let mut slices = Vec::new();
        for (i, w) in cuts.windows(2).enumerate() {
            let device = devices.get(i).copied().unwrap_or_default();
            slices.push(LayerSlice::from_gguf_on(gguf, w[0]..w[1], device)?);
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
                SliceOutput::CacheOnly => break,
            }
        }
        Err(ModelError::Invalid("the last slice has no LM head".into()))
    }
}
