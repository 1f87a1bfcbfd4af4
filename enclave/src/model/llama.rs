//! A contiguous range of Llama-family transformer layers: the unit a shard
//! serves. The first slice holds the token embedding, the last the final
//! norm and LM head; weights are immutable and shared, the KV cache is the
//! caller's per-session [`SessionKv`].

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};

use super::config::{Arch, Config, RopeStyle};
use super::error::{ModelError, Result};
use super::gguf::GgufFile;
use super::kernels::Q41Matrix;
use super::kv_cache::SessionKv;
use super::manifest::{Manifest, TensorRecord};

struct Loader<'a> {
    gguf: &'a mut GgufFile,
    device: &'a Device,
    records: Vec<TensorRecord>,
    progress: Option<indicatif::ProgressBar>,
}

impl Loader<'_> {
    fn qtensor(&mut self, name: &str) -> Result<QTensor> {
        let (t, rec) = self.gguf.load(name, self.device)?;
        self.records.push(rec);
        if let Some(p) = &self.progress {
            p.inc(1);
        }
        Ok(t)
    }

    fn matmul(&mut self, name: &str) -> Result<QMatMul> {
        Ok(QMatMul::from_qtensor(self.qtensor(name)?)?)
    }

    /// A weight matrix, on Veil's SIMD Q4_1 kernel when it is Q4_1.
    fn weight(&mut self, name: &str) -> Result<Weight> {
        let raw = self.gguf.load_raw(name)?;
        if let Some(p) = &self.progress {
            p.inc(1);
        }
        self.records.push(raw.record);
        if raw.dtype == GgmlDType::Q4_1 && raw.dims.len() == 2 && self.device.is_cpu() {
            let m = Q41Matrix::from_gguf_bytes(&raw.bytes, raw.dims[0], raw.dims[1]).map_err(ModelError::Malformed)?;
            return Ok(Weight::Q41(m));
        }
        let t = candle_core::quantized::ggml_file::qtensor_from_ggml(raw.dtype, &raw.bytes, raw.dims, self.device)?;
        Ok(Weight::Candle(QMatMul::from_qtensor(t)?))
    }

    fn dense(&mut self, name: &str) -> Result<Tensor> {
        Ok(self.qtensor(name)?.dequantize(self.device)?)
    }

    fn optional_dense(&mut self, name: &str) -> Result<Option<Tensor>> {
        if self.gguf.has_tensor(name) {
            self.dense(name).map(Some)
        } else {
            Ok(None)
        }
    }
}

struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::rms_norm(&x.contiguous()?, &self.weight, self.eps)?)
    }
}

/// A weight matrix: candle's quantized matmul, or Veil's Q4_1 kernel.
enum Weight {
    Candle(QMatMul),
    Q41(Q41Matrix),
}

impl Weight {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::Candle(q) => Ok(q.forward(x)?),
            Self::Q41(m) => {
                let mut dims = x.dims().to_vec();
                let k = dims.pop().ok_or_else(|| ModelError::Invalid("scalar input to a matmul".into()))?;
                if k != m.cols() {
                    return Err(ModelError::Invalid(format!("matmul input of width {k}, weight takes {}", m.cols())));
                }
                let rows: usize = dims.iter().product();
                let data = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                let out = m.matmul(&data, rows);
                dims.push(m.rows());
                Ok(Tensor::from_vec(out, dims, x.device())?)
            }
        }
    }
}

struct Linear {
    weight: Weight,
    bias: Option<Tensor>,
}

impl Linear {
    fn load(l: &mut Loader<'_>, prefix: &str) -> Result<Self> {
        Ok(Self { weight: l.weight(&format!("{prefix}.weight"))?, bias: l.optional_dense(&format!("{prefix}.bias"))? })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.weight.forward(x)?;
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
}

struct Mlp {
    gate: Weight,
    up: Weight,
    down: Weight,
}

impl Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let gate = candle_nn::ops::silu(&self.gate.forward(x)?)?;
        let up = self.up.forward(x)?;
        self.down.forward(&(gate * up)?)
    }
}

