//! Response shaping: bodies, server-sent events, log-probabilities and the
//! padding that hides their lengths.

use super::*;

/// Log-probabilities of generated tokens in the endpoint's shape: chat's
/// `{"content": [{token, logprob, bytes, top_logprobs}]}`, or the legacy
/// completions `{tokens, token_logprobs, top_logprobs, text_offset}` with
/// offsets (in characters) counted on from `offset`. A token that holds
/// part of a character has `bytes: null`.
pub fn logprobs_json(kind: Kind, tokenizer: &Tokenizer, lps: &[TokenLogprob], offset: &mut usize) -> Value {
    let text = |t: u32| tokenizer.piece(t).unwrap_or_default();
    let entry = |t: u32, lp: f32| {
        let s = text(t);
        let bytes = if s.contains('\u{FFFD}') { Value::Null } else { json!(s.as_bytes()) };
        json!({ "token": s, "logprob": lp, "bytes": bytes })
    };
    match kind {
        Kind::Chat => {
            let content: Vec<Value> = lps
                .iter()
                .map(|lp| {
                    let mut e = entry(lp.token, lp.logprob);
                    e["top_logprobs"] = lp.top.iter().map(|&(t, l)| entry(t, l)).collect();
                    e
                })
                .collect();
            json!({ "content": content, "refusal": Value::Null })
        }
        Kind::Completion => {
            let mut offsets = Vec::with_capacity(lps.len());
            for lp in lps {
                offsets.push(*offset);
                *offset += text(lp.token).chars().count();
            }
            let top: Vec<Value> = lps
                .iter()
                .map(|lp| Value::Object(lp.top.iter().map(|&(t, l)| (text(t), json!(l))).collect()))
                .collect();
            json!({
                "tokens": lps.iter().map(|lp| text(lp.token)).collect::<Vec<_>>(),
                "token_logprobs": lps.iter().map(|lp| lp.logprob).collect::<Vec<_>>(),
                "top_logprobs": top,
                "text_offset": offsets,
            })
        }
    }
}

/// A completion's `logprobs` with `echo`: the prompt's tokens first (the
/// first with `null` log-probability and alternatives, as it is given, not
/// predicted; then `prompt` for the others), then the answer's `lps`.
pub fn echo_logprobs_json(
    tokenizer: &Tokenizer,
    prompt_ids: &[u32],
    prompt: &[TokenLogprob],
    lps: &[TokenLogprob],
) -> Value {
    let Some(&head) = prompt_ids.first() else {
        return logprobs_json(Kind::Completion, tokenizer, lps, &mut 0);
    };
    let all: Vec<TokenLogprob> = std::iter::once(TokenLogprob { token: head, logprob: 0.0, top: Vec::new() })
        .chain(prompt.iter().cloned())
        .chain(lps.iter().cloned())
        .collect();
    let mut v = logprobs_json(Kind::Completion, tokenizer, &all, &mut 0);
    v["token_logprobs"][0] = Value::Null;
    v["top_logprobs"][0] = Value::Null;
    v
}

/// Token counts of a finished call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Both.
    pub total_tokens: usize,
}

impl Usage {
    /// Counts for a prompt and an output.
    pub fn new(prompt: usize, completion: usize) -> Self {
        Self { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion }
    }
}

/// Identity of one response across its chunks.
#[derive(Debug, Clone)]
pub struct Ids {
    /// `chatcmpl-…` / `cmpl-…`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// Model name.
    pub model: String,
}

/// The non-streamed answer.
pub fn complete_body(kind: Kind, ids: &Ids, choices: &[Choice<'_>], usage: Usage) -> Vec<u8> {
    let choices: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(index, c)| {
            let logprobs = c.logprobs.clone().unwrap_or(Value::Null);
            match kind {
                Kind::Chat => {
                    let mut message = json!({ "role": "assistant", "content": c.text });
                    if let Some(r) = c.reasoning.filter(|r| !r.is_empty()) {
                        message["reasoning_content"] = r.into();
                    }
                    if let Some(calls) = &c.tool_calls {
                        if c.text.is_empty() {
                            message["content"] = Value::Null;
                        }
                        message["tool_calls"] = calls.clone();
                    }
                    json!({ "index": index, "message": message, "logprobs": logprobs, "finish_reason": c.finish })
                }
                Kind::Completion => {
                    json!({ "index": index, "text": c.text, "logprobs": logprobs, "finish_reason": c.finish })
                }
            }
        })
        .collect();
    let object = match kind {
        Kind::Chat => "chat.completion",
        Kind::Completion => "text_completion",
    };
    let v = json!({
        "id": ids.id, "object": object, "created": ids.created, "model": ids.model,
        "choices": choices, "usage": usage,
    });
    serde_json::to_vec(&v).unwrap_or_default()
}

/// Tool calls in OpenAI's shape, each with a fresh id:
/// `[{id, type: "function", function: {name, arguments}}]`, `arguments`
/// the JSON text.
pub fn tool_calls_json(calls: &[ToolCall]) -> Value {
    calls
        .iter()
        .map(|c| {
            let id = format!("call_{}", hex::encode(&Nonce::random().as_bytes()[..12]));
            json!({ "id": id, "type": "function", "function": { "name": c.name, "arguments": c.arguments } })
        })
        .collect()
}

