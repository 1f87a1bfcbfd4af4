//! `qwen3moe` (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B-A3B): Qwen3's
//! attention (q/k norms, NeoX RoPE) and, in every block, `expert_count`
//! SwiGLU experts of `expert_feed_forward_length`, `expert_used_count` of
//! them per position by softmax routing, renormalised; no shared expert.

use crate::model::block::{DecoderLayer, Ffn, Parts};
use crate::model::config::Config;
use crate::model::error::{ModelError, Result};
use crate::model::weight::Loader;

pub(super) fn block(l: &mut Loader<'_>, c: &Config, i: usize) -> Result<DecoderLayer> {
    let moe = c.moe.ok_or_else(|| ModelError::Malformed("qwen3moe without experts".into()))?;
    DecoderLayer::load(l, c, i, Parts { qk_norm: true, ..Parts::PLAIN }, |l, p| Ffn::experts(l, p, c.n_embd, moe))
}
