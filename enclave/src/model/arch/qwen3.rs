//! `qwen3` (dense Qwen3): per-head RMS norms of q and k, NeoX RoPE, no
//! biases, dense SwiGLU.

use crate::model::block::{DecoderLayer, Ffn, Parts};
use crate::model::config::Config;
use crate::model::error::Result;
use crate::model::weight::Loader;

pub(super) fn block(l: &mut Loader<'_>, c: &Config, i: usize) -> Result<DecoderLayer> {
    DecoderLayer::load(l, c, i, Parts { qk_norm: true, ..Parts::PLAIN }, |l, p| Ffn::dense(l, p, c.n_embd))
}
