//! Planning a pipeline split: contiguous stages balanced by the weight bytes
//! each must hold, with the KV cache each needs per position, from a GGUF's
//! header (no tensor is read) or from a named shape (for models too large to
//! have at hand).

use candle_core::quantized::GgmlDType;

use super::config::Config;
use super::error::{ModelError, Result};
use super::gguf::{GgufFile, TensorType};
use super::synth::Shape;

/// What a model's stages would hold.
#[derive(Clone, Debug, PartialEq)]
pub struct Weights {
    /// Bytes of each block's tensors, in layer order.
    pub layers: Vec<u64>,
    /// Bytes only the first stage holds (the token embedding).
    pub first: u64,
    /// Bytes only the last stage holds (final norm and LM head; the
    /// embedding again when the head is tied to it).
    pub last: u64,
    /// f16 K and V bytes per position per layer.
    pub kv_per_position_layer: u64,
}

/// One planned stage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagePlan {
    /// Layers `[start, end)`.
    pub layers: std::ops::Range<usize>,
    /// Weight bytes the stage holds.
    pub weight_bytes: u64,
    /// KV bytes per 1,000 positions.
    pub kv_bytes_per_1000: u64,
}

/// The layer a `blk.N.…` tensor belongs to.
pub fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

impl Weights {
    /// From a GGUF's tensor table (the header only).
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let c = Config::from_gguf(g)?;
        let mut layers = vec![0u64; c.n_layer];
        let (mut first, mut last) = (0u64, 0u64);
        for name in g.tensor_names() {
            let bytes = g.tensor_bytes(&name).unwrap_or(0);
            if name.starts_with("blk.") {
                let i = layer_of(&name)
                    .filter(|&i| i < c.n_layer)
                    .ok_or_else(|| ModelError::Malformed(format!("tensor {name} names no layer of the model")))?;
                layers[i] += bytes;
            } else if name == "token_embd.weight" {
                first += bytes;
                if !g.has_tensor("output.weight") {
                    last += bytes;
                }
            } else {
                // output_norm, output, rope_freqs: held by the last stage (rope_freqs by all, small).
                last += bytes;
            }
        }
        Ok(Self { layers, first, last, kv_per_position_layer: (2 * c.n_head_kv * c.head_dim * 2) as u64 })
    }

    /// From a shape with its matrices in `dtype` (norms and routers f32;
    /// with MXFP4, the experts MXFP4 and the other matrices Q8_0).
    pub fn from_shape(s: &Shape, dtype: TensorType) -> Self {
        let (dense, experts) = match dtype {
            TensorType::Mxfp4 => (TensorType::Ggml(GgmlDType::Q8_0), TensorType::Mxfp4),
            d => (d, d),
        };
        let bytes = |t: TensorType, elems: usize| t.bytes_for(elems).unwrap_or(elems * 4) as u64;
        let q = |elems: usize| bytes(dense, elems);
        let (d, hd) = (s.n_embd, s.head_dim);
        let attn = q(d * s.n_head * hd) * 2 + q(d * s.n_head_kv * hd) * 2;
        let ffn = match s.n_expert {
            0 => q(d * s.n_ff) * 3,
            n => bytes(experts, d * s.n_ff) * 3 * n as u64 + (d * n * 4) as u64,
        };
        let norms = (2 * d * 4) as u64;
        Self {
            layers: vec![attn + ffn + norms; s.n_layer],
            first: q(s.vocab * d),
            last: q(s.vocab * d) + (d * 4) as u64,
            kv_per_position_layer: (2 * s.n_head_kv * hd * 2) as u64,
        }
    }

    /// Every byte of the model.
    pub fn total(&self) -> u64 {
        self.layers.iter().sum::<u64>() + self.first + self.last
    }

    /// `stages` contiguous stages minimising the largest stage's weight bytes.
    pub fn plan(&self, stages: usize) -> Result<Vec<StagePlan>> {
        let n = self.layers.len();
        if stages == 0 || stages > n {
            return Err(ModelError::Invalid(format!("{stages} stages for {n} layers (1 to {n})")));
        }
        let mut prefix = vec![0u64; n + 1];
        for (i, b) in self.layers.iter().enumerate() {
            prefix[i + 1] = prefix[i] + b;
        }
        let cost = |s: usize, i: usize, j: usize| {
            let extra = if s == 0 { self.first } else { 0 } + if j == n { self.last } else { 0 };
            prefix[j] - prefix[i] + extra
        };
        // best[s][j]: the smallest largest stage covering layers 0..j with s + 1 stages.
        let mut best = vec![vec![u64::MAX; n + 1]; stages];
        let mut cut = vec![vec![0usize; n + 1]; stages];
        for (j, b) in best[0].iter_mut().enumerate().skip(1) {
            *b = cost(0, 0, j);
        }
        for s in 1..stages {
            for j in s + 1..=n {
                for i in s..j {
                    let v = best[s - 1][i].max(cost(s, i, j));
                    if v < best[s][j] {
                        best[s][j] = v;
                        cut[s][j] = i;
                    }
                }
            }
        }
        let mut bounds = vec![n];
        let mut j = n;
        for s in (1..stages).rev() {
            j = cut[s][j];
            bounds.push(j);
        }
        bounds.push(0);
        bounds.reverse();
        Ok(bounds
            .windows(2)
            .enumerate()
            .map(|(s, w)| StagePlan {
                layers: w[0]..w[1],
                weight_bytes: cost(s, w[0], w[1]),
                kv_bytes_per_1000: self.kv_per_position_layer * (w[1] - w[0]) as u64 * 1000,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weights(layers: Vec<u64>, first: u64, last: u64) -> Weights {
        Weights { layers, first, last, kv_per_position_layer: 10 }
    }

    #[test]
    fn stages_are_contiguous_and_balanced() {
        let w = weights(vec![10; 8], 0, 0);
        let p = w.plan(4).unwrap();
        assert_eq!(p.iter().map(|s| s.layers.clone()).collect::<Vec<_>>(), vec![0..2, 2..4, 4..6, 6..8]);
        assert!(p.iter().all(|s| s.weight_bytes == 20 && s.kv_bytes_per_1000 == 20_000));
        // A heavy embedding and head push layers to the middle stage: the
        // best largest stage is 50 (2 + 4 + 2 layers, or 1 + 5 + 2).
        let heavy = weights(vec![10; 8], 30, 30);
        let p = heavy.plan(3).unwrap();
        assert_eq!(p.iter().map(|s| s.weight_bytes).max(), Some(50));
        assert_eq!(p.iter().map(|s| s.weight_bytes).sum::<u64>(), heavy.total());
        assert!(p.windows(2).all(|w| w[0].layers.end == w[1].layers.start) && p[0].layers.start == 0);
        assert_eq!(p[2].layers.end, 8);
    }

    #[test]
    fn impossible_splits_are_refused() {
        assert!(weights(vec![1; 3], 0, 0).plan(4).is_err());
        assert!(weights(vec![1; 3], 0, 0).plan(0).is_err());
    }

    #[test]
    fn the_235b_shape_counts_its_experts() {
        let w = Weights::from_shape(&Shape::QWEN3_235B_A22B, TensorType::Ggml(GgmlDType::Q4K));
        // 235B parameters at 4.5 bits: about 132 GB.
        assert!((120e9..140e9).contains(&(w.total() as f64)), "{}", w.total());
    }
}
