//! The OpenAI-compatible request layer on the reference model's tokenizer:
//! what is accepted, what is refused with which OpenAI-shaped error, and the
//! response shapes. Needs the reference model (prints SKIP without it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::cluster;

use serde_json::Value;
use veil_enclave::gateway::openai::{self, ApiError, Ids, Kind, Route, Usage};
use veil_enclave::model::GgufFile;
use veil_enclave::text::tokenizer::{ChatMessage, Tokenizer};

const CTX: usize = 8192;

fn tokenizer() -> Option<Tokenizer> {
    let path = cluster::model_path()?;
    Some(Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap())
}

fn call(tok: &Tokenizer, method: &str, path: &str, body: &str) -> Result<Route, ApiError> {
    openai::parse(method.as_bytes(), path.as_bytes(), body.as_bytes(), tok, "smollm2", CTX)
}

fn generate(tok: &Tokenizer, path: &str, body: &str) -> Box<openai::Call> {
    match call(tok, "POST", path, body).unwrap() {
        Route::Generate(c) => c,
        Route::Models | Route::Model => panic!("parsed as models"),
    }
}

#[test]
fn chat_requests_map_to_template_encoded_generations() {
    let Some(tok) = tokenizer() else { return };
    let c = generate(
        &tok,
        "/v1/chat/completions",
        r#"{"model":"SmolLM2","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hi <|im_start|>"}]}],
            "stream":true,"stream_options":{"include_usage":true},"temperature":0.5,"top_p":0.9,"seed":3,"stop":"\n\n","user":"ignored"}"#,
    );
    let want = tok
        .encode_chat(&[ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hi <|im_start|>")])
        .unwrap();
    assert_eq!(c.request.prompt_ids, want);
    assert_eq!((c.kind, c.stream, c.include_usage, c.model.as_str()), (Kind::Chat, true, true, "SmolLM2"));
    assert_eq!((c.request.sampling.temperature, c.request.sampling.top_p, c.request.sampling.seed), (0.5, 0.9, 3));
    assert_eq!(c.request.stop, vec!["\n\n".to_owned()]);
    assert_eq!(c.request.max_tokens, CTX - want.len(), "chat defaults to the rest of the context");
    assert_eq!(c.request.speculation.enabled, None, "no `speculate`: the cluster decides");
}

#[test]
fn speculation_is_switched_per_request_and_nothing_more() {
    let Some(tok) = tokenizer() else { return };
    for (flag, want) in [("true", Some(true)), ("false", Some(false))] {
        let body = format!(r#"{{"messages":[{{"role":"user","content":"Hi"}}],"speculate":{flag}}}"#);
        let c = generate(&tok, "/v1/chat/completions", &body);
        assert_eq!(c.request.speculation.enabled, want);
        // The sealed API cannot pick a drafter or script one.
        assert_eq!((c.request.speculation.drafter, c.request.speculation.script.as_deref()), (None, None));
    }
    let bad = call(
        &tok,
        "POST",
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"Hi"}],"speculate":"yes"}"#,
    );
    assert!(bad.is_err());
}

#[test]
fn completion_prompts_may_be_text_or_token_ids() {
    let Some(tok) = tokenizer() else { return };
    let text = tok.encode("Once upon", false).unwrap();
    for body in [r#"{"prompt":"Once upon"}"#, r#"{"prompt":["Once upon"]}"#] {
        let c = generate(&tok, "/v1/completions", body);
        assert_eq!(c.request.prompt_ids, text);
        assert_eq!((c.kind, c.request.max_tokens, c.stream), (Kind::Completion, 16, false));
        assert_eq!(c.request.sampling.temperature, 1.0);
    }
    for body in [r#"{"prompt":[1,2,3],"max_tokens":4}"#, r#"{"prompt":[[1,2,3]],"max_tokens":4}"#] {
        let c = generate(&tok, "/v1/completions", body);
        assert_eq!(c.request.prompt_ids, [1, 2, 3]);
    }
    assert!(matches!(call(&tok, "GET", "/v1/models", ""), Ok(Route::Models)));
}

