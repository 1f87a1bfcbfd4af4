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
    let kind = match endpoint(method, path, model_name)? {
        Endpoint::Answered(route) => return Ok(route),
        Endpoint::Generate(kind) => kind,
    };
    if body.len() > MAX_BODY {
        return Err(ApiError {
            status: 413,
            kind: "invalid_request_error",
            param: None,
            message: "request body too large".into(),
        });
    }
    let prompt = match kind {
        Kind::Chat => chat_prompt(body, tokenizer, context)?,
        Kind::Completion => completion_prompt_of(body, tokenizer, context)?,
    };
    generation(kind, prompt, tokenizer, model_name, context)
}

/// Where a request goes: answered from the path alone, or a generation.
enum Endpoint {
    Answered(Route),
    Generate(Kind),
}

/// The method and path (its query ignored): the model list, the served
/// model, or one of the two generation endpoints; anything else is a 404
/// or 405.
fn endpoint(method: &[u8], path: &[u8], model_name: &str) -> Result<Endpoint, ApiError> {
    let path = path.split(|&b| b == b'?').next().unwrap_or_default();
    match (method, path) {
        (b"GET", p) if p == MODELS_PATH.as_bytes() => Ok(Endpoint::Answered(Route::Models)),
        (b"GET", p) if p.starts_with(MODELS_PATH.as_bytes()) && p.get(MODELS_PATH.len()) == Some(&b'/') => {
            let id = String::from_utf8_lossy(&p[MODELS_PATH.len() + 1..]).into_owned();
            if id.eq_ignore_ascii_case(model_name) {
                Ok(Endpoint::Answered(Route::Model))
            } else {
                Err(ApiError::model_not_found(&id))
            }
        }
        (b"POST", p) if p == CHAT_COMPLETIONS_PATH.as_bytes() => Ok(Endpoint::Generate(Kind::Chat)),
        (b"POST", p) if p == COMPLETIONS_PATH.as_bytes() => Ok(Endpoint::Generate(Kind::Completion)),
        (_, p) if [MODELS_PATH, CHAT_COMPLETIONS_PATH, COMPLETIONS_PATH].iter().any(|k| p == k.as_bytes()) => {
            Err(ApiError {
                status: 405,
                kind: "invalid_request_error",
                param: None,
                message: "method not allowed".into(),
            })
        }
        _ => Err(ApiError { status: 404, kind: "not_found_error", param: None, message: "unknown endpoint".into() }),
    }
}

/// A request's prompt, tokenized, with what the rest of it asks.
struct Prompt {
    common: Common,
    ids: Vec<u32>,
    /// Tools offered (and `tool_choice` not `none`), with the grammar of a
    /// forced call.
    tool_use: Option<(Tools, Option<ResponseFormat>)>,
    /// The prompt as written, for a completion's `echo`.
    text: Option<String>,
}

fn bad_json(e: serde_json::Error) -> ApiError {
    ApiError::invalid("body", format!("invalid JSON: {e}"))
}

/// Text longer than the context can hold at [`MAX_BYTES_PER_TOKEN`] bytes a
/// token is refused before it is templated or tokenized (no allocation grows
/// with it). Real text averages about 4 bytes a token.
fn fits(bytes: usize, param: &'static str, tokenizer: &Tokenizer, context: usize) -> Result<(), ApiError> {
    let limit = context.saturating_mul(tokenizer.max_token_bytes().min(MAX_BYTES_PER_TOKEN));
    if bytes > limit {
        return Err(ApiError::invalid(
            param,
            format!("the prompt is {bytes} bytes; at most {limit} can fit this model's context"),
        ));
    }
    Ok(())
}

/// A chat request: its messages, the tools it offers and the template
/// variables it sets, rendered by the model's template and tokenized.
fn chat_prompt(body: &[u8], tokenizer: &Tokenizer, context: usize) -> Result<Prompt, ApiError> {
    let b: ChatBody = serde_json::from_slice(body).map_err(bad_json)?;
    let messages = chat_messages(&b.messages)?;
    let tools = tools(b.common.tools.as_ref())?;
    let choice = tool_choice(b.common.tool_choice.as_ref(), &tools)?;
    let offered = !tools.is_empty() && choice != ToolChoice::None;
    fits(messages.iter().map(|m| m.content.len()).sum(), "messages", tokenizer, context)?;
    let shown = offered.then(|| tools_context(&tools));
    let mut tool_use = None;
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
    Ok(Prompt { common: b.common, ids, tool_use, text: None })
}

