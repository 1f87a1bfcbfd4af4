//! A contiguous range of Llama-family transformer layers: the unit a shard
//! serves. The first slice holds the token embedding, the last the final
//! norm and LM head; weights are immutable and shared, the KV cache is the
//! caller's per-session [`SessionKv`].
//!
//! candle parses the GGUF and holds quantized tensors; the forward itself
//! is fused CPU code over flat f32 rows (see [`kernels`](super::kernels)):
//! for a small model a decode step is hundreds of tiny ops, and per-op
//! allocation and dispatch cost more than the arithmetic. Several sessions'
//! positions run as one batch, so every weight is read once per batch.
//!
//! On a device ([`ComputeDevice`]: a CUDA GPU) the same slice computes with
//! candle's tensor ops instead (see `accel`): quantized weights and the KV
//! cache in device memory, rows crossing to the host only at the slice's
//! boundary.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use candle_core::quantized::{ggml_file, GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};
use half::f16;
use rayon::prelude::*;

mod accel;

use super::config::{Arch, Config, RopeStyle};
use super::device::ComputeDevice;
use super::error::{ModelError, Result};
use super::gguf::GgufFile;
use super::kernels::{axpy_f16, dot_f16, KernelError, Q41Matrix, Q80Matrix};
use super::kv_cache::SessionKv;
use super::manifest::{Manifest, TensorRecord};

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

struct Loader<'a> {
    gguf: &'a mut GgufFile,
    records: Vec<TensorRecord>,
    progress: Option<indicatif::ProgressBar>,
    /// Where matrices go: `None` for the fused CPU kernels, else a candle device.
    device: Option<Device>,
    /// The token embedding as read, kept for a tied LM head on a device.
    tied: Option<super::gguf::RawTensor>,
}

impl Loader<'_> {
    fn raw(&mut self, name: &str) -> Result<super::gguf::RawTensor> {
        let raw = self.gguf.load_raw(name)?;
        if let Some(p) = &self.progress {
            p.inc(1);
        }
        self.records.push(raw.record.clone());
        Ok(raw)
    }

    fn qtensor(&mut self, name: &str) -> Result<QTensor> {
        let raw = self.raw(name)?;
        Ok(ggml_file::qtensor_from_ggml(raw.dtype, &raw.bytes, raw.dims, &Device::Cpu)?)
    }

    /// A weight matrix on Veil's kernels where it has one (Q4_1, Q8_0),
    /// otherwise on candle's quantized matmul.
    fn weight(&mut self, name: &str) -> Result<Weight> {
        let raw = self.raw(name)?;
        self.weight_from(name, raw)
    }

    fn weight_from(&mut self, name: &str, raw: super::gguf::RawTensor) -> Result<Weight> {
        let [rows, cols] = raw.dims[..] else {
            return Err(ModelError::Malformed(format!("{name} has shape {:?}, expected a matrix", raw.dims)));
        };
        let bad = |e: KernelError| ModelError::Malformed(format!("{name}: {e}"));
        if let Some(device) = &self.device {
            // Quantized in device memory; candle's quantized matmul kernels read it as is.
            let t = ggml_file::qtensor_from_ggml(raw.dtype, &raw.bytes, raw.dims, device)?;
            return Ok(Weight::Candle { matmul: QMatMul::from_qtensor(t)?, rows, cols });
        }
        Ok(match raw.dtype {
            GgmlDType::Q4_1 => Weight::Q41(Q41Matrix::from_gguf_bytes(&raw.bytes, rows, cols).map_err(bad)?),
            GgmlDType::Q8_0 => Weight::Q80(Arc::new(Q80Matrix::from_gguf_bytes(&raw.bytes, rows, cols).map_err(bad)?)),
            dtype => {
                let t = ggml_file::qtensor_from_ggml(dtype, &raw.bytes, raw.dims, &Device::Cpu)?;
                Weight::Candle { matmul: QMatMul::from_qtensor(t)?, rows, cols }
            }
        })
    }

    fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>> {
        let v = self.qtensor(name)?.dequantize(&Device::Cpu)?.flatten_all()?.to_vec1::<f32>()?;
        if v.len() != len {
            return Err(ModelError::Malformed(format!("{name} has {} values, expected {len}", v.len())));
        }
        Ok(v)
    }

    fn optional_vector(&mut self, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
        if self.gguf.has_tensor(name) {
            self.vector(name, len).map(Some)
        } else {
            Ok(None)
        }
    }
}

