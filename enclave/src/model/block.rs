//! One transformer block as every served family builds it: pre-norm
//! attention (optional q/k/v/o biases, per-head q/k norms, sinks, a norm
//! of its output) and a pre-norm feed-forward (dense gated, or a routed
//! mixture of experts; optionally normed after). The files under `arch/`
//! say which of these parts a family's blocks carry.

use super::config::{Config, MoeConfig};
use super::error::{ModelError, Result};
use super::layers::{Glu, RmsNorm};
use super::moe::Moe;
use super::weight::{digest_f32s, Loader, Projections, Weight};

/// What a family's block carries besides q, k, v and o (whose biases are
/// loaded whenever the file has them) and its feed-forward.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Parts {
    /// Per-head RMS norms of q and k (`attn_q_norm`, `attn_k_norm`).
    pub(crate) qk_norm: bool,
    /// Per-head attention sinks (`attn_sinks`, gpt-oss).
    pub(crate) sinks: bool,
    /// A norm of the attention's output before the residual
    /// (`post_attention_norm`, Gemma).
    pub(crate) attn_post_norm: bool,
    /// The pre-feed-forward norm's tensor (`ffn_norm`; gpt-oss calls it
    /// `post_attention_norm`).
    pub(crate) ffn_norm: &'static str,
    /// A norm of the feed-forward's output before the residual (`post_ffw_norm`, Gemma).
    pub(crate) ffn_post_norm: bool,
}

impl Parts {
    /// Llama's block: none of the optional parts.
    pub(crate) const PLAIN: Self =
        Self { qk_norm: false, sinks: false, attn_post_norm: false, ffn_norm: "ffn_norm", ffn_post_norm: false };
}

/// A block's feed-forward.
#[derive(Debug)]
pub(crate) enum Ffn {
    /// `down(act(gate(x)) · up(x))`.
    Dense { gate_up: Projections, down: Weight, glu: Glu },
    /// Routed experts.
    Moe(Moe),
}

impl Ffn {
    /// `ffn_gate`, `ffn_up`, `ffn_down` of block `p`, SwiGLU.
    pub(crate) fn dense(l: &mut Loader<'_>, p: &str, d: usize) -> Result<Self> {
        Self::dense_with(l, p, d, Glu::Swi)
    }

    /// `ffn_gate`, `ffn_up`, `ffn_down` of block `p`, with activation `glu`.
    pub(crate) fn dense_with(l: &mut Loader<'_>, p: &str, d: usize, glu: Glu) -> Result<Self> {
        let gate = l.weight(&format!("{p}.ffn_gate.weight"))?;
        let up = l.weight(&format!("{p}.ffn_up.weight"))?;
        let down = l.weight(&format!("{p}.ffn_down.weight"))?;
        if gate.rows() != up.rows() || down.cols() != gate.rows() {
            return Err(ModelError::Malformed(format!("{p}: feed-forward shapes disagree")));
        }
        if down.rows() != d {
            return Err(ModelError::Malformed(format!("{p}.ffn_down has {} outputs, expected {d}", down.rows())));
        }
        Ok(Self::Dense { gate_up: Projections::new(vec![gate, up], vec![None, None], d)?, down, glu })
    }

    /// `ffn_gate_inp` (the router) and `ffn_{gate,up,down}_exps` of block
    /// `p`, SwiGLU experts without biases.
    pub(crate) fn experts(l: &mut Loader<'_>, p: &str, d: usize, moe: MoeConfig) -> Result<Self> {
        Self::experts_with(l, p, d, moe, Glu::Swi, false)
    }

    /// The experts with activation `glu`; with `biases`, the router's and
    /// each expert's biases too (`ffn_gate_inp.bias`, `ffn_*_exps.bias`).
    pub(crate) fn experts_with(
        l: &mut Loader<'_>,
        p: &str,
        d: usize,
        moe: MoeConfig,
        glu: Glu,
        biases: bool,
    ) -> Result<Self> {
        let n = moe.n_expert;
        let router = l.weight(&format!("{p}.ffn_gate_inp.weight"))?;
        let router_bias = if biases { Some(l.vector(&format!("{p}.ffn_gate_inp.bias"), n)?) } else { None };
        let gates = l.experts(&format!("{p}.ffn_gate_exps.weight"), n)?;
        let ups = l.experts(&format!("{p}.ffn_up_exps.weight"), n)?;
        let downs = l.experts(&format!("{p}.ffn_down_exps.weight"), n)?;
        let mut moe = Moe::new(router, gates, ups, downs, moe, d, glu)?;
        if biases {
            let ff = moe.experts.first().map_or(0, |e| e.down.cols());
            let per_expert = |l: &mut Loader<'_>, name: &str, width: usize| -> Result<Vec<Vec<f32>>> {
                Ok(l.vector(&format!("{p}.{name}.bias"), n * width)?.chunks_exact(width).map(<[f32]>::to_vec).collect())
            };
            let gate_b = per_expert(l, "ffn_gate_exps", ff)?;
            let up_b = per_expert(l, "ffn_up_exps", ff)?;
            let down_b = per_expert(l, "ffn_down_exps", d)?;
            moe.set_biases(router_bias, gate_b, up_b, down_b)?;
        }
        Ok(Self::Moe(moe))
    }

    /// The dense feed-forward, or the experts when the model has them.
    pub(crate) fn for_config(l: &mut Loader<'_>, p: &str, c: &Config) -> Result<Self> {
        match c.moe {
            Some(moe) => Self::experts(l, p, c.n_embd, moe),
            None => Self::dense(l, p, c.n_embd),
        }
    }

    /// `m` normed rows of `d` in, `m` rows of `d` out.
    pub(crate) fn forward(&self, h: &[f32], m: usize, d: usize) -> Result<Vec<f32>> {
        match self {
            Self::Dense { gate_up, down, glu } => {
                let mut gu = gate_up.forward(h, m)?.into_iter();
                let (Some(mut gate), Some(up)) = (gu.next(), gu.next()) else {
                    return Err(ModelError::Invalid("feed-forward projections are incomplete".into()));
                };
                glu.apply(&mut gate, &up);
                down.matmul(&gate, m)
            }
            Self::Moe(moe) => moe.forward(h, m, d),
        }
    }

    fn digest_into(&self, h: &mut sha2::Sha256) -> Result<()> {
        match self {
            Self::Dense { gate_up, down, .. } => {
                gate_up.digest_into(h)?;
                down.digest_into(h)
            }
            Self::Moe(moe) => moe.digest_into(h),
        }
    }
}

