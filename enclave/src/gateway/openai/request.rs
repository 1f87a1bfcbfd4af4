//! Request parsing and validation: a sealed request's JSON body into a
//! [`Route`] with its [`Call`], or an [`ApiError`] naming the parameter.

use super::*;

/// `stop`: a string or a list of strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

/// Message content: a string, or a list of text parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Clone, Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
struct Message {
    role: String,
    content: Option<Content>,
    /// An assistant's earlier tool calls.
    #[serde(default)]
    tool_calls: Option<Value>,
    /// The call a `tool` message answers.
    #[serde(default)]
    tool_call_id: Option<String>,
    /// The function a `tool` message answers for.
    #[serde(default)]
    name: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// Fields both endpoints share. Unknown fields are ignored, as OpenAI's
/// own clients send many; those we cannot honour are refused when set.
#[derive(Debug, Clone, Deserialize)]
struct Common {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    max_tokens: Option<usize>,
    #[serde(default)]
    max_completion_tokens: Option<usize>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    stop: Option<Stop>,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    n: Option<u32>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default)]
    logprobs: Option<Value>,
    #[serde(default)]
    top_logprobs: Option<Value>,
    #[serde(default)]
    echo: Option<bool>,
    #[serde(default)]
    presence_penalty: Option<f32>,
    #[serde(default)]
    frequency_penalty: Option<f32>,
    #[serde(default)]
    logit_bias: Option<Value>,
    #[serde(default)]
    tools: Option<Value>,
    #[serde(default)]
    tool_choice: Option<Value>,
    #[serde(default)]
    parallel_tool_calls: Option<bool>,
    #[serde(default)]
    response_format: Option<Value>,
    /// Extension (vLLM's name; llama.cpp's `repeat_penalty`): logits of the
    /// last 64 tokens (prompt and answer) divided by it where positive,
    /// multiplied where negative; 1 = off. Turns speculation off.
    #[serde(default)]
    repetition_penalty: Option<f32>,
    /// Veil extension: speculative decoding on (`true`) or off (`false`)
    /// for this request; absent = the cluster's setting. Never changes the
    /// output's distribution, only its speed.
    #[serde(default)]
    speculate: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
struct ChatBody {
    messages: Vec<Message>,
    /// OpenAI's reasoning effort, given to a template that reads it
    /// (gpt-oss's writes `Reasoning: low|medium|high`).
    #[serde(default)]
    reasoning_effort: Option<Value>,
    /// More template variables (vLLM's extension, e.g. Qwen 3's
    /// `enable_thinking`).
    #[serde(default)]
    chat_template_kwargs: Option<Value>,
    #[serde(flatten)]
    common: Common,
}

#[derive(Debug, Clone, Deserialize)]
struct CompletionBody {
    prompt: Value,
    /// Refused here: a completion's prompt is not templated.
    #[serde(default)]
    reasoning_effort: Option<Value>,
    #[serde(default)]
    chat_template_kwargs: Option<Value>,
    #[serde(flatten)]
    common: Common,
}

/// Which API shape to answer in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `chat.completion` / `chat.completion.chunk`.
    Chat,
    /// `text_completion`.
    Completion,
}

/// A validated generation call.
#[derive(Debug, Clone)]
pub struct Call {
    /// Response shape.
    pub kind: Kind,
    /// What to generate (prompt ids filled in).
    pub request: PipelineRequest,
    /// Stream as server-sent events.
    pub stream: bool,
    /// Add a usage chunk before `[DONE]`.
    pub include_usage: bool,
    /// The model name to echo.
    pub model: String,
    /// Choices to generate (`n`): sessions with seeds `seed`, `seed + 1`, …,
    /// each prefilled on its own.
    pub n: usize,
    /// Read tool calls out of each answer in this format (tools offered
    /// and `tool_choice` not `none`).
    pub tools: Option<Tools>,
    /// How a chat answer sets its reasoning apart, when the model does
    /// ([`crate::text::reasoning`]): it is returned as `reasoning_content`.
    pub reasoning: Option<ReasoningFormat>,
    /// `echo` (completions, not streamed): the prompt as written, which each
    /// choice's text starts with; with `logprobs`, the prompt's tokens are
    /// scored and come first in `logprobs`.
    pub echo: Option<String>,
}

/// How the answers of a call that offered tools are read.
#[derive(Debug, Clone)]
pub struct Tools {
    /// The model's call format.
    pub format: ToolFormat,
    /// The tools offered (their schemas type the XML formats' arguments).
    pub defs: std::sync::Arc<[ToolDef]>,
    /// `parallel_tool_calls`: more than one call per answer (else only
    /// the first is returned).
    pub parallel: bool,
}

