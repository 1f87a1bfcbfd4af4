//! Random-weight GGUF models of a real architecture's shape, for measuring
//! speed where no large weights can be downloaded (`veil-shard synth-model`).
//! The numbers they produce mean nothing; the bytes moved and the
//! arithmetic done are those of the real model. With a real vocabulary and
//! sharpened logits they are also what the llama.cpp reference tests run
//! (`scripts/reference/gen_family_fixtures.py`).

use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::error::{ModelError, Result};
use super::gguf::write::{write_streamed, Entry};
use super::gguf::{GgufFile, TensorType};
use super::quant::mxfp4;
use super::quant::GgmlType;

mod shape;
pub use shape::{Family, Shape};

/// The quantizations `synth-model` and `plan` take, by name. With
/// `mxfp4` the experts are MXFP4 and every other matrix Q8_0, as in
/// gpt-oss's own GGUFs; with `iq2_xxs` the experts are IQ2_XXS blocks
/// (random but valid: see [`iq2_xxs_random_block`]) and every other matrix
/// Q8_0, as in the dynamic quants that fit the largest MoE models.
pub const DTYPES: [(&str, TensorType); 15] = [
    ("q4_0", TensorType::Ggml(GgmlDType::Q4_0)),
    ("q4_1", TensorType::Ggml(GgmlDType::Q4_1)),
    ("q5_0", TensorType::Ggml(GgmlDType::Q5_0)),
    ("q5_1", TensorType::Ggml(GgmlDType::Q5_1)),
    ("q8_0", TensorType::Ggml(GgmlDType::Q8_0)),
    ("q2_k", TensorType::Ggml(GgmlDType::Q2K)),
    ("q3_k", TensorType::Ggml(GgmlDType::Q3K)),
    ("q4_k", TensorType::Ggml(GgmlDType::Q4K)),
    ("q5_k", TensorType::Ggml(GgmlDType::Q5K)),
    ("q6_k", TensorType::Ggml(GgmlDType::Q6K)),
    ("mxfp4", TensorType::Mxfp4),
    ("iq2_xxs", TensorType::Other(GgmlType::IQ2_XXS)),
    ("bf16", TensorType::Ggml(GgmlDType::BF16)),
    ("f16", TensorType::Ggml(GgmlDType::F16)),
    ("f32", TensorType::Ggml(GgmlDType::F32)),
];

/// A quantization by its name in [`DTYPES`].
pub fn dtype_named(name: &str) -> Option<TensorType> {
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
    /// Quantization of the matrices (norms, biases and the router stay f32).
    pub dtype: TensorType,
    /// Seed of the weights.
    pub seed: u64,
    /// A GGUF whose `tokenizer.*` metadata (a real vocabulary, merges and
    /// special tokens) the model carries; its size sets the vocabulary.
    pub vocab_from: Option<std::path::PathBuf>,
    /// Multiplies the LM head and the router: random weights at a trained
    /// model's scale give flat logits, where every step is a near-tie.
    pub sharpen: f32,
    /// Write Llama 3.1-style RoPE frequency factors ([`llama31_rope_factors`]).
    pub rope_freqs: bool,
    /// Split into this many files, as `gguf-split` does (1: one file); the
    /// path is then the first file's, `PREFIX-00001-of-0000N.gguf`.
    pub files: usize,
    /// A chat template (`tokenizer.chat_template`) in place of the
    /// vocabulary file's (e.g. a family's tool-calling template).
    pub chat_template: Option<String>,
    /// Control tokens appended to the vocabulary (a family's markers that
    /// the vocabulary file lacks, e.g. gpt-oss's `<|channel|>`).
    pub specials: Vec<String>,
}

impl Options {
    /// `dtype`, seed 0x5eed, no vocabulary, no sharpening.
    pub fn new(dtype: TensorType) -> Self {
        Self {
            dtype,
            seed: 0x5eed,
            vocab_from: None,
            sharpen: 1.0,
            rope_freqs: false,
            files: 1,
            chat_template: None,
            specials: Vec::new(),
        }
    }
}

