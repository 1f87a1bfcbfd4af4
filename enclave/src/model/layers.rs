//! Parts every architecture shares: RMS norm, rotary position embedding,
//! and causal softmax attention of one query head over the f16 KV cache.

use half::f16;

use super::config::{Config, RopeStyle};
use super::error::Result;
use super::kernels::{axpy_f16, dot_f16};

#[derive(Debug)]
pub(crate) struct RmsNorm {
    pub(crate) weight: Vec<f32>,
    pub(crate) eps: f32,
}

impl RmsNorm {
    /// Normalizes each row of `width = weight.len()` values.
    pub(crate) fn forward(&self, x: &[f32]) -> Vec<f32> {
        let mut out = x.to_vec();
        self.apply(&mut out);
        out
    }

    pub(crate) fn apply(&self, x: &mut [f32]) {
        for row in x.chunks_exact_mut(self.weight.len()) {
            // Sum in f64 as ggml does.
            let ms = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / row.len() as f64;
            let scale = 1.0 / (ms as f32 + self.eps).sqrt();
            row.iter_mut().zip(&self.weight).for_each(|(v, w)| *v = *v * scale * w);
        }
    }
}

/// Rotary position embedding: inverse frequencies from metadata.
#[derive(Debug)]
pub(crate) struct Rope {
    pub(crate) inv_freq: Vec<f32>,
    pub(crate) style: RopeStyle,
}

impl Rope {
    pub(crate) fn new(cfg: &Config, freq_factors: Option<Vec<f32>>) -> Result<Self> {
        let half = cfg.head_dim / 2;
        let mut inv_freq: Vec<f32> =
            (0..half).map(|i| 1.0 / cfg.rope_theta.powf(2.0 * i as f32 / cfg.head_dim as f32)).collect();
        // Llama 3 style scaling is baked into `rope_freqs.weight` by llama.cpp: divide by it.
        if let Some(f) = freq_factors {
            for (x, s) in inv_freq.iter_mut().zip(f) {
                *x /= s;
            }
        }
        Ok(Self { inv_freq, style: cfg.rope_style })
    }

    /// `(cos, sin)` tables, `half` values per position, for `positions`.
    pub(crate) fn tables(&self, positions: &[usize]) -> (Vec<f32>, Vec<f32>) {
        let mut cos = Vec::with_capacity(positions.len() * self.inv_freq.len());
        let mut sin = Vec::with_capacity(cos.capacity());
        for &p in positions {
            for f in &self.inv_freq {
                let (s, c) = (p as f32 * f).sin_cos();
                cos.push(c);
                sin.push(s);
            }
        }
        (cos, sin)
    }

    /// Rotates every head of every row (row `r` at the table's row `r`).
    pub(crate) fn apply(&self, x: &mut [f32], head_dim: usize, heads: usize, cos: &[f32], sin: &[f32]) {
        let half = head_dim / 2;
        for (r, row) in x.chunks_exact_mut(heads * head_dim).enumerate() {
            let (c, s) = (&cos[r * half..(r + 1) * half], &sin[r * half..(r + 1) * half]);
            for head in row.chunks_exact_mut(head_dim) {
                for i in 0..half {
                    let (a, b) = match self.style {
                        RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                        RopeStyle::Neox => (i, i + half),
                    };
                    let (x0, x1) = (head[a], head[b]);
                    head[a] = x0 * c[i] - x1 * s[i];
                    head[b] = x0 * s[i] + x1 * c[i];
                }
            }
        }
    }
}

/// Softmax attention of one query head over the first `len` cached
/// positions (causal: a query at position p sees keys 0..=p), reading KV
/// head columns `[col, col + head_dim)` of rows of `stride` values. The
/// query and the probabilities stay f32 (llama.cpp rounds both to f16 for
/// its products with the f16 cache; doing the same here moved the
/// reference model's answers away from llama.cpp's, not towards them).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend(
    query: &[f32],
    keys: &[f16],
    values: &[f16],
    len: usize,
    stride: usize,
    col: usize,
    scale: f32,
    out: &mut [f32],
) {
    let hd = query.len();
    let mut scores: Vec<f32> = (0..len).map(|t| dot_f16(query, &keys[t * stride + col..][..hd]) * scale).collect();
    let max = scores.iter().fold(f32::NEG_INFINITY, |a, &s| a.max(s));
    let mut sum = 0f32;
    for s in &mut scores {
        *s = (*s - max).exp();
        sum += *s;
    }
    let inv = 1.0 / sum;
    out.fill(0.0);
    for (t, s) in scores.iter().enumerate() {
        axpy_f16(out, s * inv, &values[t * stride + col..][..hd]);
    }
}
