//! Tool calls: how a model's chat template writes a call, how to read calls
//! back out of its output, and the grammar that forces one.
//!
//! The format is not guessed from the model's name: the template itself is
//! asked. [`ToolFormat::detect`] renders a conversation in which the
//! assistant made one known call and looks for it in the text, in each
//! format Veil parses. The model was trained on that text, so that is what
//! it writes when it calls a tool:
//!
//! | format | a call as the template writes it | families |
//! |---|---|---|
//! | [`ToolFormat::Hermes`] | `<tool_call>\n{"name": N, "arguments": A}\n</tool_call>` | Qwen 2.5, Qwen 3, QwQ, Hermes |
//! | [`ToolFormat::Llama3`] | `{"name": N, "parameters": A}` | Llama 3.1 – 3.3 |
//! | [`ToolFormat::MistralList`] | `[TOOL_CALLS][{"name": N, "arguments": A}]` | Mistral Nemo, v3 tokenizers |
//! | [`ToolFormat::MistralArgs`] | `[TOOL_CALLS]N[ARGS]A` | Mistral Small 3.2, Devstral, Ministral 3 |
//! | [`ToolFormat::Harmony`] | `<\|channel\|>commentary to=functions.N …<\|message\|>A` | gpt-oss ([`super::harmony`]) |
//! | [`ToolFormat::XmlFunction`] | `<tool_call>\n<function=N>\n<parameter=K>\nV\n</parameter>…` | Qwen3-Coder, Qwen 3.5, Nemotron 3, Step 3.5 |
//! | [`ToolFormat::ArgKey`] | `<tool_call>N<arg_key>K</arg_key><arg_value>V</arg_value>…` | GLM 4.6 / 4.7, Ling, Laguna |
//!
//! (The XML-style formats write each argument as text: [`super::xml_calls`].)
//! Other formats are refused by name, as is a template that never reads
//! `tools`.

pub use super::calls::{Parsed, ToolCall, ToolDef};
use serde_json::{json, Value};

use super::grammar::{ResponseFormat, MAX_SCHEMA_BYTES};
use super::template::{render, ChatMessage, RenderRequest};
use super::tokenizer::Tokenizer;
use super::xml_calls;

/// Most tools one request may define (OpenAI's limit).
pub const MAX_TOOLS: usize = 128;

/// How a model writes its tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>` blocks of `{"name", "arguments"}` JSON.
    Hermes,
    /// One `{"name", "parameters"}` JSON object as the whole answer.
    Llama3,
    /// `[TOOL_CALLS]` then a JSON list of `{"name", "arguments"}`.
    MistralList,
    /// `[TOOL_CALLS]name[ARGS]{…}` per call (a `[CALL_ID]id` may sit
    /// between the name and `[ARGS]`).
    MistralArgs,
    /// gpt-oss's harmony messages: a call is a `commentary` message to
    /// `functions.NAME` whose body is the arguments.
    Harmony,
    /// `<tool_call>` blocks of `<function=NAME>` and one
    /// `<parameter=KEY>` block of text per argument.
    XmlFunction,
    /// `<tool_call>NAME` then `<arg_key>`/`<arg_value>` pairs; `newlines`:
    /// the template puts a newline after the name and each tag pair.
    ArgKey {
        /// Newlines between the parts (GLM 4.6) or none (GLM 4.7).
        newlines: bool,
    },
}

/// Why a model's tool calls cannot be served.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ToolsError {
    /// The model has no chat template, or it never reads `tools`.
    #[error("this model's chat template has no tool section")]
    NoToolSection,
    /// The template writes calls in a format Veil does not parse.
    #[error("this model writes tool calls as {0}, which is not served")]
    Unsupported(String),
    /// Rendering the probe conversation failed.
    #[error("the chat template failed on a tool call: {0}")]
    Template(String),
}

/// Where a tool call begins in an answer's text (special tokens written
/// out): the text before it streams, the call does not.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CallMarkers {
    /// A call begins at the first of these, wherever it is.
    pub anywhere: Vec<String>,
    /// A call begins the answer when its text (after leading whitespace)
    /// begins with one of these.
    pub at_start: Vec<String>,
}

