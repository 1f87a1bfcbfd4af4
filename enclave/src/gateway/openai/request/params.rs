//! The parameters of a request, each validated on its own: template
//! variables, tools and `tool_choice`, `response_format`, `logit_bias`,
//! `logprobs`, chat messages and a completion's prompt. Each refusal is an
//! [`ApiError`] naming the parameter.

use super::*;

/// Most `chat_template_kwargs` variables, and their JSON size.
pub const MAX_TEMPLATE_VARIABLES: usize = 16;
/// See [`MAX_TEMPLATE_VARIABLES`].
pub const MAX_TEMPLATE_VARIABLES_BYTES: usize = 4096;

/// The extra variables a chat request gives the template:
/// `chat_template_kwargs` (each an identifier the template reads, none of
/// those every render sets) and `reasoning_effort` (`minimal`, `low`,
/// `medium` or `high`, for a template that reads it). One the template
/// would not read is a 400, not ignored.
pub(super) fn template_variables(
    tokenizer: &Tokenizer,
    effort: Option<&Value>,
    kwargs: Option<&Value>,
) -> Result<Option<serde_json::Map<String, Value>>, ApiError> {
    let mut vars = serde_json::Map::new();
    match kwargs {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            let bad = |m: String| ApiError::invalid("chat_template_kwargs", m);
            if m.len() > MAX_TEMPLATE_VARIABLES
                || Value::Object(m.clone()).to_string().len() > MAX_TEMPLATE_VARIABLES_BYTES
            {
                return Err(bad(format!(
                    "at most {MAX_TEMPLATE_VARIABLES} variables and {MAX_TEMPLATE_VARIABLES_BYTES} bytes"
                )));
            }
            for (k, v) in m {
                let ident = k.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if !ident || RESERVED_VARIABLES.contains(&k.as_str()) {
                    return Err(bad(format!("{k:?} is not a template variable a request may set")));
                }
                if !tokenizer.template_reads(k) {
                    return Err(bad(format!("this model's chat template does not read {k:?}")));
                }
                vars.insert(k.clone(), v.clone());
            }
        }
        Some(_) => return Err(ApiError::invalid("chat_template_kwargs", "chat_template_kwargs must be an object")),
    }
    match effort {
        None | Some(Value::Null) => {}
        Some(Value::String(e)) if ["minimal", "low", "medium", "high"].contains(&e.as_str()) => {
            let bad = |m: &str| ApiError::invalid("reasoning_effort", m);
            if !tokenizer.template_reads("reasoning_effort") {
                return Err(bad("this model's chat template does not read reasoning_effort"));
            }
            if vars.get("reasoning_effort").is_some_and(|v| v != e.as_str()) {
                return Err(bad("reasoning_effort differs from chat_template_kwargs.reasoning_effort"));
            }
            vars.insert("reasoning_effort".into(), e.clone().into());
        }
        Some(_) => {
            return Err(ApiError::invalid("reasoning_effort", "reasoning_effort must be minimal, low, medium or high"))
        }
    }
    Ok((!vars.is_empty()).then_some(vars))
}

