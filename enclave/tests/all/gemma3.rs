//! The tokenizer and chat template on a real sentencepiece vocabulary with
//! whitespace tokens: Gemma 3 270M (`scripts/fetch-gemma3.sh`), whose runs
//! of spaces, tabs and newlines are user-defined tokens llama.cpp cuts out
//! of plain text. Every id must equal llama.cpp's in
//! `testdata/gemma3/tokenize.json` (`scripts/make-gemma3-fixtures.py`),
//! and llama.cpp's Gemma chat template (from its reference files) must
//! render jinja2's (and llama.cpp's) prompt; the model's greedy answer to
//! each chat must be llama.cpp's, step by step. The GGUF is `$VEIL_GEMMA3`, else `gemma-3-270m-q4_k_m.gguf` in
//! the model cache; without it the tests print SKIP, unless
//! `VEIL_REQUIRE_GEMMA3=1`.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use veil_enclave::model::GgufFile;
use veil_enclave::text::template::{render, ChatMessage, RenderRequest};
use veil_enclave::text::tokenizer::Tokenizer;

const MODEL_NAME: &str = "gemma-3-270m-q4_k_m.gguf";

pub(crate) fn model_path() -> Option<PathBuf> {
    let path = match std::env::var_os("VEIL_GEMMA3") {
        Some(p) => PathBuf::from(p),
        None => std::env::var_os("VEIL_MODELS")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/veil/models"))
            .join(MODEL_NAME),
    };
    if path.exists() {
        return Some(path);
    }
    if std::env::var("VEIL_REQUIRE_GEMMA3").as_deref() == Ok("1") {
        panic!("VEIL_REQUIRE_GEMMA3=1 but {} is missing", path.display());
    }
    veil_tests::skip("Gemma 3 model not found (run scripts/fetch-gemma3.sh, set VEIL_GEMMA3)");
    None
}

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/gemma3")
}

#[derive(serde::Deserialize)]
struct Fixture {
    model_sha256: String,
    bos_token: String,
    eos_token: String,
    cases: Vec<Case>,
    chat_template: String,
    chats: Vec<Chat>,
}

#[derive(serde::Deserialize)]
struct Case {
    text: String,
    add_bos: bool,
    special: bool,
    ids: Vec<u32>,
}

#[derive(serde::Deserialize)]
struct Chat {
    messages: Vec<Message>,
    prompt: String,
    ids: Vec<u32>,
    /// llama.cpp's greedy answer, and its top-2 logit gap at each step.
    greedy_ids: Vec<u32>,
    top2_gaps: Vec<f32>,
}

#[derive(serde::Deserialize)]
struct Message {
    role: String,
    content: String,
}

