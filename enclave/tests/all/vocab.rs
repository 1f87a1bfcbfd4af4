//! The tokenizers against llama.cpp's own vocabulary tests
//! (`models/ggml-vocab-NAME.gguf` with `.inp` strings and `.out` ids, as
//! llama.cpp's `test-tokenizer-0` runs them: no BOS, special-token text as
//! text). Every id of every case must equal llama.cpp's. The files live
//! outside the repository: `$VEIL_LLAMACPP_VOCABS` (all of llama.cpp's,
//! `scripts/fetch-llamacpp-vocabs.sh`, which CI runs), else
//! `$VEIL_LLAMACPP_REF` or `../shared/llamacpp-reference` next to the
//! checkout (six of them); without any the tests print SKIP, unless
//! `VEIL_REQUIRE_LLAMACPP_REF=1`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::process::Command;

use veil_enclave::model::GgufFile;
use veil_enclave::text::tokenizer::Tokenizer;

/// The families llama.cpp's reference holds; each must be present.
const FAMILIES: [&str; 6] = ["gpt-2", "llama-bpe", "llama-spm", "phi-3", "qwen2", "qwen35"];

/// Families whose cases do not all match llama.cpp yet, with how many fail.
/// Empty: every family matches every case. A family listed here must still
/// fail exactly that many cases, so fixing (or breaking) one shows.
const KNOWN_MISMATCHES: [(&str, usize); 0] = [];

/// Vocabularies Veil refuses to load, each by a typed error naming what it
/// does not serve (the text of the refusal must contain the second field):
/// BERT's WordPiece is for embedding models, which Veil does not serve. A
/// family listed here must still be refused, so serving one shows.
const KNOWN_REFUSED: [(&str, &str); 1] = [("bert-bge", "tokenizer model \"bert\"")];

/// Where llama.cpp's vocabulary tests are, or `None` (SKIP) when absent:
/// `$VEIL_LLAMACPP_VOCABS` (every vocabulary llama.cpp ships, from
/// `scripts/fetch-llamacpp-vocabs.sh`), else the reference files.
fn reference_dir() -> Option<PathBuf> {
    let candidates = std::env::var_os("VEIL_LLAMACPP_VOCABS")
        .map(PathBuf::from)
        .into_iter()
        .chain(std::env::var_os("VEIL_LLAMACPP_REF").map(PathBuf::from))
        .chain([Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/llamacpp-reference")]);
    for c in candidates {
        if c.join("vocab").is_dir() {
            return Some(c);
        }
    }
    assert_ne!(
        std::env::var("VEIL_REQUIRE_LLAMACPP_REF").as_deref(),
        Ok("1"),
        "VEIL_REQUIRE_LLAMACPP_REF=1 but no llama.cpp reference at $VEIL_LLAMACPP_REF or ../shared/llamacpp-reference"
    );
    veil_tests::skip("llama.cpp reference files not found (set VEIL_LLAMACPP_REF)");
    None
}

/// One test string and llama.cpp's ids for it.
struct Case {
    text: String,
    ids: Vec<u32>,
}

/// The cases of `ggml-vocab-NAME.gguf`, read as `test-tokenizer-0` reads
/// them: strings separated by `\n__ggml_vocab_test__\n`, one line of
/// space-separated ids each.
fn cases(vocab: &Path) -> Vec<Case> {
    let with = |ext: &str| {
        let mut p = vocab.as_os_str().to_owned();
        p.push(ext);
        PathBuf::from(p)
    };
    let inp = std::fs::read_to_string(with(".inp")).unwrap();
    let out = std::fs::read_to_string(with(".out")).unwrap();
    const SEP: &str = "\n__ggml_vocab_test__\n";
    let mut texts = Vec::new();
    let mut rest = inp.as_str();
    while !rest.is_empty() {
        match rest.find(SEP) {
            Some(at) => {
                texts.push(rest[..at].to_owned());
                rest = &rest[at + SEP.len()..];
            }
            None => {
                texts.push(rest.to_owned());
                break;
            }
        }
    }
    let ids: Vec<Vec<u32>> =
        out.lines().map(|l| l.split_whitespace().map(|t| t.parse::<u32>().unwrap()).collect()).collect();
    assert_eq!(texts.len(), ids.len(), "{}: .inp and .out hold different numbers of cases", vocab.display());
    texts.into_iter().zip(ids).map(|(text, ids)| Case { text, ids }).collect()
}

/// Every vocabulary the reference holds with its test strings (llama.cpp's
/// `models/` also holds a few without), the expected families among them.
fn families(dir: &Path) -> Vec<String> {
    let mut families: Vec<String> = std::fs::read_dir(dir.join("vocab"))
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            Some(name.strip_prefix("ggml-vocab-")?.strip_suffix(".gguf.inp")?.to_owned())
        })
        .collect();
    families.sort();
    for f in FAMILIES {
        assert!(families.iter().any(|g| g == f), "the reference lacks ggml-vocab-{f}.gguf");
    }
    families
}

fn vocab_path(dir: &Path, family: &str) -> PathBuf {
    dir.join("vocab").join(format!("ggml-vocab-{family}.gguf"))
}

