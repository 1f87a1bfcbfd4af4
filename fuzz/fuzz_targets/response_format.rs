//! Arbitrary bytes as a request's response format, past parsing and into
//! the grammar compiler: the structural limits
//! (`veil_enclave::text::grammar::limits`) run first, as the entry runs them,
//! and whatever passes them is compiled. Nothing may panic, overflow the
//! stack, or run past libFuzzer's `-timeout` / `-rss_limit_mb` (which
//! `scripts/fuzz.sh` sets to the entry's compile budget): an input that does
//! is a schema the entry would have to kill a worker for, and a candidate
//! for a new limit.
#![no_main]

use std::sync::OnceLock;

use candle_core::quantized::gguf_file::{write, Value};
use libfuzzer_sys::fuzz_target;
use veil_enclave::model::GgufFile;
use veil_enclave::text::grammar::{GrammarError, Grammars, ResponseFormat};
use veil_enclave::text::grammar::limits as schema_limits;
use veil_enclave::text::tokenizer::Tokenizer;

/// A byte-level vocabulary (every byte, a few merges), from a GGUF written once.
fn grammars() -> &'static Grammars {
    static G: OnceLock<Grammars> = OnceLock::new();
    G.get_or_init(|| {
        let mut tokens: Vec<Value> = ["<unk>", "<s>", "</s>"].iter().map(|t| Value::String((*t).into())).collect();
        let mut types = vec![Value::I32(2), Value::I32(3), Value::I32(3)];
        for b in 0..=255u8 {
            tokens.push(Value::String(format!("<0x{b:02X}>")));
            types.push(Value::I32(6));
        }
        for w in ["{\"", "\":", "\"}", "true", "null", "▁a"] {
            tokens.push(Value::String(w.into()));
            types.push(Value::I32(1));
        }
        let scores: Vec<Value> = (0..tokens.len()).map(|i| Value::F32(-(i as f32))).collect();
        let meta = [
            ("general.architecture", Value::String("llama".into())),
            ("tokenizer.ggml.model", Value::String("llama".into())),
            ("tokenizer.ggml.tokens", Value::Array(tokens)),
            ("tokenizer.ggml.scores", Value::Array(scores)),
            ("tokenizer.ggml.token_type", Value::Array(types)),
            ("tokenizer.ggml.eos_token_id", Value::U32(2)),
            ("tokenizer.ggml.bos_token_id", Value::U32(1)),
        ];
        let refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
        let path = std::env::temp_dir().join(format!("veil-fuzz-format-{}.gguf", std::process::id()));
        write(&mut std::fs::File::create(&path).expect("create"), &refs, &[]).expect("write");
        let tok = Tokenizer::from_gguf(&GgufFile::open(&path).expect("open")).expect("tokenizer");
        let _ = std::fs::remove_file(&path);
        Grammars::from_vocabulary(&tok.vocabulary()).expect("grammar engine")
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data.get(1..).unwrap_or_default()) else { return };
    let format = match data.first().map(|b| b % 2) {
        Some(0) => ResponseFormat::JsonSchema { schema: text.into() },
        _ => ResponseFormat::Lark { grammar: text.into() },
    };
    let limited = schema_limits::check(&format);
    match grammars().compile(&format) {
        // The compile checks the same limits first.
        Err(GrammarError::Limit(e)) => assert_eq!(limited, Err(e)),
        _ => assert!(limited.is_ok()),
    }
});