/// Writes a model of `shape` with random weights, matrices quantized to
/// `dtype` (norms in f32, the embedding and LM head in `dtype` too).
pub fn write_random(path: &Path, shape: Shape, dtype: GgmlDType, seed: u64) -> Result<()> {
    write_with(path, shape, &Options { seed, ..Options::new(TensorType::Ggml(dtype)) })
}

/// Writes a model of `shape` as `opts` say. The bytes depend only on the
/// arguments (and the vocabulary file), so a test can rebuild the file a
/// fixture was recorded on and check its digest.
pub fn write_with(path: &Path, shape: Shape, opts: &Options) -> Result<()> {
    check_split_name(path, opts.files)?;
    let mut s = shape;
    // MXFP4 and IQ2_XXS are for experts; the other matrices of such a file are Q8_0.
    let experts_only = matches!(opts.dtype, TensorType::Mxfp4 | TensorType::Other(GgmlType::IQ2_XXS));
    let (dtype, expert_dtype) = match opts.dtype {
        d if experts_only => (TensorType::Ggml(GgmlDType::Q8_0), d),
        d => (d, d),
    };
    let mut meta = tokenizer_meta(opts, &mut s)?;
    check_shape(&s, opts, (dtype, expert_dtype), experts_only)?;
    let (hd, d) = (s.head_dim, s.n_embd);
    let f32s = TensorType::Ggml(GgmlDType::F32);
    let mut w = Tensors { out: Vec::new(), seed: opts.seed };
    w.random("token_embd.weight", &[s.vocab, d], 1.0, dtype)?;
    for i in 0..s.n_layer {
        write_layer(&mut w, &s, i, opts, (dtype, expert_dtype))?;
    }
    w.ones("output_norm.weight", d);
    w.random("output.weight", &[s.vocab, d], opts.sharpen, dtype)?;
    if opts.rope_freqs {
        let factors = llama31_rope_factors(hd, s.rope_theta, 16.0);
        let bytes = factors.iter().flat_map(|f| f.to_le_bytes()).collect();
        w.push("rope_freqs.weight", &[hd / 2], f32s, Fill::Bytes(bytes))?;
    }
    meta.extend(architecture_meta(&s));
    let entries: Vec<Entry> = w.out.iter().map(|r| r.entry.clone()).collect();
    if opts.files > 1 {
        super::gguf::write::write_split(path, &meta, &entries, &mut w.bodies(), opts.files)?;
        return Ok(());
    }
    let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
    write_streamed(&mut file, &meta, &entries, &mut w.bodies())?;
    std::io::Write::flush(&mut file)?;
    Ok(())
}

/// A model split into `files` is found by name, so the first file must be
/// named as the first; checked before any weights are made.
fn check_split_name(path: &Path, files: usize) -> Result<()> {
    if files <= 1 {
        return Ok(());
    }
    let want = format!("-00001-of-{files:05}.gguf");
    if path.file_name().is_some_and(|n| n.to_string_lossy().ends_with(&want)) {
        return Ok(());
    }
    Err(ModelError::Invalid(format!(
        "a model split into {files} files is written as PREFIX{want} …; name the first file so, not {}",
        path.display()
    )))
}