fn fixture() -> Fixture {
    let text = std::fs::read_to_string(testdata().join("tokenize.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn tokenizer(path: &Path) -> Tokenizer {
    let g = GgufFile::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_gguf(&g).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_fixture_is_for_the_fetched_model() {
    let script = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/fetch-gemma3.sh"));
    let f = fixture();
    assert!(
        script.unwrap().contains(&format!("MODEL_SHA256=\"{}\"", f.model_sha256)),
        "tokenize.json was made from another file than scripts/fetch-gemma3.sh fetches"
    );
    assert!(f.cases.len() >= 30);
}

#[test]
fn every_case_matches_llama_cpp() {
    let Some(path) = model_path() else { return };
    let tok = tokenizer(&path);
    let f = fixture();
    let mut wrong = Vec::new();
    for (i, case) in f.cases.iter().enumerate() {
        let ids = tok.tokenize(&case.text, case.add_bos, case.special).unwrap();
        if ids != case.ids {
            wrong.push(format!("case {i} {:?}:\n  llama.cpp {:?}\n  veil      {:?}", case.text, case.ids, ids));
        }
    }
    println!("gemma3: {} cases, {} equal", f.cases.len(), f.cases.len() - wrong.len());
    assert!(wrong.is_empty(), "{} of {} cases differ:\n{}", wrong.len(), f.cases.len(), wrong.join("\n"));
}

/// Plain text's ids decode back to the text: user-defined tokens are
/// their text, and Gemma adds no space prefix to take off.
#[test]
fn plain_text_round_trips() {
    let Some(path) = model_path() else { return };
    let tok = tokenizer(&path);
    for case in fixture().cases.iter().filter(|c| !c.special && !c.add_bos) {
        assert_eq!(tok.decode(&case.ids).unwrap(), case.text);
    }
}

/// llama.cpp's Gemma chat template renders jinja2's prompt (which the fixture
/// script checked against llama.cpp's Gemma format), and the prompt
/// tokenizes, special tokens parsed, to llama.cpp's ids.
#[test]
fn the_chat_template_renders_and_tokenizes_as_llama_cpp_does() {
    let f = fixture();
    // llama.cpp's Gemma template, from its reference files (not kept here).
    let candidates = std::env::var_os("VEIL_LLAMACPP_REF")
        .map(PathBuf::from)
        .into_iter()
        .chain([Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/llamacpp-reference")]);
    let Some(path) = candidates.map(|c| c.join("templates").join(&f.chat_template)).find(|p| p.is_file()) else {
        assert!(
            std::env::var("VEIL_REQUIRE_LLAMACPP_REF").as_deref() != Ok("1"),
            "VEIL_REQUIRE_LLAMACPP_REF=1 but {} is not among llama.cpp's reference templates",
            f.chat_template
        );
        veil_tests::skip("llama.cpp reference templates not found (set VEIL_LLAMACPP_REF)");
        return;
    };
    let template = std::fs::read_to_string(path).unwrap();
    let model = model_path();
    let tok = model.as_deref().map(tokenizer);
    if let Some(tok) = &tok {
        // The base model's GGUF has no template of its own.
        assert!(tok.render_chat(&[ChatMessage::new("user", "hi")]).is_err());
        assert_eq!(tok.piece(tok.bos_added().unwrap()).unwrap(), f.bos_token);
        assert_eq!(tok.piece(tok.eos()).unwrap(), f.eos_token);
    }
    assert!(!f.chats.is_empty());
    for chat in &f.chats {
        let messages: Vec<ChatMessage> = chat.messages.iter().map(|m| ChatMessage::new(&m.role, &m.content)).collect();
        let request = RenderRequest {
            messages: &messages,
            add_generation_prompt: true,
            bos_token: &f.bos_token,
            eos_token: &f.eos_token,
            tools: None,
            now: SystemTime::UNIX_EPOCH,
            extra: None,
        };
        let prompt = render(&template, &request).unwrap();
        assert_eq!(prompt, chat.prompt);
        if let Some(tok) = &tok {
            assert_eq!(tok.tokenize(&prompt, false, true).unwrap(), chat.ids, "{prompt:?}");
        }
    }
}

/// Below this top-2 logit gap a step is a near-tie: two engines (or
/// llama.cpp's own AVX2 and AVX-512 builds, which differ by up to 0.5 on the
/// reference model) may pick differently.
const NEAR_TIE: f32 = 0.5;

/// Veil's answer to each fixture chat, on the whole model as shipped, is
/// llama.cpp's: at every step where llama.cpp's top two logits are not a
/// near-tie, Veil's choice is llama.cpp's. llama.cpp's token is fed either
/// way, so one near-tie does not part the paths.
#[test]
fn chat_answers_equal_llama_cpp_greedy() {
    use veil_enclave::model::{LayerSlice, Logits, SliceOutput};
    use veil_enclave::text::sampler::argmax;
    let Some(path) = model_path() else { return };
    let f = fixture();
    let mut g = GgufFile::open(&path).unwrap();
    let n_layer = veil_enclave::model::Config::from_gguf(&g).unwrap().n_layer;
    let slice = LayerSlice::from_gguf(&mut g, 0..n_layer).unwrap();
    let last = |out: SliceOutput| match out {
        SliceOutput::Logits(r) => argmax(r.last()),
        other => panic!("expected logits, got {other:?}"),
    };
    for chat in &f.chats {
        assert!(!chat.greedy_ids.is_empty() && chat.greedy_ids.len() == chat.top2_gaps.len());
        let mut kv = slice.new_session(1 << 26);
        let mut next = last(slice.forward(slice.embed(&chat.ids).unwrap(), &mut kv, 0, Logits::Last).unwrap());
        let (mut compared, mut equal) = (0, 0);
        for (step, (&want, &gap)) in chat.greedy_ids.iter().zip(&chat.top2_gaps).enumerate() {
            if gap >= NEAR_TIE {
                assert_eq!(next, want, "{:?}: step {step} (llama.cpp's top-2 gap {gap})", chat.prompt);
                compared += 1;
            }
            equal += usize::from(next == want);
            let at = chat.ids.len() + step;
            next = last(slice.forward(slice.embed(&[want]).unwrap(), &mut kv, at, Logits::Last).unwrap());
        }
        assert!(compared >= chat.greedy_ids.len() / 2, "only {compared} steps are not near-ties");
        println!("{:?}: {equal}/{} steps equal, {compared} compared", chat.prompt, chat.greedy_ids.len());
    }
}
