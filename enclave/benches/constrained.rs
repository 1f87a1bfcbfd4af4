//! Structured outputs: what the response-format mask costs per token, and
//! constrained against unconstrained decoding on the same prompts (one
//! process, greedy, the same model and thread count), in the same run.
//!
//! 1. Per token of a schema-valid answer: the matcher's step (consume the
//!    token, compute the allowed set) and the mask applied to a full
//!    vocabulary of logits, against the model's own decode step.
//! 2. Tokens per second with `response_format` (a JSON schema) and without,
//!    on the same prompts, each answer as long as the model makes it (the
//!    vocabulary's grammar engine built once beforehand, as a serving stage
//!    builds it; each answer compiles its schema).
//!
//! `cargo bench -p veil-enclave --bench constrained` (needs `scripts/fetch-model.sh`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

#[path = "../tests/support/cluster.rs"]
mod cluster;

use std::time::{Duration, Instant};

use veil_enclave::generate::{generate, GenerateRequest, LocalModel};
use veil_enclave::text::grammar::ResponseFormat;
use veil_enclave::text::sampler::{Sampler, SamplingParams};
use veil_enclave::text::tokenizer::ChatMessage;

const SCHEMA: &str = r#"{"type":"object","properties":{"name":{"type":"string","pattern":"^[A-Za-z ]{1,24}$"},"age":{"type":"integer","minimum":0,"maximum":120},"role":{"enum":["admin","user","guest"]},"tags":{"type":"array","items":{"type":"string","pattern":"^[a-z]{1,12}$"},"maxItems":3}},"required":["name","age","role","tags"],"additionalProperties":false}"#;

const PROMPTS: [&str; 4] = [
    "Describe a lighthouse keeper.",
    "Invent a user of a chess website.",
    "Who runs the bakery on the corner?",
    "Tell me about a guest at a wedding.",
];

fn percentile(mut xs: Vec<Duration>, p: f64) -> Duration {
    xs.sort();
    xs[((xs.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let Some(path) = cluster::model_path() else { return };
    let (model, tok) = LocalModel::load(&path, &[]).unwrap();
    let t = Instant::now();
    let grammars = tok.grammars().unwrap();
    let build = t.elapsed();
    let format = ResponseFormat::JsonSchema { schema: SCHEMA.into() };
    let t = Instant::now();
    let _ = grammars.compile(&format).unwrap();
    let compile = t.elapsed();
    println!(
        "grammar engine for {} tokens built in {:.1} ms; schema compiled in {:.2} ms",
        tok.vocab_size(),
        build.as_secs_f64() * 1e3,
        compile.as_secs_f64() * 1e3
    );

    let mut constrained_tokens = 0usize;
    let mut constrained_time = Duration::ZERO;
    let mut free_tokens = 0usize;
    let mut free_time = Duration::ZERO;
    let (mut steps, mut masks) = (Vec::new(), Vec::new());
    for prompt in PROMPTS {
        let ids = tok.encode_chat(&[ChatMessage::new("user", prompt)]).unwrap();
        let req = GenerateRequest { prompt_ids: ids.clone(), max_tokens: 96, stop: Vec::new() };
        // Decode time: from the first token to the last (prefill excluded,
        // since the answers differ in length).
        let run = |format: Option<ResponseFormat>| {
            let params = SamplingParams { temperature: 0.0, response_format: format, ..SamplingParams::default() };
            let mut sampler = Sampler::new(params).unwrap();
            let mut first = None;
            let g = generate(&model, &tok, &mut sampler, &req, |_| {
                first.get_or_insert_with(Instant::now);
            })
            .unwrap();
            (first.map_or(Duration::ZERO, |f| f.elapsed()), g)
        };
        let (took, free) = run(None);
        free_tokens += free.ids.len() - 1;
        free_time += took;
        let (took, answer) = run(Some(format.clone()));
        constrained_tokens += answer.ids.len() - 1;
        constrained_time += took;
        // The matcher alone over the answer's tokens.
        let mut m = grammars.compile(&format).unwrap();
        let mut logits = vec![0.0f32; tok.vocab_size()];
        for &t in &answer.ids {
            let s = Instant::now();
            m.mask(&mut logits).unwrap();
            masks.push(s.elapsed());
            let s = Instant::now();
            assert!(m.advance(t));
            steps.push(s.elapsed());
        }
    }
    let mean = |xs: &[Duration]| xs.iter().sum::<Duration>().as_secs_f64() / xs.len() as f64 * 1e6;
    let decode = free_time.as_secs_f64() / free_tokens as f64 * 1e6;
    println!("\n1. Per token ({} tokens of schema-valid answers)", masks.len());
    println!("{:<40} {:>10} {:>10} {:>10}", "", "mean µs", "p50 µs", "p99 µs");
    for (name, xs) in [("mask (allowed set + vocabulary)", &masks), ("advance (consume the token)", &steps)] {
        println!(
            "{name:<40} {:>10.1} {:>10.1} {:>10.1}",
            mean(xs),
            percentile(xs.clone(), 0.5).as_secs_f64() * 1e6,
            percentile(xs.clone(), 0.99).as_secs_f64() * 1e6
        );
    }
    println!("{:<40} {:>10.1}", "reference: unconstrained decode step", decode);
    println!("\n2. Greedy decoding, one process, {} prompts (decode: after each answer's first token)", PROMPTS.len());
    println!("{:<40} {:>10} {:>10}", "", "tokens", "tok/s");
    let free_rate = free_tokens as f64 / free_time.as_secs_f64();
    let constrained_rate = constrained_tokens as f64 / constrained_time.as_secs_f64();
    println!("{:<40} {:>10} {:>10.1}", "unconstrained", free_tokens, free_rate);
    println!(
        "{:<40} {:>10} {:>10.1}  ({:.2}× unconstrained)",
        "response_format json_schema",
        constrained_tokens,
        constrained_rate,
        constrained_rate / free_rate
    );
}
