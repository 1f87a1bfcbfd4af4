//! Each served architecture's blocks, configured from GGUF metadata the way
//! llama.cpp reads them. The shared parts (attention, norms, RoPE, the
//! mixture-of-experts dispatch) live once, in the modules beside this one.

mod gemma3;
mod gpt_oss;
mod llama;
mod qwen2;
mod qwen3;
mod qwen3moe;

use super::block::DecoderLayer;
use super::config::{Arch, Config};
use super::error::Result;
use super::weight::Loader;

/// Reads block `i` of a model of `c.arch`.
pub(crate) fn block(l: &mut Loader<'_>, c: &Config, i: usize) -> Result<DecoderLayer> {
    match c.arch {
        Arch::Llama | Arch::Mistral => llama::block(l, c, i),
        Arch::Qwen2 => qwen2::block(l, c, i),
        Arch::Qwen3 => qwen3::block(l, c, i),
        Arch::Qwen3Moe => qwen3moe::block(l, c, i),
        Arch::GptOss => gpt_oss::block(l, c, i),
        Arch::Gemma3 => gemma3::block(l, c, i),
    }
}