/// One block's weights.
#[derive(Debug)]
pub(crate) struct DecoderLayer {
    pub(crate) attn_norm: RmsNorm,
    /// q, k, v.
    pub(crate) qkv: Projections,
    pub(crate) q_norm: Option<RmsNorm>,
    pub(crate) k_norm: Option<RmsNorm>,
    pub(crate) o: Weight,
    pub(crate) o_bias: Option<Vec<f32>>,
    /// One logit per query head (gpt-oss).
    pub(crate) sinks: Option<Vec<f32>>,
    pub(crate) attn_post_norm: Option<RmsNorm>,
    pub(crate) ffn_norm: RmsNorm,
    pub(crate) ffn: Ffn,
    pub(crate) ffn_post_norm: Option<RmsNorm>,
    /// Whether this block attends within a sliding window.
    pub(crate) swa: bool,
    pub(crate) span: tracing::Span,
}

impl DecoderLayer {
    /// Reads block `i`'s attention as `kind` says, then its feed-forward
    /// (`ffn` reads it after the pre-feed-forward norm), in the order the
    /// manifest records.
    pub(crate) fn load(
        l: &mut Loader<'_>,
        c: &Config,
        i: usize,
        kind: Parts,
        ffn: impl FnOnce(&mut Loader<'_>, &str) -> Result<Ffn>,
    ) -> Result<Self> {
        let (d, hd, eps) = (c.n_embd, c.head_dim, c.rms_eps as f32);
        let p = format!("blk.{i}");
        let norm = |l: &mut Loader<'_>, n: &str, len: usize| -> Result<RmsNorm> {
            Ok(RmsNorm { weight: l.vector(&format!("{p}.{n}.weight"), len)?, eps })
        };
        let attn_norm = norm(l, "attn_norm", d)?;
        let (q_norm, k_norm) = if kind.qk_norm {
            (Some(norm(l, "attn_q_norm", hd)?), Some(norm(l, "attn_k_norm", hd)?))
        } else {
            (None, None)
        };
        let widths = [c.n_head * hd, c.n_head_kv * hd, c.n_head_kv * hd];
        let mut parts = Vec::new();
        let mut biases = Vec::new();
        for (name, width) in ["attn_q", "attn_k", "attn_v"].into_iter().zip(widths) {
            let w = l.weight(&format!("{p}.{name}.weight"))?;
            if w.rows() != width {
                return Err(ModelError::Malformed(format!("{p}.{name} has {} outputs, expected {width}", w.rows())));
            }
            parts.push(w);
            biases.push(l.optional_vector(&format!("{p}.{name}.bias"), width)?);
        }
        let qkv = Projections::new(parts, biases, d)?;
        let o = l.weight(&format!("{p}.attn_output.weight"))?;
        if o.cols() != c.n_head * hd || o.rows() != d {
            return Err(ModelError::Malformed(format!("{p}: attention output is {}×{}", o.rows(), o.cols())));
        }
        let o_bias = l.optional_vector(&format!("{p}.attn_output.bias"), d)?;
        let sinks = if kind.sinks { Some(l.vector(&format!("{p}.attn_sinks.weight"), c.n_head)?) } else { None };
        let attn_post_norm = if kind.attn_post_norm { Some(norm(l, "post_attention_norm", d)?) } else { None };
        let ffn_norm = norm(l, kind.ffn_norm, d)?;
        let ffn = ffn(l, &p)?;
        let ffn_post_norm = if kind.ffn_post_norm { Some(norm(l, "post_ffw_norm", d)?) } else { None };
        Ok(Self {
            attn_norm,
            qkv,
            q_norm,
            k_norm,
            o,
            o_bias,
            sinks,
            attn_post_norm,
            ffn_norm,
            ffn,
            ffn_post_norm,
            swa: c.is_swa(i),
            span: tracing::span!(tracing::Level::TRACE, "layer", index = i),
        })
    }

    pub(crate) fn digest_into(&self, h: &mut sha2::Sha256) -> Result<()> {
        digest_f32s(h, &self.attn_norm.weight);
        self.qkv.digest_into(h)?;
        for n in [&self.q_norm, &self.k_norm].into_iter().flatten() {
            digest_f32s(h, &n.weight);
        }
        self.o.digest_into(h)?;
        for v in [&self.o_bias, &self.sinks].into_iter().flatten() {
            digest_f32s(h, v);
        }
        if let Some(n) = &self.attn_post_norm {
            digest_f32s(h, &n.weight);
        }
        digest_f32s(h, &self.ffn_norm.weight);
        self.ffn.digest_into(h)?;
        if let Some(n) = &self.ffn_post_norm {
            digest_f32s(h, &n.weight);
        }
        Ok(())
    }
}