#[test]
fn bad_requests_get_openai_shaped_errors() {
    let Some(tok) = tokenizer() else { return };
    let cases: [(&str, &str, &str, u16, Option<&str>); 18] = [
        ("POST", "/v1/chat/completions", r#"{"messages":[{"role":"user","content":"x"}],"n":0}"#, 400, Some("n")),
        ("POST", "/v1/chat/completions", "{not json", 400, Some("body")),
        ("POST", "/v1/chat/completions", r#"{"messages":[]}"#, 400, Some("messages")),
        // A tool message answers a call: without its id it is refused.
        ("POST", "/v1/chat/completions", r#"{"messages":[{"role":"tool","content":"x"}]}"#, 400, Some("messages")),
        ("POST", "/v1/chat/completions", r#"{"messages":[{"role":"robot","content":"x"}]}"#, 400, Some("messages")),
        ("POST", "/v1/chat/completions", r#"{"messages":[{"role":"user","content":"x"}],"n":9}"#, 400, Some("n")),
        (
            "POST",
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"x"}],"logprobs":"yes"}"#,
            400,
            Some("logprobs"),
        ),
        (
            "POST",
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"x"}],"temperature":3}"#,
            400,
            Some("temperature"),
        ),
        (
            "POST",
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":100000}"#,
            400,
            Some("max_tokens"),
        ),
        ("POST", "/v1/completions", r#"{"prompt":["a","b"]}"#, 400, Some("prompt")),
        ("POST", "/v1/completions", r#"{"prompt":[1,99999999]}"#, 400, Some("prompt")),
        ("POST", "/v1/completions", r#"{"prompt":""}"#, 400, Some("prompt")),
        ("POST", "/v1/completions", r#"{"prompt":"x","echo":true,"stream":true}"#, 400, Some("echo")),
        (
            "POST",
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"x"}],"echo":true}"#,
            400,
            Some("echo"),
        ),
        ("POST", "/v1/completions", r#"{"prompt":"x","max_tokens":0}"#, 400, Some("max_tokens")),
        ("GET", "/v1/completions", "", 405, None),
        ("POST", "/v1/embeddings", "{}", 404, None),
        ("POST", "/v1/completions", "", 400, Some("body")),
    ];
    for (method, path, body, status, param) in cases {
        let err = call(&tok, method, path, body).unwrap_err();
        assert_eq!((err.status, err.param), (status, param), "{method} {path} {body}");
        let v: Value = serde_json::from_slice(&err.body()).unwrap();
        assert!(v["error"]["message"].is_string() && v["error"]["type"].is_string(), "{v}");
    }
    let long = format!(r#"{{"prompt":"{}"}}"#, "word ".repeat(9000));
    assert_eq!(call(&tok, "POST", "/v1/completions", &long).unwrap_err().param, Some("messages"));
    let huge = format!(r#"{{"prompt":"{}"}}"#, "x".repeat(openai::MAX_BODY));
    assert_eq!(call(&tok, "POST", "/v1/completions", &huge).unwrap_err().status, 413);
}

/// `echo` on a completion (what lm-evaluation-harness sends to score a
/// text): the prompt is kept for the answer, scored when `logprobs` is
/// asked, and `max_tokens` 0 generates nothing.
#[test]
fn echo_scores_the_prompt_of_a_completion() {
    let Some(tok) = tokenizer() else { return };
    let c = generate(&tok, "/v1/completions", r#"{"prompt":"The cat sat","echo":true,"logprobs":2,"max_tokens":0}"#);
    assert_eq!(c.echo.as_deref(), Some("The cat sat"));
    assert_eq!((c.request.max_tokens, c.request.score_prompt, c.request.sampling.logprobs), (0, true, Some(2)));
    let ids = tok.encode("The cat sat", false).unwrap();
    let body = serde_json::json!({ "prompt": ids, "echo": true, "max_tokens": 1 }).to_string();
    let c = generate(&tok, "/v1/completions", &body);
    assert_eq!(c.echo, Some(tok.decode(&ids).unwrap()), "token ids are echoed as their text");
    assert!(!c.request.score_prompt, "no logprobs: nothing to score");
    let c = generate(&tok, "/v1/completions", r#"{"prompt":"x","max_tokens":1}"#);
    assert!(c.echo.is_none() && !c.request.score_prompt);

    // The response: the prompt's tokens first, the first unscored.
    let lp =
        |token: u32, logprob: f32| veil_enclave::generate::TokenLogprob { token, logprob, top: vec![(token, logprob)] };
    let v = openai::echo_logprobs_json(&tok, &ids, &[lp(ids[1], -1.5), lp(ids[2], -0.25)], &[lp(ids[0], -3.0)]);
    assert_eq!(v["token_logprobs"], serde_json::json!([null, -1.5, -0.25, -3.0]));
    assert_eq!(v["top_logprobs"][0], Value::Null);
    assert_eq!(v["tokens"].as_array().map(Vec::len), Some(4));
    let offsets: Vec<u64> = v["text_offset"].as_array().unwrap().iter().map(|o| o.as_u64().unwrap()).collect();
    assert!(offsets.windows(2).all(|w| w[0] < w[1]) && offsets[0] == 0, "{offsets:?}");
}

#[test]
fn response_shapes_follow_openai() {
    let ids = Ids { id: "chatcmpl-1".into(), created: 7, model: "m".into() };
    let v: Value = serde_json::from_slice(&openai::complete_body(
        Kind::Chat,
        &ids,
        &[openai::Choice { text: "Paris.", reasoning: None, finish: "stop", logprobs: None, tool_calls: None }],
        Usage::new(5, 2),
    ))
    .unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], "Paris.");
    assert_eq!(v["usage"]["total_tokens"], 7);
    // An event's data line (events carry a padding comment line after it).
    let data = |event: &[u8]| -> Value {
        let text = String::from_utf8(event.to_vec()).unwrap();
        assert!(text.ends_with("\n\n") && text.len().is_multiple_of(openai::SSE_PAD), "{text:?}");
        serde_json::from_str(text.lines().find_map(|l| l.strip_prefix("data: ")).unwrap()).unwrap()
    };
    let first = openai::sse_chunk(Kind::Chat, &ids, 0, Some("Pa"), None, true, None);
    assert!(first.starts_with(b"data: {"));
    let v = data(&first);
    assert_eq!(
        (v["object"].as_str(), v["choices"][0]["delta"]["role"].as_str()),
        (Some("chat.completion.chunk"), Some("assistant"))
    );
    let last = openai::sse_chunk(Kind::Completion, &ids, 2, None, Some("length"), false, None);
    let v = data(&last);
    assert_eq!(
        (v["choices"][0]["finish_reason"].as_str(), v["choices"][0]["text"].as_str()),
        (Some("length"), Some(""))
    );
    assert_eq!(v["choices"][0]["index"], 2, "a chunk names its choice");
    let u = openai::sse_usage(Kind::Chat, &ids, Usage::new(1, 1));
    let v = data(&u);
    assert_eq!(v["choices"].as_array().map(Vec::len), Some(0));
    let m: Value = serde_json::from_slice(&openai::models_body("m", 1)).unwrap();
    assert_eq!(m["data"][0]["id"], "m");
}

/// Abusive but well-formed requests: too many messages, a max_tokens that
/// would overflow, and unseeded sampling that must not repeat itself.
#[test]
fn abusive_requests_get_400s_and_unseeded_requests_differ() {
    let Some(tok) = tokenizer() else { return };
    let many = |n: usize| {
        let msgs: Vec<Value> =
            (0..n).map(|i| serde_json::json!({"role": "user", "content": format!("m{i}")})).collect();
        serde_json::json!({ "messages": msgs }).to_string()
    };
    let e = call(&tok, "POST", "/v1/chat/completions", &many(openai::MAX_MESSAGES + 1)).err().unwrap();
    assert_eq!((e.status, e.param), (400, Some("messages")));
    // Many messages encode in one left-to-right pass (the former marker
    // search was quadratic), each message's text in its place.
    let n = 600;
    let c = generate(&tok, "/v1/chat/completions", &many(n));
    let msgs: Vec<ChatMessage> = (0..n).map(|i| ChatMessage::new("user", format!("m{i}"))).collect();
    let text = tok.decode(&c.request.prompt_ids).unwrap();
    let at = |needle: String| text.find(&format!("{needle}<")).or_else(|| text.find(&format!("{needle}\n"))).unwrap();
    assert!(at("m0".into()) < at("m1".into()) && at("m1".into()) < at(format!("m{}", n - 1)), "{}", &text[..80]);
    assert_eq!(c.request.prompt_ids, tok.encode_chat(&msgs).unwrap());
    for max in [usize::MAX, usize::MAX / 2 + 1, CTX] {
        let body = format!(r#"{{"messages":[{{"role":"user","content":"Hi"}}],"max_tokens":{max}}}"#);
        let e = call(&tok, "POST", "/v1/chat/completions", &body).err().unwrap();
        assert_eq!((e.status, e.param), (400, Some("max_tokens")), "{max}");
    }
    let body = r#"{"messages":[{"role":"user","content":"Hi"}],"temperature":1}"#;
    let seeds: std::collections::HashSet<u64> =
        (0..8).map(|_| generate(&tok, "/v1/chat/completions", body).request.sampling.seed).collect();
    assert_eq!(seeds.len(), 8, "unseeded requests share a seed");
    let seeded = r#"{"messages":[{"role":"user","content":"Hi"}],"seed":7}"#;
    assert_eq!(generate(&tok, "/v1/chat/completions", seeded).request.sampling.seed, 7);
}

/// Another model's name gets OpenAI's 404 `model_not_found` (not this model
/// answering under that name); the served model can be retrieved by id.
#[test]
fn unknown_models_are_404_and_the_served_one_can_be_retrieved() {
    let Some(tok) = tokenizer() else { return };
    for (method, path, body) in [
        ("POST", "/v1/chat/completions", r#"{"model":"gpt-4","messages":[{"role":"user","content":"Hi"}]}"#),
        ("POST", "/v1/completions", r#"{"model":"gpt-4","prompt":"Hi"}"#),
        ("GET", "/v1/models/gpt-4", ""),
    ] {
        let e = call(&tok, method, path, body).err().unwrap();
        assert_eq!((e.status, e.param, e.code()), (404, Some("model"), Some("model_not_found")), "{path}");
        let v: Value = serde_json::from_slice(&e.body()).unwrap();
        assert_eq!(v["error"]["code"], "model_not_found");
        assert!(v["error"]["message"].as_str().unwrap().contains("gpt-4"));
    }
    assert!(matches!(call(&tok, "GET", "/v1/models/smollm2", ""), Ok(Route::Model)));
    let ok = r#"{"model":"smollm2","messages":[{"role":"user","content":"Hi"}]}"#;
    assert!(call(&tok, "POST", "/v1/chat/completions", ok).is_ok());
    let v: Value = serde_json::from_slice(&openai::model_body("smollm2", 1)).unwrap();
    assert_eq!((v["id"].as_str(), v["object"].as_str()), (Some("smollm2"), Some("model")));
}

/// A prompt too long for the context in any tokenization is refused before
/// tokenizing (a 900 KB prompt costs no tokenizer allocations).
#[test]
fn oversized_prompts_are_refused_before_tokenizing() {
    let Some(tok) = tokenizer() else { return };
    let big = "word ".repeat(180_000);
    let chat = serde_json::json!({"messages": [{"role": "user", "content": big}]}).to_string();
    let e = call(&tok, "POST", "/v1/chat/completions", &chat).err().unwrap();
    assert_eq!((e.status, e.param), (400, Some("messages")));
    assert!(e.message.contains("bytes"), "{}", e.message);
    let completion = serde_json::json!({"prompt": big}).to_string();
    let e = call(&tok, "POST", "/v1/completions", &completion).err().unwrap();
    assert_eq!((e.status, e.param), (400, Some("prompt")));
    assert!(openai::MAX_BYTES_PER_TOKEN * CTX < big.len());
}

/// What a chat app sends: defaults pass; penalties, logit bias and
/// log-probabilities in OpenAI's ranges are taken into the sampling
/// parameters; out of range, or what is not implemented, is refused by
/// name, never silently ignored.
#[test]
fn chat_app_parameters_pass_at_defaults_and_are_refused_otherwise() {
    let Some(tok) = tokenizer() else { return };
    let with = |extra: &str| format!(r#"{{"messages":[{{"role":"user","content":"Hi"}}],"user":"u1","n":1{extra}}}"#);
    for ok in [
        "",
        r#","presence_penalty":0,"frequency_penalty":0"#,
        r#","logit_bias":{}"#,
        r#","tools":[]"#,
        r#","response_format":{"type":"text"}"#,
        r#","logprobs":false"#,
    ] {
        let c = generate(&tok, "/v1/chat/completions", &with(ok));
        let s = &c.request.sampling;
        assert_eq!((s.presence_penalty, s.frequency_penalty, s.logit_bias.len(), s.logprobs), (0.0, 0.0, 0, None));
    }
    let c = generate(
        &tok,
        "/v1/chat/completions",
        &with(
            r#","presence_penalty":0.5,"frequency_penalty":-1,"logit_bias":{"300":-100,"7":2.5},"logprobs":true,"top_logprobs":3"#,
        ),
    );
    let s = &c.request.sampling;
    assert_eq!((s.presence_penalty, s.frequency_penalty, s.repetition_penalty), (0.5, -1.0, 1.0));
    let repeat = generate(&tok, "/v1/chat/completions", &with(r#","repetition_penalty":1.1"#));
    assert_eq!(repeat.request.sampling.repetition_penalty, 1.1);
    assert_eq!(s.logit_bias, vec![(7, 2.5), (300, -100.0)], "ascending ids");
    assert_eq!(s.logprobs, Some(3));
    assert_eq!(generate(&tok, "/v1/chat/completions", &with(r#","logprobs":true"#)).request.sampling.logprobs, Some(0));
    let legacy = generate(&tok, "/v1/completions", r#"{"prompt":"Hi","logprobs":2}"#);
    assert_eq!(legacy.request.sampling.logprobs, Some(2));
    assert_eq!((legacy.n, generate(&tok, "/v1/completions", r#"{"prompt":"Hi","n":8}"#).n), (1, 8));
    let vocab = tok.vocab_size();
    let outside = format!(r#","logit_bias":{{"{vocab}":1}}"#);
    let many: String = (0..1025).map(|i| format!(r#""{i}":1"#)).collect::<Vec<_>>().join(",");
    let too_many = format!(r#","logit_bias":{{{many}}}"#);
    let huge_schema = format!(
        r#","response_format":{{"type":"json_schema","json_schema":{{"schema":{{"description":"{}"}}}}}}"#,
        "x".repeat(40_000)
    );
    use veil_enclave::text::grammar::ResponseFormat;
    let object = generate(&tok, "/v1/chat/completions", &with(r#","response_format":{"type":"json_object"}"#));
    assert_eq!(object.request.sampling.response_format, Some(ResponseFormat::JsonObject));
    let schema = generate(
        &tok,
        "/v1/chat/completions",
        &with(
            r#","response_format":{"type":"json_schema","json_schema":{"name":"p","strict":true,"schema":{"type":"object"}}}"#,
        ),
    );
    assert_eq!(
        schema.request.sampling.response_format,
        Some(ResponseFormat::JsonSchema { schema: r#"{"type":"object"}"#.into() })
    );
    for (bad, param) in [
        (r#","presence_penalty":2.5"#, "presence_penalty"),
        (r#","frequency_penalty":-2.01"#, "frequency_penalty"),
        (r#","repetition_penalty":0"#, "repetition_penalty"),
        (r#","repetition_penalty":2.5"#, "repetition_penalty"),
        (r#","repetition_penalty":-1"#, "repetition_penalty"),
        (r#","logit_bias":{"50":-101}"#, "logit_bias"),
        (r#","logit_bias":{"fifty":1}"#, "logit_bias"),
        (r#","logit_bias":{"50":"high"}"#, "logit_bias"),
        (r#","logit_bias":[1,2]"#, "logit_bias"),
        (outside.as_str(), "logit_bias"),
        (too_many.as_str(), "logit_bias"),
        (r#","logprobs":true,"top_logprobs":21"#, "top_logprobs"),
        (r#","top_logprobs":2"#, "top_logprobs"),
        (r#","tools":[{"type":"function","function":{"name":"f"}}]"#, "tools"),
        (r#","response_format":{"type":"xml"}"#, "response_format"),
        (r#","response_format":{"type":"json_schema","json_schema":{"name":"x"}}"#, "response_format"),
        (r#","response_format":{"type":"json_schema","json_schema":{"schema":true}}"#, "response_format"),
        (huge_schema.as_str(), "response_format"),
    ] {
        let e = call(&tok, "POST", "/v1/chat/completions", &with(bad)).err().unwrap();
        assert_eq!((e.status, e.param), (400, Some(param)), "{bad}");
    }
    for bad in [r#"{"prompt":"Hi","logprobs":6}"#, r#"{"prompt":"Hi","logprobs":true}"#] {
        let e = call(&tok, "POST", "/v1/completions", bad).err().unwrap();
        assert_eq!((e.status, e.param), (400, Some("logprobs")), "{bad}");
    }
}