const PROBE_NAME: &str = "veil_probe_fn";
const PROBE_ID: &str = "call0veil";

/// Whether a chat template reads `tools` at all (the identifier, not a
/// word inside another): one that never does would drop the definitions.
pub fn reads_tools(template: &str) -> bool {
    super::template::reads(template, "tools")
}

/// The probe: one tool, and a conversation in which the assistant called it.
fn probe() -> (Value, [ChatMessage; 2]) {
    let tools = json!([{
        "type": "function",
        "function": {
            "name": PROBE_NAME,
            "description": "Probe.",
            "parameters": {"type": "object", "properties": {"q": {"type": "integer"}}, "required": ["q"]},
        },
    }]);
    let call = json!([{
        "id": PROBE_ID, "type": "function", "function": {"name": PROBE_NAME, "arguments": {"q": 1}},
    }]);
    let messages = [
        ChatMessage::new("user", "Probe."),
        ChatMessage { tool_calls: Some(call), ..ChatMessage::new("assistant", "") },
    ];
    (tools, messages)
}

impl ToolFormat {
    /// The format `tokenizer`'s chat template writes calls in.
    pub fn detect(tokenizer: &Tokenizer) -> Result<Self, ToolsError> {
        if !tokenizer.template_reads("tools") {
            return Err(ToolsError::NoToolSection);
        }
        let (tools, messages) = probe();
        let text =
            tokenizer.render_chat_with(&messages, Some(&tools)).map_err(|e| ToolsError::Template(e.to_string()))?;
        Self::from_rendered(&text)
    }

    /// The format a chat template's source writes calls in (rendered with
    /// `<s>` and `</s>` as BOS and EOS), for reviewing templates without a
    /// model.
    pub fn detect_in_template(template: &str) -> Result<Self, ToolsError> {
        if !reads_tools(template) {
            return Err(ToolsError::NoToolSection);
        }
        let (tools, messages) = probe();
        let request = RenderRequest {
            messages: &messages,
            add_generation_prompt: true,
            bos_token: "<s>",
            eos_token: "</s>",
            tools: Some(&tools),
            now: std::time::SystemTime::now(),
            extra: None,
        };
        let text = render(template, &request).map_err(|e| ToolsError::Template(e.to_string()))?;
        Self::from_rendered(&text)
    }

    /// The format whose call to the probe `text` holds.
    fn from_rendered(text: &str) -> Result<Self, ToolsError> {
        let n = PROBE_NAME;
        let formats = [
            (format!("<tool_call>\n{{\"name\": \"{n}\", \"arguments\": {{\"q\": 1}}}}\n</tool_call>"), Self::Hermes),
            (format!("[TOOL_CALLS][{{\"name\": \"{n}\", \"arguments\": {{\"q\": 1}}"), Self::MistralList),
            (format!("[TOOL_CALLS]{n}[ARGS]{{\"q\": 1}}"), Self::MistralArgs),
            (format!("[TOOL_CALLS]{n}[CALL_ID]{PROBE_ID}[ARGS]{{\"q\": 1}}"), Self::MistralArgs),
            (format!("{{\"name\": \"{n}\", \"parameters\": {{\"q\": 1}}}}"), Self::Llama3),
            (format!("to=functions.{n}<|channel|>commentary json<|message|>{{\"q\": 1}}"), Self::Harmony),
            (format!("<tool_call>\n<function={n}>\n<parameter=q>\n1\n</parameter>"), Self::XmlFunction),
            (format!("<tool_call>{n}\n<arg_key>q</arg_key>"), Self::ArgKey { newlines: true }),
            (format!("<tool_call>{n}<arg_key>q</arg_key>"), Self::ArgKey { newlines: false }),
        ];
        if let Some((_, f)) = formats.iter().find(|(needle, _)| text.contains(needle.as_str())) {
            return Ok(*f);
        }
        let other = if text.contains(&format!("<function={n}>")) {
            "XML-style <function=…> calls"
        } else if text.contains("<arg_key>") {
            "<arg_key>/<arg_value> calls"
        } else {
            "a format Veil does not recognise"
        };
        Err(ToolsError::Unsupported(other.to_owned()))
    }

