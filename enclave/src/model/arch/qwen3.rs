//! `qwen3` (dense Qwen3): per-head RMS norms of q and k, NeoX RoPE, no
//! biases, dense SwiGLU.

use crate::model::block::{AttentionKind, DecoderLayer, Ffn};
use crate::model::config::Config;
use crate::model::error::Result;
use crate::model::weight::Loader;

pub(super) fn block(l: &mut Loader<'_>, c: &Config, i: usize) -> Result<DecoderLayer> {
    DecoderLayer::load(l, c, i, AttentionKind { qk_norm: true }, |l, p| Ffn::dense(l, p, c.n_embd))
}
