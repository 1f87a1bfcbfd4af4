//! The slice's forward on a candle device (a CUDA GPU; or candle's CPU
//! backend, to check this path where no GPU is).
//!
//! The same computation as the fused CPU path, as tensor ops: RMS norm,
//! quantized projections (candle's GGUF matmul kernels, weights quantized in
//! device memory; MXFP4, which candle lacks, as exact BF16), RoPE at each
//! row's own position (per layer kind: sliding-window layers may have their
//! own), attention per session over its f16 KV cache in device memory (with
//! sliding windows and sinks), the gated feed-forward (SwiGLU, GeGLU,
//! gpt-oss's clamped SwiGLU), the optional biases and post-norms, and the
//! LM head. Every session in the batch shares each matmul; attention stays
//! per session. Rows move host → device once on entry and device → host
//! once on exit.

use candle_core::{DType, Device, Module, Tensor};

use super::LayerSlice;
use super::{hidden_outputs, logit_outputs, wanted_rows};
use super::{BatchItem, Config, DecoderLayer, ModelError, Result, RmsNorm, SliceOutput, Weight};
use crate::model::block::Ffn;
use crate::model::config::RopeStyle;
use crate::model::layers::Glu;
use crate::model::moe::{route_row, Moe};
use crate::model::weight::Projections;

/// Norms and biases of a slice, in device memory (the matrices are the
/// slice's own [`Weight::Candle`]s, loaded onto the device).
#[derive(Debug)]
pub(super) struct DeviceSlice {
    device: Device,
    layers: Vec<DeviceLayer>,
    head_norm: Option<Tensor>,
}

#[derive(Debug)]
struct DeviceLayer {
    attn_norm: Tensor,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    ffn_norm: Tensor,
    /// q, k, v.
    biases: Vec<Option<Tensor>>,
    o_bias: Option<Tensor>,
    /// `(heads, 1, 1)`: one extra logit per head.
    sinks: Option<Tensor>,
    attn_post_norm: Option<Tensor>,
    ffn_post_norm: Option<Tensor>,
}

fn vector(v: &[f32], device: &Device) -> Result<Tensor> {
    Ok(Tensor::from_slice(v, v.len(), device)?)
}

impl DeviceSlice {
    pub(super) fn new(layers: &[DecoderLayer], head: Option<&(RmsNorm, Weight)>, device: Device) -> Result<Self> {
        let norm = |n: &RmsNorm| vector(&n.weight, &device);
        let layers = layers
            .iter()
            .map(|l| {
                Ok(DeviceLayer {
                    attn_norm: norm(&l.attn_norm)?,
                    q_norm: l.q_norm.as_ref().map(norm).transpose()?,
                    k_norm: l.k_norm.as_ref().map(norm).transpose()?,
                    ffn_norm: norm(&l.ffn_norm)?,
                    biases: l
                        .qkv
                        .biases
                        .iter()
                        .map(|b| b.as_deref().map(|b| vector(b, &device)).transpose())
                        .collect::<Result<_>>()?,
                    o_bias: l.o_bias.as_deref().map(|b| vector(b, &device)).transpose()?,
                    sinks: l
                        .sinks
                        .as_deref()
                        .map(|s| Ok::<_, ModelError>(Tensor::from_slice(s, (s.len(), 1, 1), &device)?))
                        .transpose()?,
                    attn_post_norm: l.attn_post_norm.as_ref().map(norm).transpose()?,
                    ffn_post_norm: l.ffn_post_norm.as_ref().map(norm).transpose()?,
                })
            })
            .collect::<Result<_>>()?;
        let head_norm = head.map(|(n, _)| norm(n)).transpose()?;
        Ok(Self { device, layers, head_norm })
    }
}

/// `x (m × cols) → (m × rows)` with a weight in device memory.
fn project(w: &Weight, x: &Tensor) -> Result<Tensor> {
    match w {
        Weight::Candle { matmul, .. } => Ok(matmul.forward(x)?.to_dtype(DType::F32)?),
        _ => Err(ModelError::Invalid("a host weight in a device slice".into())),
    }
}

fn parts(p: &Projections) -> Result<&[Weight]> {
    if p.stacked.is_some() {
        return Err(ModelError::Invalid("stacked host projections in a device slice".into()));
    }
    Ok(&p.parts)
}

fn rms(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    Ok(candle_nn::ops::rms_norm(&x.contiguous()?, w, eps)?)
}

