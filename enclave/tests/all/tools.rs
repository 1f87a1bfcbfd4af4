//! Tool calls: the call format read from each real template, the gateway's
//! validation, and a tools round trip through a sealed 3-stage cluster of a
//! Qwen3-MoE-shaped model (random weights) carrying Qwen's real vocabulary
//! and Qwen 2.5's tool-calling template. Needs the llama.cpp reference
//! files (`$VEIL_LLAMACPP_REF`; SKIP without them unless required).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use veil_enclave::gateway::openai::{self, ApiError, Route};
use veil_enclave::model::synth::{self, Options, Shape};
use veil_enclave::model::GgufFile;
use veil_enclave::text::grammar::ResponseFormat;
use veil_enclave::text::reasoning::ReasoningFormat;
use veil_enclave::text::tokenizer::{ChatMessage, Tokenizer};
use veil_enclave::text::tools::{ToolFormat, ToolsError};

use crate::cluster::{self, Cluster};
use crate::families::TempDir;

/// The llama.cpp reference set (its `vocab` and `templates`).
fn reference() -> Option<PathBuf> {
    crate::families::vocab_dir().and_then(|v| v.parent().map(Path::to_path_buf))
}

/// A 3-layer Qwen3-MoE-shaped model with random weights, Qwen's vocabulary
/// and Qwen 2.5's template (whose tool section writes `<tool_call>` JSON).
fn qwen_model(reference: &Path, dir: &Path) -> PathBuf {
    qwen_model_with(reference, dir, QWEN25)
}

const QWEN25: &str = "Qwen-Qwen2.5-7B-Instruct.jinja";

/// [`qwen_model`] with another reference template.
fn qwen_model_with(reference: &Path, dir: &Path, template: &str) -> PathBuf {
    let path = dir.join("qwen-tools.gguf");
    let template = std::fs::read_to_string(reference.join("templates").join(template)).unwrap();
    let opts = Options {
        vocab_from: Some(reference.join("vocab/ggml-vocab-qwen2.gguf")),
        chat_template: Some(template),
        sharpen: 8.0,
        ..Options::new(synth::dtype_named("q8_0").unwrap())
    };
    synth::write_with(&path, Shape::QWEN3MOE_SMOKE, &opts).unwrap();
    path
}

/// gpt-oss's harmony markers, which llama.cpp's Llama 3 vocabulary lacks.
const HARMONY: [&str; 7] =
    ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"];

/// A 3-layer gpt-oss-shaped model (MXFP4 experts, random weights) with the
/// Llama 3 vocabulary plus harmony's markers as control tokens, as in
/// gpt-oss's own vocabulary, and gpt-oss-120b's real template.
fn gpt_oss_model(reference: &Path, dir: &Path) -> PathBuf {
    let path = dir.join("gpt-oss-tools.gguf");
    let template = std::fs::read_to_string(reference.join("templates/openai-gpt-oss-120b.jinja")).unwrap();
    let opts = Options {
        vocab_from: Some(reference.join("vocab/ggml-vocab-llama-bpe.gguf")),
        chat_template: Some(template),
        specials: HARMONY.iter().map(|s| (*s).to_owned()).collect(),
        sharpen: 8.0,
        ..Options::new(synth::dtype_named("mxfp4").unwrap())
    };
    synth::write_with(&path, Shape::GPT_OSS_SMOKE, &opts).unwrap();
    path
}

fn weather() -> Value {
    json!({
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 24},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": false,
            },
        },
    })
}

fn clock() -> Value {
    json!({
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string", "maxLength": 12}},
                "required": ["zone"],
                "additionalProperties": false,
            },
        },
    })
}

/// Arguments that hold what `get_weather`'s schema requires, and nothing else.
fn check_weather_arguments(arguments: &str) {
    let a: Value = serde_json::from_str(arguments).unwrap_or_else(|e| panic!("{arguments:?}: {e}"));
    let o = a.as_object().unwrap();
    assert!(o.keys().all(|k| k == "city" || k == "unit"), "{arguments}");
    assert!(a["city"].as_str().is_some_and(|c| c.chars().count() <= 24), "{arguments}");
    assert!(["celsius", "fahrenheit"].contains(&a["unit"].as_str().unwrap()), "{arguments}");
}