    /// Where this format's calls begin.
    pub fn markers(self) -> CallMarkers {
        let strings = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect();
        match self {
            Self::Hermes | Self::XmlFunction | Self::ArgKey { .. } => {
                CallMarkers { anywhere: strings(&["<tool_call>"]), at_start: Vec::new() }
            }
            Self::MistralList | Self::MistralArgs => {
                CallMarkers { anywhere: strings(&["[TOOL_CALLS]"]), at_start: Vec::new() }
            }
            Self::Llama3 => CallMarkers { anywhere: Vec::new(), at_start: strings(&["{", "<|python_tag|>"]) },
            // Nothing is held back in the text: the gateway's harmony
            // reader holds a call's body (it knows the message's recipient).
            Self::Harmony => CallMarkers::default(),
        }
    }

    /// Reads the calls in `text` (the output with special tokens written
    /// out); `tools` type the XML formats' argument text. Text that holds
    /// no well-formed call is all content.
    pub fn parse(self, text: &str, tools: &[ToolDef]) -> Parsed {
        let xml = |found: Option<(String, Vec<ToolCall>)>| {
            found.filter(|(_, c)| !c.is_empty()).map(|(content, calls)| Parsed { content, calls, ..Parsed::default() })
        };
        let calls = match self {
            Self::Hermes => hermes(text),
            Self::Llama3 => llama3(text),
            Self::MistralList => mistral_list(text),
            Self::MistralArgs => mistral_args(text),
            Self::Harmony => return super::reasoning::parse(super::reasoning::ReasoningFormat::Harmony, text, true),
            Self::XmlFunction => xml(xml_calls::parse_function_blocks(text, tools)),
            Self::ArgKey { .. } => xml(xml_calls::parse_arg_blocks(text, tools)),
        };
        calls.unwrap_or_else(|| Parsed { content: text.trim().to_owned(), ..Parsed::default() })
    }

    /// The grammar that makes the answer one call to one of `tools`, its
    /// arguments valid under that tool's parameters. `special` gives the id
    /// of a marker (`<tool_call>`, `[TOOL_CALLS]`, `[ARGS]`) that is one
    /// special token in the model's vocabulary: the grammar then takes that
    /// token (what the model was trained to write) as well as the text.
    pub fn forced(self, tools: &[ToolDef], special: &dyn Fn(&str) -> Option<u32>) -> Result<ResponseFormat, String> {
        let lit = xml_calls::lit;
        let marker = |s: &str| match special(s) {
            Some(id) => format!("(<[{id}]> | {})", lit(s)),
            None => lit(s),
        };
        let mut alternatives = Vec::with_capacity(tools.len());
        let mut terminals = Vec::new();
        for (i, t) in tools.iter().enumerate() {
            let mut params = t.parameters.clone();
            compact(&mut params);
            let name = Value::String(t.name.clone());
            let object = |key: &str| {
                let mut o = json!({
                    "type": "object",
                    "properties": {"name": {"const": name}, key: params},
                    "required": ["name", key],
                    "additionalProperties": false,
                });
                compact(&mut o);
                o
            };
            let alt = match self {
                Self::Hermes => format!(
                    "{} \"\\n\" %json {} \"\\n\" {}",
                    marker("<tool_call>"),
                    object("arguments"),
                    marker("</tool_call>")
                ),
                Self::Llama3 => format!("%json {}", object("parameters")),
                Self::MistralList => format!("{} \"[\" %json {} \"]\"", marker("[TOOL_CALLS]"), object("arguments")),
                Self::MistralArgs => {
                    format!("{} {} {} %json {}", marker("[TOOL_CALLS]"), lit(&t.name), marker("[ARGS]"), params)
                }
                // As gpt-oss writes a call after the prompt's
                // `<|start|>assistant`; `<|call|>` ends generation.
                Self::Harmony => format!(
                    "{} {} {} \"json\" {} %json {} {}",
                    marker("<|channel|>"),
                    lit(&format!("commentary to=functions.{} ", t.name)),
                    marker("<|constrain|>"),
                    marker("<|message|>"),
                    params,
                    marker("<|call|>")
                ),
                Self::XmlFunction | Self::ArgKey { .. } => self.forced_xml(t, i, &marker, special, &mut terminals)?,
            };
            alternatives.push(alt);
        }
        let rules: Vec<String> = alternatives.iter().enumerate().map(|(i, a)| format!("call{i}: {a}\n")).collect();
        let start: Vec<String> = (0..alternatives.len()).map(|i| format!("call{i}")).collect();
        let terminals: Vec<String> = terminals.iter().map(|t| format!("{t}\n")).collect();
        let grammar = format!("start: {}\n{}{}", start.join(" | "), rules.concat(), terminals.concat());
        if grammar.len() > MAX_SCHEMA_BYTES {
            return Err(format!(
                "the forced tool call's grammar is {} bytes; at most {MAX_SCHEMA_BYTES}",
                grammar.len()
            ));
        }
        Ok(ResponseFormat::Lark { grammar })
    }
}