/// A weight matrix: one of Veil's kernels, or candle's quantized matmul.
#[derive(Debug)]
enum Weight {
    Q41(Q41Matrix),
    Q80(Arc<Q80Matrix>),
    Candle { matmul: QMatMul, rows: usize, cols: usize },
}

fn digest_f32s(h: &mut sha2::Sha256, values: &[f32]) {
    use sha2::Digest as _;
    h.update((values.len() as u64).to_le_bytes());
    for chunk in values.chunks(4096) {
        let bytes: Vec<u8> = chunk.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
        h.update(&bytes);
    }
}

impl Weight {
    fn digest_into(&self, h: &mut sha2::Sha256) -> Result<()> {
        use sha2::Digest as _;
        match self {
            Self::Q41(m) => m.digest_into(h),
            Self::Q80(m) => m.digest_into(h),
            Self::Candle { matmul: QMatMul::QTensor(t), .. } => h.update(&*t.data()?),
            Self::Candle { matmul: QMatMul::Tensor(t) | QMatMul::TensorF16(t), .. } => {
                digest_f32s(h, &t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?)
            }
        }
        Ok(())
    }

    fn rows(&self) -> usize {
        match self {
            Self::Q41(m) => m.rows(),
            Self::Q80(m) => m.rows(),
            Self::Candle { rows, .. } => *rows,
        }
    }

    fn cols(&self) -> usize {
        match self {
            Self::Q41(m) => m.cols(),
            Self::Q80(m) => m.cols(),
            Self::Candle { cols, .. } => *cols,
        }
    }

    /// `x (m × cols) → (m × rows)`.
    fn matmul(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        Ok(match self {
            Self::Q41(w) => w.matmul(x, m),
            Self::Q80(w) => w.matmul(x, m),
            Self::Candle { matmul, cols, .. } => {
                let x = Tensor::from_slice(x, (m, *cols), &Device::Cpu)?;
                matmul.forward(&x)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?
            }
        })
    }
}

/// Projections of one input (q/k/v, or gate/up): a single stacked matmul
/// when every part is on the Q4_1 kernel, so the input is quantized once
/// and the threads are woken once.
#[derive(Debug)]
struct Projections {
    stacked: Option<Weight>,
    parts: Vec<Weight>,
    widths: Vec<usize>,
    biases: Vec<Option<Vec<f32>>>,
}

impl Projections {
    fn new(parts: Vec<Weight>, biases: Vec<Option<Vec<f32>>>, input: usize) -> Result<Self> {
        if parts.iter().any(|w| w.cols() != input) {
            return Err(ModelError::Malformed(format!("a projection does not take inputs of width {input}")));
        }
        let widths: Vec<usize> = parts.iter().map(Weight::rows).collect();
        for (b, w) in biases.iter().zip(&widths) {
            if b.as_ref().is_some_and(|b| b.len() != *w) {
                return Err(ModelError::Malformed("a bias does not match its projection".into()));
            }
        }
        if parts.iter().all(|w| matches!(w, Weight::Q41(_))) {
            let q41 = parts.into_iter().filter_map(|w| if let Weight::Q41(m) = w { Some(m) } else { None });
            let stacked = Q41Matrix::stack(q41.collect()).map_err(|e| ModelError::Malformed(e.to_string()))?;
            return Ok(Self { stacked: Some(Weight::Q41(stacked)), parts: Vec::new(), widths, biases });
        }
        Ok(Self { stacked: None, parts, widths, biases })
    }