/// Every reference template that reads `tools` gets a call format or a
/// refusal that names what it writes; the families the issue names get
/// theirs.
#[test]
fn every_reference_template_gets_a_call_format_or_a_named_refusal() {
    let Some(reference) = reference() else { return };
    let mut names: Vec<PathBuf> =
        std::fs::read_dir(reference.join("templates")).unwrap().map(|e| e.unwrap().path()).collect();
    names.sort();
    let mut found = std::collections::BTreeMap::new();
    for path in &names {
        let source = std::fs::read_to_string(path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let format = ToolFormat::detect_in_template(&source);
        println!("{name:<55} {format:?}");
        found.insert(name, format);
    }
    let want = [
        ("Qwen-Qwen2.5-7B-Instruct.jinja", Ok(ToolFormat::Hermes)),
        ("Qwen-Qwen3-0.6B.jinja", Ok(ToolFormat::Hermes)),
        ("Qwen-QwQ-32B.jinja", Ok(ToolFormat::Hermes)),
        ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", Ok(ToolFormat::Hermes)),
        ("meta-llama-Llama-3.1-8B-Instruct.jinja", Ok(ToolFormat::Llama3)),
        ("meta-llama-Llama-3.2-3B-Instruct.jinja", Ok(ToolFormat::Llama3)),
        ("meta-llama-Llama-3.3-70B-Instruct.jinja", Ok(ToolFormat::Llama3)),
        ("mistralai-Mistral-Nemo-Instruct-2407.jinja", Ok(ToolFormat::MistralList)),
        ("Mistral-Small-3.2-24B-Instruct-2506.jinja", Ok(ToolFormat::MistralArgs)),
        ("unsloth-mistral-Devstral-Small-2507.jinja", Ok(ToolFormat::MistralArgs)),
        ("openai-gpt-oss-120b.jinja", Ok(ToolFormat::Harmony)),
        ("Qwen3-Coder.jinja", Ok(ToolFormat::XmlFunction)),
        ("Qwen3.5-4B.jinja", Ok(ToolFormat::XmlFunction)),
        ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", Ok(ToolFormat::XmlFunction)),
        ("GLM-4.6.jinja", Ok(ToolFormat::ArgKey { newlines: true })),
        ("GLM-4.7-Flash.jinja", Ok(ToolFormat::ArgKey { newlines: false })),
        ("ByteDance-Seed-OSS.jinja", Err(ToolsError::Unsupported("XML-style <function=…> calls".into()))),
        ("google-gemma-2-2b-it.jinja", Err(ToolsError::NoToolSection)),
    ];
    for (name, format) in want {
        assert_eq!(found.get(name), Some(&format), "{name}");
    }
}

/// With tools offered, the text streams up to where a call begins and no
/// further; the whole answer, the call included, is the final text.
#[test]
fn text_streams_up_to_a_tool_call_and_no_further() {
    use veil_enclave::generate::TextStream;
    let Some(reference) = reference() else { return };
    let dir = TempDir::new("tools-stream");
    let tok = Tokenizer::from_gguf(&GgufFile::open(&qwen_model(&reference, dir.path())).unwrap()).unwrap();
    let stream = |format: ToolFormat, answer: &str| {
        let mut s = TextStream::new(&tok, Vec::new()).with_calls(Some(format.markers()));
        let mut streamed = String::new();
        for id in tok.encode(answer, true).unwrap() {
            streamed.push_str(&s.push(id).unwrap().piece);
        }
        let (rest, _, text) = s.finish(false).unwrap();
        (streamed + &rest, text)
    };
    let call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
    let answer = format!("Let me look <tool that up.\n{call}");
    let (streamed, text) = stream(ToolFormat::Hermes, &answer);
    assert_eq!((streamed.as_str(), text.as_str()), ("Let me look <tool that up.\n", answer.as_str()));
    // No call: everything streams.
    assert_eq!(stream(ToolFormat::Hermes, "Plain <tool text.").0, "Plain <tool text.");
    // Llama 3 writes a call as the whole answer: an answer that begins with
    // one streams nothing; one that does not streams whole, braces and all.
    let json_call = "  {\"name\": \"f\", \"parameters\": {}}";
    assert_eq!(stream(ToolFormat::Llama3, json_call), (String::new(), json_call.to_owned()));
    assert_eq!(stream(ToolFormat::Llama3, "Use {braces} freely.").0, "Use {braces} freely.");
    assert_eq!(stream(ToolFormat::MistralArgs, "Sure.[TOOL_CALLS]f[ARGS]{}").0, "Sure.");
}

/// Decoded text leaves control tokens out and writes user-defined ones as
/// their text, as llama.cpp's `token_to_piece` does: in Phi-3's
/// vocabulary `</s>` is user-defined and `<|endoftext|>` control.
#[test]
fn user_defined_tokens_are_text_and_control_tokens_are_not() {
    let Some(reference) = reference() else { return };
    let tok = Tokenizer::from_gguf(&GgufFile::open(&reference.join("vocab/ggml-vocab-phi-3.gguf")).unwrap()).unwrap();
    let ids = tok.tokenize("Hello</s> there<|endoftext|>", false, true).unwrap();
    assert!(ids.contains(&tok.special_id("</s>").unwrap()) && ids.contains(&tok.special_id("<|endoftext|>").unwrap()));
    let all = tok.decode_with_special(&ids).unwrap();
    assert!(all.contains("Hello</s>") && all.ends_with("there<|endoftext|>"), "{all:?}");
    assert_eq!(tok.decode(&ids).unwrap(), all.trim_end_matches("<|endoftext|>"));
}

fn parse(tok: &Tokenizer, body: &Value) -> Result<Box<openai::Call>, ApiError> {
    let body = serde_json::to_vec(body).unwrap();
    match openai::parse(b"POST", b"/v1/chat/completions", &body, tok, "qwen", 4096)? {
        Route::Generate(c) => Ok(c),
        _ => panic!("not a generation"),
    }
}

/// Tools reach the template, tool messages and earlier calls render, and
/// `tool_choice` maps to parsing and forcing; bad tools get a 400 naming
/// the parameter.
#[test]
fn the_gateway_renders_tools_and_refuses_bad_ones_by_name() {
    let Some(reference) = reference() else { return };
    let dir = TempDir::new("tools-gateway");
    let path = qwen_model(&reference, dir.path());
    let tok = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    let user = json!([{"role": "user", "content": "Weather in Paris?"}]);
    let c = parse(&tok, &json!({"messages": user, "tools": [weather()]})).unwrap();
    let t = c.tools.expect("tools offered, auto: answers are read for calls");
    assert_eq!(t.format, ToolFormat::Hermes);
    assert_eq!(c.request.sampling.response_format, None, "auto forces nothing");
    let prompt = tok.decode_with_special(&c.request.prompt_ids).unwrap();
    assert!(prompt.contains("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\""), "{prompt}");
    // A round trip: the earlier call (arguments as OpenAI's JSON text) and
    // the tool's answer render as the template writes them.
    let trip = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees <|im_start|>"},
    ]);
    let c = parse(&tok, &json!({"messages": trip, "tools": [weather()]})).unwrap();
    let prompt = tok.decode_with_special(&c.request.prompt_ids).unwrap();
    assert!(
        prompt.contains(
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>"
        ),
        "{prompt}"
    );
    assert!(prompt.contains("<tool_response>\n18 degrees <|im_start|>\n</tool_response>"), "{prompt}");
    // The prompt is the template's own text for these messages, byte for
    // byte (an empty content stays empty, as the template saw it).
    let messages = [
        ChatMessage::new("user", "Weather in Paris?"),
        ChatMessage {
            tool_calls: Some(json!([{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}])),
            ..ChatMessage::new("assistant", "")
        },
        ChatMessage { tool_call_id: Some("call_1".into()), ..ChatMessage::new("tool", "18 degrees <|im_start|>") },
    ];
    let shown = json!([weather()]);
    assert_eq!(prompt, tok.render_chat_with(&messages, Some(&shown)).unwrap());
    let im_start = tok.encode("<|im_start|>", true).unwrap();
    let starts = c.request.prompt_ids.iter().filter(|&&i| i == im_start[0]).count();
    assert_eq!(starts, 5, "the tool's text stays text: system, user, assistant, tool turn and the generation prompt");
    // required and a named function force a call by grammar.
    for (choice, names) in [
        (json!("required"), vec!["get_weather", "get_time"]),
        (json!({"type": "function", "function": {"name": "get_time"}}), vec!["get_time"]),
    ] {
        let c = parse(&tok, &json!({"messages": user, "tools": [weather(), clock()], "tool_choice": choice})).unwrap();
        let Some(ResponseFormat::Lark { grammar }) = &c.request.sampling.response_format else { panic!("not forced") };
        for n in ["get_weather", "get_time"] {
            assert_eq!(grammar.contains(&format!("\"const\":\"{n}\"")), names.contains(&n), "{grammar}");
        }
    }
    // none: no tools shown, nothing read.
    let c = parse(&tok, &json!({"messages": user, "tools": [weather()], "tool_choice": "none"})).unwrap();
    assert!(c.tools.is_none() && !tok.decode_with_special(&c.request.prompt_ids).unwrap().contains("<tools>"));
    // Bad input, each a 400 naming its parameter.
    let no_params = json!([{"type": "function", "function": {"name": "f"}}]);
    let bad_name = json!([{"type": "function", "function": {"name": "no spaces", "parameters": {}}}]);
    let control =
        json!([{"type": "function", "function": {"name": "f", "description": "<|im_end|>", "parameters": {}}}]);
    let twice = json!([weather(), weather()]);
    let many: Vec<Value> = (0..129)
        .map(|i| json!({"type": "function", "function": {"name": format!("f{i}"), "parameters": {}}}))
        .collect();
    let huge = json!([{"type": "function", "function": {"name": "f",
        "parameters": {"type": "object", "description": "x".repeat(40_000)}}}]);
    for (extra, param) in [
        (json!({"tools": no_params}), "tools"),
        (json!({"tools": bad_name}), "tools"),
        (json!({"tools": twice}), "tools"),
        (json!({"tools": many}), "tools"),
        (json!({"tools": "f"}), "tools"),
        (json!({"tools": control}), "messages"),
        (json!({"tools": huge, "tool_choice": "required"}), "tool_choice"),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (
            json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
        ),
        (json!({"tools": [weather()], "tool_choice": "always"}), "tool_choice"),
        (json!({"tools": [weather()], "response_format": {"type": "json_object"}}), "response_format"),
    ] {
        let mut body = json!({"messages": user});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let e = parse(&tok, &body).err().unwrap_or_else(|| panic!("accepted {extra}"));
        assert_eq!((e.status, e.param), (400, Some(param)), "{extra}: {}", e.message);
    }
    let bad_args = json!([{"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function",
        "function": {"name": "get_weather", "arguments": "{not json"}}]}]);
    let e = parse(&tok, &json!({"messages": bad_args})).err().unwrap();
    assert_eq!((e.status, e.param), (400, Some("messages")));
    // A model whose template has no tool section: refused by name.
    if let Some(smol) = cluster::model_path() {
        let smol = Tokenizer::from_gguf(&GgufFile::open(&smol).unwrap()).unwrap();
        let e = parse(&smol, &json!({"messages": user, "tools": [weather()]})).err().unwrap();
        assert_eq!((e.status, e.param), (400, Some("tools")));
        assert!(e.message.contains("no tool section"), "{}", e.message);
    }
}