impl ToolFormat {
    /// A forced call to `t` (the `i`th tool) in an XML-style format: its
    /// arguments in the schema's order, the required ones always, the
    /// others optional; `terminals` gains the terminals its string values
    /// need.
    fn forced_xml(
        self,
        t: &ToolDef,
        i: usize,
        marker: &dyn Fn(&str) -> String,
        special: &dyn Fn(&str) -> Option<u32>,
        terminals: &mut Vec<String>,
    ) -> Result<String, String> {
        let lit = xml_calls::lit;
        let sep = if self == (Self::ArgKey { newlines: false }) { "" } else { "\n" };
        // An empty literal is left out, not written as "".
        let sep_lit = if sep.is_empty() { String::new() } else { lit(sep) };
        let empty = serde_json::Map::new();
        let props = t.parameters.get("properties").and_then(Value::as_object).unwrap_or(&empty);
        let required: Vec<&str> = t
            .parameters
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let mut items = Vec::with_capacity(props.len());
        for (j, (key, schema)) in props.iter().enumerate() {
            let term = format!("V{i}X{j}");
            let item = if self == Self::XmlFunction {
                let close = xml_calls::Close::Text("\n</parameter>");
                let (value, def) = xml_calls::value_then(schema, &close, key, &term)?;
                terminals.extend(def);
                format!("{} {value} \"\\n\"", lit(&format!("<parameter={key}>\n")))
            } else {
                let close = match special("</arg_value>") {
                    Some(id) => xml_calls::Close::Special(id),
                    None => xml_calls::Close::Text("</arg_value>"),
                };
                let (value, def) = xml_calls::value_then(schema, &close, key, &term)?;
                terminals.extend(def);
                format!(
                    "{} {} {} {sep_lit} {} {value} {sep_lit}",
                    marker("<arg_key>"),
                    lit(key),
                    marker("</arg_key>"),
                    marker("<arg_value>"),
                )
            };
            items.push(if required.contains(&key.as_str()) { item } else { format!("({item})?") });
        }
        let head = match self {
            Self::XmlFunction => lit(&format!("\n<function={}>\n", t.name)),
            _ => lit(&format!("{}{sep}", t.name)),
        };
        let tail = if self == Self::XmlFunction { lit("</function>\n") } else { String::new() };
        Ok(format!("{} {head} {} {tail} {}", marker("<tool_call>"), items.join(" "), marker("</tool_call>")))
    }
}

/// Sets the separators OpenAI writes (`", "`, `": "`, nothing else) on a
/// schema that is compiled on its own.
fn compact(schema: &mut Value) {
    if let Value::Object(m) = schema {
        m.insert(
            "x-guidance".into(),
            json!({"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": false}),
        );
    }
}

/// A `{"name": …, key: {…}}` object as a call; the arguments may also be a
/// string holding a JSON object.
fn call_from(v: &Value, keys: &[&str]) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?.to_owned();
    let args = keys.iter().find_map(|k| v.get(*k))?;
    let args = match args {
        Value::String(s) => serde_json::from_str::<Value>(s).ok()?,
        other => other.clone(),
    };
    args.is_object().then(|| ToolCall { name, arguments: args.to_string() })
}