    /// One `(m × width_i)` output per part, biases added.
    fn forward(&self, x: &[f32], m: usize) -> Result<Vec<Vec<f32>>> {
        let mut outs = match &self.stacked {
            Some(w) => {
                let all = w.matmul(x, m)?;
                let total = w.rows();
                let mut outs: Vec<Vec<f32>> = self.widths.iter().map(|w| Vec::with_capacity(m * w)).collect();
                for row in all.chunks_exact(total) {
                    let mut at = 0;
                    for (out, w) in outs.iter_mut().zip(&self.widths) {
                        out.extend_from_slice(&row[at..at + w]);
                        at += w;
                    }
                }
                outs
            }
            None => self.parts.iter().map(|w| w.matmul(x, m)).collect::<Result<_>>()?,
        };
        for (out, bias) in outs.iter_mut().zip(&self.biases) {
            if let Some(b) = bias {
                for row in out.chunks_exact_mut(b.len()) {
                    row.iter_mut().zip(b).for_each(|(o, b)| *o += b);
                }
            }
        }
        Ok(outs)
    }
}

#[derive(Debug)]
struct RmsNorm {
    weight: Vec<f32>,
    eps: f32,
}

impl RmsNorm {
    /// Normalizes each row of `width = weight.len()` values.
    fn forward(&self, x: &[f32]) -> Vec<f32> {
        let mut out = x.to_vec();
        self.apply(&mut out);
        out
    }

    fn apply(&self, x: &mut [f32]) {
        for row in x.chunks_exact_mut(self.weight.len()) {
            // Sum in f64 as ggml does.
            let ms = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / row.len() as f64;
            let scale = 1.0 / (ms as f32 + self.eps).sqrt();
            row.iter_mut().zip(&self.weight).for_each(|(v, w)| *v = *v * scale * w);
        }
    }
}

impl Projections {
    fn digest_into(&self, h: &mut sha2::Sha256) -> Result<()> {
        if let Some(w) = &self.stacked {
            w.digest_into(h)?;
        }
        for w in &self.parts {
            w.digest_into(h)?;
        }
        for b in self.biases.iter().flatten() {
            digest_f32s(h, b);
        }
        Ok(())
    }
}

impl DecoderLayer {
    fn digest_into(&self, h: &mut sha2::Sha256) -> Result<()> {
        digest_f32s(h, &self.attn_norm.weight);
        self.qkv.digest_into(h)?;
        for n in [&self.q_norm, &self.k_norm].into_iter().flatten() {
            digest_f32s(h, &n.weight);
        }
        self.o.digest_into(h)?;
        digest_f32s(h, &self.ffn_norm.weight);
        self.gate_up.digest_into(h)?;
        self.down.digest_into(h)
    }
}

#[derive(Debug)]
struct DecoderLayer {
    attn_norm: RmsNorm,
    /// q, k, v.
    qkv: Projections,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    o: Weight,
    ffn_norm: RmsNorm,
    /// gate, up.
    gate_up: Projections,
    down: Weight,
    span: tracing::Span,
}

/// Rotary position embedding: inverse frequencies from metadata.
#[derive(Debug)]
struct Rope {
    inv_freq: Vec<f32>,
    style: RopeStyle,
}