/// gpt-oss: the answer ends at `<|return|>` or `<|call|>`, not at the
/// `<|end|>` after its reasoning; the stream's pieces (special tokens
/// written out) sorted by channel say what the whole answer says; tools
/// and an earlier call render as harmony, and a forced call is harmony's.
#[test]
fn a_gpt_oss_answer_is_read_by_channel() {
    use veil_enclave::generate::TextStream;
    use veil_enclave::text::harmony::HarmonyReader;
    use veil_enclave::text::reasoning;
    use veil_enclave::text::tools::CallMarkers;
    let Some(reference) = reference() else { return };
    let dir = TempDir::new("tools-harmony");
    let tok = Tokenizer::from_gguf(&GgufFile::open(&gpt_oss_model(&reference, dir.path())).unwrap()).unwrap();
    assert!(tok.harmony());
    let id = |t: &str| tok.special_id(t).unwrap();
    assert!(tok.stop_ids().contains(&id("<|return|>")) && tok.stop_ids().contains(&id("<|call|>")));
    assert!(!tok.stop_ids().contains(&id("<|end|>")), "<|end|> only ends the reasoning");
    assert_eq!(tok.tool_format(), Ok(ToolFormat::Harmony));
    // The stream as the entry makes it, then sorted as the gateway does.
    let answer = "<|channel|>analysis<|message|>They want Paris.<|end|><|start|>assistant<|channel|>final<|message|>\
                  It is 18 °C in Paris.";
    let mut stream = TextStream::new(&tok, Vec::new()).with_calls(Some(CallMarkers::default()));
    let mut reader = HarmonyReader::new(false);
    let (mut reasoning, mut content) = (String::new(), String::new());
    for i in tok.tokenize(answer, false, true).unwrap() {
        let d = reader.push(&stream.push(i).unwrap().piece);
        reasoning.push_str(&d.reasoning);
        content.push_str(&d.content);
    }
    let (rest, text) = {
        let (rest, _, text) = stream.finish(false).unwrap();
        (rest, text)
    };
    let d = reader.push(&rest);
    let (end, whole) = reader.finish();
    reasoning += &(d.reasoning + &end.reasoning);
    content += &(d.content + &end.content);
    assert_eq!((reasoning.as_str(), content.as_str()), ("They want Paris.", "It is 18 °C in Paris."));
    assert_eq!(whole, reasoning::parse(ReasoningFormat::Harmony, &text, false));
    // Through the gateway's parsing: a chat is read by channel, a
    // completion is not.
    let user = json!([{"role": "user", "content": "Weather in Paris?"}]);
    let c = parse(&tok, &json!({"messages": user})).unwrap();
    assert!(c.reasoning == Some(ReasoningFormat::Harmony) && c.tools.is_none());
    assert_eq!(c.request.calls, Some(CallMarkers::default()), "read with special tokens written out");
    let body = serde_json::to_vec(&json!({"prompt": "Hi"})).unwrap();
    let Route::Generate(completion) = openai::parse(b"POST", b"/v1/completions", &body, &tok, "gpt-oss", 4096).unwrap()
    else {
        panic!()
    };
    assert!(completion.reasoning.is_none() && completion.request.calls.is_none());
    // Tools, an earlier call and its result, as the template writes them.
    let trip = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees"},
    ]);
    let c = parse(&tok, &json!({"messages": trip, "tools": [weather()]})).unwrap();
    assert_eq!(c.tools.unwrap().format, ToolFormat::Harmony);
    let prompt = tok.decode_with_special(&c.request.prompt_ids).unwrap();
    for want in [
        "type get_weather = (_: {",
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>\
         {\"city\": \"Paris\", \"unit\": \"celsius\"}<|call|>",
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"18 degrees\"<|end|>",
    ] {
        assert!(prompt.contains(want), "{want:?} not in {prompt}");
    }
    assert!(prompt.ends_with("<|start|>assistant"), "{prompt}");
    // This template writes every tool's description: one without fails
    // in the template, as under jinja2, and is a 400.
    let e = parse(&tok, &json!({"messages": user, "tools": [clock()]})).err().unwrap();
    assert_eq!((e.status, e.param), (400, Some("messages")), "{}", e.message);
    let c = parse(&tok, &json!({"messages": user, "tools": [weather()], "tool_choice": "required"})).unwrap();
    let Some(ResponseFormat::Lark { grammar }) = &c.request.sampling.response_format else { panic!("not forced") };
    let marker = |t: &str| format!("(<[{}]> | {:?})", id(t), t);
    assert!(
        grammar.contains(&format!(
            "{} \"commentary to=functions.get_weather \" {}",
            marker("<|channel|>"),
            marker("<|constrain|>")
        )),
        "{grammar}"
    );
}

