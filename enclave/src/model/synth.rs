//! Random-weight GGUF models of a real architecture's shape, for measuring
//! speed where no large weights can be downloaded (`veil-shard synth-model`).
//! The numbers they produce mean nothing; the bytes moved and the
//! arithmetic done are those of the real model. With a real vocabulary and
//! sharpened logits they are also what the llama.cpp reference tests run
//! (`scripts/reference/gen_family_fixtures.py`).

use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::error::{ModelError, Result};

/// The family a random model is written as (`general.architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `llama`: dense, or Mixtral-style experts when the shape has them.
    Llama,
    /// `qwen3moe`: q/k norms and experts in every block.
    Qwen3Moe,
}

impl Family {
    fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen3Moe => "qwen3moe",
        }
    }
}

/// The dimensions of a model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// Architecture written.
    pub family: Family,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Hidden size.
    pub n_embd: usize,
    /// Feed-forward size (of each expert, in a mixture).
    pub n_ff: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Size of one head (`n_embd / n_head` in Llama; Qwen3 sets it apart).
    pub head_dim: usize,
    /// Experts per block (0: a dense feed-forward).
    pub n_expert: usize,
    /// Experts per position.
    pub n_used: usize,
    /// Vocabulary (replaced by a real vocabulary's size when one is given).
    pub vocab: usize,
    /// Context window.
    pub context: usize,
    /// RoPE base.
    pub rope_theta: f32,
}

impl Shape {
    /// Llama-3-8B (and 3.1-8B): 32 × 4096, FFN 14336, 32/8 heads, 128256 tokens.
    pub const LLAMA3_8B: Self = Self {
        family: Family::Llama,
        n_layer: 32,
        n_embd: 4096,
        n_ff: 14336,
        n_head: 32,
        n_head_kv: 8,
        head_dim: 128,
        n_expert: 0,
        n_used: 0,
        vocab: 128_256,
        context: 8192,
        rope_theta: 500_000.0,
    };
    /// Qwen3-30B-A3B: 48 × 2048, 32/4 heads of 128, 128 experts of 768, 8 used.
    pub const QWEN3_30B_A3B: Self = Self {
        family: Family::Qwen3Moe,
        n_layer: 48,
        n_embd: 2048,
        n_ff: 768,
        n_head: 32,
        n_head_kv: 4,
        head_dim: 128,
        n_expert: 128,
        n_used: 8,
        vocab: 151_936,
        context: 40_960,
        rope_theta: 1_000_000.0,
    };
    /// Qwen3-235B-A22B: 94 × 4096, 64/4 heads of 128, 128 experts of 1536, 8 used.
    pub const QWEN3_235B_A22B: Self = Self {
        family: Family::Qwen3Moe,
        n_layer: 94,
        n_embd: 4096,
        n_ff: 1536,
        n_head: 64,
        n_head_kv: 4,
        head_dim: 128,
        n_expert: 128,
        n_used: 8,
        vocab: 151_936,
        context: 40_960,
        rope_theta: 1_000_000.0,
    };
    /// A small shape for checking the tooling in seconds.
    pub const SMOKE: Self = Self {
        family: Family::Llama,
        n_layer: 2,
        n_embd: 256,
        n_ff: 512,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_expert: 0,
        n_used: 0,
        vocab: 512,
        context: 1024,
        rope_theta: 10_000.0,
    };
    /// A small Qwen3-MoE: 8 experts of 256, 2 used (256 wide: K-quant blocks).
    pub const QWEN3MOE_SMOKE: Self = Self {
        family: Family::Qwen3Moe,
        n_layer: 3,
        n_embd: 256,
        n_ff: 256,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_expert: 8,
        n_used: 2,
        vocab: 512,
        context: 2048,
        rope_theta: 1_000_000.0,
    };
    /// A small Mixtral-style `llama` with experts: 4 experts of 512, 2 used, 4/2 heads.
    pub const MIXTRAL_SMOKE: Self = Self {
        family: Family::Llama,
        n_layer: 3,
        n_embd: 256,
        n_ff: 512,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_expert: 4,
        n_used: 2,
        vocab: 512,
        context: 2048,
        rope_theta: 1_000_000.0,
    };

