//! `gpt-oss` (gpt-oss-20b, gpt-oss-120b): every block has q/k/v/o biases,
//! one attention sink per head, NeoX RoPE with YaRN scaling, and a mixture
//! of experts with a biased router, a softmax over the chosen experts'
//! logits, and biased experts under a clamped SwiGLU. Blocks alternate
//! sliding-window (even) and full attention (odd). The norm before the
//! experts is stored as `post_attention_norm`. Real files hold the experts
//! in MXFP4.

use crate::model::block::{DecoderLayer, Ffn, Parts};
use crate::model::config::Config;
use crate::model::error::{ModelError, Result};
use crate::model::layers::Glu;
use crate::model::weight::Loader;

pub(super) fn block(l: &mut Loader<'_>, c: &Config, i: usize) -> Result<DecoderLayer> {
    let moe = c.moe.ok_or_else(|| ModelError::Malformed("gpt-oss without experts".into()))?;
    let parts = Parts { sinks: true, ffn_norm: "post_attention_norm", ..Parts::PLAIN };
    DecoderLayer::load(l, c, i, parts, |l, p| Ffn::experts_with(l, p, c.n_embd, moe, Glu::SwiClamped, true))
}
