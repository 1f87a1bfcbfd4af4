//! The answer core driven by hand: each event in, the exact steps out, with
//! no sessions, sealer or sockets.

use candle_core::quantized::gguf_file::Value as Meta;
use serde_json::Value;

use super::*;
use crate::gateway::openai::{Route, SSE_PAD};

fn tokenizer() -> Tokenizer {
    let tokens = ["<|endoftext|>", "a", "b", "c", "Ġ"];
    let types = [3, 1, 1, 1, 1];
    let strings = |v: &[&str]| Meta::Array(v.iter().map(|s| Meta::String((*s).to_owned())).collect());
    let meta = [
        ("tokenizer.ggml.model", Meta::String("gpt2".into())),
        ("tokenizer.ggml.pre", Meta::String("default".into())),
        ("tokenizer.ggml.tokens", strings(&tokens)),
        ("tokenizer.ggml.token_type", Meta::Array(types.iter().map(|&t| Meta::I32(t)).collect())),
        ("tokenizer.ggml.merges", strings(&[])),
        ("tokenizer.ggml.eos_token_id", Meta::U32(0)),
    ];
    crate::text::tokenizer::from_metadata(&meta).unwrap()
}

/// A completion call parsed as the gateway parses it (prompt "ab", 2 ids).
fn call(tok: &Tokenizer, extra: &str) -> Call {
    let body = format!(r#"{{"prompt": "ab", "max_tokens": 3{extra}}}"#);
    match openai::parse(b"POST", b"/v1/completions", body.as_bytes(), tok, "m", 64).unwrap() {
        Route::Generate(c) => *c,
        r => panic!("not a generation: {r:?}"),
    }
}

fn ids() -> Ids {
    Ids { id: "cmpl-test".into(), created: 7, model: "m".into() }
}

fn done(ids: &[u32], text: &str) -> GenerateEvent {
    GenerateEvent::Done(Box::new(Generation {
        prompt_ids: vec![1, 2],
        ids: ids.to_vec(),
        text: text.into(),
        speculation: None,
        logprobs: None,
        prompt_logprobs: None,
    }))
}

/// A streamed event's JSON (`data: {…}\n:   …\n\n`), checking its padding.
fn event(step: &Step) -> Value {
    let Step::Body(b) = step else { panic!("not a body: {step:?}") };
    assert_eq!(b.len() % SSE_PAD, 0, "an event is padded to its bucket");
    let text = std::str::from_utf8(b).unwrap();
    let line = text.lines().next().unwrap().strip_prefix("data: ").unwrap();
    serde_json::from_str(line).unwrap()
}

fn body_json(step: &Step) -> Value {
    let Step::Body(b) = step else { panic!("not a body: {step:?}") };
    serde_json::from_slice(b).unwrap()
}

#[test]
fn a_stream_sends_its_head_each_piece_then_the_end_and_a_signed_finish() {
    let tok = tokenizer();
    let c = call(&tok, r#", "stream": true, "stream_options": {"include_usage": true}"#);
    let mut core = AnswerCore::new(&c, ids(), &tok);
    assert_eq!(
        core.start(),
        vec![Step::Head {
            status: 200,
            fields: vec![("content-type", EVENT_STREAM_TYPE.into()), ("cache-control", "no-cache".into())]
        }]
    );
    core.route("s1@a".into());
    let piece = core.event(0, GenerateEvent::Text("b".into()));
    assert_eq!(piece.len(), 1);
    let v = event(&piece[0]);
    assert_eq!((v["id"].as_str(), v["choices"][0]["text"].as_str()), (Some("cmpl-test"), Some("b")));
    assert!(v["choices"][0]["finish_reason"].is_null());
    assert!(!core.finished());
    let end = core.event(0, done(&[2], "b"));
    // The end chunk (stop: 1 of 3 tokens), usage, [DONE], then the finish.
    assert_eq!(end.len(), 4, "{end:?}");
    assert_eq!(event(&end[0])["choices"][0]["finish_reason"], "stop");
    let usage = event(&end[1]);
    assert_eq!(
        (usage["usage"]["prompt_tokens"].as_u64(), usage["usage"]["completion_tokens"].as_u64()),
        (Some(2), Some(1))
    );
    let Step::Body(d) = &end[2] else { panic!() };
    assert!(d.starts_with(openai::SSE_DONE.strip_suffix(b"\n").unwrap()));
    let signed = Signed { tokens: (2, 1), drafter: "none".into(), route: "s1@a".into() };
    let trailer = vec![(ROUTE_FIELD, "s1@a".to_owned()), (DRAFTER_FIELD, "none".to_owned())];
    assert_eq!(end[3], Step::Finish { receipt: Some(signed), trailer });
    assert!(core.finished());
    // Nothing goes out after the finish.
    assert!(core.event(0, GenerateEvent::Text("late".into())).is_empty());
    assert!(core.ended().is_empty());
}

#[test]
fn a_complete_answer_waits_for_every_choice_and_names_the_route_in_its_head() {
    let tok = tokenizer();
    let c = call(&tok, r#", "n": 2"#);
    let mut core = AnswerCore::new(&c, ids(), &tok);
    assert!(core.start().is_empty(), "a complete answer's head waits for the answer");
    assert!(core.event(1, GenerateEvent::Text("c".into())).is_empty());
    core.route("r0".into());
    assert!(core.event(1, done(&[3, 3, 3], "ccc")).is_empty(), "choice 0 is not done");
    core.route("r1".into());
    // A choice the call did not ask for changes nothing.
    assert!(core.event(2, done(&[1], "a")).is_empty());
    let out = core.event(0, done(&[1], "a"));
    assert_eq!(out.len(), 3, "{out:?}");
    let fields = vec![
        ("content-type", JSON_TYPE.to_owned()),
        (ROUTE_FIELD, "r0;r1".to_owned()),
        (DRAFTER_FIELD, "none | none".to_owned()),
    ];
    assert_eq!(out[0], Step::Head { status: 200, fields });
    let Step::Body(b) = &out[1] else { panic!() };
    assert_eq!(b.len() % openai::BODY_PAD, 0, "the body is padded to its bucket");
    let v = body_json(&out[1]);
    let choices = v["choices"].as_array().unwrap();
    assert_eq!((choices[0]["text"].as_str(), choices[0]["finish_reason"].as_str()), (Some("a"), Some("stop")));
    // Choice 1 used all 3 tokens: cut at the length.
    assert_eq!((choices[1]["text"].as_str(), choices[1]["finish_reason"].as_str()), (Some("ccc"), Some("length")));
    assert_eq!(v["usage"]["completion_tokens"], 4);
    let signed = Signed { tokens: (2, 4), drafter: "none | none".into(), route: "r0;r1".into() };
    assert_eq!(out[2], Step::Finish { receipt: Some(signed), trailer: Vec::new() });
}

#[test]
fn a_failure_mid_stream_is_an_error_event_signed_for_with_no_completion_tokens() {
    let tok = tokenizer();
    let c = call(&tok, r#", "stream": true"#);
    let mut core = AnswerCore::new(&c, ids(), &tok);
    core.start();
    core.event(0, GenerateEvent::Text("a".into()));
    core.route("s1".into());
    let failure = Failure { message: "stage 1 is gone".into(), blame: Blame::Pipeline };
    let out = core.event(0, GenerateEvent::Error(failure));
    assert_eq!(out.len(), 2, "{out:?}");
    let e = event(&out[0]);
    assert_eq!(
        (e["error"]["message"].as_str(), e["error"]["type"].as_str()),
        (Some("stage 1 is gone"), Some("server_error"))
    );
    let signed = Signed { tokens: (2, 0), drafter: "none".into(), route: "s1".into() };
    assert_eq!(out[1], Step::Finish { receipt: Some(signed), trailer: Vec::new() });
    assert!(core.finished());
}

#[test]
fn a_failed_complete_answer_is_an_error_answer_with_its_blames_status_and_no_receipt() {
    let tok = tokenizer();
    let mut core = AnswerCore::new(&call(&tok, ""), ids(), &tok);
    let busy = Failure { message: "no capacity".into(), blame: Blame::Busy };
    let out = core.event(0, GenerateEvent::Error(busy));
    assert_eq!(out[0], Step::Head { status: 429, fields: vec![("content-type", JSON_TYPE.into())] });
    assert_eq!(body_json(&out[1])["error"]["type"], "rate_limit_error");
    assert_eq!(out[2], Step::Finish { receipt: None, trailer: Vec::new() });
    // A refusal is the request's fault: a 400 naming it.
    let mut core = AnswerCore::new(&call(&tok, ""), ids(), &tok);
    let out = core.event(0, GenerateEvent::Refused("the grammar cannot start".into()));
    assert_eq!(out[0], Step::Head { status: 400, fields: vec![("content-type", JSON_TYPE.into())] });
    assert_eq!(body_json(&out[1])["error"]["param"], "request");
}

#[test]
fn sessions_that_end_before_every_choice_is_done_are_the_pipelines_error_never_a_short_answer() {
    let tok = tokenizer();
    let c = call(&tok, r#", "n": 2"#);
    let mut core = AnswerCore::new(&c, ids(), &tok);
    assert!(core.event(0, done(&[1], "a")).is_empty());
    let out = core.ended();
    assert_eq!(
        out[0],
        Step::Head { status: Blame::Pipeline.status(), fields: vec![("content-type", JSON_TYPE.into())] }
    );
    assert_eq!(body_json(&out[1])["error"]["message"], "generation ended");
    assert_eq!(out[2], Step::Finish { receipt: None, trailer: Vec::new() });
}

#[test]
fn logprobs_wait_for_their_text_and_go_out_with_it() {
    let tok = tokenizer();
    let c = call(&tok, r#", "stream": true, "logprobs": 1"#);
    let mut core = AnswerCore::new(&c, ids(), &tok);
    let lp = TokenLogprob { token: 1, logprob: -0.5, top: vec![(1, -0.5)] };
    assert!(core.event(0, GenerateEvent::Logprobs(vec![lp])).is_empty(), "held until its text");
    let out = core.event(0, GenerateEvent::Text("a".into()));
    let v = event(&out[0]);
    assert_eq!(v["choices"][0]["logprobs"]["tokens"][0], "a");
    assert_eq!(v["choices"][0]["logprobs"]["token_logprobs"][0], -0.5);
}