/// Rotates `x (m, heads, head_dim)`, row `r` by the angles in row `r` of
/// `cos`/`sin` (`(m, 1, head_dim / 2)`).
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, style: RopeStyle) -> Result<Tensor> {
    let (m, h, hd) = x.dims3()?;
    let half = hd / 2;
    Ok(match style {
        RopeStyle::Neox => {
            let (a, b) = (x.narrow(2, 0, half)?, x.narrow(2, half, half)?);
            let lo = (a.broadcast_mul(cos)? - b.broadcast_mul(sin)?)?;
            let hi = (a.broadcast_mul(sin)? + b.broadcast_mul(cos)?)?;
            Tensor::cat(&[&lo, &hi], 2)?
        }
        RopeStyle::Interleaved => {
            let pairs = x.reshape((m, h, half, 2))?;
            let (a, b) = (pairs.narrow(3, 0, 1)?.squeeze(3)?, pairs.narrow(3, 1, 1)?.squeeze(3)?);
            let even = (a.broadcast_mul(cos)? - b.broadcast_mul(sin)?)?;
            let odd = (a.broadcast_mul(sin)? + b.broadcast_mul(cos)?)?;
            Tensor::stack(&[&even, &odd], 3)?.reshape((m, h, hd))?
        }
    })
}

/// The causal mask of `n` new positions after `start` cached ones,
/// `(1, n, start + n)`: query i (position start + i) sees keys 0..=start + i,
/// and within a sliding `window` only the last `window` of them. `None`
/// where every query sees every key.
fn causal_mask(n: usize, start: usize, window: usize, device: &Device) -> Result<Option<Tensor>> {
    let t = start + n;
    if n == 1 && t <= window {
        return Ok(None);
    }
    let mask: Vec<f32> = (0..n)
        .flat_map(|i| {
            let p = start + i;
            (0..t).map(move |j| if j <= p && p - j < window { 0.0 } else { f32::NEG_INFINITY })
        })
        .collect();
    Ok(Some(Tensor::from_vec(mask, (1, n, t), device)?))
}

/// Causal attention of one session's `n` new queries `(n, heads, hd)` over
/// its cached keys and values `(T, kv_heads, hd)` (f16), with its
/// [`causal_mask`] and, where the layer has them, one sink logit per head
/// `(heads, 1, 1)` in the softmax. Returns `(n, heads · hd)`.
fn attend(
    q: &Tensor,
    keys: &Tensor,
    values: &Tensor,
    mask: Option<&Tensor>,
    sinks: Option<&Tensor>,
    scale: f64,
) -> Result<Tensor> {
    let (n, heads, hd) = q.dims3()?;
    let (t, kv_heads, _) = keys.dims3()?;
    let group = heads / kv_heads;
    // Query head h reads KV head h / group: repeat each KV head `group` times.
    let expand = |x: &Tensor| -> Result<Tensor> {
        Ok(x.to_dtype(DType::F32)?
            .unsqueeze(2)?
            .broadcast_as((t, kv_heads, group, hd))?
            .reshape((t, heads, hd))?
            .transpose(0, 1)?
            .contiguous()?)
    };
    let (k, v) = (expand(keys)?, expand(values)?);
    let q = q.transpose(0, 1)?.contiguous()?;
    let mut scores = (q.matmul(&k.t()?.contiguous()?)? * scale)?;
    if let Some(mask) = mask {
        scores = scores.broadcast_add(mask)?;
    }
    let p = match sinks {
        // The sink takes part in the softmax and carries no value: drop its column after.
        Some(s) => {
            let with = Tensor::cat(&[&scores, &s.broadcast_as((heads, n, 1))?.contiguous()?], 2)?;
            candle_nn::ops::softmax_last_dim(&with)?.narrow(2, 0, t)?.contiguous()?
        }
        None => candle_nn::ops::softmax_last_dim(&scores)?,
    };
    Ok(p.matmul(&v)?.transpose(0, 1)?.reshape((n, heads * hd))?)
}

fn add_bias(y: Tensor, b: Option<&[f32]>) -> Result<Tensor> {
    match b {
        Some(b) => Ok(y.broadcast_add(&Tensor::from_slice(b, b.len(), y.device())?)?),
        None => Ok(y),
    }
}

