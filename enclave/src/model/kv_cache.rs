//! Per-session KV cache, held outside the (shared, immutable) weights.
//!
//! Keys and values are stored as f16 (half the memory of f32, and what
//! llama.cpp keeps by default), position-major per layer: position `t`,
//! KV head `g` occupies `[(t·heads + g)·head_dim, +head_dim)`. Appending is
//! an extend and rollback a truncate; attention reads f16 directly.
//!
//! A sliding-window layer (gpt-oss, Gemma 3) attends to its last `window`
//! positions only, so on the CPU path its cache keeps only those plus
//! [`ROLLBACK_SLACK`] positions for speculation's rollback: older rows are
//! dropped once twice that many are held, which bounds its memory at any
//! context length. Rolling back further than what is kept is refused
//! ([`SessionKv::truncate`]); the caller starts the session over.
//!
//! A slice that computes on a device keeps its cache there instead: per
//! layer one f16 tensor of keys and one of values, `(positions, KV heads,
//! head_dim)`, grown by concatenation and rolled back by narrowing.

use candle_core::Tensor;
use half::f16;

use super::error::{ModelError, Result};

/// Positions a sliding-window layer keeps beyond its window, so a
/// speculation round (at most `MAX_K + 1` positions) can always be rolled
/// back.
pub const ROLLBACK_SLACK: usize = 64;

/// Keys and values of one session for the layers of one slice.
#[derive(Debug, Clone)]
pub struct SessionKv {
    keys: Vec<Vec<f16>>,
    values: Vec<Vec<f16>>,
    /// Per layer: the absolute position of its first row held (non-zero
    /// once a sliding-window layer has dropped old rows).
    first: Vec<usize>,
    /// Per layer: the sliding window, for layers that have one (CPU path).
    windows: Vec<Option<usize>>,
    /// On a device: per layer keys and values, `None` until the first append.
    device: Option<Vec<Option<(Tensor, Tensor)>>>,
    /// Values per position per layer for keys (and for values): heads × head_dim.
    width: usize,
    len: usize,
    budget_bytes: usize,
}

impl SessionKv {
    /// An empty cache for `n_layers` layers of `width` key values per
    /// position (KV heads × head size); `budget_bytes` caps the total.
    pub fn new(n_layers: usize, width: usize, budget_bytes: usize) -> Self {
        Self::with_windows(vec![None; n_layers], width, budget_bytes)
    }

    /// [`new`](Self::new) for layers of which some attend to a sliding
    /// window (`windows[l]`): those keep only the window and the slack.
    pub fn with_windows(windows: Vec<Option<usize>>, width: usize, budget_bytes: usize) -> Self {
        let n_layers = windows.len();
        let (keys, values) = (vec![Vec::new(); n_layers], vec![Vec::new(); n_layers]);
        Self { keys, values, first: vec![0; n_layers], windows, device: None, width, len: 0, budget_bytes }
    }

    /// An empty cache held in device memory (for a slice computing on a device).
    pub(crate) fn new_on_device(n_layers: usize, width: usize, budget_bytes: usize) -> Self {
        Self { device: Some(vec![None; n_layers]), ..Self::new(n_layers, width, budget_bytes) }
    }