/// Through a sealed 3-stage cluster of the gpt-oss-shaped model: a forced
/// call is harmony's, read back as `tool_calls` (streamed and not); the
/// result goes back; a plain chat's stream, reasoning and content, says
/// what its whole answer says; and the official `openai` client's round
/// trip passes as it does for Qwen's format.
#[test]
fn a_gpt_oss_tools_round_trip_through_a_sealed_three_stage_cluster() {
    let Some(reference) = reference() else { return };
    let dir = TempDir::new("tools-harmony-cluster");
    let path = gpt_oss_model(&reference, dir.path());
    let s = Sealed::start("tools-harmony", &path);
    let question = json!([{"role": "user", "content": "What is the weather in Paris?"}]);
    let mut clock = clock();
    clock["function"]["description"] = "Local time.".into();
    let forced = json!({"messages": question, "tools": [weather(), clock], "tool_choice": "required",
        "temperature": 0, "max_tokens": 96});
    let (name, arguments) = forced_call(&s, &forced);
    let (name, arguments) = (name.as_str(), arguments.as_str());
    // The result goes back through the template; an answer comes.
    let trip = json!({"messages": [
        question[0],
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_7", "type": "function",
            "function": {"name": name, "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_7", "content": "{\"temperature\": 18}"},
    ], "tools": forced["tools"], "temperature": 0, "max_tokens": 12});
    let (status, body) = s.chat(trip);
    assert_eq!(status, 200, "{body}");
    // A plain chat, sampled: the stream's reasoning and content deltas
    // add up to the whole answer's (the same seed, the same tokens).
    let plain = json!({"messages": question, "temperature": 1.0, "seed": 3, "max_tokens": 24});
    let (status, body) = s.chat(plain.clone());
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status, 200, "{v}");
    let message = &v["choices"][0]["message"];
    let mut streamed = plain;
    streamed["stream"] = true.into();
    let (_, sse) = s.chat(streamed);
    let (text, calls, finish) = read_stream(&sse);
    let reasoning: String = sse
        .split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter(|e| *e != "[DONE]")
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|v| v["choices"][0]["delta"]["reasoning_content"].as_str().map(str::to_owned))
        .collect();
    assert!(calls.is_empty());
    assert_eq!(finish, v["choices"][0]["finish_reason"].as_str().unwrap());
    assert_eq!(text, message["content"].as_str().unwrap(), "{v}");
    assert_eq!(reasoning, message["reasoning_content"].as_str().unwrap_or_default(), "{v}");
    openai_python_client(&s.url, &s.cluster.route.policy);
}