/// One chat chunk carrying choice `index`'s tool calls whole, each under
/// its `index` in the delta's `tool_calls` (as OpenAI streams them, in one
/// piece instead of argument fragments).
pub fn sse_tool_calls(ids: &Ids, index: usize, calls: &[ToolCall], first: bool) -> Vec<u8> {
    let mut list = tool_calls_json(calls);
    if let Value::Array(items) = &mut list {
        for (i, item) in items.iter_mut().enumerate() {
            item["index"] = i.into();
        }
    }
    let mut delta = serde_json::Map::new();
    if first {
        delta.insert("role".into(), "assistant".into());
    }
    delta.insert("tool_calls".into(), list);
    sse(&json!({
        "id": ids.id, "object": "chat.completion.chunk", "created": ids.created, "model": ids.model,
        "choices": [{ "index": index, "delta": delta, "logprobs": Value::Null, "finish_reason": Value::Null }],
    }))
}

/// One server-sent event carrying a chunk of choice `index`: `delta` text,
/// or the finish reason (with empty text), or the first chat chunk's role;
/// with the log-probabilities of the tokens it covers, when asked for.
pub fn sse_chunk(
    kind: Kind,
    ids: &Ids,
    index: usize,
    text: Option<&str>,
    finish: Option<&str>,
    first: bool,
    logprobs: Option<Value>,
) -> Vec<u8> {
    let logprobs = logprobs.unwrap_or(Value::Null);
    let v = match kind {
        Kind::Chat => {
            let mut delta = serde_json::Map::new();
            if first {
                delta.insert("role".into(), "assistant".into());
            }
            if let Some(t) = text {
                delta.insert("content".into(), t.into());
            }
            json!({
                "id": ids.id, "object": "chat.completion.chunk", "created": ids.created, "model": ids.model,
                "choices": [{ "index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish }],
            })
        }
        Kind::Completion => json!({
            "id": ids.id, "object": "text_completion", "created": ids.created, "model": ids.model,
            "choices": [{ "index": index, "text": text.unwrap_or_default(), "logprobs": logprobs, "finish_reason": finish }],
        }),
    };
    sse(&v)
}

/// One chat chunk carrying reasoning (`delta.reasoning_content`, as vLLM
/// streams it).
pub fn sse_reasoning(ids: &Ids, index: usize, text: &str, first: bool) -> Vec<u8> {
    let mut delta = serde_json::Map::new();
    if first {
        delta.insert("role".into(), "assistant".into());
    }
    delta.insert("reasoning_content".into(), text.into());
    sse(&json!({
        "id": ids.id, "object": "chat.completion.chunk", "created": ids.created, "model": ids.model,
        "choices": [{ "index": index, "delta": delta, "logprobs": Value::Null, "finish_reason": Value::Null }],
    }))
}

/// The usage chunk (`stream_options.include_usage`): no choices.
pub fn sse_usage(kind: Kind, ids: &Ids, usage: Usage) -> Vec<u8> {
    let object = match kind {
        Kind::Chat => "chat.completion.chunk",
        Kind::Completion => "text_completion",
    };
    sse(
        &json!({ "id": ids.id, "object": object, "created": ids.created, "model": ids.model, "choices": [], "usage": usage }),
    )
}

/// An error inside an event stream (after the head was sent).
pub fn sse_error(err: &ApiError) -> Vec<u8> {
    let mut out = b"data: ".to_vec();
    out.extend(err.body());
    out.extend(b"\n\n");
    pad_event(out)
}

/// The stream's end marker (unpadded; [`sse_done`] is what is sent).
pub const SSE_DONE: &[u8] = b"data: [DONE]\n\n";

/// The stream's end marker, padded like every event.
pub fn sse_done() -> Vec<u8> {
    pad_event(SSE_DONE.to_vec())
}

/// Every server-sent event is padded to a multiple of this many bytes, so
/// the sealed chunks the host relays all have one size whatever token they
/// carry (SECURITY-CASES I2: token lengths read from encrypted chunk sizes).
pub const SSE_PAD: usize = 256;

/// Every complete (non-streamed) body is padded with JSON whitespace to a
/// multiple of this many bytes: the host learns the answer's length only to
/// within a bucket.
pub const BODY_PAD: usize = 1024;

/// Pads one event (`…\n\n`) with an SSE comment line (`:` and spaces, which
/// every SSE client ignores) to a multiple of [`SSE_PAD`] bytes.
pub fn pad_event(mut event: Vec<u8>) -> Vec<u8> {
    if !event.ends_with(b"\n\n") {
        return event;
    }
    // The comment takes at least ":\n" (2 bytes) before the final blank line.
    let fill = (event.len() + 2).div_ceil(SSE_PAD) * SSE_PAD - (event.len() + 2);
    event.pop();
    event.push(b':');
    event.resize(event.len() + fill, b' ');
    event.extend(b"\n\n");
    event
}

/// Pads a JSON body with trailing spaces to a multiple of [`BODY_PAD`].
pub fn pad_body(mut body: Vec<u8>) -> Vec<u8> {
    let target = body.len().div_ceil(BODY_PAD).max(1) * BODY_PAD;
    body.resize(target, b' ');
    body
}

fn sse(v: &Value) -> Vec<u8> {
    let mut out = b"data: ".to_vec();
    out.extend(serde_json::to_vec(v).unwrap_or_default());
    out.extend(b"\n\n");
    pad_event(out)
}

/// `GET /v1/models/{id}` for the served model.
pub fn model_body(model_name: &str, created: u64) -> Vec<u8> {
    serde_json::to_vec(&json!({ "id": model_name, "object": "model", "created": created, "owned_by": "veil" }))
        .unwrap_or_default()
}

/// `GET /v1/models`.
pub fn models_body(model_name: &str, created: u64) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "object": "list",
        "data": [{ "id": model_name, "object": "model", "created": created, "owned_by": "veil" }],
    }))
    .unwrap_or_default()
}