impl Rope {
    fn new(cfg: &Config, freq_factors: Option<Vec<f32>>) -> Result<Self> {
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
    fn tables(&self, positions: &[usize]) -> (Vec<f32>, Vec<f32>) {
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
    fn apply(&self, x: &mut [f32], head_dim: usize, heads: usize, cos: &[f32], sin: &[f32]) {
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

/// The token embedding: Veil's Q8_0 rows, or a candle tensor.
#[derive(Debug)]
enum Embedding {
    Q80(Arc<Q80Matrix>),
    Candle(Arc<QTensor>),
}

/// Layers `[start, end)` of a model, plus the embedding (first slice) and
/// the final norm and LM head (last slice).
pub struct LayerSlice {
    config: Config,
    compute: ComputeDevice,
    /// Norms and biases in device memory, when computing on a device.
    accel: Option<accel::DeviceSlice>,
    range: Range<usize>,
    embedding: Option<Embedding>,
    layers: Vec<DecoderLayer>,
    head: Option<(RmsNorm, Weight)>,
    rope: Rope,
    manifest: Manifest,
}

impl std::fmt::Debug for LayerSlice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerSlice")
            .field("range", &self.range)
            .field("first", &self.is_first())
            .field("last", &self.is_last())
            .finish()
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

impl LayerSlice {
    /// Loads layers `range` of the model at `path`; only their tensors are read.
    /// Weights live in host memory: this build runs the forward on the CPU.
    pub fn load(path: &Path, range: Range<usize>) -> Result<Self> {
        let mut gguf = GgufFile::open(path)?;
        Self::from_gguf(&mut gguf, range)
    }

    /// Loads from an open file, to compute on the CPU.
    pub fn from_gguf(gguf: &mut GgufFile, range: Range<usize>) -> Result<Self> {
        Self::from_gguf_on(gguf, range, ComputeDevice::Cpu)
    }

    /// Loads from an open file, to compute on `compute`. The manifest is
    /// the same whatever the device: the same tensors are read in the same
    /// order.
    pub fn from_gguf_on(gguf: &mut GgufFile, range: Range<usize>, compute: ComputeDevice) -> Result<Self> {
        let device = compute.is_candle().then(|| compute.open()).transpose()?;
        let config = Config::from_gguf(gguf)?;
        if range.start >= range.end {
            return Err(ModelError::Invalid(format!(
                "layer range {}..{} is empty or reversed",
                range.start, range.end
            )));
        }
        if range.end > config.n_layer {
            return Err(ModelError::Invalid(format!(
                "layer range {}..{} is outside the model's 0..{}",
                range.start, range.end, config.n_layer
            )));
        }
        let first = range.start == 0;
        let last = range.end == config.n_layer;
        let total = range.len() as u64 * 9 + 3;
        let progress = std::io::IsTerminal::is_terminal(&std::io::stderr()).then(|| {
            let p = indicatif::ProgressBar::new(total);
            p.set_message(format!("loading and hashing layers {}..{}", range.start, range.end));
            p
        });
        let mut l = Loader { gguf, records: Vec::new(), progress, device, tied: None };
        let (d, hd) = (config.n_embd, config.head_dim);
        let embedding = if first { Some(load_embedding(&mut l, &config)?) } else { None };
        let eps = config.rms_eps as f32;
        let mut layers = Vec::with_capacity(range.len());
        for i in range.clone() {
            let p = format!("blk.{i}");
            let norm = |l: &mut Loader<'_>, n: &str, len: usize| -> Result<RmsNorm> {
                Ok(RmsNorm { weight: l.vector(&format!("{p}.{n}.weight"), len)?, eps })
            };
            let attn_norm = norm(&mut l, "attn_norm", d)?;
            let (q_norm, k_norm) = if config.arch == Arch::Qwen3 {
                (Some(norm(&mut l, "attn_q_norm", hd)?), Some(norm(&mut l, "attn_k_norm", hd)?))
            } else {
                (None, None)
            };
            let widths = [config.n_head * hd, config.n_head_kv * hd, config.n_head_kv * hd];
            let mut parts = Vec::new();
            let mut biases = Vec::new();
            for (name, width) in ["attn_q", "attn_k", "attn_v"].into_iter().zip(widths) {
                let w = l.weight(&format!("{p}.{name}.weight"))?;
                if w.rows() != width {
                    return Err(ModelError::Malformed(format!(
                        "{p}.{name} has {} outputs, expected {width}",
                        w.rows()
                    )));
                }
                parts.push(w);
                biases.push(l.optional_vector(&format!("{p}.{name}.bias"), width)?);
            }
            let qkv = Projections::new(parts, biases, d)?;
            let o = l.weight(&format!("{p}.attn_output.weight"))?;
            let ffn_norm = norm(&mut l, "ffn_norm", d)?;
            let gate = l.weight(&format!("{p}.ffn_gate.weight"))?;
            let up = l.weight(&format!("{p}.ffn_up.weight"))?;
            let down = l.weight(&format!("{p}.ffn_down.weight"))?;
            if o.cols() != config.n_head * hd || o.rows() != d || gate.rows() != up.rows() || down.cols() != gate.rows()
            {
                return Err(ModelError::Malformed(format!("{p}: attention output or feed-forward shapes disagree")));
            }
            if down.rows() != d {
                return Err(ModelError::Malformed(format!("{p}.ffn_down has {} outputs, expected {d}", down.rows())));
            }
            let gate_up = Projections::new(vec![gate, up], vec![None, None], d)?;
            layers.push(DecoderLayer {
                attn_norm,
                qkv,
                q_norm,
                k_norm,
                o,
                ffn_norm,
                gate_up,
                down,
                span: tracing::span!(tracing::Level::TRACE, "layer", index = i),
            });
        }
        let head = if last {
            let norm = RmsNorm { weight: l.vector("output_norm.weight", d)?, eps };
            // Tied embeddings: without `output.weight` the LM head is the token embedding.
            let tied = l.tied.take();
            let lm = match (&embedding, l.gguf.has_tensor("output.weight")) {
                (_, true) => l.weight("output.weight")?,
                // On a device: the embedding's bytes as read, quantized on the device.
                (Some(_), false) if tied.is_some() => match tied {
                    Some(raw) => l.weight_from("token_embd.weight", raw)?,
                    None => return Err(ModelError::Invalid("tied embedding missing".into())),
                },
                // A whole-model slice shares the one copy it already loaded.
                (Some(Embedding::Q80(m)), false) => Weight::Q80(m.clone()),
                (Some(Embedding::Candle(t)), false) => {
                    Weight::Candle { matmul: QMatMul::from_arc(t.clone())?, rows: config.vocab_size, cols: d }
                }
                (None, false) => l.weight("token_embd.weight")?,
            };
            if lm.cols() != d || lm.rows() != config.vocab_size {
                return Err(ModelError::Malformed(format!(
                    "LM head is {}×{}, expected {}×{d}",
                    lm.rows(),
                    lm.cols(),
                    config.vocab_size
                )));
            }
            Some((norm, lm))
        } else {
            None
        };
        let freq_factors = l.optional_vector("rope_freqs.weight", hd / 2)?;
        if let Some(p) = &l.progress {
            p.finish_and_clear();
        }
        let rope = Rope::new(&config, freq_factors)?;
        let manifest = Manifest { metadata: l.gguf.metadata_digest(), tensors: l.records };
        let accel = match &l.device {
            Some(device) => Some(accel::DeviceSlice::new(&layers, head.as_ref(), device.clone())?),
            None => None,
        };
        if compute.is_candle() {
            tracing::info!(device = %compute, layers = ?range, "slice computes on candle's ops");
        }
        Ok(Self { config, compute, accel, range, embedding, layers, head, rope, manifest })
    }

    /// The model configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }
    /// Where this slice computes.
    pub fn device(&self) -> ComputeDevice {
        self.compute
    }
    /// Layers served.
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }
    /// Whether this slice holds the embedding.
    pub fn is_first(&self) -> bool {
        self.embedding.is_some()
    }
    /// Whether this slice holds the LM head.
    pub fn is_last(&self) -> bool {
        self.head.is_some()
    }
    /// What was loaded, hashed.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// SHA-256 over every weight as it is resident now — the decoded blocks
    /// the kernels read, candle's quantized tensors, norms, biases and RoPE
    /// frequencies — in a fixed order (SECURITY-CASES G5). The manifest
    /// covers the file's bytes at load; this covers memory while serving: a
    /// shard recomputes it periodically and stops when it changes (a memory
    /// corruption, or a compromised process altering weights).
    pub fn resident_digest(&self) -> Result<[u8; 32]> {
        use sha2::Digest as _;
        let mut h = sha2::Sha256::new();
        h.update(b"veil/resident-weights/v1\0");
        match &self.embedding {
            None => h.update([0]),
            Some(Embedding::Q80(m)) => {
                h.update([1]);
                m.digest_into(&mut h);
            }
            Some(Embedding::Candle(t)) => {
                h.update([2]);
                h.update(&*t.data()?);
            }
        }
        for layer in &self.layers {
            layer.digest_into(&mut h)?;
        }
        if let Some((norm, lm)) = &self.head {
            digest_f32s(&mut h, &norm.weight);
            lm.digest_into(&mut h)?;
        }
        digest_f32s(&mut h, &self.rope.inv_freq);
        Ok(h.finalize().into())
    }

    /// A fresh KV cache for this slice's layers with a memory budget
    /// (f16 keys and values; attention runs in f32).
    pub fn new_session(&self, budget_bytes: usize) -> SessionKv {
        let width = self.config.n_head_kv * self.config.head_dim;
        match self.accel {
            Some(_) => SessionKv::new_on_device(self.layers.len(), width, budget_bytes),
            None => SessionKv::new(self.layers.len(), width, budget_bytes),
        }
    }

    /// Embeds token ids (first slice only): one row of `n_embd` per id.
    pub fn embed(&self, ids: &[u32]) -> Result<Rows> {
        let emb = self.embedding.as_ref().ok_or_else(|| ModelError::Invalid("this slice holds no embedding".into()))?;
        if ids.is_empty() {
            return Err(ModelError::Invalid("no token ids to embed".into()));
        }
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= self.config.vocab_size) {
            return Err(ModelError::Invalid(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.config.vocab_size
            )));
        }
        let d = self.config.n_embd;
        let data = match emb {
            Embedding::Q80(m) => {
                let mut data = vec![0f32; ids.len() * d];
                for (&id, out) in ids.iter().zip(data.chunks_exact_mut(d)) {
                    m.row_into(id as usize, out);
                }
                data
            }
            Embedding::Candle(t) => {
                t.embedding(&Tensor::new(ids, &Device::Cpu)?)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?
            }
        };
        Rows::new(data, d)
    }