/// The XML-style formats: a forced call's grammar takes the call exactly as
/// the template writes it (every token, then the end) and refuses a value
/// outside the schema; the call reads back with its arguments typed by the
/// schema.
#[test]
fn xml_style_calls_are_forced_as_the_template_writes_them_and_read_back_typed() {
    let Some(reference) = reference() else { return };
    let dir = TempDir::new("tools-xml-forced");
    for (template, format) in [
        ("Qwen3-Coder.jinja", ToolFormat::XmlFunction),
        ("GLM-4.6.jinja", ToolFormat::ArgKey { newlines: true }),
        ("GLM-4.7-Flash.jinja", ToolFormat::ArgKey { newlines: false }),
    ] {
        let tok =
            Tokenizer::from_gguf(&GgufFile::open(&qwen_model_with(&reference, dir.path(), template)).unwrap()).unwrap();
        assert_eq!(tok.tool_format(), Ok(format), "{template}");
        // The call as the template writes an earlier one.
        let args = json!({"city": "Paris", "unit": "celsius"});
        let messages = [
            ChatMessage::new("user", "Weather?"),
            ChatMessage {
                tool_calls: Some(json!([{"id": "c1", "type": "function",
                    "function": {"name": "get_weather", "arguments": args}}])),
                ..ChatMessage::new("assistant", "")
            },
        ];
        let rendered = tok.render_chat_with(&messages, Some(&json!([weather()]))).unwrap();
        let start = rendered.rfind("<tool_call>").unwrap();
        let end = rendered.rfind("</tool_call>").unwrap() + "</tool_call>".len();
        let written = &rendered[start..end];
        let user = json!([{"role": "user", "content": "Weather?"}]);
        let c = parse(&tok, &json!({"messages": user, "tools": [weather(), clock()], "tool_choice": "required"}))
            .unwrap_or_else(|e| panic!("{template}: {}", e.message));
        let forced = c.request.sampling.response_format.clone().unwrap();
        let grammars = tok.grammars().unwrap();
        let mut m = grammars.compile(&forced).unwrap_or_else(|e| panic!("{template}: {e}"));
        for id in tok.tokenize(written, false, true).unwrap() {
            assert!(m.advance(id), "{template}: {:?} refused in {written:?}", tok.piece(id).unwrap());
        }
        let mut logits = vec![0.0f32; tok.vocab_size()];
        m.mask(&mut logits).unwrap();
        assert!(logits[tok.eos() as usize].is_finite(), "{template}: the call is whole, the answer may end");
        // A unit outside the enum is refused somewhere in its value.
        let mut m = grammars.compile(&forced).unwrap();
        let wrong = written.replace("celsius", "kelvin");
        assert!(!tok.tokenize(&wrong, false, true).unwrap().into_iter().all(|id| m.advance(id)), "{template}");
        // Read back: the arguments' JSON, typed by the schema.
        let defs = c.tools.as_ref().unwrap().defs.clone();
        let p = format.parse(&format!("Let me look.\n{written}"), &defs);
        assert_eq!(p.content, "Let me look.", "{template}");
        assert_eq!(p.calls.len(), 1, "{template}: {p:?}");
        assert_eq!(serde_json::from_str::<Value>(&p.calls[0].arguments).unwrap(), args, "{template}");
    }
}

