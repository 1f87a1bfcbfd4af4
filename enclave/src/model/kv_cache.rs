//! Per-session KV cache, held outside the (shared, immutable) weights.

use candle_core::{DType, Tensor, D};

use super::error::{ModelError, Result};

/// Keys and values of one session for the layers of one slice.
#[derive(Debug, Clone)]
pub struct SessionKv {
    layers: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
    bytes_per_position: usize,
    budget_bytes: usize,
    dtype: DType,
}

impl SessionKv {
    /// An empty cache for `n_layers` layers storing `dtype`.
    /// `bytes_per_position` is the cost of one position across those layers;
    /// `budget_bytes` caps the total.
    pub fn new(n_layers: usize, bytes_per_position: usize, budget_bytes: usize, dtype: DType) -> Self {
        Self { layers: vec![None; n_layers], len: 0, bytes_per_position, budget_bytes, dtype }
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.len * self.bytes_per_position
    }

    /// Refuses growth beyond the budget before any work is done.
    pub fn reserve(&self, extra_positions: usize) -> Result<()> {
        let needed = (self.len + extra_positions) * self.bytes_per_position;
        if needed > self.budget_bytes {
            return Err(ModelError::KvBudget { needed_bytes: needed, budget_bytes: self.budget_bytes });
        }
        Ok(())
    }

    /// Appends `k`, `v` (batch, kv_heads, positions, head_dim) for `layer`
    /// and returns the full keys and values in `k`'s dtype.
    pub(crate) fn append(&mut self, layer: usize, k: Tensor, v: Tensor) -> Result<(Tensor, Tensor)> {
        let compute = k.dtype();
        let slot =
            self.layers.get_mut(layer).ok_or_else(|| ModelError::Invalid(format!("no KV slot for layer {layer}")))?;
        let (k, v) = (k.to_dtype(self.dtype)?, v.to_dtype(self.dtype)?);
        let (k, v) = match slot.take() {
            None => (k, v),
            Some((pk, pv)) => (Tensor::cat(&[&pk, &k], 2)?, Tensor::cat(&[&pv, &v], 2)?),
        };
        *slot = Some((k.clone(), v.clone()));
        Ok((k.to_dtype(compute)?, v.to_dtype(compute)?))
    }

    /// Marks `n` new positions as committed after every layer appended them.
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// Drops every position at or after `len` (speculation rollback).
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len >= self.len {
            return Ok(());
        }
        for slot in &mut self.layers {
            if len == 0 {
                *slot = None;
            } else if let Some((k, v)) = slot {
                *k = k.narrow(D::Minus2, 0, len)?;
                *v = v.narrow(D::Minus2, 0, len)?;
            }
        }
        self.len = len;
        Ok(())
    }
}
