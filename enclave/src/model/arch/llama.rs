//! `llama` and `mistral`: Llama 2/3 and SmolLM2 (GGUF's q/k rows permuted
//! for interleaved RoPE; Llama 3.1+ frequency scaling in `rope_freqs`), and
//! Mixtral-style experts (`ffn_gate_inp`, `ffn_*_exps`) when
//! `llama.expert_count` is set.

use crate::model::block::{DecoderLayer, Ffn, Parts};
use crate::model::config::Config;
use crate::model::error::Result;
use crate::model::weight::Loader;

pub(super) fn block(l: &mut Loader<'_>, c: &Config, i: usize) -> Result<DecoderLayer> {
    DecoderLayer::load(l, c, i, Parts::PLAIN, |l, p| Ffn::for_config(l, p, c))
}