/// `reasoning_effort` and `chat_template_kwargs` reach a template that reads
/// them (gpt-oss's `Reasoning: high`, Qwen 3's `enable_thinking: false`,
/// which closes the `<think>` block in the prompt); a variable the template
/// does not read, one every render sets, a bad value or control-token text
/// is a 400 naming the parameter.
#[test]
fn template_variables_reach_the_template_or_are_refused() {
    let Some(reference) = reference() else { return };
    let dir = TempDir::new("tools-variables");
    let user = json!([{"role": "user", "content": "Hi"}]);
    let with = |tok: &Tokenizer, extra: Value| {
        let mut body = json!({"messages": user});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        parse(tok, &body)
    };
    let prompt = |tok: &Tokenizer, c: &openai::Call| tok.decode_with_special(&c.request.prompt_ids).unwrap();
    let oss = Tokenizer::from_gguf(&GgufFile::open(&gpt_oss_model(&reference, dir.path())).unwrap()).unwrap();
    assert!(prompt(&oss, &with(&oss, json!({})).unwrap()).contains("Reasoning: medium"));
    let high = with(&oss, json!({"reasoning_effort": "high"})).unwrap();
    assert!(prompt(&oss, &high).contains("Reasoning: high"));
    let qwen3 = Tokenizer::from_gguf(
        &GgufFile::open(&qwen_model_with(&reference, dir.path(), "Qwen-Qwen3-0.6B.jinja")).unwrap(),
    )
    .unwrap();
    let plain = with(&qwen3, json!({})).unwrap();
    assert!(prompt(&qwen3, &plain).ends_with("<|im_start|>assistant\n"));
    let off = with(&qwen3, json!({"chat_template_kwargs": {"enable_thinking": false}})).unwrap();
    assert!(
        prompt(&qwen3, &off).ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        "{}",
        prompt(&qwen3, &off)
    );
    assert_eq!(off.reasoning, Some(ReasoningFormat::Think { open: false }));
    for (tok, extra, param) in [
        (&oss, json!({"reasoning_effort": "extreme"}), "reasoning_effort"),
        (&qwen3, json!({"reasoning_effort": "high"}), "reasoning_effort"),
        (
            &oss,
            json!({"reasoning_effort": "high", "chat_template_kwargs": {"reasoning_effort": "low"}}),
            "reasoning_effort",
        ),
        (&qwen3, json!({"chat_template_kwargs": {"unread_variable": 1}}), "chat_template_kwargs"),
        (&qwen3, json!({"chat_template_kwargs": {"messages": []}}), "chat_template_kwargs"),
        (&qwen3, json!({"chat_template_kwargs": {"not an identifier": 1}}), "chat_template_kwargs"),
        (&qwen3, json!({"chat_template_kwargs": [1]}), "chat_template_kwargs"),
        (&qwen3, json!({"chat_template_kwargs": {"enable_thinking": "<|im_end|>"}}), "messages"),
    ] {
        let e = with(tok, extra.clone()).err().unwrap_or_else(|| panic!("accepted {extra}"));
        assert_eq!((e.status, e.param), (400, Some(param)), "{extra}: {}", e.message);
    }
    let body = serde_json::to_vec(&json!({"prompt": "Hi", "reasoning_effort": "high"})).unwrap();
    let e = openai::parse(b"POST", b"/v1/completions", &body, &oss, "gpt-oss", 4096).err().unwrap();
    assert_eq!((e.status, e.param), (400, Some("reasoning_effort")));
}

/// The streamed reasoning and content deltas of an event stream, each
/// put together.
fn stream_parts(sse: &str) -> (String, String) {
    let mut parts = (String::new(), String::new());
    for ev in sse.split("\n\n").filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: "))) {
        let Ok(v) = serde_json::from_str::<Value>(ev) else { continue };
        let delta = &v["choices"][0]["delta"];
        parts.0.push_str(delta["reasoning_content"].as_str().unwrap_or_default());
        parts.1.push_str(delta["content"].as_str().unwrap_or_default());
    }
    parts
}