fn hermes(text: &str) -> Option<Parsed> {
    const OPEN: &str = "<tool_call>";
    const CLOSE: &str = "</tool_call>";
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(OPEN) {
        content.push_str(&rest[..at]);
        let body = &rest[at + OPEN.len()..];
        let (inner, after) = match body.find(CLOSE) {
            Some(end) => (&body[..end], &body[end + CLOSE.len()..]),
            None => (body, ""),
        };
        let v: Value = serde_json::from_str(inner.trim()).ok()?;
        calls.push(call_from(&v, &["arguments", "parameters"])?);
        rest = after;
    }
    content.push_str(rest);
    (!calls.is_empty()).then(|| Parsed { content: content.trim().to_owned(), calls, ..Parsed::default() })
}

fn llama3(text: &str) -> Option<Parsed> {
    let body = text.trim();
    let body = body.strip_prefix("<|python_tag|>").unwrap_or(body).trim();
    // One call, or several separated by `;` as Llama 3.2 sometimes writes.
    let mut calls = Vec::new();
    for v in serde_json::Deserializer::from_str(body).into_iter::<Value>() {
        calls.push(call_from(&v.ok()?, &["parameters", "arguments"])?);
    }
    (!calls.is_empty()).then(|| Parsed { calls, ..Parsed::default() })
}

fn mistral_list(text: &str) -> Option<Parsed> {
    let at = text.find("[TOOL_CALLS]")?;
    let list: Vec<Value> = serde_json::from_str(text[at + "[TOOL_CALLS]".len()..].trim()).ok()?;
    let calls: Option<Vec<ToolCall>> = list.iter().map(|v| call_from(v, &["arguments", "parameters"])).collect();
    let calls = calls.filter(|c| !c.is_empty())?;
    Some(Parsed { content: text[..at].trim().to_owned(), calls, ..Parsed::default() })
}