/// The tokenizer's metadata: copied from `opts.vocab_from` (the vocabulary
/// size follows it), with `opts.specials` appended and `opts.chat_template` set.
fn tokenizer_meta(opts: &Options, s: &mut Shape) -> Result<Vec<(String, Value)>> {
    let mut meta: Vec<(String, Value)> = Vec::new();
    if let Some(v) = &opts.vocab_from {
        let g = GgufFile::open(v)?;
        let mut keys: Vec<String> = g.metadata_keys().into_iter().filter(|k| k.starts_with("tokenizer.")).collect();
        keys.sort();
        for k in keys {
            let value = g.meta(&k).cloned().ok_or_else(|| ModelError::Malformed(format!("{k} vanished")))?;
            if let (true, Value::Array(t)) = (k == "tokenizer.ggml.tokens", &value) {
                s.vocab = t.len();
            }
            meta.push((k, value));
        }
    }
    if !opts.specials.is_empty() {
        append_specials(&mut meta, &opts.specials)?;
        s.vocab += opts.specials.len();
    }
    if let Some(t) = &opts.chat_template {
        meta.retain(|(k, _)| k != "tokenizer.chat_template");
        meta.push(("tokenizer.chat_template".into(), Value::String(t.clone())));
    }
    Ok(meta)
}

/// Refuses a shape whose widths do not fit the types' blocks, whose heads do
/// not group, or whose experts do not suit the family or the type.
fn check_shape(
    s: &Shape,
    opts: &Options,
    (dtype, expert_dtype): (TensorType, TensorType),
    experts_only: bool,
) -> Result<()> {
    let block = |t: TensorType| t.block().map_or(1, |(n, _)| n);
    let fits = |n: usize| n.is_multiple_of(block(dtype)) && n.is_multiple_of(block(expert_dtype));
    if !s.n_head.is_multiple_of(s.n_head_kv)
        || !fits(s.n_embd)
        || !fits(s.n_ff)
        || !fits(s.n_head * s.head_dim)
        || s.n_used > s.n_expert
        || (matches!(s.family, Family::Qwen3Moe | Family::GptOss) && s.n_expert == 0)
        || (s.family == Family::Gemma3 && s.n_expert > 0)
        || (experts_only && s.n_expert == 0)
    {
        return Err(ModelError::Invalid(format!(
            "shape {s:?} does not fit {:?} blocks, grouped heads or experts",
            opts.dtype
        )));
    }
    Ok(())
}

/// Layer `i`'s tensors, as the family names and shapes them.
fn write_layer(
    w: &mut Tensors,
    s: &Shape,
    i: usize,
    opts: &Options,
    (dtype, expert_dtype): (TensorType, TensorType),
) -> Result<()> {
    let (hd, d, f) = (s.head_dim, s.n_embd, s.n_ff);
    let f32s = TensorType::Ggml(GgmlDType::F32);
    let gpt_oss = s.family == Family::GptOss;
    let gemma = s.family == Family::Gemma3;
    let p = format!("blk.{i}");
    w.ones(&format!("{p}.attn_norm.weight"), d);
    if matches!(s.family, Family::Qwen3Moe | Family::Gemma3) {
        w.ones(&format!("{p}.attn_q_norm.weight"), hd);
        w.ones(&format!("{p}.attn_k_norm.weight"), hd);
    }
    for (name, rows) in [("attn_q", s.n_head * hd), ("attn_k", s.n_head_kv * hd), ("attn_v", s.n_head_kv * hd)] {
        w.random(&format!("{p}.{name}.weight"), &[rows, d], 1.0, dtype)?;
        if gpt_oss {
            w.uniform(&format!("{p}.{name}.bias"), &[rows], 0.2)?;
        }
    }
    w.random(&format!("{p}.attn_output.weight"), &[d, s.n_head * hd], 1.0, dtype)?;
    if gpt_oss {
        w.uniform(&format!("{p}.attn_output.bias"), &[d], 0.2)?;
        w.uniform(&format!("{p}.attn_sinks.weight"), &[s.n_head], 4.0)?;
        w.ones(&format!("{p}.post_attention_norm.weight"), d);
    } else if gemma {
        w.ones(&format!("{p}.post_attention_norm.weight"), d);
        w.ones(&format!("{p}.ffn_norm.weight"), d);
    } else {
        w.ones(&format!("{p}.ffn_norm.weight"), d);
    }
    if s.n_expert == 0 {
        w.random(&format!("{p}.ffn_gate.weight"), &[f, d], 1.0, dtype)?;
        w.random(&format!("{p}.ffn_up.weight"), &[f, d], 1.0, dtype)?;
        w.random(&format!("{p}.ffn_down.weight"), &[d, f], 1.0, dtype)?;
    } else {
        let e = s.n_expert;
        w.random(&format!("{p}.ffn_gate_inp.weight"), &[e, d], opts.sharpen, f32s)?;
        if gpt_oss {
            w.uniform(&format!("{p}.ffn_gate_inp.bias"), &[e], 0.2)?;
        }
        for (name, dims) in [("ffn_gate_exps", [e, f, d]), ("ffn_up_exps", [e, f, d]), ("ffn_down_exps", [e, d, f])] {
            w.random(&format!("{p}.{name}.weight"), &dims, 1.0, expert_dtype)?;
            if gpt_oss {
                w.uniform(&format!("{p}.{name}.bias"), &dims[..2], 0.2)?;
            }
        }
    }
    if gemma {
        w.ones(&format!("{p}.post_ffw_norm.weight"), d);
    }
    Ok(())
}