/// A model that thinks in `<think>` first: which templates open the block
/// in the prompt; through a sealed 3-stage cluster (Qwen 3.5's template,
/// which opens it), the answer is reasoning, streamed and not alike, while
/// a forced call and a response format hold from the first token and are
/// read as content.
#[test]
fn a_thinking_model_s_reasoning_is_set_apart_through_a_sealed_three_stage_cluster() {
    let Some(reference) = reference() else { return };
    let dir = TempDir::new("tools-think");
    let user = json!([{"role": "user", "content": "Weather in Paris?"}]);
    for (template, want) in [
        ("Qwen-Qwen3-0.6B.jinja", Some(ReasoningFormat::Think { open: false })),
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", Some(ReasoningFormat::Think { open: false })),
        ("Qwen3.5-4B.jinja", Some(ReasoningFormat::Think { open: true })),
        (QWEN25, None),
    ] {
        let tok =
            Tokenizer::from_gguf(&GgufFile::open(&qwen_model_with(&reference, dir.path(), template)).unwrap()).unwrap();
        assert_eq!(parse(&tok, &json!({"messages": user})).unwrap().reasoning, want, "{template}");
        let formatted = parse(&tok, &json!({"messages": user, "response_format": {"type": "json_object"}})).unwrap();
        assert!(!matches!(formatted.reasoning, Some(ReasoningFormat::Think { open: true })), "{template}");
    }
    let path = qwen_model_with(&reference, dir.path(), "Qwen3.5-4B.jinja");
    let s = Sealed::start("tools-think", &path);
    // The prompt opened the block and a random model never closes it:
    // all of the answer is reasoning.
    let plain = json!({"messages": user, "temperature": 0, "max_tokens": 16});
    let v: Value = serde_json::from_str(&s.chat_ok(plain.clone())).unwrap();
    let message = &v["choices"][0]["message"];
    let reasoning = message["reasoning_content"].as_str().unwrap_or_default().to_owned();
    assert!(!reasoning.is_empty() && message["content"] == "", "{v}");
    let mut streamed = plain;
    streamed["stream"] = true.into();
    assert_eq!(stream_parts(&s.chat_ok(streamed)), (reasoning.clone(), String::new()));
    // `veil-shard generate --chat` sets it apart the same way: the
    // reasoning on standard error, the answer (none) on standard output.
    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_veil-shard"))
        .args(["generate", "--model", path.to_str().unwrap(), "--prompt", "Weather in Paris?", "--chat"])
        .args(["--max-tokens", "16"])
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    let (out, err) = (String::from_utf8_lossy(&cli.stdout), String::from_utf8_lossy(&cli.stderr));
    assert!(cli.status.success(), "{err}");
    assert_eq!((err.as_ref(), out.as_ref()), (reasoning.as_str(), "\n"));
    // A forced call: the grammar holds from the first token; the call
    // is read from the content.
    let forced = json!({"messages": user, "tools": [weather()], "tool_choice": "required", "temperature": 0,
        "max_tokens": 96});
    let v: Value = serde_json::from_str(&s.chat_ok(forced)).unwrap();
    let f = &v["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(f["name"], "get_weather", "{v}");
    check_weather_arguments(f["arguments"].as_str().unwrap());
    // A response format: the content is the JSON.
    let json_object = json!({"messages": user, "response_format": {"type": "json_object"}, "temperature": 0,
        "max_tokens": 48});
    let v: Value = serde_json::from_str(&s.chat_ok(json_object)).unwrap();
    let choice = &v["choices"][0];
    if choice["finish_reason"] == "stop" {
        let content = choice["message"]["content"].as_str().unwrap();
        assert!(serde_json::from_str::<Value>(content).unwrap().is_object(), "{v}");
    }
    assert!(choice["message"].get("reasoning_content").is_none(), "{v}");
}

/// A sealed 3-stage cluster of one model, and a client of its gateway.
struct Sealed {
    cluster: Cluster,
    url: String,
    rt: tokio::runtime::Runtime,
    client: veil_client::sdk::Client,
}

impl Sealed {
    /// Starts the cluster (layers 0, 1, 2 on their own stages) and connects.
    fn start(name: &str, path: &Path) -> Self {
        let mut cluster = Cluster::with_layers(name, path, &[1, 2], &[1, 1, 1], 3);
        cluster.start_all();
        let url = format!("http://{}", cluster.route.sealed_listen.unwrap());
        let policy = veil_enclave::pipeline::shard::load_policy(&cluster.route.policy).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let client = rt.block_on(veil_client::sdk::Client::connect(&url, &policy)).unwrap();
        Self { cluster, url, rt, client }
    }

    /// `POST /v1/chat/completions` with `body`: the status and the whole
    /// (unsealed) answer.
    fn chat(&self, body: Value) -> (u16, String) {
        self.rt.block_on(async {
            let mut resp = self.client.call("POST", "/v1/chat/completions", &body).await.unwrap();
            let mut bytes = Vec::new();
            while let Some(p) = resp.next().await.unwrap() {
                bytes.extend(p);
            }
            (resp.status, String::from_utf8(bytes).unwrap())
        })
    }

    /// [`Self::chat`] that must answer 200: the answer.
    fn chat_ok(&self, body: Value) -> String {
        let (status, answer) = self.chat(body);
        assert_eq!(status, 200, "{answer}");
        answer
    }
}

/// A forced greedy call (`forced`: a chat body with `tool_choice`
/// required): one call to one of [`weather`] and [`clock`], its arguments
/// holding that tool's schema, `content` null; streamed, the same call in
/// one delta and no text. Its name and arguments.
fn forced_call(s: &Sealed, forced: &Value) -> (String, String) {
    let (status, body) = s.chat(forced.clone());
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status, 200, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert!(choice["message"]["content"].is_null(), "{v}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    let name = calls[0]["function"]["name"].as_str().unwrap().to_owned();
    let arguments = calls[0]["function"]["arguments"].as_str().unwrap().to_owned();
    match name.as_str() {
        "get_weather" => check_weather_arguments(&arguments),
        "get_time" => assert!(serde_json::from_str::<Value>(&arguments).unwrap()["zone"].is_string()),
        other => panic!("called {other}"),
    }
    let mut streamed = forced.clone();
    streamed["stream"] = true.into();
    let (status, sse) = s.chat(streamed);
    assert_eq!(status, 200);
    let (text, calls, finish) = read_stream(&sse);
    assert_eq!((text.as_str(), finish.as_str()), ("", "tool_calls"));
    assert_eq!(calls, vec![(name.clone(), arguments.clone())]);
    (name, arguments)
}

/// What a streamed answer said: its text, its tool calls (name and
/// arguments) and its finish reason.
fn read_stream(sse: &str) -> (String, Vec<(String, String)>, String) {
    let (mut text, mut calls, mut finish) = (String::new(), Vec::new(), String::new());
    for ev in sse.split("\n\n").filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: "))) {
        if ev == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(ev).unwrap();
        let choice = &v["choices"][0];
        text.push_str(choice["delta"]["content"].as_str().unwrap_or_default());
        for c in choice["delta"]["tool_calls"].as_array().into_iter().flatten() {
            assert!(c["id"].as_str().unwrap().starts_with("call_"));
            let f = &c["function"];
            calls.push((f["name"].as_str().unwrap().to_owned(), f["arguments"].as_str().unwrap().to_owned()));
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_owned();
        }
    }
    (text, calls, finish)
}

/// Through a sealed 3-stage cluster: a forced call comes back as
/// `tool_calls` whose arguments hold the tool's schema, streamed and not;
/// a named choice calls that function; the tool's result goes back and an
/// answer comes; and the shard keeps serving after refused requests.
#[test]
fn a_tools_round_trip_through_a_sealed_three_stage_cluster() {
    round_trip("tools", QWEN25);
}

/// The same round trip in Qwen3-Coder's XML format (`<function=…>` and
/// one `<parameter=…>` block of text per argument).
#[test]
fn an_xml_tools_round_trip_through_a_sealed_three_stage_cluster() {
    round_trip("tools-xml", "Qwen3-Coder.jinja");
}

fn round_trip(name: &str, template: &str) {
    let Some(reference) = reference() else { return };
    let dir = TempDir::new(name);
    let path = qwen_model_with(&reference, dir.path(), template);
    let s = Sealed::start(name, &path);
    let question = json!([{"role": "user", "content": "What is the weather in Paris?"}]);
    let forced = json!({"messages": question, "tools": [weather(), clock()], "tool_choice": "required",
        "temperature": 0, "max_tokens": 96});
    let (name, arguments) = forced_call(&s, &forced);
    let (name, arguments) = (name.as_str(), arguments.as_str());
    // auto, streamed: the text (if any) streams, the calls come whole,
    // and together they say what the plain answer says.
    let auto = json!({"messages": question, "tools": [weather(), clock()], "temperature": 1.0, "seed": 11,
        "max_tokens": 40});
    let (_, body) = s.chat(auto.clone());
    let plain: Value = serde_json::from_str(&body).unwrap();
    let mut streamed = auto.clone();
    streamed["stream"] = true.into();
    let (_, sse) = s.chat(streamed);
    let (text, calls, finish) = read_stream(&sse);
    let choice = &plain["choices"][0];
    assert_eq!(finish, choice["finish_reason"].as_str().unwrap(), "{plain}");
    let plain_calls: Vec<(String, String)> = choice["message"]["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let f = &c["function"];
            (f["name"].as_str().unwrap().to_owned(), f["arguments"].as_str().unwrap().to_owned())
        })
        .collect();
    assert_eq!(calls, plain_calls);
    assert_eq!(text.trim(), choice["message"]["content"].as_str().unwrap_or_default().trim(), "{plain}");
    // A named function is the one called, sampled or not.
    for temperature in [0.0, 1.0] {
        let named = json!({"messages": question, "tools": [weather(), clock()], "temperature": temperature,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "max_tokens": 96, "seed": 5});
        let (_, body) = s.chat(named);
        let v: Value = serde_json::from_str(&body).unwrap();
        let f = &v["choices"][0]["message"]["tool_calls"][0]["function"];
        assert_eq!(f["name"], "get_weather", "{v}");
        check_weather_arguments(f["arguments"].as_str().unwrap());
    }
    // The result goes back; the model answers (auto: text or a call,
    // well formed either way).
    let trip = json!({"messages": [
        question[0],
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_7", "type": "function",
            "function": {"name": name, "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_7", "content": "{\"temperature\": 18}"},
    ], "tools": [weather(), clock()], "temperature": 0, "max_tokens": 12});
    let (status, body) = s.chat(trip);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status, 200, "{v}");
    let choice = &v["choices"][0];
    match choice["finish_reason"].as_str().unwrap() {
        "tool_calls" => assert!(choice["message"]["tool_calls"].is_array()),
        "stop" | "length" => assert!(choice["message"]["content"].is_string()),
        other => panic!("finish_reason {other}"),
    }
    // Refused requests leave the shard serving.
    let (status, _) = s.chat(json!({"messages": question, "tools": [{"type": "function",
        "function": {"name": "f"}}]}));
    assert_eq!(status, 400);
    let (status, _) = s.chat(forced);
    assert_eq!(status, 200);
    openai_python_client(&s.url, &s.cluster.route.policy);
}

