//! A contiguous range of transformer layers: the unit a shard serves. The
//! first slice holds the token embedding, the last the final norm and LM
//! head; weights are immutable and shared, the KV cache is the caller's
//! per-session [`SessionKv`].
//!
//! candle parses the GGUF and holds quantized tensors; the forward itself
//! is fused CPU code over flat f32 rows (see [`kernels`](super::kernels)):
//! for a small model a decode step is hundreds of tiny ops, and per-op
//! allocation and dispatch cost more than the arithmetic. Several sessions'
//! positions run as one batch, so every weight is read once per batch
//! (and, in a mixture of experts, every chosen expert once per batch).
//!
//! On a device ([`ComputeDevice`]: a CUDA GPU) the same slice computes with
//! candle's tensor ops instead (see `accel`): quantized weights and the KV
//! cache in device memory, rows crossing to the host only at the slice's
//! boundary.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use candle_core::quantized::{ggml_file, GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

mod accel;

use super::arch;
use super::block::DecoderLayer;
use super::config::Config;
use super::device::ComputeDevice;
use super::error::{ModelError, Result};
use super::gguf::GgufFile;
use super::kernels::expanded::ExpandedMatrix;
use super::kernels::kquant::KQuantMatrix;
use super::kernels::Q80Matrix;
use super::kv_cache::SessionKv;
use super::layers::{attend, RmsNorm, Rope};
use super::manifest::Manifest;
use super::rows::{hidden_outputs, logit_outputs, wanted_rows, BatchItem, Logits, Rows, SliceOutput};
use super::weight::{digest_f32s, Loader, Weight};

/// The token embedding: Veil's Q8_0 or K-quant rows, or a candle tensor.
#[derive(Debug)]
enum Embedding {
    Q80(Arc<Q80Matrix>),
    KQuant(Arc<KQuantMatrix>),
    /// MXFP4, IQ4_NL, IQ4_XS or Q5_0, kept packed (CPU path).
    Expanded(Arc<ExpandedMatrix>),
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
    /// RoPE of sliding-window layers, where it differs.
    rope_swa: Option<Rope>,
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
            layers.push(arch::block(&mut l, &config, i)?);
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
                (Some(Embedding::KQuant(m)), false) => Weight::KQuant(m.clone()),
                (Some(Embedding::Expanded(m)), false) => Weight::Expanded(m.clone()),
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
        let rope = Rope::new(&config, config.rope, freq_factors.as_deref())?;
        let rope_swa = match &config.swa {
            Some(_) if config.rope_swa != config.rope => {
                Some(Rope::new(&config, config.rope_swa, freq_factors.as_deref())?)
            }
            _ => None,
        };
        let manifest = l.gguf.prove(std::mem::take(&mut l.records))?;
        let accel = match &l.device {
            Some(device) => Some(accel::DeviceSlice::new(&layers, head.as_ref(), device.clone())?),
            None => None,
        };
        if compute.is_candle() {
            tracing::info!(device = %compute, layers = ?range, "slice computes on candle's ops");
        }
        Ok(Self { config, compute, accel, range, embedding, layers, head, rope, rope_swa, manifest })
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
            Some(Embedding::KQuant(m)) => {
                h.update([3]);
                m.digest_into(&mut h);
            }
            Some(Embedding::Expanded(m)) => {
                h.update([4]);
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
        if let Some(r) = &self.rope_swa {
            digest_f32s(&mut h, &r.inv_freq);
        }
        Ok(h.finalize().into())
    }

