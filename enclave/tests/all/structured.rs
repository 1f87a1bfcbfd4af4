//! Structured outputs by constrained decoding (issue 29): an answer with a
//! response format is masked token by token on the last stage, so it parses
//! and validates; the pipeline equals one process with the same mask,
//! greedy, sampled and under pipelined speculation whose drafts break the
//! format; bad formats are refused by name at admission and the entry
//! keeps serving.

use veil_enclave::generate::{Generation, LocalModel};
use veil_enclave::pipeline::entry::GenerateWire;
use veil_enclave::text::grammar::{Grammars, ResponseFormat};
use veil_enclave::text::tokenizer::ChatMessage;

use crate::cluster::{greedy, local, model_path, scripted, Cluster};

/// A person record: an object with a string, a bounded integer, an enum and
/// an array of strings, all required, nothing else.
const PERSON: &str = r#"{"type":"object","properties":{"name":{"type":"string","maxLength":24},"age":{"type":"integer","minimum":0,"maximum":120},"role":{"enum":["admin","user","guest"]},"tags":{"type":"array","items":{"type":"string","maxLength":12},"maxItems":3}},"required":["name","age","role","tags"],"additionalProperties":false}"#;

/// Checks `text` against [`PERSON`] by hand (the Python suite checks with
/// `jsonschema` through the official client).
fn is_person(text: &str) -> Result<(), String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON ({e}): {text:?}"))?;
    let o = v.as_object().ok_or("not an object")?;
    let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
    keys.sort_unstable();
    if keys != ["age", "name", "role", "tags"] {
        return Err(format!("keys {keys:?}"));
    }
    let age = o["age"].as_i64().ok_or("age is not an integer")?;
    let name = o["name"].as_str().ok_or("name is not a string")?;
    let role = o["role"].as_str().ok_or("role is not a string")?;
    let tags = o["tags"].as_array().ok_or("tags is not an array")?;
    let fits = (0..=120).contains(&age)
        && name.chars().count() <= 24
        && ["admin", "user", "guest"].contains(&role)
        && tags.len() <= 3
        && tags.iter().all(|t| t.as_str().is_some_and(|s| s.chars().count() <= 12));
    fits.then_some(()).ok_or_else(|| format!("out of the schema: {text}"))
}

fn person_request(tok: &veil_enclave::text::tokenizer::Tokenizer, prompt: &str, max_tokens: usize) -> GenerateWire {
    let mut req = greedy(&[], max_tokens);
    req.prompt_ids = Some(tok.encode_chat(&[ChatMessage::new("user", prompt)]).unwrap());
    req.sampling.response_format = Some(ResponseFormat::JsonSchema { schema: PERSON.into() });
    req
}

