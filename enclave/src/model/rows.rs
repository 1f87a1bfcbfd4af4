//! What crosses a slice's boundary: rows of hidden states or logits, a
//! session's positions in a batch, and what each session gets back.

use std::ops::Range;

use super::error::{ModelError, Result};
use super::kv_cache::SessionKv;

/// `n` rows of `width` f32 values, row-major: hidden states between slices,
/// or logits out of the last one.
#[derive(Clone, Debug, PartialEq)]
pub struct Rows {
    width: usize,
    data: Vec<f32>,
}

impl Rows {
    /// Wraps `data` as rows of `width`; refuses a ragged or empty shape.
    pub fn new(data: Vec<f32>, width: usize) -> Result<Self> {
        if width == 0 || data.is_empty() || !data.len().is_multiple_of(width) {
            return Err(ModelError::Invalid(format!("{} values are not whole rows of {width}", data.len())));
        }
        Ok(Self { width, data })
    }

    /// Number of rows.
    pub fn n(&self) -> usize {
        self.data.len() / self.width
    }

    /// Values per row.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.width..(i + 1) * self.width]
    }

    /// The last row.
    pub fn last(&self) -> &[f32] {
        self.row(self.n() - 1)
    }

    /// Every value, row-major.
    pub fn as_slice(&self) -> &[f32] {
        &self.data
    }

    /// The values, row-major.
    pub fn into_vec(self) -> Vec<f32> {
        self.data
    }
}

/// Which positions the last slice computes logits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Every position (speculative verification, teacher forcing).
    All,
    /// Only the last position (plain prefill and decode).
    Last,
    /// None: the caller only fills the cache (a prefill chunk that is not the last).
    None,
}

/// What a slice returns for one session.
#[derive(Debug, Clone, PartialEq)]
pub enum SliceOutput {
    /// Hidden states, one row per position, for the next slice.
    Hidden(Rows),
    /// Logits from the last slice: one row per position asked for.
    Logits(Rows),
    /// The last slice ran, and no logits were asked for ([`Logits::None`]).
    CacheOnly,
}

/// One session's positions in a batched forward.
#[derive(Debug)]
pub struct BatchItem<'a> {
    /// Hidden states of the new positions (rows of `n_embd`).
    pub hidden: Rows,
    /// The session's cache for this slice.
    pub kv: &'a mut SessionKv,
    /// Absolute position of the first row; must equal the cached length.
    pub start: usize,
    /// Which rows get logits on the last slice.
    pub logits: Logits,
}

/// Each item's rows of the batch's hidden states `x` (rows of `d`).
pub(crate) fn hidden_outputs(items: &[BatchItem<'_>], x: &[f32], d: usize) -> Result<Vec<SliceOutput>> {
    let mut at = 0;
    items
        .iter()
        .map(|it| {
            let n = it.hidden.n();
            let rows = Rows::new(x[at * d..(at + n) * d].to_vec(), d);
            at += n;
            Ok(SliceOutput::Hidden(rows?))
        })
        .collect()
}

/// Per item, the batch rows that need logits (empty: none).
pub(crate) fn wanted_rows(items: &[BatchItem<'_>]) -> Vec<Range<usize>> {
    let mut at = 0;
    items
        .iter()
        .map(|it| {
            let n = it.hidden.n();
            let r = match it.logits {
                Logits::All => at..at + n,
                Logits::Last => at + n - 1..at + n,
                Logits::None => at + n..at + n,
            };
            at += n;
            r
        })
        .collect()
}

/// Splits `logits` (the wanted rows, in order, of `vocab` each) per item.
pub(crate) fn logit_outputs(wanted: &[Range<usize>], logits: &[f32], vocab: usize) -> Result<Vec<SliceOutput>> {
    let mut at = 0;
    wanted
        .iter()
        .map(|r| {
            if r.is_empty() {
                return Ok(SliceOutput::CacheOnly);
            }
            let rows = Rows::new(logits[at * vocab..(at + r.len()) * vocab].to_vec(), vocab)?;
            at += r.len();
            Ok(SliceOutput::Logits(rows))
        })
        .collect()
}