struct DecoderLayer {
    attn_norm: RmsNorm,
    attn: Attention,
    ffn_norm: RmsNorm,
    mlp: Mlp,
    span: tracing::Span,
}

struct Rope {
    cos: Tensor,
    sin: Tensor,
    style: RopeStyle,
}

impl Rope {
    fn new(cfg: &Config, freq_factors: Option<&Tensor>, device: &Device) -> Result<Self> {
        let half = cfg.head_dim / 2;
        let mut inv: Vec<f32> =
            (0..half).map(|i| 1.0 / cfg.rope_theta.powf(2.0 * i as f32 / cfg.head_dim as f32)).collect();
        // Llama 3 style scaling is baked into `rope_freqs.weight` by llama.cpp: divide by it.
        if let Some(f) = freq_factors {
            let f = f.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            if f.len() != half {
                return Err(ModelError::Malformed(format!("rope_freqs has {} entries, expected {half}", f.len())));
            }
            for (x, s) in inv.iter_mut().zip(f) {
                *x /= s;
            }
        }
        let inv = Tensor::from_vec(inv, (1, half), device)?;
        let pos = Tensor::arange(0u32, cfg.context_length as u32, device)?
            .to_dtype(DType::F32)?
            .reshape((cfg.context_length, 1))?;
        let freqs = pos.matmul(&inv)?;
        Ok(Self { cos: freqs.cos()?, sin: freqs.sin()?, style: cfg.rope_style })
    }

    fn apply(&self, x: &Tensor, start: usize) -> Result<Tensor> {
        let (_, _, n, _) = x.dims4()?;
        let cos = self.cos.narrow(0, start, n)?;
        let sin = self.sin.narrow(0, start, n)?;
        let x = x.contiguous()?;
        Ok(match self.style {
            RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(&x, &cos, &sin)?,
            RopeStyle::Neox => candle_nn::rotary_emb::rope(&x, &cos, &sin)?,
        })
    }
}

/// Layers `[start, end)` of a model, plus the embedding (first slice) and
/// the final norm and LM head (last slice).
pub struct LayerSlice {
    config: Config,
    range: Range<usize>,
    embedding: Option<Arc<QTensor>>,
    layers: Vec<DecoderLayer>,
    head: Option<(RmsNorm, QMatMul)>,
    rope: Rope,
    manifest: Manifest,
    device: Device,
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
}

/// What a slice returns.
#[derive(Debug)]
pub enum SliceOutput {
    /// Hidden states `(1, n, n_embd)` for the next slice.
    Hidden(Tensor),
    /// Logits `(n, vocab)` from the last slice.
    Logits(Tensor),
}

impl LayerSlice {
    /// Loads layers `range` of the model at `path`; only their tensors are read.
    pub fn load(path: &Path, range: Range<usize>, device: &Device) -> Result<Self> {
        let mut gguf = GgufFile::open(path)?;
        Self::from_gguf(&mut gguf, range, device)
    }