    /// A fresh KV cache for this slice's layers with a memory budget
    /// (f16 keys and values; attention runs in f32).
    pub fn new_session(&self, budget_bytes: usize) -> SessionKv {
        let width = self.config.n_head_kv * self.config.head_dim;
        match self.accel {
            Some(_) => SessionKv::new_on_device(self.layers.len(), width, budget_bytes),
            None => {
                let window = self.config.swa.as_ref().map(|s| s.window);
                let windows = self.layers.iter().map(|l| window.filter(|_| l.swa)).collect();
                SessionKv::with_windows(windows, width, budget_bytes)
            }
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
        let mut data = match emb {
            Embedding::Q80(m) => rows_of(ids, d, |r, out| m.row_into(r, out)),
            Embedding::KQuant(m) => rows_of(ids, d, |r, out| m.row_into(r, out)),
            Embedding::Expanded(m) => rows_of(ids, d, |r, out| m.row_into(r, out)),
            Embedding::Candle(t) => {
                t.embedding(&Tensor::new(ids, &Device::Cpu)?)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?
            }
        };
        if let Some(s) = self.config.embed_scale {
            data.iter_mut().for_each(|v| *v *= s);
        }
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
                    Err(_) => it.kv.discard_uncommitted(),
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
                    it.kv.discard_uncommitted();
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
        let swa_tables = self.rope_swa.as_ref().map(|r| r.tables(&positions));
        let window = c.swa.as_ref().map_or(usize::MAX, |s| s.window);
        let scale = c.attn_scale;
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
            let (rope, cos, sin) = match (&self.rope_swa, &swa_tables) {
                (Some(r), Some((cos, sin))) if layer.swa => (r, cos, sin),
                _ => (&self.rope, &cos, &sin),
            };
            rope.apply(&mut q, hd, c.n_head, cos, sin);
            rope.apply(&mut k, hd, c.n_head_kv, cos, sin);
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
                // A sliding-window layer's cache may start past position 0
                // (`first`); the window never reaches below it.
                let (keys, values, first) = caches[owner[r]];
                let query = &q[r * q_width + head * hd..][..hd];
                let g = head / group;
                let end = positions[r] + 1;
                let from = if layer.swa { end.saturating_sub(window) } else { 0 };
                let sink = layer.sinks.as_ref().map(|s| s[head]);
                let held = from.max(first) - first..end - first;
                attend(query, keys, values, held, kv_width, g * hd, scale, sink, out);
            });
            let mut o = layer.o.matmul(&y, m)?;
            if let Some(b) = &layer.o_bias {
                o.chunks_exact_mut(d).for_each(|row| row.iter_mut().zip(b).for_each(|(o, b)| *o += b));
            }
            if let Some(n) = &layer.attn_post_norm {
                n.apply(&mut o);
            }
            x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
            let h = layer.ffn_norm.forward(&x);
            let mut y = layer.ffn.forward(&h, m, d)?;
            if let Some(n) = &layer.ffn_post_norm {
                n.apply(&mut y);
            }
            x.iter_mut().zip(&y).for_each(|(x, o)| *x += o);
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
        let mut logits = lm.matmul(&h, h.len() / d)?;
        if let Some(cap) = self.config.final_softcap {
            logits.iter_mut().for_each(|l| *l = (*l * (1.0 / cap)).tanh() * cap);
        }
        logit_outputs(&wanted, &logits, lm.rows())
    }
}

/// One dequantized row of `d` per token id, from `row_into(id, out)`.
fn rows_of(ids: &[u32], d: usize, row_into: impl Fn(usize, &mut [f32])) -> Vec<f32> {
    let mut data = vec![0f32; ids.len() * d];
    for (&id, out) in ids.iter().zip(data.chunks_exact_mut(d)) {
        row_into(id as usize, out);
    }
    data
}

fn load_embedding(l: &mut Loader<'_>, config: &Config) -> Result<Embedding> {
    let raw = l.matrix_raw("token_embd.weight")?;
    if raw.dims != [config.vocab_size, config.n_embd] {
        return Err(ModelError::Malformed(format!(
            "token_embd.weight has shape {:?}, expected [{}, {}]",
            raw.dims, config.vocab_size, config.n_embd
        )));
    }
    if l.device.is_some() && !l.gguf.has_tensor("output.weight") {
        l.tied = Some(raw.clone());
    }
    // Kept packed on the CPU path (IQ4_NL/IQ4_XS come back packed only there).
    if l.device.is_none() {
        if let Some(load) = crate::model::weight::expanded_loader(raw.dtype) {
            let m = load(&raw.bytes, config.vocab_size, config.n_embd)
                .map_err(|e| ModelError::Malformed(format!("token_embd.weight: {e}")))?;
            return Ok(Embedding::Expanded(Arc::new(m)));
        }
    }
    if raw.ggml()? == GgmlDType::Q8_0 {
        let m = Q80Matrix::from_gguf_bytes(&raw.bytes, config.vocab_size, config.n_embd)
            .map_err(|e| ModelError::Malformed(format!("token_embd.weight: {e}")))?;
        return Ok(Embedding::Q80(Arc::new(m)));
    }
    if let Some(m) = KQuantMatrix::from_gguf_bytes(raw.ggml()?, &raw.bytes, config.vocab_size, config.n_embd) {
        let m = m.map_err(|e| ModelError::Malformed(format!("token_embd.weight: {e}")))?;
        return Ok(Embedding::KQuant(Arc::new(m)));
    }
    let t = ggml_file::qtensor_from_ggml(raw.ggml()?, &raw.bytes, raw.dims, &Device::Cpu)?;
    Ok(Embedding::Candle(Arc::new(t)))
}