    /// Whether the cache is held in device memory.
    pub fn on_device(&self) -> bool {
        self.device.is_some()
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes one position costs across this slice's layers.
    pub fn bytes_per_position(&self) -> usize {
        self.keys.len() * 2 * self.width * std::mem::size_of::<f16>()
    }

    /// Bytes held (committed positions; a sliding-window layer counts only
    /// the rows it keeps).
    pub fn bytes(&self) -> usize {
        let rows: usize = self.first.iter().map(|f| self.len - f.min(&self.len)).sum();
        rows * 2 * self.width * std::mem::size_of::<f16>()
    }

    /// The memory budget.
    pub fn budget_bytes(&self) -> usize {
        self.budget_bytes
    }

    /// Refuses growth beyond the budget before any work is done.
    pub fn reserve(&self, extra_positions: usize) -> Result<()> {
        let needed = self.bytes().saturating_add(extra_positions.saturating_mul(self.bytes_per_position()));
        if needed > self.budget_bytes {
            return Err(ModelError::KvBudget { needed_bytes: needed, budget_bytes: self.budget_bytes });
        }
        Ok(())
    }

    /// Appends rows of keys and values (`n × width` each) for `layer`, at
    /// positions `[len, len + n)`; committed by [`advance`](Self::advance).
    pub(crate) fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<()> {
        let (keys, values) = match (self.keys.get_mut(layer), self.values.get_mut(layer)) {
            (Some(k), Some(v)) => (k, v),
            _ => return Err(ModelError::Invalid(format!("no KV slot for layer {layer}"))),
        };
        let held = self.len - self.first[layer];
        if k.len() != v.len() || !k.len().is_multiple_of(self.width) || keys.len() != held * self.width {
            return Err(ModelError::Invalid("KV rows do not match the cache layout".into()));
        }
        keys.extend(k.iter().map(|&x| f16::from_f32(x)));
        values.extend(v.iter().map(|&x| f16::from_f32(x)));
        Ok(())
    }

    /// Appends keys and values (`(n, KV heads, head_dim)` f16 tensors) for
    /// `layer` of a device cache, at positions `[len, len + n)`.
    pub(crate) fn append_device(&mut self, layer: usize, k: Tensor, v: Tensor) -> Result<()> {
        let len = self.len;
        let slot = self
            .device
            .as_mut()
            .and_then(|d| d.get_mut(layer))
            .ok_or_else(|| ModelError::Invalid(format!("no device KV slot for layer {layer}")))?;
        let held = slot.as_ref().map(|(k, _)| k.dim(0)).transpose()?.unwrap_or(0);
        if held != len || k.dims() != v.dims() {
            return Err(ModelError::Invalid("KV rows do not match the cache layout".into()));
        }
        *slot = Some(match slot.take() {
            None => (k, v),
            Some((keys, values)) => (Tensor::cat(&[&keys, &k], 0)?, Tensor::cat(&[&values, &v], 0)?),
        });
        Ok(())
    }

    /// Keys and values of `layer` of a device cache, every position appended so far.
    pub(crate) fn device_layer(&self, layer: usize) -> Result<(&Tensor, &Tensor)> {
        match self.device.as_ref().and_then(|d| d.get(layer)) {
            Some(Some((k, v))) => Ok((k, v)),
            _ => Err(ModelError::Invalid(format!("no device KV for layer {layer}"))),
        }
    }

    /// Keys and values of `layer` for the positions it holds, and the
    /// absolute position of the first (0 unless a sliding-window layer has
    /// dropped old rows).
    pub(crate) fn layer(&self, layer: usize) -> (&[f16], &[f16], usize) {
        (&self.keys[layer], &self.values[layer], self.first[layer])
    }

    /// Marks `n` new positions as committed after every layer appended
    /// them; a sliding-window layer holding twice its window and slack drops
    /// all but the last window and slack.
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
        for (l, window) in self.windows.iter().enumerate() {
            let Some(w) = window else { continue };
            let keep = w.saturating_add(ROLLBACK_SLACK);
            let held = self.len - self.first[l];
            if held > keep.saturating_mul(2) {
                let drop = held - keep;
                self.keys[l].drain(..drop * self.width);
                self.values[l].drain(..drop * self.width);
                self.first[l] += drop;
            }
        }
    }

    /// Drops the positions appended but not committed (a forward that failed part-way).
    pub(crate) fn discard_uncommitted(&mut self) {
        let len = self.len;
        // Rolling back to the committed length never needs a dropped row.
        let _ = self.truncate(len);
    }

    /// The shortest length other than 0 (starting over) this cache can roll
    /// back to: a sliding-window layer that has dropped rows needs its whole
    /// window before the next position.
    pub fn min_rollback(&self) -> usize {
        self.first
            .iter()
            .zip(&self.windows)
            .filter(|(first, _)| **first > 0)
            .map(|(first, w)| (first + w.unwrap_or(0)).saturating_sub(1))
            .max()
            .unwrap_or(0)
            .min(self.len)
    }

    /// Drops every position at or after `len` (speculation rollback, or
    /// undoing a forward that failed part-way). Refused, with nothing
    /// changed, below [`min_rollback`](Self::min_rollback) unless to 0: a sliding-window
    /// layer no longer holds what attention from there would read.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len == 0 {
            // Starting over is always possible.
            self.first.iter_mut().for_each(|f| *f = 0);
        } else if len < self.min_rollback() {
            return Err(ModelError::Invalid(format!(
                "cannot roll back to position {len}: sliding-window layers keep positions from {} on",
                self.min_rollback()
            )));
        }
        let target = len.min(self.len);
        for ((k, v), first) in self.keys.iter_mut().zip(&mut self.values).zip(&self.first) {
            let keep = (target - first.min(&target)) * self.width;
            k.truncate(keep);
            v.truncate(keep);
        }
        let positions = len.min(self.len);
        for slot in self.device.iter_mut().flatten() {
            *slot = match slot.take() {
                Some((k, v)) if positions == 0 => {
                    drop((k, v));
                    None
                }
                Some((k, v)) if k.dim(0).unwrap_or(0) > positions => {
                    // A narrowed view would keep the whole allocation alive; copy.
                    match (
                        k.narrow(0, 0, positions).and_then(|k| k.copy()),
                        v.narrow(0, 0, positions).and_then(|v| v.copy()),
                    ) {
                        (Ok(k), Ok(v)) => Some((k, v)),
                        // A device that cannot copy has failed: drop the cache rather than keep stale rows.
                        _ => None,
                    }
                }
                other => other,
            };
        }
        self.len = self.len.min(len);
        Ok(())
    }
}