/// `tools`: at most [`MAX_TOOLS`] functions, each `{type: "function",
/// function: {name, description?, parameters}}` with a name of 1–64
/// letters, digits, `_` or `-`, unique, and `parameters` a JSON schema
/// object (required: a function without parameters takes `{"type":
/// "object", "properties": {}}`).
pub(super) fn tools(v: Option<&Value>) -> Result<Vec<ToolDef>, ApiError> {
    let bad = |m: String| ApiError::invalid("tools", m);
    let list = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(l)) => l,
        Some(_) => return Err(bad("tools must be a list".into())),
    };
    if list.len() > MAX_TOOLS {
        return Err(bad(format!("{} tools; at most {MAX_TOOLS}", list.len())));
    }
    let mut out: Vec<ToolDef> = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(bad(format!("tools[{i}].type must be \"function\"")));
        }
        let f = t.get("function").ok_or_else(|| bad(format!("tools[{i}] has no function")))?;
        let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
        let valid = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
        if name.is_empty() || name.len() > 64 || !name.chars().all(valid) {
            return Err(bad(format!("tools[{i}].function.name must be 1 to 64 letters, digits, _ or -")));
        }
        if out.iter().any(|d| d.name == name) {
            return Err(bad(format!("tools[{i}]: the name {name:?} is used twice")));
        }
        if f.get("description").is_some_and(|d| !d.is_string()) {
            return Err(bad(format!("tools[{i}].function.description must be a string")));
        }
        let parameters = match f.get("parameters") {
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => return Err(bad(format!("tools[{i}].function.parameters must be a JSON schema object"))),
            None => return Err(bad(format!("tools[{i}].function has no parameters (a JSON schema object)"))),
        };
        out.push(ToolDef { name: name.to_owned(), description: f.get("description").cloned(), parameters });
    }
    Ok(out)
}

/// The tools as the chat template receives them.
pub(super) fn tools_context(tools: &[ToolDef]) -> Value {
    tools
        .iter()
        .map(|t| {
            let mut f = serde_json::Map::new();
            f.insert("name".into(), t.name.clone().into());
            if let Some(d) = &t.description {
                f.insert("description".into(), d.clone());
            }
            f.insert("parameters".into(), t.parameters.clone());
            json!({ "type": "function", "function": f })
        })
        .collect()
}

/// `tool_choice`: `none`, `auto` (the default with tools), `required`, or
/// `{type: "function", function: {name}}` naming one of `tools`.
pub(super) fn tool_choice(v: Option<&Value>, tools: &[ToolDef]) -> Result<ToolChoice, ApiError> {
    let bad = |m: &str| ApiError::invalid("tool_choice", m.to_owned());
    let choice = match v {
        None | Some(Value::Null) => {
            return Ok(if tools.is_empty() { ToolChoice::None } else { ToolChoice::Auto });
        }
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            _ => return Err(bad("tool_choice must be none, auto, required or a named function")),
        },
        Some(o @ Value::Object(_)) => {
            let name = o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
            match (o.get("type").and_then(Value::as_str), name) {
                (Some("function"), Some(n)) => ToolChoice::Named(n.to_owned()),
                _ => return Err(bad("a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": …}}")),
            }
        }
        Some(_) => return Err(bad("tool_choice must be a string or an object")),
    };
    match &choice {
        ToolChoice::Auto | ToolChoice::Required if tools.is_empty() => Err(bad("tool_choice needs tools")),
        ToolChoice::Named(n) if !tools.iter().any(|t| &t.name == n) => {
            let shown: String = n.chars().take(64).collect();
            Err(bad(&format!("tool_choice names {shown:?}, which is not in tools")))
        }
        _ => Ok(choice),
    }
}

/// An assistant message's `tool_calls` as templates take them: each
/// `{id, type: "function", function: {name, arguments}}`, `arguments`
/// parsed from OpenAI's JSON string into an object.
pub(super) fn message_tool_calls(v: &Value) -> Result<Value, ApiError> {
    let bad = |m: &str| ApiError::invalid("messages", m.to_owned());
    let calls = v.as_array().ok_or_else(|| bad("tool_calls must be a list"))?;
    let mut out = Vec::with_capacity(calls.len());
    for c in calls {
        let f = c.get("function").ok_or_else(|| bad("a tool call has no function"))?;
        let name = f.get("name").and_then(Value::as_str).ok_or_else(|| bad("a tool call has no function name"))?;
        let arguments = match f.get("arguments") {
            Some(Value::String(s)) => {
                serde_json::from_str::<Value>(s).map_err(|_| bad("a tool call's arguments are not JSON"))?
            }
            Some(o @ Value::Object(_)) => o.clone(),
            _ => return Err(bad("a tool call's arguments must be a JSON object or its text")),
        };
        if !arguments.is_object() {
            return Err(bad("a tool call's arguments must be a JSON object"));
        }
        let id = c.get("id").and_then(Value::as_str).unwrap_or_default();
        out.push(json!({ "id": id, "type": "function", "function": { "name": name, "arguments": arguments } }));
    }
    Ok(Value::Array(out))
}