    /// The shapes by name.
    pub const NAMED: [(&'static str, Self); 6] = [
        ("llama3-8b", Self::LLAMA3_8B),
        ("qwen3-30b-a3b", Self::QWEN3_30B_A3B),
        ("qwen3-235b-a22b", Self::QWEN3_235B_A22B),
        ("smoke", Self::SMOKE),
        ("qwen3moe-smoke", Self::QWEN3MOE_SMOKE),
        ("mixtral-smoke", Self::MIXTRAL_SMOKE),
    ];

    /// By name (see [`Shape::NAMED`]).
    pub fn named(name: &str) -> Option<Self> {
        Self::NAMED.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
    }

    /// Parameters of the matrices, embedding excluded, and the LM head:
    /// every expert counted (what the file holds).
    pub fn matrix_params(&self) -> usize {
        let attn = self.n_embd * (self.n_head * self.head_dim) * 2 + self.n_embd * (self.n_head_kv * self.head_dim) * 2;
        let ffn = self.n_embd * self.n_ff * 3 * self.n_expert.max(1) + self.n_embd * self.n_expert;
        self.n_layer * (attn + ffn) + self.vocab * self.n_embd
    }
}

/// The quantizations `synth-model` and `plan` take, by name.
pub const DTYPES: [(&str, GgmlDType); 8] = [
    ("q4_0", GgmlDType::Q4_0),
    ("q4_1", GgmlDType::Q4_1),
    ("q8_0", GgmlDType::Q8_0),
    ("q4_k", GgmlDType::Q4K),
    ("q5_k", GgmlDType::Q5K),
    ("q6_k", GgmlDType::Q6K),
    ("f16", GgmlDType::F16),
    ("f32", GgmlDType::F32),
];

/// A quantization by its name in [`DTYPES`].
pub fn dtype_named(name: &str) -> Option<GgmlDType> {
    DTYPES.iter().find(|(n, _)| *n == name).map(|(_, d)| *d)
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

/// How a random model is written.
#[derive(Clone, Debug)]
pub struct Options {
    /// Quantization of the matrices (norms and the router stay f32).
    pub dtype: GgmlDType,
    /// Seed of the weights.
    pub seed: u64,
    /// A GGUF whose `tokenizer.*` metadata (a real vocabulary, merges and
    /// special tokens) the model carries; its size sets the vocabulary.
    pub vocab_from: Option<std::path::PathBuf>,
    /// Multiplies the LM head and the router: random weights at a trained
    /// model's scale give flat logits, where every step is a near-tie.
    pub sharpen: f32,
}

impl Options {
    /// `dtype`, seed 0x5eed, no vocabulary, no sharpening.
    pub fn new(dtype: GgmlDType) -> Self {
        Self { dtype, seed: 0x5eed, vocab_from: None, sharpen: 1.0 }
    }
}

/// Writes a model of `shape` with random weights, matrices quantized to
/// `dtype` (norms in f32, the embedding and LM head in `dtype` too).
pub fn write_random(path: &Path, shape: Shape, dtype: GgmlDType, seed: u64) -> Result<()> {
    write_with(path, shape, &Options { seed, ..Options::new(dtype) })
}

/// Writes a model of `shape` as `opts` say. The bytes depend only on the
/// arguments (and the vocabulary file), so a test can rebuild the file a
/// fixture was recorded on and check its digest.
pub fn write_with(path: &Path, shape: Shape, opts: &Options) -> Result<()> {
    let mut s = shape;
    let dtype = opts.dtype;
    let mut meta: Vec<(String, Value)> = Vec::new();
    if let Some(v) = &opts.vocab_from {
        let mut f = std::fs::File::open(v)?;
        let content =
            gguf_file::Content::read(&mut f).map_err(|e| ModelError::Malformed(format!("{}: {e}", v.display())))?;
        let mut keys: Vec<&String> = content.metadata.keys().filter(|k| k.starts_with("tokenizer.")).collect();
        keys.sort();
        for k in keys {
            if k == "tokenizer.ggml.tokens" {
                if let Value::Array(t) = &content.metadata[k] {
                    s.vocab = t.len();
                }
            }
            meta.push((k.clone(), content.metadata[k].clone()));
        }
    }
    if !s.n_head.is_multiple_of(s.n_head_kv)
        || !s.n_embd.is_multiple_of(dtype.block_size())
        || !s.n_ff.is_multiple_of(dtype.block_size())
        || !(s.n_head * s.head_dim).is_multiple_of(dtype.block_size())
        || s.n_used > s.n_expert
        || (s.family == Family::Qwen3Moe && s.n_expert == 0)
    {
        return Err(ModelError::Invalid(format!(
            "shape {s:?} does not fit {dtype:?} blocks, grouped heads or experts"
        )));
    }
    let (hd, d) = (s.head_dim, s.n_embd);
    let mut seed = opts.seed;
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    let random =
        |name: String, dims: &[usize], scale: f32, dt: GgmlDType, seed: &mut u64| -> Result<(String, QTensor)> {
            let cols = *dims.last().unwrap_or(&1);
            // Weights of a trained model's scale, so activations stay finite through every layer.
            let n = dims.iter().product();
            let t = Tensor::from_vec(uniform(n, scale / (cols as f32).sqrt(), seed), dims, &Device::Cpu)?;
            Ok((name, QTensor::quantize(&t, dt)?))
        };
    let ones = |n: usize| -> Result<QTensor> {
        Ok(QTensor::quantize(&Tensor::ones(n, candle_core::DType::F32, &Device::Cpu)?, GgmlDType::F32)?)
    };
    tensors.push(random("token_embd.weight".into(), &[s.vocab, d], 1.0, dtype, &mut seed)?);
    for i in 0..s.n_layer {
        let p = format!("blk.{i}");
        tensors.push((format!("{p}.attn_norm.weight"), ones(d)?));
        if s.family == Family::Qwen3Moe {
            tensors.push((format!("{p}.attn_q_norm.weight"), ones(hd)?));
            tensors.push((format!("{p}.attn_k_norm.weight"), ones(hd)?));
        }
        tensors.push(random(format!("{p}.attn_q.weight"), &[s.n_head * hd, d], 1.0, dtype, &mut seed)?);
        tensors.push(random(format!("{p}.attn_k.weight"), &[s.n_head_kv * hd, d], 1.0, dtype, &mut seed)?);
        tensors.push(random(format!("{p}.attn_v.weight"), &[s.n_head_kv * hd, d], 1.0, dtype, &mut seed)?);
        tensors.push(random(format!("{p}.attn_output.weight"), &[d, s.n_head * hd], 1.0, dtype, &mut seed)?);
        tensors.push((format!("{p}.ffn_norm.weight"), ones(d)?));
        if s.n_expert == 0 {
            tensors.push(random(format!("{p}.ffn_gate.weight"), &[s.n_ff, d], 1.0, dtype, &mut seed)?);
            tensors.push(random(format!("{p}.ffn_up.weight"), &[s.n_ff, d], 1.0, dtype, &mut seed)?);
            tensors.push(random(format!("{p}.ffn_down.weight"), &[d, s.n_ff], 1.0, dtype, &mut seed)?);
        } else {
            let (e, f) = (s.n_expert, s.n_ff);
            let router = random(format!("{p}.ffn_gate_inp.weight"), &[e, d], opts.sharpen, GgmlDType::F32, &mut seed)?;
            tensors.push(router);
            tensors.push(random(format!("{p}.ffn_gate_exps.weight"), &[e, f, d], 1.0, dtype, &mut seed)?);
            tensors.push(random(format!("{p}.ffn_up_exps.weight"), &[e, f, d], 1.0, dtype, &mut seed)?);
            tensors.push(random(format!("{p}.ffn_down_exps.weight"), &[e, d, f], 1.0, dtype, &mut seed)?);
        }
    }
    tensors.push(("output_norm.weight".into(), ones(d)?));
    tensors.push(random("output.weight".into(), &[s.vocab, d], opts.sharpen, dtype, &mut seed)?);
    let arch = s.family.name();
    let u32_of = |v: usize| Value::U32(u32::try_from(v).unwrap_or(u32::MAX));
    meta.extend([
        ("general.architecture".to_owned(), Value::String(arch.into())),
        ("general.name".to_owned(), Value::String("veil random-weight model".into())),
        (format!("{arch}.block_count"), u32_of(s.n_layer)),
        (format!("{arch}.embedding_length"), u32_of(d)),
        (format!("{arch}.feed_forward_length"), u32_of(s.n_ff)),
        (format!("{arch}.attention.head_count"), u32_of(s.n_head)),
        (format!("{arch}.attention.head_count_kv"), u32_of(s.n_head_kv)),
        (format!("{arch}.attention.key_length"), u32_of(hd)),
        (format!("{arch}.attention.value_length"), u32_of(hd)),
        (format!("{arch}.rope.dimension_count"), u32_of(hd)),
        (format!("{arch}.context_length"), u32_of(s.context)),
        (format!("{arch}.vocab_size"), u32_of(s.vocab)),
        (format!("{arch}.rope.freq_base"), Value::F32(s.rope_theta)),
        (format!("{arch}.attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
    ]);
    if s.n_expert > 0 {
        meta.push((format!("{arch}.expert_count"), u32_of(s.n_expert)));
        meta.push((format!("{arch}.expert_used_count"), u32_of(s.n_used)));
        meta.push((format!("{arch}.expert_feed_forward_length"), u32_of(s.n_ff)));
    }
    let meta: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
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
