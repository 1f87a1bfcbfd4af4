//! Arbitrary bytes as the OpenAI request inside the seal (method, path and
//! body from the input): parsing never panics, every refusal is an
//! OpenAI-shaped 4xx, and an accepted request fits the context.
#![no_main]

use std::sync::OnceLock;

use candle_core::quantized::gguf_file::{write, Value};
use libfuzzer_sys::fuzz_target;
use veil_enclave::text::tokenizer::Tokenizer;
use veil_enclave::gateway::openai::{self, Route};
use veil_enclave::model::GgufFile;

const CONTEXT: usize = 256;

/// A small sentencepiece tokenizer with a chat template, from a GGUF written once.
fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let mut tokens: Vec<Value> = ["<unk>", "<s>", "</s>"].iter().map(|t| Value::String((*t).into())).collect();
        let mut types = vec![Value::I32(2), Value::I32(3), Value::I32(3)];
        for b in 0..=255u8 {
            tokens.push(Value::String(format!("<0x{b:02X}>")));
            types.push(Value::I32(6));
        }
        for w in ["▁a", "▁b", "ab", "▁hello", "lo"] {
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
            (
                "tokenizer.chat_template",
                Value::String("{% for m in messages %}<s>{{ m.role }}: {{ m.content }}</s>{% endfor %}".into()),
            ),
        ];
        let refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
        let path = std::env::temp_dir().join(format!("veil-fuzz-tokenizer-{}.gguf", std::process::id()));
        write(&mut std::fs::File::create(&path).expect("create"), &refs, &[]).expect("write");
        let tok = Tokenizer::from_gguf(&GgufFile::open(&path).expect("open")).expect("tokenizer");
        let _ = std::fs::remove_file(&path);
        tok
    })
}

fuzz_target!(|data: &[u8]| {
    let (method, path): (&[u8], &[u8]) = match data.first().map(|b| b % 4) {
        Some(0) => (b"POST", b"/v1/chat/completions"),
        Some(1) => (b"POST", b"/v1/completions"),
        Some(2) => (b"GET", b"/v1/models/smollm2"),
        _ => (b"GET", b"/v1/models"),
    };
    let body = data.get(1..).unwrap_or_default();
    match openai::parse(method, path, body, tokenizer(), "smollm2", CONTEXT) {
        Ok(Route::Generate(call)) => {
            let prompt = call.request.prompt_ids.len();
            assert!(prompt < CONTEXT && call.request.max_tokens >= 1);
            assert!(prompt + call.request.max_tokens <= CONTEXT);
        }
        Ok(_) => {}
        Err(e) => {
            assert!((400..500).contains(&e.status), "{e:?}");
            assert!(serde_json::from_slice::<serde_json::Value>(&e.body()).is_ok());
        }
    }
});
