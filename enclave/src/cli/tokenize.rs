//! `veil-shard tokenize`: the ids a shard's tokenizer gives a text, as
//! llama.cpp's `llama-tokenize` would (no BOS), for checking a GGUF's
//! vocabulary against another tokenizer. Vocabulary-only GGUFs will do.

use std::path::PathBuf;

use anyhow::Context;

use crate::model::GgufFile;
use crate::text::tokenizer::Tokenizer;

#[derive(Debug, clap::Args)]
pub(super) struct TokenizeArgs {
    /// GGUF file (a vocabulary-only one will do: no weights are read).
    #[arg(long)]
    model: PathBuf,
    /// The text to tokenize.
    #[arg(long)]
    text: String,
    /// Print `{"ids": [...], "pieces": [...]}` instead of the ids alone.
    #[arg(long)]
    json: bool,
    /// Match special-token text (`<|im_start|>`) as the token.
    #[arg(long)]
    special: bool,
}

#[derive(serde::Serialize)]
struct Tokens {
    ids: Vec<u32>,
    /// Each token's text (special tokens as written; bytes of a split
    /// character lossily).
    pieces: Vec<String>,
}

pub(super) fn tokenize(args: &TokenizeArgs) -> anyhow::Result<()> {
    let gguf = GgufFile::open(&args.model)?;
    let tokenizer = Tokenizer::from_gguf(&gguf).with_context(|| format!("tokenizer of {}", args.model.display()))?;
    let ids = tokenizer.tokenize(&args.text, false, args.special)?;
    if args.json {
        let pieces = ids.iter().map(|&id| tokenizer.piece(id)).collect::<Result<_, _>>()?;
        println!("{}", serde_json::to_string(&Tokens { ids, pieces })?);
    } else {
        let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
        println!("{}", ids.join(" "));
    }
    Ok(())
}
