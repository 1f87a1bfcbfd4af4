//! Parts every architecture shares: RMS norm, rotary position embedding,
//! and causal softmax attention of one query head over the f16 KV cache.

use half::f16;

use super::config::{Config, RopeParams, RopeStyle};
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

/// The gated activation of a feed-forward: `down(act(gate) · up)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Glu {
    /// SwiGLU: `silu(gate) · up`.
    Swi,
    /// GeGLU (Gemma): tanh-approximated GELU of the gate, through ggml's
    /// f16 table (the gate rounded to f16, the GELU rounded to f16).
    Ge,
    /// gpt-oss's clamped SwiGLU: `min(g, 7) · σ(1.702 · min(g, 7)) · (clamp(u, ±7) + 1)`.
    SwiClamped,
}

impl Glu {
    /// `gate ← act(gate) · up`, element by element.
    pub(crate) fn apply(self, gate: &mut [f32], up: &[f32]) {
        match self {
            Self::Swi => gate.iter_mut().zip(up).for_each(|(g, u)| *g = *g / (1.0 + (-*g).exp()) * u),
            Self::Ge => gate.iter_mut().zip(up).for_each(|(g, u)| *g = gelu_f16(*g) * u),
            Self::SwiClamped => {
                const ALPHA: f32 = 1.702;
                const LIMIT: f32 = 7.0;
                gate.iter_mut().zip(up).for_each(|(g, u)| {
                    let x = g.min(LIMIT);
                    let y = u.clamp(-LIMIT, LIMIT);
                    *g = x / (1.0 + (ALPHA * -x).exp()) * (y + 1.0);
                })
            }
        }
    }
}

/// ggml's GELU of one value: 0 below -10, the identity above 10, else the
/// tanh approximation looked up at the value rounded to f16 and stored as f16.
fn gelu_f16(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044_715;
    if x <= -10.0 {
        return 0.0;
    }
    if x >= 10.0 {
        return x;
    }
    let v = f16::from_f32(x).to_f32();
    let g = 0.5 * v * (1.0 + (SQRT_2_OVER_PI * v * (1.0 + COEF_A * v * v)).tanh());
    f16::from_f32(g).to_f32()
}

/// Rotary position embedding of one kind of layer: inverse frequencies
/// from metadata, linear or YaRN scaling (ggml's `rope_yarn`).
#[derive(Debug)]
pub(crate) struct Rope {
    pub(crate) inv_freq: Vec<f32>,
    pub(crate) style: RopeStyle,
    /// Position scale (`1 / factor`).
    freq_scale: f32,
    /// YaRN's correction range `[low, high]` over dimension pairs.
    yarn: Option<[f32; 2]>,
    /// Magnitude of cos and sin.
    mscale: f32,
}

impl Rope {
    pub(crate) fn new(cfg: &Config, params: RopeParams, freq_factors: Option<&[f32]>) -> Result<Self> {
        let half = cfg.head_dim / 2;
        let mut inv_freq: Vec<f32> =
            (0..half).map(|i| 1.0 / params.freq_base.powf(2.0 * i as f32 / cfg.head_dim as f32)).collect();
        // Llama 3 style scaling is baked into `rope_freqs.weight` by llama.cpp: divide by it.
        if let Some(f) = freq_factors {
            for (x, s) in inv_freq.iter_mut().zip(f) {
                *x /= s;
            }
        }
        let (yarn, mscale) = match params.yarn {
            None => (None, 1.0),
            Some(y) => {
                // ggml_rope_yarn_corr_dims: the pairs that turn more than
                // beta_fast (keep) or fewer than beta_slow (interpolate)
                // times over the original context.
                let n = cfg.head_dim as f32;
                let corr = |beta: f32| {
                    n * (y.orig_ctx as f32 / (beta * 2.0 * std::f32::consts::PI)).ln() / (2.0 * params.freq_base.ln())
                };
                let low = corr(y.beta_fast).floor().max(0.0);
                let high = corr(y.beta_slow).ceil().min(n - 1.0);
                (Some([low, high]), y.attn_factor * (1.0 + 0.1 * (1.0 / params.freq_scale).ln()))
            }
        };
        Ok(Self { inv_freq, style: cfg.rope_style, freq_scale: params.freq_scale, yarn, mscale })
    }

    /// `(cos, sin)` tables, `half` values per position, for `positions`.
    pub(crate) fn tables(&self, positions: &[usize]) -> (Vec<f32>, Vec<f32>) {
        let mut cos = Vec::with_capacity(positions.len() * self.inv_freq.len());
        let mut sin = Vec::with_capacity(cos.capacity());
        for &p in positions {
            for (i, f) in self.inv_freq.iter().enumerate() {
                let extrap = p as f32 * f;
                let interp = self.freq_scale * extrap;
                let theta = match self.yarn {
                    None => interp,
                    Some([low, high]) => {
                        let y = (i as f32 - low) / (high - low).max(0.001);
                        let mix = 1.0 - y.clamp(0.0, 1.0);
                        interp * (1.0 - mix) + extrap * mix
                    }
                };
                let (s, c) = theta.sin_cos();
                cos.push(c * self.mscale);
                sin.push(s * self.mscale);
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

/// Softmax attention of one query head over cached positions `from..len`
/// (causal: a query at position p sees keys up to p; a sliding window
/// starts `from` later), reading KV
/// head columns `[col, col + head_dim)` of rows of `stride` values. The
/// query and the probabilities stay f32 (llama.cpp rounds both to f16 for
/// its products with the f16 cache; doing the same here moved the
/// reference model's answers away from llama.cpp's, not towards them).
/// A sink (gpt-oss) is one more logit in the softmax with no value: it
/// takes part in the maximum and the sum, as ggml's `soft_max` with sinks.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend(
    query: &[f32],
    keys: &[f16],
    values: &[f16],
    span: std::ops::Range<usize>,
    stride: usize,
    col: usize,
    scale: f32,
    sink: Option<f32>,
    out: &mut [f32],
) {
    let hd = query.len();
    let mut scores: Vec<f32> = span.clone().map(|t| dot_f16(query, &keys[t * stride + col..][..hd]) * scale).collect();
    let mut max = scores.iter().fold(f32::NEG_INFINITY, |a, &s| a.max(s));
    if let Some(s) = sink {
        max = max.max(s);
    }
    let mut sum = 0f32;
    for s in &mut scores {
        *s = (*s - max).exp();
        sum += *s;
    }
    if let Some(s) = sink {
        sum += (s - max).exp();
    }
    let inv = 1.0 / sum;
    out.fill(0.0);
    for (t, s) in span.zip(&scores) {
        axpy_f16(out, s * inv, &values[t * stride + col..][..hd]);
    }
}
