//! `gemma3` (Gemma 3, dense): the token embedding scaled by `sqrt(n_embd)`,
//! per-head q/k norms, norms after attention and after the feed-forward
//! as well as before, GeGLU, and interleaved attention: five local
//! (sliding-window, RoPE base 10 000) blocks to one global (the model's
//! RoPE base and scaling). GGUF norm weights already include Gemma's `+1`.

use crate::model::block::{DecoderLayer, Ffn, Parts};
use crate::model::config::Config;
use crate::model::error::Result;
use crate::model::layers::Glu;
use crate::model::weight::Loader;

pub(super) fn block(l: &mut Loader<'_>, c: &Config, i: usize) -> Result<DecoderLayer> {
    let parts = Parts { qk_norm: true, attn_post_norm: true, ffn_post_norm: true, ..Parts::PLAIN };
    DecoderLayer::load(l, c, i, parts, |l, p| Ffn::dense_with(l, p, c.n_embd, Glu::Ge))
}