/// The official `openai` Python package, unmodified, through `veil proxy`
/// in front of this cluster (`scripts/openai_tools_check.py`): the same
/// round trip as the client's own types and stream accumulation see it,
/// arguments validated by `jsonschema`. CI sets `VEIL_REQUIRE_OPENAI=1`;
/// elsewhere a missing package prints SKIP.
fn openai_python_client(gateway: &str, policy: &Path) {
    use std::process::{Command, Stdio};
    let have = Command::new("python3").args(["-c", "import openai, jsonschema"]).status().is_ok_and(|s| s.success());
    let veil = Path::new(env!("CARGO_BIN_EXE_veil-shard")).with_file_name("veil");
    if !have || !veil.exists() {
        assert!(
            std::env::var("VEIL_REQUIRE_OPENAI").as_deref() != Ok("1"),
            "VEIL_REQUIRE_OPENAI=1 but `import openai, jsonschema` fails or {} is not built",
            veil.display()
        );
        veil_tests::skip("the openai Python package or the veil binary is missing");
        return;
    }
    let listen = cluster::free_port();
    let mut proxy = Command::new(&veil)
        .args(["proxy", gateway, "--listen", &listen.to_string(), "--policy"])
        .arg(policy)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(proxy.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("listening on") {
        line.clear();
        if std::io::BufRead::read_line(&mut out, &mut line).unwrap() == 0 {
            let _ = proxy.kill();
            panic!("veil proxy ended before listening");
        }
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/openai_tools_check.py");
    let run = Command::new("python3").arg(script).arg(format!("http://{listen}/v1")).output().unwrap();
    let _ = proxy.kill();
    let _ = proxy.wait();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    println!("openai tools check: {stdout}");
}
