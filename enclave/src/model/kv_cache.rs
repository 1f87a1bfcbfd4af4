//! Per-session KV cache, held outside the (shared, immutable) weights.
//!
//! Keys and values are stored as f16 (half the memory of f32, and what
//! llama.cpp keeps by default), position-major per layer: position `t`,
//! KV head `g` occupies `[(t·heads + g)·head_dim, +head_dim)`. Appending is
//! an extend and rollback a truncate; attention reads f16 directly.
//!
//! A slice that computes on a device keeps its cache there instead: per
//! layer one f16 tensor of keys and one of values, `(positions, KV heads,
//! head_dim)`, grown by concatenation and rolled back by narrowing.

use candle_core::Tensor;
use half::f16;

use super::error::{ModelError, Result};

/// Keys and values of one session for the layers of one slice.
#[derive(Debug, Clone)]
pub struct SessionKv {
    keys: Vec<Vec<f16>>,
    values: Vec<Vec<f16>>,
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
        let (keys, values) = (vec![Vec::new(); n_layers], vec![Vec::new(); n_layers]);
        Self { keys, values, device: None, width, len: 0, budget_bytes }
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

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.len * self.bytes_per_position()
    }

    /// The memory budget.
    pub fn budget_bytes(&self) -> usize {
        self.budget_bytes
    }

    /// Refuses growth beyond the budget before any work is done.
    pub fn reserve(&self, extra_positions: usize) -> Result<()> {
        let needed = (self.len + extra_positions).saturating_mul(self.bytes_per_position());
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
        if k.len() != v.len() || !k.len().is_multiple_of(self.width) || keys.len() != self.len * self.width {
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

    /// Keys and values of `layer` for every position appended so far.
    pub(crate) fn layer(&self, layer: usize) -> (&[f16], &[f16]) {
        (&self.keys[layer], &self.values[layer])
    }

    /// Marks `n` new positions as committed after every layer appended them.
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// Drops every position at or after `len` (speculation rollback, or
    /// undoing a forward that failed part-way).
    pub fn truncate(&mut self, len: usize) {
        let keep = len.min(self.len) * self.width;
        for (k, v) in self.keys.iter_mut().zip(&mut self.values) {
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
    }
}