/// The architecture's hyperparameters as llama.cpp names them.
fn architecture_meta(s: &Shape) -> Vec<(String, Value)> {
    let arch = s.family.name();
    let (hd, d, f) = (s.head_dim, s.n_embd, s.n_ff);
    let u32_of = |v: usize| Value::U32(u32::try_from(v).unwrap_or(u32::MAX));
    let mut meta = vec![
        ("general.architecture".to_owned(), Value::String(arch.into())),
        ("general.name".to_owned(), Value::String("veil random-weight model".into())),
        (format!("{arch}.block_count"), u32_of(s.n_layer)),
        (format!("{arch}.embedding_length"), u32_of(d)),
        (format!("{arch}.feed_forward_length"), u32_of(f)),
        (format!("{arch}.attention.head_count"), u32_of(s.n_head)),
        (format!("{arch}.attention.head_count_kv"), u32_of(s.n_head_kv)),
        (format!("{arch}.attention.key_length"), u32_of(hd)),
        (format!("{arch}.attention.value_length"), u32_of(hd)),
        (format!("{arch}.rope.dimension_count"), u32_of(hd)),
        (format!("{arch}.context_length"), u32_of(s.context)),
        (format!("{arch}.vocab_size"), u32_of(s.vocab)),
        (format!("{arch}.rope.freq_base"), Value::F32(s.rope_theta)),
        (format!("{arch}.attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
    ];
    if s.n_expert > 0 {
        meta.push((format!("{arch}.expert_count"), u32_of(s.n_expert)));
        meta.push((format!("{arch}.expert_used_count"), u32_of(s.n_used)));
        meta.push((format!("{arch}.expert_feed_forward_length"), u32_of(f)));
    }
    if s.window > 0 {
        meta.push((format!("{arch}.attention.sliding_window"), u32_of(s.window)));
    }
    if s.family == Family::GptOss {
        meta.push((format!("{arch}.rope.scaling.type"), Value::String("yarn".into())));
        meta.push((format!("{arch}.rope.scaling.factor"), Value::F32(32.0)));
        meta.push((format!("{arch}.rope.scaling.original_context_length"), u32_of(4096)));
    }
    meta
}

/// Appends `specials` to a vocabulary's tokens as control tokens (type 3),
/// with score 0 where the vocabulary has scores.
fn append_specials(meta: &mut Vec<(String, Value)>, specials: &[String]) -> Result<()> {
    let n = meta
        .iter()
        .find_map(|(k, v)| match v {
            Value::Array(t) if k == "tokenizer.ggml.tokens" => Some(t.len()),
            _ => None,
        })
        .ok_or_else(|| ModelError::Invalid("special tokens need a vocabulary to add to".into()))?;
    if !meta.iter().any(|(k, _)| k == "tokenizer.ggml.token_type") {
        meta.push(("tokenizer.ggml.token_type".into(), Value::Array(vec![Value::I32(1); n])));
    }
    for (k, v) in meta.iter_mut() {
        let add = |t: &String| match k.as_str() {
            "tokenizer.ggml.tokens" => Some(Value::String(t.clone())),
            "tokenizer.ggml.token_type" => Some(Value::I32(3)),
            "tokenizer.ggml.scores" => Some(Value::F32(0.0)),
            _ => None,
        };
        if let Value::Array(items) = v {
            items.extend(specials.iter().filter_map(add));
        }
    }
    Ok(())
}

/// Llama 3.1's RoPE frequency factors (as its GGUF converter computes them:
/// factor 8, low- and high-frequency factors 1 and 4) over an original
/// context of `orig_ctx` positions: 1 for wavelengths under `orig_ctx / 4`,
/// 8 above `orig_ctx`, and a smooth blend between.
pub fn llama31_rope_factors(head_dim: usize, base: f32, orig_ctx: f32) -> Vec<f32> {
    let (factor, low, high) = (8.0f32, 1.0f32, 4.0f32);
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / base.powf(2.0 * i as f32 / head_dim as f32);
            let wavelen = 2.0 * std::f32::consts::PI / freq;
            if wavelen < orig_ctx / high {
                1.0
            } else if wavelen > orig_ctx / low {
                factor
            } else {
                let smooth = (orig_ctx / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect()
}

/// The tensors of a model being written, and the seed of their values.
/// How a tensor's values are made.
enum Fill {
    /// Uniform in `±scale / (2·sqrt(cols))`, stored as the entry's type.
    Random { scale: f32 },
    /// f32 uniform in `±width / 2`.
    Uniform { width: f32 },
    /// f32 ones.
    Ones,
    /// These bytes.
    Bytes(Vec<u8>),
}

/// A tensor to be made when written: its entry, its fill, and the LCG state
/// its values start from (so tensors can be made in any order, in parallel,
/// and the file is the same).
struct Recipe {
    entry: Entry,
    fill: Fill,
    seed: u64,
}

impl Recipe {
    fn bytes(&self) -> Result<Vec<u8>> {
        let (dims, elems) = (&self.entry.dims, self.entry.dims.iter().product::<usize>());
        let mut seed = self.seed;
        match &self.fill {
            Fill::Random { scale } => {
                let cols = *dims.last().unwrap_or(&1);
                encode(uniform(elems, scale / (cols as f32).sqrt(), &mut seed), dims, self.entry.dtype)
            }
            Fill::Uniform { width } => {
                encode(uniform(elems, *width, &mut seed), dims, TensorType::Ggml(GgmlDType::F32))
            }
            Fill::Ones => Ok(1f32.to_le_bytes().repeat(elems)),
            Fill::Bytes(b) => Ok(b.clone()),
        }
    }
}

/// The LCG of [`uniform`] advanced `n` steps, in O(log n).
fn lcg_jump(seed: u64, mut n: u64) -> u64 {
    let (mut a, mut c) = (6_364_136_223_846_793_005u64, 1_442_695_040_888_963_407u64);
    let (mut acc_a, mut acc_c) = (1u64, 0u64);
    while n > 0 {
        if n & 1 == 1 {
            acc_a = acc_a.wrapping_mul(a);
            acc_c = acc_c.wrapping_mul(a).wrapping_add(c);
        }
        c = a.wrapping_add(1).wrapping_mul(c);
        a = a.wrapping_mul(a);
        n >>= 1;
    }
    acc_a.wrapping_mul(seed).wrapping_add(acc_c)
}

struct Tensors {
    out: Vec<Recipe>,
    seed: u64,
}

impl Tensors {
    fn push(&mut self, name: &str, dims: &[usize], dtype: TensorType, fill: Fill) -> Result<()> {
        let elems: usize = dims.iter().product();
        let len = match &fill {
            Fill::Bytes(b) => b.len(),
            _ => dtype.bytes_for(elems).ok_or_else(|| {
                ModelError::Invalid(format!("{name}: {elems} values do not fill {} blocks", dtype.name()))
            })?,
        };
        let seed = self.seed;
        if matches!(fill, Fill::Random { .. } | Fill::Uniform { .. }) {
            self.seed = lcg_jump(self.seed, elems as u64);
        }
        self.out.push(Recipe { entry: Entry { name: name.into(), dims: dims.to_vec(), dtype, len }, fill, seed });
        Ok(())
    }

    /// Values uniform in `±scale / (2·sqrt(cols))`: a trained model's scale,
    /// so activations stay finite through every layer.
    fn random(&mut self, name: &str, dims: &[usize], scale: f32, dtype: TensorType) -> Result<()> {
        self.push(name, dims, dtype, Fill::Random { scale })
    }

    /// f32 values uniform in `±width / 2` (biases, sinks).
    fn uniform(&mut self, name: &str, dims: &[usize], width: f32) -> Result<()> {
        self.push(name, dims, TensorType::Ggml(GgmlDType::F32), Fill::Uniform { width })
    }

    /// f32 ones (norm weights).
    fn ones(&mut self, name: &str, n: usize) {
        let f32s = TensorType::Ggml(GgmlDType::F32);
        self.push(name, &[n], f32s, Fill::Ones).expect("f32 has no blocks to fill");
    }

    /// The tensors' bytes in order, made a few at a time on every core
    /// (memory: one batch of tensors, not the model).
    fn bodies(&self) -> impl Iterator<Item = std::io::Result<Vec<u8>>> + '_ {
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
        self.out.chunks(workers).flat_map(|batch| {
            std::thread::scope(|s| {
                let made: Vec<_> = batch.iter().map(|r| s.spawn(move || r.bytes())).collect();
                made.into_iter()
                    .map(|h| match h.join() {
                        Ok(r) => r.map_err(|e| std::io::Error::other(e.to_string())),
                        Err(_) => Err(std::io::Error::other("making a tensor panicked")),
                    })
                    .collect::<Vec<_>>()
            })
        })
    }
}

/// `values` stored as `dtype`: candle's quantizers for ggml types, MXFP4 by
/// its reference quantizer.
fn encode(values: Vec<f32>, dims: &[usize], dtype: TensorType) -> Result<Vec<u8>> {
    match dtype {
        TensorType::Ggml(dt) => {
            let t = Tensor::from_vec(values, dims, &Device::Cpu)?;
            Ok(QTensor::quantize(&t, dt)?.data()?.to_vec())
        }
        TensorType::Mxfp4 => Ok(values.chunks_exact(32).flat_map(mxfp4::quantize_block).collect()),
        TensorType::Other(GgmlType::IQ2_XXS) => Ok(values.chunks_exact(256).flat_map(iq2_xxs_random_block).collect()),
        TensorType::Other(_) | TensorType::Unknown(_) => {
            Err(ModelError::Invalid(format!("cannot write tensors of type {}", dtype.ggml_name())))
        }
    }
}

/// A valid IQ2_XXS block whose weights have about the RMS of `values`.
/// llama.cpp writes IQ2_XXS only with an importance matrix, and every byte
/// pattern of its 64 code bytes is valid (8-bit grid indices, 7-bit sign
/// indices, 4-bit scales), so a random model gets codes drawn from a hash of
/// `values` under the block scale `d`. A weight is `d·(0.5 + s)/4·g·±1`, `s`
/// uniform in 0..16 (mean factor 2) and `g` a grid value of 8, 25 or 43
/// (RMS about 29): `d = rms / 58`.
pub fn iq2_xxs_random_block(values: &[f32]) -> Vec<u8> {
    let rms = (values.iter().map(|v| v * v).sum::<f32>() / values.len().max(1) as f32).sqrt();
    let mut out = half::f16::from_f32(rms / 58.0).to_le_bytes().to_vec();
    let mut state =
        values.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, v| (h ^ u64::from(v.to_bits())).wrapping_mul(0x100_0000_01b3));
    for _ in 0..64 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.push((state >> 24) as u8);
    }
    out
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

    /// `--dtype iq2_xxs`: the experts are IQ2_XXS blocks whose weights have
    /// the RMS the other types' random values have (within a third), the
    /// other matrices Q8_0; the model loads and runs to finite logits; a
    /// model without experts is refused.
    #[test]
    fn iq2_xxs_experts_are_valid_blocks_at_the_values_scale() {
        let path = std::env::temp_dir().join(format!("veil-synth-iq2-{}.gguf", std::process::id()));
        let opts = Options::new(TensorType::Other(GgmlType::IQ2_XXS));
        write_with(&path, Shape::QWEN3MOE_SMOKE, &opts).unwrap();
        let mut g = crate::model::GgufFile::open(&path).unwrap();
        let ty = |g: &mut crate::model::GgufFile, n: &str| g.load_raw_keeping(n, &[GgmlType::IQ2_XXS]).unwrap().dtype;
        assert_eq!(ty(&mut g, "blk.0.ffn_up_exps.weight"), TensorType::Other(GgmlType::IQ2_XXS));
        assert_eq!(ty(&mut g, "blk.0.attn_q.weight"), TensorType::Ggml(GgmlDType::Q8_0));
        let values = uniform(256, 1.0 / 16.0, &mut 7);
        let want = (values.iter().map(|v| v * v).sum::<f32>() / 256.0).sqrt();
        let got = crate::model::quant::dequant::dequantize(GgmlType::IQ2_XXS, &iq2_xxs_random_block(&values)).unwrap();
        let rms = (got.iter().map(|v| v * v).sum::<f32>() / 256.0).sqrt();
        assert!((rms / want - 1.0).abs() < 0.35, "block RMS {rms}, values' {want}");
        let n = Shape::QWEN3MOE_SMOKE.n_layer;
        let slice = LayerSlice::from_gguf_on(&mut g, 0..n, crate::model::ComputeDevice::Cpu).unwrap();
        let mut kv = slice.new_session(1 << 24);
        match slice.forward(slice.embed(&[1, 2, 3]).unwrap(), &mut kv, 0, Logits::Last).unwrap() {
            SliceOutput::Logits(r) => assert!(r.as_slice().iter().all(|v| v.is_finite())),
            other => panic!("{other:?}"),
        }
        assert!(write_with(&path, Shape::SMOKE, &opts).is_err(), "IQ2_XXS is for experts");
        std::fs::remove_file(&path).ok();
    }

    #[test]
    fn a_split_model_must_be_named_as_its_first_file() {
        let dir = std::env::temp_dir().join(format!("veil-synth-split-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let opts = Options { files: 2, ..Options::new(TensorType::Ggml(GgmlDType::Q8_0)) };
        for bad in ["m.gguf", "m-00002-of-00002.gguf", "m-00001-of-00003.gguf"] {
            let err = write_with(&dir.join(bad), Shape::SMOKE, &opts).unwrap_err();
            assert!(matches!(&err, ModelError::Invalid(m) if m.contains("PREFIX-00001-of-00002.gguf")), "{bad}: {err}");
        }
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "nothing is written under a wrong name");
        write_with(&dir.join("m-00001-of-00002.gguf"), Shape::SMOKE, &opts).unwrap();
        assert!(dir.join("m-00002-of-00002.gguf").exists());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn the_8b_shape_has_8b_parameters() {
        let p = Shape::LLAMA3_8B.matrix_params() + Shape::LLAMA3_8B.vocab * Shape::LLAMA3_8B.n_embd;
        assert!((8_000_000_000..8_100_000_000).contains(&p), "{p}");
    }
}