/// `down(act(gate(h)) · up(h))` on the device, with the biases the
/// projections carry (an expert's are host values, uploaded per forward).
fn gated(gate_up: &Projections, down: &Weight, down_bias: Option<&[f32]>, glu: Glu, h: &Tensor) -> Result<Tensor> {
    let [gate, up] = parts(gate_up)? else {
        return Err(ModelError::Invalid("feed-forward projections are incomplete".into()));
    };
    let bias = |i: usize| gate_up.biases.get(i).and_then(|b| b.as_deref());
    let g = add_bias(project(gate, h)?, bias(0))?;
    let u = add_bias(project(up, h)?, bias(1))?;
    let a = match glu {
        Glu::Swi => (g.silu()? * u)?,
        // ggml's f16 GELU table: the gate rounded to f16, candle's tanh
        // approximation, the result rounded to f16.
        Glu::Ge => {
            (g.to_dtype(DType::F16)?.to_dtype(DType::F32)?.gelu()?.to_dtype(DType::F16)?.to_dtype(DType::F32)? * u)?
        }
        Glu::SwiClamped => {
            let x = g.minimum(7f32)?;
            let y = u.clamp(-7f32, 7f32)?;
            ((&x * candle_nn::ops::sigmoid(&(&x * 1.702)?)?)? * (y + 1.0)?)?
        }
    };
    add_bias(project(down, &a)?, down_bias)
}

/// A block's feed-forward on the device, `h (m, d)` normed.
fn ffn(f: &Ffn, h: &Tensor) -> Result<Tensor> {
    match f {
        Ffn::Dense { gate_up, down, glu } => gated(gate_up, down, None, *glu, h),
        Ffn::Moe(moe) => experts(moe, h),
    }
}

/// The mixture of experts on the device: router logits come to the host
/// (`m × n_expert` values) to be routed exactly as the CPU path routes;
/// each chosen expert then runs once over the rows that chose it, and its
/// weighted output is added into those rows.
fn experts(moe: &Moe, h: &Tensor) -> Result<Tensor> {
    let (m, d) = h.dims2()?;
    let mut logits = project(&moe.router, h)?.flatten_all()?.to_vec1::<f32>()?;
    let cfg = moe.config;
    if let Some(b) = &moe.router_bias {
        for row in logits.chunks_exact_mut(cfg.n_expert) {
            row.iter_mut().zip(b).for_each(|(l, b)| *l += b);
        }
    }
    let mut by_expert: Vec<(Vec<u32>, Vec<f32>)> = vec![(Vec::new(), Vec::new()); moe.experts.len()];
    for (r, row) in logits.chunks_exact(cfg.n_expert).enumerate() {
        for (e, w) in route_row(row, &cfg) {
            by_expert[e].0.push(r as u32);
            by_expert[e].1.push(w);
        }
    }
    let mut out = Tensor::zeros((m, d), DType::F32, h.device())?;
    for (expert, (rows, weights)) in moe.experts.iter().zip(by_expert) {
        if rows.is_empty() {
            continue;
        }
        let n = rows.len();
        let idx = Tensor::from_vec(rows, n, h.device())?;
        let y = gated(&expert.gate_up, &expert.down, expert.down_bias.as_deref(), moe.glu, &h.index_select(&idx, 0)?)?;
        let y = y.broadcast_mul(&Tensor::from_vec(weights, (n, 1), h.device())?)?;
        out = out.index_add(&idx, &y, 0)?;
    }
    Ok(out)
}