/// `response_format`: `text` (none), `json_object`, or `json_schema` with
/// its `schema` (enforced whether or not `strict` is set, at most
/// [`MAX_SCHEMA_BYTES`]). Whether the engine can compile the schema is
/// checked at admission, which refuses with the engine's reason.
pub(super) fn response_format(v: Option<&Value>) -> Result<Option<ResponseFormat>, ApiError> {
    let bad = |m: &str| ApiError::invalid("response_format", m.to_owned());
    let Some(f) = v.filter(|f| !f.is_null()) else { return Ok(None) };
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(ResponseFormat::JsonObject)),
        Some("json_schema") => {
            let schema = f
                .get("json_schema")
                .and_then(|j| j.get("schema"))
                .ok_or_else(|| bad("json_schema needs json_schema.schema"))?;
            if !schema.is_object() {
                return Err(bad("json_schema.schema must be a JSON object"));
            }
            let schema = serde_json::to_string(schema).unwrap_or_default();
            if schema.len() > MAX_SCHEMA_BYTES {
                return Err(bad(&format!("the schema is {} bytes; at most {MAX_SCHEMA_BYTES}", schema.len())));
            }
            Ok(Some(ResponseFormat::JsonSchema { schema }))
        }
        _ => Err(bad("response_format.type must be text, json_object or json_schema")),
    }
}

/// `logit_bias`: an object from token ids (as strings) to a bias in
/// `[-100, 100]`, each id in the vocabulary, at most [`MAX_LOGIT_BIAS`].
pub(super) fn logit_bias(v: Option<&Value>, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let bad = |m: String| ApiError::invalid("logit_bias", m);
    let map = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(m)) => m,
        Some(_) => return Err(bad("logit_bias must be an object from token ids to numbers".into())),
    };
    if map.len() > MAX_LOGIT_BIAS {
        return Err(bad(format!("{} entries; at most {MAX_LOGIT_BIAS}", map.len())));
    }
    let mut out = Vec::with_capacity(map.len());
    for (k, v) in map {
        let shown: String = k.chars().take(16).collect();
        let id: u32 = k.parse().map_err(|_| bad(format!("key {shown:?} is not a token id")))?;
        if id as usize >= vocab {
            return Err(bad(format!("token id {id} is outside the vocabulary of {vocab}")));
        }
        let b = v.as_f64().filter(|b| (-100.0..=100.0).contains(b));
        let b = b.ok_or_else(|| bad(format!("the bias of token {id} must be a number between -100 and 100")))?;
        out.push((id, b as f32));
    }
    out.sort_by_key(|e| e.0);
    Ok(out)
}

/// How many top alternatives a request's log-probabilities carry: chat's
/// `logprobs: true` with `top_logprobs` 0–20, or the completions endpoint's
/// `logprobs` 0–5 (OpenAI's limits); `None` when not asked.
pub(super) fn logprobs_asked(
    kind: Kind,
    logprobs: Option<&Value>,
    top: Option<&Value>,
) -> Result<Option<u8>, ApiError> {
    let top = match top {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64().filter(|&n| n <= MAX_TOP_LOGPROBS as u64) {
            Some(n) => Some(n as u8),
            None => {
                return Err(ApiError::invalid(
                    "top_logprobs",
                    format!("top_logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}"),
                ))
            }
        },
    };
    match kind {
        Kind::Chat => match logprobs {
            None | Some(Value::Null) | Some(Value::Bool(false)) if top.is_none() => Ok(None),
            None | Some(Value::Null) | Some(Value::Bool(false)) => {
                Err(ApiError::invalid("top_logprobs", "top_logprobs needs logprobs: true"))
            }
            Some(Value::Bool(true)) => Ok(Some(top.unwrap_or(0))),
            Some(_) => Err(ApiError::invalid("logprobs", "logprobs must be true or false")),
        },
        Kind::Completion => {
            if top.is_some() {
                return Err(ApiError::invalid("top_logprobs", "the completions endpoint takes logprobs: N"));
            }
            match logprobs {
                None | Some(Value::Null) => Ok(None),
                Some(v) => match v.as_u64().filter(|&n| n <= 5) {
                    Some(n) => Ok(Some(n as u8)),
                    None => Err(ApiError::invalid("logprobs", "logprobs must be an integer from 0 to 5")),
                },
            }
        }
    }
}