    /// Loads from an open file.
    pub fn from_gguf(gguf: &mut GgufFile, range: Range<usize>, device: &Device) -> Result<Self> {
        let config = Config::from_gguf(gguf)?;
        if range.start >= range.end || range.end > config.n_layer {
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
        let mut l = Loader { gguf, device, records: Vec::new(), progress };
        let embedding = if first { Some(Arc::new(l.qtensor("token_embd.weight")?)) } else { None };
        let eps = config.rms_eps as f32;
        let mut layers = Vec::with_capacity(range.len());
        for i in range.clone() {
            let p = format!("blk.{i}");
            let norm = |l: &mut Loader<'_>, n: &str| -> Result<RmsNorm> {
                Ok(RmsNorm { weight: l.dense(&format!("{p}.{n}.weight"))?, eps })
            };
            let attn_norm = norm(&mut l, "attn_norm")?;
            let (q_norm, k_norm) = if config.arch == Arch::Qwen3 {
                (Some(norm(&mut l, "attn_q_norm")?), Some(norm(&mut l, "attn_k_norm")?))
            } else {
                (None, None)
            };
            let attn = Attention {
                q: Linear::load(&mut l, &format!("{p}.attn_q"))?,
                k: Linear::load(&mut l, &format!("{p}.attn_k"))?,
                v: Linear::load(&mut l, &format!("{p}.attn_v"))?,
                o: Linear::load(&mut l, &format!("{p}.attn_output"))?,
                q_norm,
                k_norm,
            };
            let ffn_norm = norm(&mut l, "ffn_norm")?;
            let mlp = Mlp {
                gate: l.weight(&format!("{p}.ffn_gate.weight"))?,
                up: l.weight(&format!("{p}.ffn_up.weight"))?,
                down: l.weight(&format!("{p}.ffn_down.weight"))?,
            };
            layers.push(DecoderLayer {
                attn_norm,
                attn,
                ffn_norm,
                mlp,
                span: tracing::span!(tracing::Level::TRACE, "layer", index = i),
            });
        }
        let head = if last {
            let norm = RmsNorm { weight: l.dense("output_norm.weight")?, eps };
            // Tied embeddings: without `output.weight` the LM head is the token embedding.
            let lm = match (&embedding, l.gguf.has_tensor("output.weight")) {
                (_, true) => l.matmul("output.weight")?,
                // A whole-model slice shares the one copy it already loaded.
                (Some(emb), false) => QMatMul::from_arc(emb.clone())?,
                (None, false) => l.matmul("token_embd.weight")?,
            };
            Some((norm, lm))
        } else {
            None
        };
        let freq_factors = l.optional_dense("rope_freqs.weight")?;
        if let Some(p) = &l.progress {
            p.finish_and_clear();
        }
        let rope = Rope::new(&config, freq_factors.as_ref(), device)?;
        let manifest = Manifest { tensors: l.records };
        Ok(Self { config, range, embedding, layers, head, rope, manifest, device: device.clone() })
    }