impl LayerSlice {
    /// The batch's forward on the device: KV appended per item (committed by
    /// the caller), outputs per item.
    pub(super) fn run_on_device(&self, dev: &DeviceSlice, items: &mut [BatchItem<'_>]) -> Result<Vec<SliceOutput>> {
        let c: &Config = &self.config;
        let (d, hd) = (c.n_embd, c.head_dim);
        let eps = c.rms_eps as f32;
        let host: Vec<f32> = items.iter().flat_map(|it| it.hidden.as_slice().iter().copied()).collect();
        let m = host.len() / d;
        let mut x = Tensor::from_vec(host, (m, d), &dev.device)?;
        let mut positions = Vec::with_capacity(m);
        let mut offsets = Vec::with_capacity(items.len());
        for it in items.iter() {
            offsets.push(positions.len());
            positions.extend(it.start..it.start + it.hidden.n());
        }
        let half = hd / 2;
        let table = |rope: &crate::model::layers::Rope| -> Result<(Tensor, Tensor)> {
            let (cos, sin) = rope.tables(&positions);
            Ok((Tensor::from_vec(cos, (m, 1, half), &dev.device)?, Tensor::from_vec(sin, (m, 1, half), &dev.device)?))
        };
        let full_rope = table(&self.rope)?;
        let swa_rope = self.rope_swa.as_ref().map(table).transpose()?;
        let scale = f64::from(c.attn_scale);
        // One mask per session per kind of layer.
        let window = c.swa.as_ref().map_or(usize::MAX, |s| s.window);
        let masks = |w: usize| -> Result<Vec<Option<Tensor>>> {
            items.iter().map(|it| causal_mask(it.hidden.n(), it.start, w, &dev.device)).collect()
        };
        let full_masks = masks(usize::MAX)?;
        let swa_masks = if c.swa.is_some() { masks(window)? } else { Vec::new() };
        for (l, (layer, dl)) in self.layers.iter().zip(&dev.layers).enumerate() {
            let _enter = layer.span.enter();
            let h = rms(&x, &dl.attn_norm, eps)?;
            let [wq, wk, wv] = parts(&layer.qkv)? else {
                return Err(ModelError::Invalid("attention projections are incomplete".into()));
            };
            let mut qkv = Vec::with_capacity(3);
            for (w, bias) in [wq, wk, wv].into_iter().zip(&dl.biases) {
                let y = project(w, &h)?;
                qkv.push(match bias {
                    Some(b) => y.broadcast_add(b)?,
                    None => y,
                });
            }
            let mut q = qkv[0].reshape((m, c.n_head, hd))?;
            let mut k = qkv[1].reshape((m, c.n_head_kv, hd))?;
            let v = qkv[2].reshape((m, c.n_head_kv, hd))?;
            if let (Some(qn), Some(kn)) = (&dl.q_norm, &dl.k_norm) {
                q = rms(&q, qn, eps)?;
                k = rms(&k, kn, eps)?;
            }
            let (cos, sin) = match &swa_rope {
                Some(t) if layer.swa => t,
                _ => &full_rope,
            };
            let masks = if layer.swa { &swa_masks } else { &full_masks };
            let q = rope(&q, cos, sin, self.rope.style)?;
            let k = rope(&k, cos, sin, self.rope.style)?;
            let mut ys = Vec::with_capacity(items.len());
            for (b, it) in items.iter_mut().enumerate() {
                let (off, n) = (offsets[b], it.hidden.n());
                let kb = k.narrow(0, off, n)?.to_dtype(DType::F16)?;
                let vb = v.narrow(0, off, n)?.to_dtype(DType::F16)?;
                it.kv.append_device(l, kb, vb)?;
                let (keys, values) = it.kv.device_layer(l)?;
                let q = q.narrow(0, off, n)?;
                ys.push(attend(&q, keys, values, masks[b].as_ref(), dl.sinks.as_ref(), scale)?);
            }
            let y = Tensor::cat(&ys, 0)?;
            let mut o = project(&layer.o, &y)?;
            if let Some(b) = &dl.o_bias {
                o = o.broadcast_add(b)?;
            }
            if let Some(n) = &dl.attn_post_norm {
                o = rms(&o, n, eps)?;
            }
            x = (x + o)?;
            let h = rms(&x, &dl.ffn_norm, eps)?;
            let mut f = ffn(&layer.ffn, &h)?;
            if let Some(n) = &dl.ffn_post_norm {
                f = rms(&f, n, eps)?;
            }
            x = (x + f)?;
        }
        self.finish_on_device(dev, items, x)
    }

    fn finish_on_device(&self, dev: &DeviceSlice, items: &[BatchItem<'_>], x: Tensor) -> Result<Vec<SliceOutput>> {
        let (Some((_, lm)), Some(norm)) = (&self.head, &dev.head_norm) else {
            // Not the last slice: hidden states back to the host, for the link.
            return hidden_outputs(items, &x.flatten_all()?.to_vec1::<f32>()?, self.config.n_embd);
        };
        let wanted = wanted_rows(items);
        if wanted.iter().all(|r| r.is_empty()) {
            return Ok(items.iter().map(|_| SliceOutput::CacheOnly).collect());
        }
        let rows: Vec<Tensor> = wanted
            .iter()
            .filter(|r| !r.is_empty())
            .map(|r| x.narrow(0, r.start, r.len()))
            .collect::<std::result::Result<_, _>>()?;
        let h = rms(&Tensor::cat(&rows, 0)?, norm, self.config.rms_eps as f32)?;
        let mut logits = project(lm, &h)?.flatten_all()?.to_vec1::<f32>()?;
        if let Some(cap) = self.config.final_softcap {
            logits.iter_mut().for_each(|l| *l = (*l * (1.0 / cap)).tanh() * cap);
        }
        logit_outputs(&wanted, &logits, lm.rows())
    }
}
