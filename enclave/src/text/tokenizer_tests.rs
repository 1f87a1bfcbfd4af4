//! The pre-tokenizers' splits and the BOS rules, on hand-made inputs; the
//! whole tokenizers against llama.cpp's vocabulary tests are in
//! `tests/all/vocab.rs`.

use candle_core::quantized::gguf_file::Value;
use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

use super::*;

/// The pieces `pre` splits `text` into, as the original text.
fn pieces(pre: PreType, text: &str) -> Vec<String> {
    let mut p = PreTokenizedString::from(text);
    pre.pre_tokenizer().unwrap().pre_tokenize(&mut p).unwrap();
    p.get_splits(OffsetReferential::Original, OffsetType::Byte)
        .into_iter()
        .map(|(_, (a, b), _)| text[a..b].to_owned())
        .collect()
}

#[test]
fn splits_as_llama_cpp_does() {
    let cases: [(PreType, &str, &[&str]); 10] = [
        (PreType::Gpt2, "12345 can't", &["12345", " can", "'t"]),
        (PreType::Starcoder, "123 ab", &["1", "2", "3", " ab"]),
        (PreType::Default, "a+b 1234", &["a", "+", "b", " ", "123", "4"]),
        (PreType::Llama3, "12345 can't", &["123", "45", " can", "'t"]),
        (PreType::Qwen2, "12 re\u{301}sume\u{301}", &["1", "2", " re", "\u{301}sume", "\u{301}"]),
        // Combining marks stay in the word.
        (PreType::Qwen35, "12 re\u{301}sume\u{301}", &["1", "2", " re\u{301}sume\u{301}"]),
        // Words split where the case changes; the contraction stays on its word.
        (PreType::Gpt4o, "HelloWorld can't 12345", &["Hello", "World", " can't", " ", "123", "45"]),
        // Han runs apart from other letters; no split at a case change.
        (PreType::KimiK2, "HelloWorld你好 can't", &["HelloWorld", "你好", " can't"]),
        (PreType::DeepseekV3, "你好world 12345", &["你好", "world", " ", "123", "45"]),
        (PreType::ChatGlm4, "12345 can't", &["123", "45", " can", "'t"]),
    ];
    for (pre, text, expected) in cases {
        assert_eq!(pieces(pre, text), expected, "{pre:?} {text:?}");
    }
}

/// A byte-level vocabulary with `tokenizer.ggml.pre` = `pre` (`None`: no key).
fn tokenizer(pre: Option<&str>) -> Result<Tokenizer> {
    let strings = |v: &[&str]| Value::Array(v.iter().map(|s| Value::String((*s).to_owned())).collect());
    let mut meta = vec![
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.tokens", strings(&["<|endoftext|>", "<|begin|>", "a", "b", "ab"])),
        ("tokenizer.ggml.token_type", Value::Array([3, 3, 1, 1, 1].iter().map(|&t| Value::I32(t)).collect())),
        ("tokenizer.ggml.merges", strings(&["a b"])),
        ("tokenizer.ggml.eos_token_id", Value::U32(0)),
        ("tokenizer.ggml.bos_token_id", Value::U32(1)),
    ];
    if let Some(pre) = pre {
        meta.push(("tokenizer.ggml.pre", Value::String(pre.into())));
    }
    super::from_metadata(&meta)
}

#[test]
fn refuses_an_unknown_pre_type_by_name() {
    let err = tokenizer(Some("no-such-pre")).unwrap_err();
    assert!(matches!(&err, ModelError::Unsupported(m) if m.contains("\"no-such-pre\"")), "{err}");
}

#[test]
fn bos_follows_llama_cpp_per_pre_type() {
    // Llama 3 prepends BOS unless the GGUF says otherwise; most BPE vocabularies
    // do not; GLM-4 has no BOS at all.
    for (pre, bos) in [(Some("llama-bpe"), true), (Some("qwen2"), false), (None, false), (Some("glm4"), false)] {
        let t = tokenizer(pre).unwrap();
        assert_eq!(t.tokenize("ab", true, false).unwrap(), if bos { vec![1, 4] } else { vec![4] }, "{pre:?}");
        assert_eq!(t.tokenize("ab", false, false).unwrap(), vec![4]);
        assert_eq!(t.tokenize("", false, false).unwrap(), Vec::<u32>::new());
    }
}

#[test]
fn pieces_show_special_tokens_as_written() {
    let t = tokenizer(Some("gpt-2")).unwrap();
    assert_eq!(t.tokenize("<|begin|>ab", false, true).unwrap(), vec![1, 4]);
    assert_eq!(t.piece(1).unwrap(), "<|begin|>");
    assert_eq!(t.piece(4).unwrap(), "ab");
    assert!(t.piece(5).is_err());
}