    /// Runs positions `[start, start + n)` of one session: hidden states in,
    /// hidden states (or, on the last slice, logits) out. Multi-position
    /// input is causally masked, so prefill and speculative verification
    /// share this path.
    pub fn forward(&self, hidden: Rows, kv: &mut SessionKv, start: usize, logits: Logits) -> Result<SliceOutput> {
        let mut out = self.forward_batch(&mut [BatchItem { hidden, kv, start, logits }])?;
        out.pop().ok_or_else(|| ModelError::Invalid("empty batch".into()))
    }

    /// Runs several sessions' new positions as one batch: every weight is
    /// read once for all of them, attention stays within each session.
    /// Each output equals what the session would get alone. Every item is
    /// checked before any work; on failure no cache is changed.
    pub fn forward_batch(&self, items: &mut [BatchItem<'_>]) -> Result<Vec<SliceOutput>> {
        let c = &self.config;
        let kv_width = c.n_head_kv * c.head_dim;
        for it in items.iter() {
            let n = it.hidden.n();
            if it.hidden.width() != c.n_embd {
                return Err(ModelError::Invalid(format!(
                    "hidden states of width {}; this model's is {}",
                    it.hidden.width(),
                    c.n_embd
                )));
            }
            if it.start != it.kv.len() {
                return Err(ModelError::Invalid(format!(
                    "start position {} does not follow the {} cached positions",
                    it.start,
                    it.kv.len()
                )));
            }
            if it.start + n > c.context_length {
                return Err(ModelError::Invalid(format!(
                    "{} positions exceed the context of {}",
                    it.start + n,
                    c.context_length
                )));
            }
            if it.kv.bytes_per_position() != self.layers.len() * 2 * kv_width * 2
                || it.kv.on_device() != self.accel.is_some()
            {
                return Err(ModelError::Invalid("the KV cache was made for another slice".into()));
            }
            it.kv.reserve(n)?;
        }
        if items.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(dev) = &self.accel {
            let result = self.run_on_device(dev, items);
            for it in items.iter_mut() {
                match &result {
                    Ok(_) => it.kv.advance(it.hidden.n()),
                    Err(_) => {
                        let len = it.kv.len();
                        it.kv.truncate(len);
                    }
                }
            }
            return result;
        }
        // The whole forward runs on a pool thread, so with one thread the
        // parallel loops run inline instead of handing every matmul across.
        rayon::scope(|_| {
            let result = self.run_layers(items);
            if result.is_err() {
                for it in items.iter_mut() {
                    let len = it.kv.len();
                    it.kv.truncate(len);
                }
            }
            let x = result?;
            for it in items.iter_mut() {
                it.kv.advance(it.hidden.n());
            }
            self.finish(items, x)
        })
    }

    /// The decoder layers over the concatenated rows of every item.
    fn run_layers(&self, items: &mut [BatchItem<'_>]) -> Result<Vec<f32>> {
        let c = &self.config;
        let (d, hd) = (c.n_embd, c.head_dim);
        let (q_width, kv_width) = (c.n_head * hd, c.n_head_kv * hd);
        let mut x: Vec<f32> = items.iter().flat_map(|it| it.hidden.as_slice().iter().copied()).collect();
        let m = x.len() / d;
        // Row r belongs to item `owner[r]` at absolute position `positions[r]`.
        let mut owner = Vec::with_capacity(m);
        let mut positions = Vec::with_capacity(m);
        let mut offsets = Vec::with_capacity(items.len());
        for (b, it) in items.iter().enumerate() {
            offsets.push(owner.len());
            owner.extend(std::iter::repeat_n(b, it.hidden.n()));
            positions.extend(it.start..it.start + it.hidden.n());
        }
        let (cos, sin) = self.rope.tables(&positions);
        let scale = 1.0 / (hd as f32).sqrt();
        let group = c.n_head / c.n_head_kv;
        for (l, layer) in self.layers.iter().enumerate() {
            let _enter = layer.span.enter();
            let h = layer.attn_norm.forward(&x);
            let mut qkv = layer.qkv.forward(&h, m)?.into_iter();
            let (Some(mut q), Some(mut k), Some(v)) = (qkv.next(), qkv.next(), qkv.next()) else {
                return Err(ModelError::Invalid("attention projections are incomplete".into()));
            };
            if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
                qn.apply(&mut q);
                kn.apply(&mut k);
            }
            self.rope.apply(&mut q, hd, c.n_head, &cos, &sin);
            self.rope.apply(&mut k, hd, c.n_head_kv, &cos, &sin);
            for (b, it) in items.iter_mut().enumerate() {
                let rows = offsets[b]..offsets[b] + it.hidden.n();
                let span = rows.start * kv_width..rows.end * kv_width;
                it.kv.append(l, &k[span.clone()], &v[span])?;
            }
            let caches: Vec<_> = items.iter().map(|it| it.kv.layer(l)).collect();
            let mut y = vec![0f32; m * q_width];
            // Row by row straight from the f16 cache: each output row is the
            // same arithmetic whether it runs alone (decode), with its
            // neighbours (prefill, verification) or batched with other
            // sessions, so all of those agree bit for bit.
            y.par_chunks_mut(hd).enumerate().for_each(|(task, out)| {
                let (r, head) = (task / c.n_head, task % c.n_head);
                let (keys, values) = caches[owner[r]];
                let query = &q[r * q_width + head * hd..][..hd];
                let g = head / group;
                attend(query, keys, values, positions[r] + 1, kv_width, g * hd, scale, out);
            });
            let o = layer.o.matmul(&y, m)?;
            x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
            let h = layer.ffn_norm.forward(&x);
            let mut gu = layer.gate_up.forward(&h, m)?.into_iter();
            let (Some(mut gate), Some(up)) = (gu.next(), gu.next()) else {
                return Err(ModelError::Invalid("feed-forward projections are incomplete".into()));
            };
            gate.iter_mut().zip(&up).for_each(|(g, u)| *g = *g / (1.0 + (-*g).exp()) * u);
            let down = layer.down.matmul(&gate, m)?;
            x.iter_mut().zip(&down).for_each(|(x, o)| *x += o);
        }
        Ok(x)
    }

    /// Splits the batch's rows back per item; on the last slice, the final
    /// norm and LM head over the rows that need logits.
    fn finish(&self, items: &[BatchItem<'_>], x: Vec<f32>) -> Result<Vec<SliceOutput>> {
        let d = self.config.n_embd;
        let Some((norm, lm)) = &self.head else {
            return hidden_outputs(items, &x, d);
        };
        let wanted = wanted_rows(items);
        if wanted.iter().all(|r| r.is_empty()) {
            return Ok(items.iter().map(|_| SliceOutput::CacheOnly).collect());
        }
        let h: Vec<f32> = wanted.iter().flat_map(|r| x[r.start * d..r.end * d].iter().copied()).collect();
        let h = norm.forward(&h);
        let logits = lm.matmul(&h, h.len() / d)?;
        logit_outputs(&wanted, &logits, lm.rows())
    }
}

/// Each item's rows of the batch's hidden states `x` (rows of `d`).
fn hidden_outputs(items: &[BatchItem<'_>], x: &[f32], d: usize) -> Result<Vec<SliceOutput>> {
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
fn wanted_rows(items: &[BatchItem<'_>]) -> Vec<Range<usize>> {
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
fn logit_outputs(wanted: &[Range<usize>], logits: &[f32], vocab: usize) -> Result<Vec<SliceOutput>> {
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

fn load_embedding(l: &mut Loader<'_>, config: &Config) -> Result<Embedding> {
    let raw = l.raw("token_embd.weight")?;
    if raw.dims != [config.vocab_size, config.n_embd] {
        return Err(ModelError::Malformed(format!(
            "token_embd.weight has shape {:?}, expected [{}, {}]",
            raw.dims, config.vocab_size, config.n_embd
        )));
    }
    if l.device.is_some() && !l.gguf.has_tensor("output.weight") {
        l.tied = Some(raw.clone());
    }
    if raw.dtype == GgmlDType::Q8_0 {
        let m = Q80Matrix::from_gguf_bytes(&raw.bytes, config.vocab_size, config.n_embd)
            .map_err(|e| ModelError::Malformed(format!("token_embd.weight: {e}")))?;
        return Ok(Embedding::Q80(Arc::new(m)));
    }
    let t = ggml_file::qtensor_from_ggml(raw.dtype, &raw.bytes, raw.dims, &Device::Cpu)?;
    Ok(Embedding::Candle(Arc::new(t)))
}

/// Softmax attention of one query head over the first `len` cached
/// positions (causal: a query at position p sees keys 0..=p), reading KV
/// head columns `[col, col + head_dim)` of rows of `stride` values.
#[allow(clippy::too_many_arguments)]
fn attend(
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