pub(super) fn chat_messages(messages: &[Message]) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "at least one message is required"));
    }
    if messages.len() > MAX_MESSAGES {
        return Err(ApiError::invalid(
            "messages",
            format!("{} messages; at most {MAX_MESSAGES} are served per request", messages.len()),
        ));
    }
    messages
        .iter()
        .map(|m| {
            if !matches!(m.role.as_str(), "system" | "developer" | "user" | "assistant" | "tool") {
                return Err(ApiError::invalid("messages", format!("unsupported role {:?}", m.role)));
            }
            let content = match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for p in parts {
                        if p.kind != "text" {
                            return Err(ApiError::invalid(
                                "messages",
                                format!("content part {:?} is not served", p.kind),
                            ));
                        }
                        text.push_str(p.text.as_deref().unwrap_or_default());
                    }
                    text
                }
            };
            let role = if m.role == "developer" { "system".to_owned() } else { m.role.clone() };
            let tool_calls = match &m.tool_calls {
                Some(c) if m.role == "assistant" && !c.is_null() => Some(message_tool_calls(c)?),
                None | Some(Value::Null) => None,
                Some(_) => return Err(ApiError::invalid("messages", "only assistant messages carry tool_calls")),
            };
            let (tool_call_id, name) = if m.role == "tool" {
                let id = m.tool_call_id.clone().filter(|id| !id.is_empty());
                let id = id.ok_or_else(|| ApiError::invalid("messages", "a tool message needs its tool_call_id"))?;
                (Some(id), m.name.clone())
            } else {
                (None, None)
            };
            Ok(ChatMessage { role, content, tool_calls, tool_call_id, name })
        })
        .collect()
}

pub(super) fn completion_prompt(prompt: &Value, tokenizer: &Tokenizer) -> Result<Vec<u32>, ApiError> {
    let ids = |v: &[Value]| -> Option<Vec<u32>> {
        v.iter().map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok())).collect()
    };
    let ids = match prompt {
        Value::String(s) => tokenizer.encode(s, false).map_err(|e| ApiError::invalid("prompt", e.to_string()))?,
        Value::Array(items) if items.len() == 1 && items[0].is_string() => tokenizer
            .encode(items[0].as_str().unwrap_or_default(), false)
            .map_err(|e| ApiError::invalid("prompt", e.to_string()))?,
        Value::Array(items) if items.len() == 1 && items[0].is_array() => {
            ids(items[0].as_array().map(Vec::as_slice).unwrap_or_default())
                .ok_or_else(|| ApiError::invalid("prompt", "token ids must be integers"))?
        }
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_number) => {
            ids(items).ok_or_else(|| ApiError::invalid("prompt", "token ids must be integers"))?
        }
        _ => return Err(ApiError::invalid("prompt", "a string, or an array of token ids (one prompt only)")),
    };
    if ids.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt is empty"));
    }
    if let Some(bad) = ids.iter().find(|&&i| i as usize >= tokenizer.vocab_size()) {
        return Err(ApiError::invalid("prompt", format!("token id {bad} is outside the vocabulary")));
    }
    Ok(ids)
}