    /// The model configuration.
    pub fn config(&self) -> &Config {
        &self.config
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
    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// A fresh KV cache for this slice's layers with a memory budget.
    /// Keys and values are stored as f16 (half the memory of f32, and the
    /// precision llama.cpp keeps by default); attention runs in f32.
    pub fn new_session(&self, budget_bytes: usize) -> SessionKv {
        let per_position =
            self.layers.len() * 2 * self.config.n_head_kv * self.config.head_dim * DType::F16.size_in_bytes();
        SessionKv::new(self.layers.len(), per_position, budget_bytes, DType::F16)
    }

    /// Embeds token ids (first slice only) into `(1, n, n_embd)`.
    pub fn embed(&self, ids: &[u32]) -> Result<Tensor> {
        let emb = self.embedding.as_ref().ok_or_else(|| ModelError::Invalid("this slice holds no embedding".into()))?;
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= self.config.vocab_size) {
            return Err(ModelError::Invalid(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.config.vocab_size
            )));
        }
        let ids = Tensor::new(ids, &self.device)?;
        Ok(emb.embedding(&ids)?.unsqueeze(0)?)
    }

    /// Runs positions `[start, start + n)`: hidden states in, hidden states
    /// (or, on the last slice, logits for every position) out. Multi-position
    /// input is causally masked, so prefill and speculative verification
    /// share this path.
    pub fn forward(&self, hidden: &Tensor, kv: &mut SessionKv, start: usize) -> Result<SliceOutput> {
        self.forward_with(hidden, kv, start, Logits::All)
    }

    /// As [`forward`](Self::forward), choosing which positions get logits
    /// (the LM head is the largest matmul of a small model: skip it where unused).
    pub fn forward_with(
        &self,
        hidden: &Tensor,
        kv: &mut SessionKv,
        start: usize,
        logits: Logits,
    ) -> Result<SliceOutput> {
        let (b, n, d) = hidden.dims3()?;
        if b != 1 || d != self.config.n_embd {
            return Err(ModelError::Invalid(format!(
                "hidden states of shape ({b}, {n}, {d}); expected (1, n, {})",
                self.config.n_embd
            )));
        }
        if n == 0 {
            return Err(ModelError::Invalid("no positions to run".into()));
        }
        if start != kv.len() {
            return Err(ModelError::Invalid(format!(
                "start position {start} does not follow the {} cached positions",
                kv.len()
            )));
        }
        if start + n > self.config.context_length {
            return Err(ModelError::Invalid(format!(
                "{} positions exceed the context of {}",
                start + n,
                self.config.context_length
            )));
        }
        kv.reserve(n)?;
        let mask = causal_mask(n, start, &self.device)?;
        let mut x = hidden.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            let _enter = layer.span.enter();
            let h = layer.attn_norm.forward(&x)?;
            let a = self.attention(&layer.attn, &h, kv, i, start, mask.as_ref())?;
            x = (x + a)?;
            let h = layer.ffn_norm.forward(&x)?;
            x = (&x + layer.mlp.forward(&h)?)?;
        }
        kv.advance(n);
        match &self.head {
            None => Ok(SliceOutput::Hidden(x)),
            Some((norm, lm)) => {
                let x = match logits {
                    Logits::All => x,
                    Logits::Last => x.narrow(1, n - 1, 1)?,
                };
                let x = norm.forward(&x)?;
                Ok(SliceOutput::Logits(lm.forward(&x)?.squeeze(0)?))
            }
        }
    }

    fn attention(
        &self,
        a: &Attention,
        x: &Tensor,
        kv: &mut SessionKv,
        layer: usize,
        start: usize,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let c = &self.config;
        let (b, n, _) = x.dims3()?;
        let heads = |t: Tensor, h: usize| -> Result<Tensor> { Ok(t.reshape((b, n, h, c.head_dim))?.transpose(1, 2)?) };
        let mut q = heads(a.q.forward(x)?, c.n_head)?;
        let mut k = heads(a.k.forward(x)?, c.n_head_kv)?;
        let v = heads(a.v.forward(x)?, c.n_head_kv)?.contiguous()?;
        if let (Some(qn), Some(kn)) = (&a.q_norm, &a.k_norm) {
            q = qn.forward(&q)?;
            k = kn.forward(&k)?;
        }
        let q = self.rope.apply(&q, start)?;
        let k = self.rope.apply(&k, start)?;
        let (k, v) = kv.append(layer, k, v)?;
        let rep = c.n_head / c.n_head_kv;
        let k = repeat_kv(&k, rep)?;
        let v = repeat_kv(&v, rep)?;
        let scale = 1.0 / (c.head_dim as f64).sqrt();
        let mut att = (q.matmul(&k.t()?.contiguous()?)? * scale)?;
        if let Some(m) = mask {
            att = att.broadcast_add(m)?;
        }
        let att = candle_nn::ops::softmax_last_dim(&att)?;
        let y = att.matmul(&v)?.transpose(1, 2)?.reshape((b, n, c.n_head * c.head_dim))?;
        a.o.forward(&y)
    }
}

/// `-inf` where query `i` (absolute position `start + i`) would see a later key.
fn causal_mask(n: usize, start: usize, device: &Device) -> Result<Option<Tensor>> {
    if n == 1 {
        return Ok(None);
    }
    let total = start + n;
    let mask: Vec<f32> =
        (0..n).flat_map(|i| (0..total).map(move |j| if j > start + i { f32::NEG_INFINITY } else { 0.0 })).collect();
    Ok(Some(Tensor::from_vec(mask, (n, total), device)?))
}

fn repeat_kv(x: &Tensor, rep: usize) -> Result<Tensor> {
    if rep == 1 {
        return Ok(x.clone());
    }
    let (b, h, t, d) = x.dims4()?;
    Ok(x.unsqueeze(2)?.expand((b, h, rep, t, d))?.reshape((b, h * rep, t, d))?)
}

/// Logits of the last position, as a vector.
pub fn last_logits(logits: &Tensor) -> Result<Vec<f32>> {
    let n = logits.dim(0)?;
    Ok(logits.get(n - 1)?.to_dtype(DType::F32)?.to_vec1::<f32>()?)
}