#[test]
fn json_schema_answers_validate_and_the_pipeline_equals_one_process() {
    let Some(path) = model_path() else { return };
    let (model, tok) = LocalModel::load(&path, &[]).unwrap();
    let prompts = [
        "Describe the administrator of a small web shop.",
        "Make up a guest user called Ann.",
        "Who is the oldest person you know of?",
        "Write a haiku about autumn.",
    ];
    let mut c = Cluster::new("structured", &path, &[10, 20], &[1, 1, 1]);
    c.start_all();
    for prompt in prompts {
        let greedy = person_request(&tok, prompt, 96);
        let want: Generation = local(&model, &tok, &greedy);
        is_person(&want.text).unwrap_or_else(|e| panic!("one process, {prompt:?}: {e}"));
        let got = c.generate(&greedy).unwrap();
        assert_eq!(got.ids, want.ids, "{prompt:?}: three shards differ from one process");
        // Unconstrained, this model does not answer in JSON: the mask did it.
        let mut free = greedy.clone();
        free.sampling.response_format = None;
        assert!(is_person(&c.generate(&free).unwrap().text).is_err(), "{prompt:?}: JSON without a format");
        // Pipelined speculation with drafts that break the format every
        // third token: the same answer.
        let script: Vec<u32> = want.ids.iter().enumerate().map(|(i, &t)| if i % 3 == 2 { t ^ 1 } else { t }).collect();
        let spec = c.generate(&scripted(&greedy, script, 4, 3)).unwrap();
        assert_eq!(spec.ids, want.ids, "{prompt:?}: speculation changed a constrained answer");
        let s = spec.speculation.expect("speculated");
        assert!(s.drafted > s.accepted, "{prompt:?}: some drafts must have been refused: {s:?}");
        assert!(s.pipelined_rounds > 0, "{prompt:?}: rounds in flight assume earlier drafts: {s:?}");
        // Seeded sampling: one process's draws, and valid.
        let mut sampled = greedy.clone();
        (sampled.sampling.temperature, sampled.sampling.top_p, sampled.sampling.seed) = (1.0, 0.95, 17);
        let want = local(&model, &tok, &sampled);
        is_person(&want.text).unwrap_or_else(|e| panic!("sampled, {prompt:?}: {e}"));
        assert_eq!(c.generate(&sampled).unwrap().ids, want.ids, "{prompt:?}: sampled");
    }
    // json_object: any object.
    let mut object = person_request(&tok, "List two fruits.", 64);
    object.sampling.response_format = Some(ResponseFormat::JsonObject);
    let g = c.generate(&object).unwrap();
    let v: serde_json::Value = serde_json::from_str(&g.text).unwrap_or_else(|e| panic!("{e}: {:?}", g.text));
    assert!(v.is_object());

    // Bad formats are refused by name; the entry keeps serving.
    let bad = |schema: &str| {
        let mut r = person_request(&tok, "Hi", 8);
        r.sampling.response_format = Some(ResponseFormat::JsonSchema { schema: schema.into() });
        c.generate(&r).unwrap_err()
    };
    assert!(bad("{not json").contains("not JSON"), "{}", bad("{not json"));
    let e = bad(r#"{"type":"object","properties":{"a":{"type":"integer","minimum":5,"maximum":1}},"required":["a"]}"#);
    assert!(e.contains("cannot be enforced"), "{e}");
    let huge = format!(r#"{{"type":"string","description":"{}"}}"#, "x".repeat(40_000));
    assert!(bad(&huge).contains("at most"), "{}", bad(&huge));
    assert_eq!(
        c.generate(&person_request(&tok, prompts[0], 96)).unwrap().ids,
        local(&model, &tok, &person_request(&tok, prompts[0], 96)).ids
    );
}

/// The matcher itself: the mask leaves only what continues the format, a
/// rejected token changes nothing, rollback restores the state, and a
/// finished format allows only the stop tokens.
#[test]
fn the_mask_follows_the_format_and_rolls_back() {
    let Some(path) = model_path() else { return };
    let (_, tok) = LocalModel::load(&path, &[]).unwrap();
    let grammars = Grammars::from_vocabulary(&tok.vocabulary()).unwrap();
    let mut m = grammars.compile(&ResponseFormat::JsonSchema { schema: r#"{"enum":["yes","no"]}"#.into() }).unwrap();
    let allowed = |m: &mut veil_enclave::text::grammar::Constrained| -> Vec<u32> {
        let mut logits = vec![0.0f32; tok.vocab_size()];
        m.mask(&mut logits).unwrap();
        (0..logits.len() as u32).filter(|&t| logits[t as usize].is_finite()).collect()
    };
    let first = allowed(&mut m);
    let spell = |t: u32| tok.decode(&[t]).unwrap();
    assert!(
        !first.is_empty() && first.iter().all(|&t| "\"yes\"".starts_with(&spell(t)) || "\"no\"".starts_with(&spell(t)))
    );
    let answer = tok.encode("\"no\"", false).unwrap();
    let bad = tok.encode("\"maybe\"", false).unwrap();
    assert!(!m.advance(bad[0]) || spell(bad[0]) == "\"");
    m.sync(&answer).unwrap();
    let end = allowed(&mut m);
    assert!(!end.is_empty() && end.iter().all(|t| tok.stop_ids().contains(t)), "only stops after the answer");
    m.sync(&answer[..1]).unwrap();
    assert_eq!(m.sync(&bad).map_err(|e| e.to_string()).err().is_some(), bad[0] != answer[0] || bad.len() > 1);
    m.sync(&[]).unwrap();
    assert_eq!(allowed(&mut m), first, "rolled back to the start");
}
