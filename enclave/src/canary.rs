//! Canary prompts: an output-side check, from outside, that a route serves
//! the model a relying party has (SECURITY-CASES G6).
//!
//! Attestation proves which code runs and which weight files it hashed; a
//! canary checks what comes out. `veil-shard canary --model M --out FILE`
//! runs a few fixed completion prompts greedily on the relying party's own
//! copy of the model and records the text; `veil canary URL --reference FILE`
//! sends the same prompts through the sealed API and compares. Veil's
//! pipeline is token-identical to one process on the same CPU code (tested),
//! so any divergence means other weights or other arithmetic (a substituted
//! or re-quantized model, or a GPU path whose rounding differs): a secondary
//! signal, never a replacement for attestation.

use serde::{Deserialize, Serialize};

use crate::generate::{generate, GenerateRequest, LocalModel};
use crate::model::error::Result;
use crate::text::sampler::{Sampler, SamplingParams};
use crate::text::tokenizer::Tokenizer;

/// The file's `format`.
pub const CANARY_FORMAT: &str = "veil-canary/v1";
/// Tokens generated per prompt.
pub const CANARY_TOKENS: usize = 24;
/// The prompts: prose, code, a fact and a sequence, so a weight change in
/// any part of the vocabulary is likely to show within a few tokens.
pub const CANARY_PROMPTS: [&str; 4] =
    ["The capital of France is", "def fibonacci(n):\n", "Water boils at a temperature of", "1, 1, 2, 3, 5, 8,"];

/// Reference answers recorded from a local copy of the model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CanarySet {
    /// [`CANARY_FORMAT`].
    pub format: String,
    /// The model file's name (information only).
    pub model: String,
    /// Tokens requested per prompt (`max_tokens`, greedy).
    pub max_tokens: usize,
    /// Prompt and greedy completion text, in order.
    pub cases: Vec<CanaryCase>,
}

/// One prompt and the text the reference model completes it with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CanaryCase {
    /// The completion prompt (tokenized without special tokens, as `/v1/completions` does).
    pub prompt: String,
    /// The greedy completion.
    pub text: String,
}

/// Records the canary answers of `model` (greedy, [`CANARY_TOKENS`] each).
pub fn record(model: &LocalModel, tokenizer: &Tokenizer, name: &str) -> Result<CanarySet> {
    let mut cases = Vec::new();
    for prompt in CANARY_PROMPTS {
        let req = GenerateRequest {
            prompt_ids: tokenizer.encode(prompt, false)?,
            max_tokens: CANARY_TOKENS,
            stop: Vec::new(),
        };
        let mut sampler = Sampler::new(SamplingParams { temperature: 0.0, ..SamplingParams::default() })?;
        let g = generate(model, tokenizer, &mut sampler, &req, |_| {})?;
        cases.push(CanaryCase { prompt: prompt.to_owned(), text: g.text });
    }
    Ok(CanarySet { format: CANARY_FORMAT.into(), model: name.to_owned(), max_tokens: CANARY_TOKENS, cases })
}

/// Where an answer first differs from the reference: case index and the
/// byte offset of the first difference (`None` when they agree).
pub fn first_divergence(reference: &CanarySet, answers: &[String]) -> Vec<Option<usize>> {
    reference
        .cases
        .iter()
        .zip(answers.iter().map(Some).chain(std::iter::repeat(None)))
        .map(|(case, answer)| {
            let answer = answer.map(String::as_str).unwrap_or_default();
            if answer == case.text {
                None
            } else {
                Some(case.text.bytes().zip(answer.bytes()).take_while(|(a, b)| a == b).count())
            }
        })
        .collect()
}
