//! Random-weight GGUF models of a real architecture's shape, for measuring
//! speed where no large weights can be downloaded (`veil-shard synth-model`).
//! The numbers they produce mean nothing; the bytes moved and the
//! arithmetic done are those of the real model.

use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::error::{ModelError, Result};

/// The dimensions of a Llama-family model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// Transformer blocks.
    pub n_layer: usize,
    /// Hidden size.
    pub n_embd: usize,
    /// Feed-forward size.
    pub n_ff: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Vocabulary.
    pub vocab: usize,
    /// Context window.
    pub context: usize,
    /// RoPE base.
    pub rope_theta: f32,
}

impl Shape {
    /// Llama-3-8B (and 3.1-8B): 32 × 4096, FFN 14336, 32/8 heads, 128256 tokens.
    pub const LLAMA3_8B: Self = Self {
        n_layer: 32,
        n_embd: 4096,
        n_ff: 14336,
        n_head: 32,
        n_head_kv: 8,
        vocab: 128_256,
        context: 8192,
        rope_theta: 500_000.0,
    };
    /// A small shape for checking the tooling in seconds.
    pub const SMOKE: Self = Self {
        n_layer: 2,
        n_embd: 256,
        n_ff: 512,
        n_head: 4,
        n_head_kv: 2,
        vocab: 512,
        context: 1024,
        rope_theta: 10_000.0,
    };

    /// By name: `llama3-8b` or `smoke`.
    pub fn named(name: &str) -> Option<Self> {
        match name {
            "llama3-8b" => Some(Self::LLAMA3_8B),
            "smoke" => Some(Self::SMOKE),
            _ => None,
        }
    }

    /// Parameters of the matrices (what decode reads per token), embedding excluded.
    pub fn matrix_params(&self) -> usize {
        let hd = self.n_embd / self.n_head;
        let attn = self.n_embd * (self.n_head * hd) * 2 + self.n_embd * (self.n_head_kv * hd) * 2;
        let ffn = self.n_embd * self.n_ff * 3;
        self.n_layer * (attn + ffn) + self.vocab * self.n_embd
    }
}

/// `n` values uniform in `[-width/2, width/2)` from a 64-bit LCG, advancing
/// `seed` (reproducible; the test models use it too).
pub fn uniform(n: usize, width: f32, seed: &mut u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * width
        })
        .collect()
}

