//! `qwen2` (Qwen2, Qwen2.5): q/k/v biases, NeoX RoPE, dense SwiGLU.

use crate::model::block::{DecoderLayer, Ffn, Parts};
use crate::model::config::Config;
use crate::model::error::Result;
use crate::model::weight::Loader;

pub(super) fn block(l: &mut Loader<'_>, c: &Config, i: usize) -> Result<DecoderLayer> {
    DecoderLayer::load(l, c, i, Parts::PLAIN, |l, p| Ffn::dense(l, p, c.n_embd))
}