/// What `tool_choice` asks.
#[derive(Debug, Clone, PartialEq)]
enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

/// Most choices (`n`) one request may ask for: each is a session of its
/// own, so this bounds what one request can take of the entry.
pub const MAX_CHOICES: usize = 8;

/// One choice of a complete answer.
#[derive(Debug, Clone)]
pub struct Choice<'a> {
    /// Its text.
    pub text: &'a str,
    /// Its reasoning (`reasoning_content`), when the model sets it apart.
    pub reasoning: Option<&'a str>,
    /// `stop` or `length`.
    pub finish: &'a str,
    /// Its log-probabilities ([`logprobs_json`]), when asked for.
    pub logprobs: Option<Value>,
    /// Its tool calls ([`tool_calls_json`]), when it made any.
    pub tool_calls: Option<Value>,
}

/// What a request asks for.
#[derive(Debug, Clone)]
pub enum Route {
    /// Generate.
    Generate(Box<Call>),
    /// `GET /v1/models`.
    Models,
    /// `GET /v1/models/{id}` for the served model.
    Model,
}

/// Parses and validates one request. `context` bounds prompt + output.
pub fn parse(
    method: &[u8],
    path: &[u8],
    body: &[u8],
    tokenizer: &Tokenizer,
    model_name: &str,
    context: usize,
) -> Result<Route, ApiError> {
    let path = path.split(|&b| b == b'?').next().unwrap_or_default();
    let kind = match (method, path) {
        (b"GET", p) if p == MODELS_PATH.as_bytes() => return Ok(Route::Models),
        (b"GET", p) if p.starts_with(MODELS_PATH.as_bytes()) && p.get(MODELS_PATH.len()) == Some(&b'/') => {
            let id = String::from_utf8_lossy(&p[MODELS_PATH.len() + 1..]).into_owned();
            return if id.eq_ignore_ascii_case(model_name) {
                Ok(Route::Model)
            } else {
                Err(ApiError::model_not_found(&id))
            };
        }
        (b"POST", p) if p == CHAT_COMPLETIONS_PATH.as_bytes() => Kind::Chat,
        (b"POST", p) if p == COMPLETIONS_PATH.as_bytes() => Kind::Completion,
        (_, p) if [MODELS_PATH, CHAT_COMPLETIONS_PATH, COMPLETIONS_PATH].iter().any(|k| p == k.as_bytes()) => {
            return Err(ApiError {
                status: 405,
                kind: "invalid_request_error",
                param: None,
                message: "method not allowed".into(),
            })
        }
        _ => {
            return Err(ApiError {
                status: 404,
                kind: "not_found_error",
                param: None,
                message: "unknown endpoint".into(),
            })
        }
    };
    if body.len() > MAX_BODY {
        return Err(ApiError {
            status: 413,
            kind: "invalid_request_error",
            param: None,
            message: "request body too large".into(),
        });
    }
    let bad_json = |e: serde_json::Error| ApiError::invalid("body", format!("invalid JSON: {e}"));
    // Text longer than the context can hold at MAX_BYTES_PER_TOKEN bytes a
    // token is refused before it is templated or tokenized (no allocation
    // grows with it). Real text averages about 4 bytes a token.
    let too_long = |bytes: usize, param: &'static str| {
        let limit = context.saturating_mul(tokenizer.max_token_bytes().min(MAX_BYTES_PER_TOKEN));
        (bytes > limit).then(|| {
            ApiError::invalid(
                param,
                format!("the prompt is {bytes} bytes; at most {limit} can fit this model's context"),
            )
        })
    };
    let mut tool_use = None;
    let harmony = kind == Kind::Chat && tokenizer.harmony();
    // The prompt as written, for `echo` (a completion's).
    let mut prompt_text: Option<String> = None;
    let (common, prompt_ids) = match kind {
        Kind::Chat => {
            let b: ChatBody = serde_json::from_slice(body).map_err(bad_json)?;
            let messages = chat_messages(&b.messages)?;
            let tools = tools(b.common.tools.as_ref())?;
            let choice = tool_choice(b.common.tool_choice.as_ref(), &tools)?;
            let offered = !tools.is_empty() && choice != ToolChoice::None;
            if let Some(e) = too_long(messages.iter().map(|m| m.content.len()).sum(), "messages") {
                return Err(e);
            }
            let shown = offered.then(|| tools_context(&tools));
            if offered {
                let format = tokenizer.tool_format().map_err(|e| ApiError::invalid("tools", e.to_string()))?;
                let special = |t: &str| tokenizer.special_id(t);
                let forced = match &choice {
                    ToolChoice::Required => Some(format.forced(&tools, &special)),
                    ToolChoice::Named(n) => {
                        let named: Vec<ToolDef> = tools.iter().filter(|t| &t.name == n).cloned().collect();
                        Some(format.forced(&named, &special))
                    }
                    _ => None,
                };
                let forced = forced.transpose().map_err(|e| ApiError::invalid("tool_choice", e))?;
                let parallel = b.common.parallel_tool_calls.unwrap_or(true);
                tool_use = Some((Tools { format, defs: tools.clone().into(), parallel }, forced));
            }
            let extra = template_variables(tokenizer, b.reasoning_effort.as_ref(), b.chat_template_kwargs.as_ref())?;
            let ids = tokenizer
                .encode_chat_in(&messages, shown.as_ref(), extra.as_ref())
                .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
            (b.common, ids)
        }
        Kind::Completion => {
            let b: CompletionBody = serde_json::from_slice(body).map_err(bad_json)?;
            if b.common.tools.as_ref().is_some_and(|t| !t.is_null()) {
                return Err(ApiError::invalid("tools", "tools are served on /v1/chat/completions only"));
            }
            for (param, v) in
                [("reasoning_effort", &b.reasoning_effort), ("chat_template_kwargs", &b.chat_template_kwargs)]
            {
                if v.as_ref().is_some_and(|v| !v.is_null()) {
                    return Err(ApiError::invalid(param, format!("{param} is served on /v1/chat/completions only")));
                }
            }
            let text_bytes = match &b.prompt {
                Value::String(t) => t.len(),
                Value::Array(items) => items.iter().filter_map(Value::as_str).map(str::len).sum(),
                _ => 0,
            };
            if let Some(e) = too_long(text_bytes, "prompt") {
                return Err(e);
            }
            let ids = completion_prompt(&b.prompt, tokenizer)?;
            if b.common.echo == Some(true) {
                prompt_text = Some(match &b.prompt {
                    Value::String(t) => t.clone(),
                    _ => tokenizer.decode(&ids).map_err(|e| ApiError::invalid("prompt", e.to_string()))?,
                });
            }
            (b.common, ids)
        }
    };
    // Another model's name is OpenAI's 404, not this model answering in its place.
    if let Some(m) = common.model.as_deref() {
        if !m.eq_ignore_ascii_case(model_name) {
            return Err(ApiError::model_not_found(m));
        }
    }
    let n = common.n.unwrap_or(1) as usize;
    if !(1..=MAX_CHOICES).contains(&n) {
        return Err(ApiError::invalid("n", format!("n must be from 1 to {MAX_CHOICES}")));
    }
    let logprobs = logprobs_asked(kind, common.logprobs.as_ref(), common.top_logprobs.as_ref())?;
    let echo = common.echo == Some(true);
    if echo && kind == Kind::Chat {
        return Err(ApiError::invalid("echo", "echo is served on /v1/completions only"));
    }
    if echo && common.stream == Some(true) {
        return Err(ApiError::invalid("echo", "echo is served without stream"));
    }
    // What chat apps send: defaults are accepted; anything that would change
    // the output and is not implemented is refused, never silently ignored.
    for (param, value) in
        [("presence_penalty", common.presence_penalty), ("frequency_penalty", common.frequency_penalty)]
    {
        if value.is_some_and(|v| !(-2.0..=2.0).contains(&v)) {
            return Err(ApiError::invalid(param, format!("{param} must be between -2 and 2")));
        }
    }
    if common.repetition_penalty.is_some_and(|v| !(v > 0.0 && v <= 2.0)) {
        return Err(ApiError::invalid("repetition_penalty", "repetition_penalty must be above 0 and at most 2"));
    }
    let logit_bias = logit_bias(common.logit_bias.as_ref(), tokenizer.vocab_size())?;
    let mut response_format = response_format(common.response_format.as_ref())?;
    let tools = match tool_use {
        Some((_, _)) if response_format.is_some() => {
            return Err(ApiError::invalid(
                "response_format",
                "response_format with tools is not served (set tool_choice to none, or drop one)",
            ))
        }
        Some((t, forced)) => {
            response_format = forced;
            Some(t)
        }
        None => None,
    };
    let temperature = common.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid("temperature", "temperature must be between 0 and 2"));
    }
    let top_p = common.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid("top_p", "top_p must be in (0, 1]"));
    }
    let stop = match common.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    if stop.len() > 4 || stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "up to 4 non-empty stop strings"));
    }
    if prompt_ids.len() >= context {
        return Err(ApiError::invalid(
            "messages",
            format!("the prompt is {} tokens; this model's context is {context}", prompt_ids.len()),
        ));
    }
    let default_max = match kind {
        Kind::Chat => context - prompt_ids.len(),
        Kind::Completion => DEFAULT_COMPLETION_TOKENS,
    };
    let max_tokens = common.max_completion_tokens.or(common.max_tokens).unwrap_or(default_max);
    // With echo, max_tokens 0 scores the prompt and generates nothing.
    if max_tokens == 0 && !echo {
        return Err(ApiError::invalid("max_tokens", "max_tokens must be at least 1 (or 0 with echo)"));
    }
    // `prompt < context` above, so the subtraction cannot underflow, and a
    // client-chosen max_tokens cannot overflow an addition.
    if max_tokens > context - prompt_ids.len() {
        return Err(ApiError::invalid(
            "max_tokens",
            format!("{} prompt tokens + max_tokens {max_tokens} exceed the context of {context}", prompt_ids.len()),
        ));
    }
    // Under a response format or a forced call the grammar holds from the
    // first token, so the answer does not think first, even where the
    // prompt opened a `<think>` block: it is read as content.
    let reasoning = match kind {
        Kind::Chat => ReasoningFormat::of(tokenizer, &prompt_ids, response_format.is_some()),
        Kind::Completion => None,
    };
    let request = PipelineRequest {
        prompt_ids,
        max_tokens,
        sampling: SamplingParams {
            temperature,
            top_p,
            // Unseeded requests draw a seed from the OS: two identical unseeded
            // prompts do not get the same sampled answer.
            seed: common.seed.unwrap_or_else(crate::pipeline::sessions::random_id),
            presence_penalty: common.presence_penalty.unwrap_or(0.0),
            frequency_penalty: common.frequency_penalty.unwrap_or(0.0),
            repetition_penalty: common.repetition_penalty.unwrap_or(1.0),
            logit_bias,
            logprobs,
            response_format,
            ..SamplingParams::default()
        },
        stop,
        speculation: SpeculationRequest { enabled: common.speculate, ..SpeculationRequest::default() },
        // A harmony answer is read with special tokens written out, all of
        // it (the gateway sorts it by channel).
        calls: match harmony {
            true => Some(CallMarkers::default()),
            false => tools.as_ref().map(|t| t.format.markers()),
        },
        score_prompt: echo && logprobs.is_some(),
    };
    Ok(Route::Generate(Box::new(Call {
        kind,
        request,
        stream: common.stream.unwrap_or(false),
        include_usage: common.stream_options.is_some_and(|o| o.include_usage),
        model: common.model.unwrap_or_else(|| model_name.to_owned()),
        n,
        tools,
        reasoning,
        echo: prompt_text,
    })))
}