/// A completion request: its prompt (text, a list of texts or token ids),
/// tokenized as written; chat-only parameters refused.
fn completion_prompt_of(body: &[u8], tokenizer: &Tokenizer, context: usize) -> Result<Prompt, ApiError> {
    let b: CompletionBody = serde_json::from_slice(body).map_err(bad_json)?;
    if b.common.tools.as_ref().is_some_and(|t| !t.is_null()) {
        return Err(ApiError::invalid("tools", "tools are served on /v1/chat/completions only"));
    }
    for (param, v) in [("reasoning_effort", &b.reasoning_effort), ("chat_template_kwargs", &b.chat_template_kwargs)] {
        if v.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(ApiError::invalid(param, format!("{param} is served on /v1/chat/completions only")));
        }
    }
    let text_bytes = match &b.prompt {
        Value::String(t) => t.len(),
        Value::Array(items) => items.iter().filter_map(Value::as_str).map(str::len).sum(),
        _ => 0,
    };
    fits(text_bytes, "prompt", tokenizer, context)?;
    let ids = completion_prompt(&b.prompt, tokenizer)?;
    let text = match (b.common.echo == Some(true), &b.prompt) {
        (false, _) => None,
        (true, Value::String(t)) => Some(t.clone()),
        (true, _) => Some(tokenizer.decode(&ids).map_err(|e| ApiError::invalid("prompt", e.to_string()))?),
    };
    Ok(Prompt { common: b.common, ids, tool_use: None, text })
}

/// The sampling parameters every endpoint shares, range-checked: what chat
/// apps send at its default is accepted; anything that would change the
/// output and is not implemented is refused, never silently ignored.
struct Sampling {
    temperature: f32,
    top_p: f32,
    stop: Vec<String>,
}

fn sampling(common: &mut Common) -> Result<Sampling, ApiError> {
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
    let temperature = common.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid("temperature", "temperature must be between 0 and 2"));
    }
    let top_p = common.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid("top_p", "top_p must be in (0, 1]"));
    }
    let stop = match common.stop.take() {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    if stop.len() > 4 || stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "up to 4 non-empty stop strings"));
    }
    Ok(Sampling { temperature, top_p, stop })
}

/// `max_tokens` (or `max_completion_tokens`): by default what the context
/// leaves (chat) or [`DEFAULT_COMPLETION_TOKENS`]; prompt and output within
/// the context.
fn max_tokens(kind: Kind, common: &Common, prompt: usize, context: usize, echo: bool) -> Result<usize, ApiError> {
    if prompt >= context {
        return Err(ApiError::invalid(
            "messages",
            format!("the prompt is {prompt} tokens; this model's context is {context}"),
        ));
    }
    let default_max = match kind {
        Kind::Chat => context - prompt,
        Kind::Completion => DEFAULT_COMPLETION_TOKENS,
    };
    let max_tokens = common.max_completion_tokens.or(common.max_tokens).unwrap_or(default_max);
    // With echo, max_tokens 0 scores the prompt and generates nothing.
    if max_tokens == 0 && !echo {
        return Err(ApiError::invalid("max_tokens", "max_tokens must be at least 1 (or 0 with echo)"));
    }
    // `prompt < context` above, so the subtraction cannot underflow, and a
    // client-chosen max_tokens cannot overflow an addition.
    if max_tokens > context - prompt {
        return Err(ApiError::invalid(
            "max_tokens",
            format!("{prompt} prompt tokens + max_tokens {max_tokens} exceed the context of {context}"),
        ));
    }
    Ok(max_tokens)
}

/// The rest of a generation request, validated against its prompt.
fn generation(
    kind: Kind,
    prompt: Prompt,
    tokenizer: &Tokenizer,
    model_name: &str,
    context: usize,
) -> Result<Route, ApiError> {
    let Prompt { mut common, ids: prompt_ids, tool_use, text: prompt_text } = prompt;
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
    let Sampling { temperature, top_p, stop } = sampling(&mut common)?;
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
    let max_tokens = max_tokens(kind, &common, prompt_ids.len(), context, echo)?;
    // Under a response format or a forced call the grammar holds from the
    // first token, so the answer does not think first, even where the
    // prompt opened a `<think>` block: it is read as content.
    let reasoning = match kind {
        Kind::Chat => ReasoningFormat::of(tokenizer, &prompt_ids, response_format.is_some()),
        Kind::Completion => None,
    };
    let harmony = kind == Kind::Chat && tokenizer.harmony();
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

mod params;
use params::*;
pub use params::{MAX_TEMPLATE_VARIABLES, MAX_TEMPLATE_VARIABLES_BYTES};
