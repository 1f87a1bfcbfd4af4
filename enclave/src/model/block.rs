//! One transformer block as every served family builds it: pre-norm
//! attention (optional q/k/v biases, optional per-head q/k norms) and a
//! pre-norm feed-forward, dense SwiGLU or a routed mixture of experts. The
//! files under `arch/` say which of these parts a family's blocks carry.

use super::config::{Config, MoeConfig};
use super::error::{ModelError, Result};
use super::layers::RmsNorm;
use super::moe::Moe;
use super::weight::{digest_f32s, Loader, Projections, Weight};

/// What a family's attention carries besides q, k, v and o (whose biases
/// are loaded whenever the file has them).
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttentionKind {
    /// Per-head RMS norms of q and k (`attn_q_norm`, `attn_k_norm`).
    pub(crate) qk_norm: bool,
}

/// A block's feed-forward.
#[derive(Debug)]
pub(crate) enum Ffn {
    /// SwiGLU: `down(silu(gate(x)) · up(x))`.
    Dense { gate_up: Projections, down: Weight },
    /// Routed experts, each a SwiGLU.
    Moe(Moe),
}

impl Ffn {
    /// `ffn_gate`, `ffn_up`, `ffn_down` of block `p`.
    pub(crate) fn dense(l: &mut Loader<'_>, p: &str, d: usize) -> Result<Self> {
        let gate = l.weight(&format!("{p}.ffn_gate.weight"))?;
        let up = l.weight(&format!("{p}.ffn_up.weight"))?;
        let down = l.weight(&format!("{p}.ffn_down.weight"))?;
        if gate.rows() != up.rows() || down.cols() != gate.rows() {
            return Err(ModelError::Malformed(format!("{p}: feed-forward shapes disagree")));
        }
        if down.rows() != d {
            return Err(ModelError::Malformed(format!("{p}.ffn_down has {} outputs, expected {d}", down.rows())));
        }
        Ok(Self::Dense { gate_up: Projections::new(vec![gate, up], vec![None, None], d)?, down })
    }

    /// `ffn_gate_inp` (the router) and `ffn_{gate,up,down}_exps` of block `p`.
    pub(crate) fn experts(l: &mut Loader<'_>, p: &str, d: usize, moe: MoeConfig) -> Result<Self> {
        let router = l.weight(&format!("{p}.ffn_gate_inp.weight"))?;
        let gates = l.experts(&format!("{p}.ffn_gate_exps.weight"), moe.n_expert)?;
        let ups = l.experts(&format!("{p}.ffn_up_exps.weight"), moe.n_expert)?;
        let downs = l.experts(&format!("{p}.ffn_down_exps.weight"), moe.n_expert)?;
        Ok(Self::Moe(Moe::new(router, gates, ups, downs, moe, d)?))
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
            Self::Dense { gate_up, down } => {
                let mut gu = gate_up.forward(h, m)?.into_iter();
                let (Some(mut gate), Some(up)) = (gu.next(), gu.next()) else {
                    return Err(ModelError::Invalid("feed-forward projections are incomplete".into()));
                };
                gate.iter_mut().zip(&up).for_each(|(g, u)| *g = *g / (1.0 + (-*g).exp()) * u);
                down.matmul(&gate, m)
            }
            Self::Moe(moe) => moe.forward(h, m, d),
        }
    }

    fn digest_into(&self, h: &mut sha2::Sha256) -> Result<()> {
        match self {
            Self::Dense { gate_up, down } => {
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
    pub(crate) ffn_norm: RmsNorm,
    pub(crate) ffn: Ffn,
    pub(crate) span: tracing::Span,
}

impl DecoderLayer {
    /// Reads block `i`'s attention as `kind` says, then its feed-forward
    /// (`ffn` reads it after `ffn_norm`), in the order the manifest records.
    pub(crate) fn load(
        l: &mut Loader<'_>,
        c: &Config,
        i: usize,
        kind: AttentionKind,
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
        let ffn_norm = norm(l, "ffn_norm", d)?;
        let ffn = ffn(l, &p)?;
        Ok(Self {
            attn_norm,
            qkv,
            q_norm,
            k_norm,
            o,
            ffn_norm,
            ffn,
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
        digest_f32s(h, &self.ffn_norm.weight);
        self.ffn.digest_into(h)
    }
}