/// Writes a model of `shape` with random weights, matrices quantized to
/// `dtype` (norms in f32, the embedding and LM head in `dtype` too).
pub fn write_random(path: &Path, shape: Shape, dtype: GgmlDType, seed: u64) -> Result<()> {
    let s = shape;
    if !s.n_embd.is_multiple_of(s.n_head)
        || !s.n_head.is_multiple_of(s.n_head_kv)
        || !s.n_embd.is_multiple_of(dtype.block_size())
    {
        return Err(ModelError::Invalid(format!("shape {s:?} does not fit {dtype:?} blocks and grouped heads")));
    }
    let hd = s.n_embd / s.n_head;
    let mut seed = seed;
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let matrix = |name: String, rows: usize, cols: usize, seed: &mut u64| -> Result<(String, QTensor)> {
        // Weights of a trained model's scale, so activations stay finite through every layer.
        let t = Tensor::from_vec(uniform(rows * cols, 1.0 / (cols as f32).sqrt(), seed), (rows, cols), &Device::Cpu)?;
        Ok((name, QTensor::quantize(&t, dtype)?))
    };
    let ones = |n: usize| -> Result<QTensor> {
        Ok(QTensor::quantize(&Tensor::ones(n, candle_core::DType::F32, &Device::Cpu)?, GgmlDType::F32)?)
    };
    tensors.push(matrix("token_embd.weight".into(), s.vocab, s.n_embd, &mut seed)?);
    for i in 0..s.n_layer {
        let p = format!("blk.{i}");
        tensors.push((format!("{p}.attn_norm.weight"), ones(s.n_embd)?));
        tensors.push(matrix(format!("{p}.attn_q.weight"), s.n_head * hd, s.n_embd, &mut seed)?);
        tensors.push(matrix(format!("{p}.attn_k.weight"), s.n_head_kv * hd, s.n_embd, &mut seed)?);
        tensors.push(matrix(format!("{p}.attn_v.weight"), s.n_head_kv * hd, s.n_embd, &mut seed)?);
        tensors.push(matrix(format!("{p}.attn_output.weight"), s.n_embd, s.n_head * hd, &mut seed)?);
        tensors.push((format!("{p}.ffn_norm.weight"), ones(s.n_embd)?));
        tensors.push(matrix(format!("{p}.ffn_gate.weight"), s.n_ff, s.n_embd, &mut seed)?);
        tensors.push(matrix(format!("{p}.ffn_up.weight"), s.n_ff, s.n_embd, &mut seed)?);
        tensors.push(matrix(format!("{p}.ffn_down.weight"), s.n_embd, s.n_ff, &mut seed)?);
    }
    tensors.push(("output_norm.weight".into(), ones(s.n_embd)?));
    tensors.push(matrix("output.weight".into(), s.vocab, s.n_embd, &mut seed)?);
    let u32_of = |v: usize| Value::U32(u32::try_from(v).unwrap_or(u32::MAX));
    let meta = [
        ("general.architecture", Value::String("llama".into())),
        ("general.name", Value::String("veil random-weight model".into())),
        ("llama.block_count", u32_of(s.n_layer)),
        ("llama.embedding_length", u32_of(s.n_embd)),
        ("llama.feed_forward_length", u32_of(s.n_ff)),
        ("llama.attention.head_count", u32_of(s.n_head)),
        ("llama.attention.head_count_kv", u32_of(s.n_head_kv)),
        ("llama.context_length", u32_of(s.context)),
        ("llama.vocab_size", u32_of(s.vocab)),
        ("llama.rope.freq_base", Value::F32(s.rope_theta)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
    ];
    let meta: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    gguf_file::write(&mut f, &meta, &refs)?;
    std::io::Write::flush(&mut f)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{LayerSlice, Logits, SliceOutput};

    #[test]
    fn a_random_model_loads_and_runs_on_both_paths() {
        let path = std::env::temp_dir().join(format!("veil-synth-{}.gguf", std::process::id()));
        for dtype in [GgmlDType::Q4_0, GgmlDType::Q8_0] {
            write_random(&path, Shape::SMOKE, dtype, 1).unwrap();
            let mut outs = Vec::new();
            for device in [crate::model::ComputeDevice::Cpu, crate::model::ComputeDevice::CandleCpu] {
                let mut g = crate::model::GgufFile::open(&path).unwrap();
                let slice = LayerSlice::from_gguf_on(&mut g, 0..Shape::SMOKE.n_layer, device).unwrap();
                assert_eq!(slice.config().vocab_size, Shape::SMOKE.vocab);
                let mut kv = slice.new_session(1 << 24);
                match slice.forward(slice.embed(&[1, 2, 3]).unwrap(), &mut kv, 0, Logits::Last).unwrap() {
                    SliceOutput::Logits(r) => {
                        assert!(r.as_slice().iter().all(|v| v.is_finite()));
                        outs.push(r.into_vec());
                    }
                    other => panic!("{other:?}"),
                }
            }
            let worst = outs[0].iter().zip(&outs[1]).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            let scale = outs[0].iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(worst <= 0.05 * scale.max(1.0), "{dtype:?}: paths differ by {worst} (logits up to {scale})");
        }
        std::fs::remove_file(&path).ok();
    }

    #[test]
    fn the_8b_shape_has_8b_parameters() {
        let p = Shape::LLAMA3_8B.matrix_params() + Shape::LLAMA3_8B.vocab * Shape::LLAMA3_8B.n_embd;
        assert!((8_000_000_000..8_100_000_000).contains(&p), "{p}");
    }
}