fn mistral_args(text: &str) -> Option<Parsed> {
    const CALLS: &str = "[TOOL_CALLS]";
    let at = text.find(CALLS)?;
    let content = text[..at].trim().to_owned();
    let mut calls = Vec::new();
    let mut rest = &text[at..];
    while let Some(r) = rest.strip_prefix(CALLS) {
        let args_at = r.find("[ARGS]")?;
        let name = r[..args_at].split("[CALL_ID]").next().unwrap_or_default().trim().to_owned();
        let mut stream = serde_json::Deserializer::from_str(&r[args_at + "[ARGS]".len()..]).into_iter::<Value>();
        let args = stream.next()?.ok()?;
        if name.is_empty() || !args.is_object() {
            return None;
        }
        calls.push(ToolCall { name, arguments: args.to_string() });
        rest = r[args_at + "[ARGS]".len() + stream.byte_offset()..].trim_start();
    }
    if !rest.trim().is_empty() {
        return None;
    }
    Some(Parsed { content, calls, ..Parsed::default() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, args: &str) -> ToolCall {
        ToolCall { name: name.into(), arguments: args.into() }
    }

    #[test]
    fn hermes_blocks_are_read_with_the_text_around_them() {
        let p = ToolFormat::Hermes.parse(
            "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n\
             <tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": \\\"CET\\\"}\"}\n</tool_call>",
            &[],
        );
        assert_eq!(p.content, "Let me check.");
        assert_eq!(p.calls, vec![call("get_weather", r#"{"city":"Paris"}"#), call("get_time", r#"{"tz":"CET"}"#)]);
        // Cut off before its closing tag (the answer ended): still a call.
        let p = ToolFormat::Hermes.parse("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n", &[]);
        assert_eq!(p.calls, vec![call("f", "{}")]);
        // Broken JSON, or no block: all content.
        for text in ["<tool_call>\n{\"name\": \"f\", \"arguments\": {\n</tool_call>", "Just text."] {
            let p = ToolFormat::Hermes.parse(text, &[]);
            assert!(p.calls.is_empty());
            assert_eq!(p.content, text.trim());
        }
    }

    #[test]
    fn llama3_and_mistral_calls_are_read() {
        let p = ToolFormat::Llama3.parse("<|python_tag|>{\"name\": \"f\", \"parameters\": {\"x\": 1}}", &[]);
        assert_eq!(p.calls, vec![call("f", r#"{"x":1}"#)]);
        assert!(ToolFormat::Llama3.parse("The answer is {\"name\": 1}", &[]).calls.is_empty());
        let p = ToolFormat::MistralList.parse("Sure.[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"x\": 1}}]", &[]);
        assert_eq!((p.content.as_str(), p.calls), ("Sure.", vec![call("f", r#"{"x":1}"#)]));
        let p = ToolFormat::MistralArgs
            .parse("[TOOL_CALLS]f[ARGS]{\"x\": 1}[TOOL_CALLS]g[CALL_ID]abc123xyz[ARGS]{\"y\": [2]}", &[]);
        assert_eq!(p.calls, vec![call("f", r#"{"x":1}"#), call("g", r#"{"y":[2]}"#)]);
        assert!(ToolFormat::MistralArgs.parse("[TOOL_CALLS]f[ARGS]{\"x\": ", &[]).calls.is_empty());
        assert!(ToolFormat::MistralArgs.parse("[TOOL_CALLS]f[ARGS]{} trailing words", &[]).calls.is_empty());
    }

    #[test]
    fn the_probe_finds_each_format_and_names_the_ones_it_refuses() {
        let n = PROBE_NAME;
        let qwen = format!("<|im_start|>assistant\n<tool_call>\n{{\"name\": \"{n}\", \"arguments\": {{\"q\": 1}}}}\n</tool_call><|im_end|>");
        assert_eq!(ToolFormat::from_rendered(&qwen), Ok(ToolFormat::Hermes));
        let llama = format!("<|start_header_id|>assistant<|end_header_id|>\n\n{{\"name\": \"{n}\", \"parameters\": {{\"q\": 1}}}}<|eot_id|>");
        assert_eq!(ToolFormat::from_rendered(&llama), Ok(ToolFormat::Llama3));
        let harmony = format!("<|start|>assistant to=functions.{n}<|channel|>commentary json<|message|>{{\"q\": 1}}");
        assert_eq!(ToolFormat::from_rendered(&harmony), Ok(ToolFormat::Harmony));
        let coder = format!("<tool_call>\n<function={n}>\n<parameter=q>\n1\n</parameter>\n</function>");
        assert_eq!(ToolFormat::from_rendered(&coder), Ok(ToolFormat::XmlFunction));
        let glm = format!("<tool_call>{n}<arg_key>q</arg_key><arg_value>1</arg_value></tool_call>");
        assert_eq!(ToolFormat::from_rendered(&glm), Ok(ToolFormat::ArgKey { newlines: false }));
        let seed = format!("<seed:tool_call>\n<function={n}>\n<parameter=q>1</parameter>\n</function>");
        assert_eq!(
            ToolFormat::from_rendered(&seed),
            Err(ToolsError::Unsupported("XML-style <function=…> calls".into()))
        );
    }

    #[test]
    fn a_forced_call_is_a_grammar_over_every_tool() {
        let tools = [
            ToolDef { name: "a".into(), description: None, parameters: json!({"type": "object"}) },
            ToolDef { name: "b".into(), description: None, parameters: json!({"type": "object"}) },
        ];
        let ResponseFormat::Lark { grammar } = ToolFormat::Hermes.forced(&tools, &|_| None).unwrap() else { panic!() };
        assert!(grammar.starts_with("start: call0 | call1\n"), "{grammar}");
        assert!(grammar.contains(r#"call1: "<tool_call>" "\n" %json {"#), "{grammar}");
        // A marker that is one special token: that token, or its text.
        let special = |t: &str| (t == "[ARGS]").then_some(771);
        let ResponseFormat::Lark { grammar } = ToolFormat::MistralArgs.forced(&tools[..1], &special).unwrap() else {
            panic!()
        };
        assert!(grammar.contains(r#"call0: "[TOOL_CALLS]" "a" (<[771]> | "[ARGS]") %json {"#), "{grammar}");
        let huge = [ToolDef {
            name: "a".into(),
            description: None,
            parameters: json!({"description": "x".repeat(MAX_SCHEMA_BYTES)}),
        }];
        assert!(ToolFormat::Llama3.forced(&huge, &|_| None).is_err());
    }
}