/// Most `chat_template_kwargs` variables, and their JSON size.
pub const MAX_TEMPLATE_VARIABLES: usize = 16;
/// See [`MAX_TEMPLATE_VARIABLES`].
pub const MAX_TEMPLATE_VARIABLES_BYTES: usize = 4096;

/// The extra variables a chat request gives the template:
/// `chat_template_kwargs` (each an identifier the template reads, none of
/// those every render sets) and `reasoning_effort` (`minimal`, `low`,
/// `medium` or `high`, for a template that reads it). One the template
/// would not read is a 400, not ignored.
fn template_variables(
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
fn tools(v: Option<&Value>) -> Result<Vec<ToolDef>, ApiError> {
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
fn tools_context(tools: &[ToolDef]) -> Value {
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
fn tool_choice(v: Option<&Value>, tools: &[ToolDef]) -> Result<ToolChoice, ApiError> {
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
fn message_tool_calls(v: &Value) -> Result<Value, ApiError> {
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
fn response_format(v: Option<&Value>) -> Result<Option<ResponseFormat>, ApiError> {
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
fn logit_bias(v: Option<&Value>, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
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
fn logprobs_asked(kind: Kind, logprobs: Option<&Value>, top: Option<&Value>) -> Result<Option<u8>, ApiError> {
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

fn chat_messages(messages: &[Message]) -> Result<Vec<ChatMessage>, ApiError> {
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

fn completion_prompt(prompt: &Value, tokenizer: &Tokenizer) -> Result<Vec<u32>, ApiError> {
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