fn tokenizer(path: &Path) -> Tokenizer {
    let g = GgufFile::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_gguf(&g).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_vocabulary_matches_llama_cpp_on_every_case() {
    let Some(dir) = reference_dir() else { return };
    let families = families(&dir);
    println!("{:<16} {:>6} {:>6}", "family", "cases", "equal");
    let mut wrong = Vec::new();
    for family in &families {
        let path = vocab_path(&dir, family);
        let refused = KNOWN_REFUSED.iter().find(|(f, _)| *f == family.as_str());
        let loaded = GgufFile::open(&path).and_then(|g| Tokenizer::from_gguf(&g));
        let tok = match (loaded, refused) {
            (Ok(tok), None) => tok,
            (Err(e), Some((_, why))) if e.to_string().contains(why) => {
                println!("{family:<16} refused: {e}");
                continue;
            }
            (Ok(_), Some(_)) => {
                wrong.push(format!("{family}: loads, but is listed as refused"));
                continue;
            }
            (Err(e), _) => {
                wrong.push(format!("{family}: {e}"));
                continue;
            }
        };
        let cases = cases(&path);
        let mut equal = 0;
        for (i, case) in cases.iter().enumerate() {
            let ids = tok.tokenize(&case.text, false, false).unwrap();
            if ids == case.ids {
                equal += 1;
            } else {
                eprintln!("{family} case {i} {:?}:\n  llama.cpp {:?}\n  veil      {:?}", case.text, case.ids, ids);
            }
        }
        println!("{family:<16} {:>6} {equal:>6}", cases.len());
        let allowed = KNOWN_MISMATCHES.iter().find(|(f, _)| *f == family.as_str()).map_or(0, |(_, n)| *n);
        if cases.is_empty() || cases.len() - equal != allowed {
            wrong.push(format!(
                "{family}: {} of {} cases differ (expected {allowed})",
                cases.len() - equal,
                cases.len()
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:?}");
}

fn shard(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_veil-shard")).args(args).env("RUST_LOG", "warn").output().unwrap()
}

/// `veil-shard tokenize` on a vocabulary-only GGUF prints llama.cpp's ids.
#[test]
fn the_tokenize_command_prints_llama_cpp_ids() {
    let Some(dir) = reference_dir() else { return };
    let path = vocab_path(&dir, "qwen2");
    let model = path.to_str().unwrap();
    let cases = cases(&path);
    let case = cases.iter().find(|c| c.text == " Hello, world!").expect("the reference has ' Hello, world!'");
    let plain = shard(&["tokenize", "--model", model, "--text", &case.text]);
    assert!(plain.status.success(), "{}", String::from_utf8_lossy(&plain.stderr));
    let expected: Vec<String> = case.ids.iter().map(u32::to_string).collect();
    assert_eq!(String::from_utf8_lossy(&plain.stdout).trim_end(), expected.join(" "));

    let json = shard(&["tokenize", "--model", model, "--text", &case.text, "--json"]);
    assert!(json.status.success(), "{}", String::from_utf8_lossy(&json.stderr));
    let j: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(j["ids"], serde_json::json!(case.ids));
    let pieces: Vec<&str> = j["pieces"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
    assert_eq!(pieces.len(), case.ids.len());
    assert_eq!(pieces.concat(), case.text);

    // Special-token text is text unless --special.
    let tok = tokenizer(&path);
    let im_start = tok.tokenize("<|im_start|>", false, true).unwrap();
    assert_eq!(im_start.len(), 1);
    let special = shard(&["tokenize", "--model", model, "--text", "<|im_start|>", "--special"]);
    assert_eq!(String::from_utf8_lossy(&special.stdout).trim_end(), im_start[0].to_string());
    let text = shard(&["tokenize", "--model", model, "--text", "<|im_start|>"]);
    assert!(String::from_utf8_lossy(&text.stdout).split_whitespace().count() > 1);

    // A file that is not a GGUF is an error naming it, not a panic.
    let bad = shard(&["tokenize", "--model", "/nonexistent/vocab.gguf", "--text", "x"]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && !err.contains("panicked") && err.contains("/nonexistent/vocab.gguf"), "{err}");
}

/// Issue 29: the bytes a grammar engine matches tokens by
/// (`Tokenizer::token_bytes`) spell llama.cpp's tokenization of every case
/// of every family back into the case's text (sentencepiece families with
/// the space they prefix), so a response format masks exactly the tokens
/// that spell what it allows. A user-defined token (MPT's runs of spaces)
/// is spelled as a special one, `0xFF` and its text: the grammar engine
/// never uses it to spell text, and its text after the marker must still be
/// the case's.
#[test]
fn token_bytes_spell_every_case_back_to_its_text() {
    let Some(dir) = reference_dir() else { return };
    for family in families(&dir) {
        if KNOWN_REFUSED.iter().any(|(f, _)| *f == family) {
            continue;
        }
        let path = vocab_path(&dir, &family);
        let tok = tokenizer(&path);
        let bytes = tok.token_bytes();
        assert_eq!(bytes.len(), tok.vocab_size());
        for (i, case) in cases(&path).iter().enumerate() {
            let spelled: Vec<u8> = case
                .ids
                .iter()
                .flat_map(|&id| {
                    let b = &bytes[id as usize];
                    b.strip_prefix(&[0xFF]).filter(|_| tok.is_user_defined(id)).unwrap_or(b).to_vec()
                })
                .collect();
            let text = case.text.as_bytes();
            let ok = spelled == text || spelled.strip_prefix(b" ") == Some(text);
            assert!(ok, "{family} case {i}: {:?} spelled {:?}", case.text, String::from_utf8_lossy(&spelled));
        }
    }
}
