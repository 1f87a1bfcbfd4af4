//! Chat templates: the Jinja text a GGUF carries (`tokenizer.chat_template`),
//! rendered on `minijinja` the way Hugging Face transformers renders it with
//! Python's jinja2 in `apply_chat_template`.
//!
//! What HF sets up, and what this module does to match it:
//!
//! | HF (jinja2)                                        | here (minijinja)                              |
//! |----------------------------------------------------|-----------------------------------------------|
//! | `trim_blocks=True`, `lstrip_blocks=True`           | the same settings                             |
//! | trailing newline of the template dropped           | `keep_trailing_newline` off                   |
//! | Python `str`/`dict`/`list` methods                 | `minijinja_contrib::pycompat`                 |
//! | `loopcontrols` extension (`break`, `continue`)     | minijinja's `loop_controls` feature           |
//! | `{% generation %}` tag (assistant-mask tracking)   | rewritten to a block that renders its body    |
//! | `raise_exception(msg)` raises `TemplateError`      | [`TemplateError::Raised`]                     |
//! | `strftime_now(fmt)`: local `datetime.now()`        | [`RenderRequest::now`] (UTC), C-locale subset |
//! | `tojson` = `json.dumps(ensure_ascii=False, ...)`   | [`to_python_json`], same escapes and spacing  |
//! | context `tools=None` (or the tools), `documents=None` | the same (`none`, so `is defined` is true)  |
//!
//! A template that needs something missing here (a filter, method or test
//! minijinja lacks, a `strftime` directive, a `tojson` option) is refused
//! with [`TemplateError::Unsupported`] naming it, never rendered differently.
//! `enclave/tests/all/templates.rs` holds real models' templates to jinja2's
//! text byte for byte.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use std::borrow::Cow;

use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{filters, Environment, ErrorKind, State};

/// One chat message, as HF's `apply_chat_template` receives it: `role` and
/// `content`, and for tool use `tool_calls` (an assistant's calls, each
/// `{id, type, function: {name, arguments}}` with `arguments` an object),
/// `tool_call_id` and `name` (a tool's result). Fields that are not set are
/// absent from the message (a template's `is defined` is false); an
/// assistant message that only calls tools has an empty `content` (OpenAI's
/// null), which every reference template renders under jinja2, where an
/// absent or `None` content breaks ten of them.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
    /// An assistant's tool calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// The call a tool message answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The function a tool message answers for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message of `role` holding `content` alone.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into(), ..Self::default() }
    }
}

/// Everything a render depends on besides the template: HF's
/// `apply_chat_template` context and the clock `strftime_now` reads.
#[derive(Debug, Clone, Copy)]
pub struct RenderRequest<'a> {
    /// The conversation, in order.
    pub messages: &'a [ChatMessage],
    /// `add_generation_prompt`: end with the header of the assistant's turn.
    pub add_generation_prompt: bool,
    /// The text of the BOS token (`bos_token`), empty when the model has none.
    pub bos_token: &'a str,
    /// The text of the EOS token (`eos_token`).
    pub eos_token: &'a str,
    /// `tools`: the function definitions (`[{type, function: {name,
    /// description, parameters}}]`), or Python's `None`.
    pub tools: Option<&'a serde_json::Value>,
    /// What `strftime_now` formats, read as UTC. Passed in so that a render
    /// is a function of its inputs (tests pin it).
    pub now: SystemTime,
    /// More variables for the template (`chat_template_kwargs`,
    /// `reasoning_effort`); the ones above take precedence.
    pub extra: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

/// The variables every render sets: extra variables may not name them.
pub const RESERVED_VARIABLES: [&str; 6] =
    ["messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token"];

/// Why a chat template did not render.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TemplateError {
    /// The template is not valid Jinja.
    #[error("chat template does not parse: {0}")]
    Malformed(String),
    /// The template refused the conversation (`raise_exception`).
    #[error("the chat template refused the conversation: {0}")]
    Raised(String),
    /// Rendering failed: a type error, a missing value, an undefined name.
    #[error("chat template failed: {0}")]
    Render(String),
    /// The template needs a feature this renderer does not have.
    #[error("chat template uses {feature}, which is not supported")]
    Unsupported {
        /// What is missing, e.g. `strftime directive %U` or `filter wordcount`.
        feature: String,
    },
}

/// Carried as the source of a minijinja error, so that the typed error
/// survives calls and macros.
#[derive(Debug, thiserror::Error)]
enum Signal {
    #[error("raise_exception: {0}")]
    Raised(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
}

fn unsupported(feature: String) -> minijinja::Error {
    minijinja::Error::new(ErrorKind::InvalidOperation, format!("{feature} is not supported"))
        .with_source(Signal::Unsupported(feature))
}

/// Whether `template` names the variable `name` anywhere (as a whole
/// identifier, not inside another).
pub fn reads(template: &str, name: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    !name.is_empty()
        && template
            .match_indices(name)
            .any(|(at, _)| !template[..at].ends_with(ident) && !template[at + name.len()..].starts_with(ident))
}

/// Renders `template` for `request`.
pub fn render(template: &str, request: &RenderRequest<'_>) -> Result<String, TemplateError> {
    if request.tools.is_some() && adds_to_safe(template) {
        // jinja2's `|safe` makes a Markup string, and `Markup + str`
        // HTML-escapes the str: text minijinja would write unescaped.
        return Err(TemplateError::Unsupported {
            feature: "`+` after `|safe` (jinja2's Markup HTML-escapes what is added to it)".into(),
        });
    }
    let source = rewrite_generation_tags(template);
    let mut env = environment(request.now);
    env.add_template("chat", &source).map_err(classify)?;
    let ctx = minijinja::context! {
        messages => request.messages,
        tools => request.tools.map_or_else(|| Value::from_object(PythonNone), Value::from_serialize),
        documents => Value::from_object(PythonNone),
        add_generation_prompt => request.add_generation_prompt,
        bos_token => request.bos_token,
        eos_token => request.eos_token,
        ..Value::from_serialize(request.extra.cloned().unwrap_or_default())
    };
    env.get_template("chat").and_then(|t| t.render(ctx)).map_err(classify)
}

/// Whether the template adds (`+`) to the result of `|safe`.
fn adds_to_safe(template: &str) -> bool {
    template.match_indices("|safe").chain(template.match_indices("| safe")).any(|(at, m)| {
        let rest = template[at + m.len()..].trim_start_matches([' ', ')']);
        rest.starts_with('+')
    })
}

/// The environment HF's `_compile_jinja_template` builds, in minijinja.
fn environment(now: SystemTime) -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |message: String| -> Result<Value, minijinja::Error> {
        Err(minijinja::Error::new(ErrorKind::InvalidOperation, "raise_exception").with_source(Signal::Raised(message)))
    });
    let now = CivilTime::from_system(now);
    env.add_function("strftime_now", move |format: String| strftime(&now, &format));
    env.add_filter("tojson", tojson_filter);
    // Python's `iter(None)` fails; minijinja iterates none as empty.
    env.add_test("iterable", |v: &Value| !is_python_none(v) && v.try_iter().is_ok());
    env.add_test("none", is_python_none);
    // jinja2's select/reject family and `map` return nothing for a falsy
    // input (`if value:`) before iterating it.
    env.add_filter("select", select);
    env.add_filter("reject", reject);
    env.add_filter("selectattr", selectattr);
    env.add_filter("rejectattr", rejectattr);
    env.add_filter("map", map);
    env.add_filter("string", string_filter);
    // `{{ a_dict }}` prints Python's repr, as `str()` of it does.
    env.set_formatter(|out, state, value| match value.kind() {
        ValueKind::Map | ValueKind::Seq if !is_python_none(value) => {
            out.write_str(&python_repr(value)?).map_err(|_| minijinja::Error::from(ErrorKind::WriteFailure))
        }
        _ => minijinja::escape_formatter(out, state, value),
    });
    env
}

/// `string`: Python's `str()`, which for a dict or list is its repr.
fn string_filter(value: &Value) -> Result<Value, minijinja::Error> {
    match value.kind() {
        ValueKind::Map | ValueKind::Seq if !is_python_none(value) => Ok(Value::from(python_repr(value)?)),
        _ if is_python_none(value) => Ok(Value::from("None")),
        _ => Ok(Value::from(value.to_string())),
    }
}

/// `value` as Python's `repr()` writes it: `{'a': [1, True, None]}`.
fn python_repr(value: &Value) -> Result<String, minijinja::Error> {
    let mut out = String::new();
    write_repr(&mut out, value, 0)?;
    Ok(out)
}

fn write_repr(out: &mut String, v: &Value, depth: usize) -> Result<(), minijinja::Error> {
    if depth > MAX_JSON_DEPTH {
        return Err(minijinja::Error::new(ErrorKind::InvalidOperation, "repr: value nested too deeply"));
    }
    if is_python_none(v) {
        out.push_str("None");
        return Ok(());
    }
    match v.kind() {
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number if v.is_integer() => {
            let _ = write!(out, "{v}");
        }
        ValueKind::Number => out.push_str(&python_float_json(f64::try_from(v.clone())?)),
        ValueKind::String => write_repr_str(out, v.as_str().unwrap_or_default()),
        ValueKind::Map => {
            out.push('{');
            for (i, key) in v.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &key, depth + 1)?;
                out.push_str(": ");
                write_repr(out, &v.get_item(&key)?, depth + 1)?;
            }
            out.push('}');
        }
        ValueKind::Seq => {
            out.push('[');
            for (i, item) in v.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &item, depth + 1)?;
            }
            out.push(']');
        }
        other => return Err(unsupported(format!("Python repr of a value of type {other}"))),
    }
    Ok(())
}

/// A string as Python's `repr()` quotes it: single quotes unless it holds a
/// single quote and no double one; backslash, the quote, `\n`, `\r`, `\t`
/// and other control characters escaped.
fn write_repr_str(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if ('\u{80}'..='\u{a0}').contains(&c) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// [`PythonNone`] as minijinja's none, which the filters iterate as empty.
fn none_as_empty(value: Value) -> Value {
    if is_python_none(&value) {
        Value::from(())
    } else {
        value
    }
}

type Filtered = Result<Value, minijinja::Error>;

/// What jinja2's `map`, `select` and their kin return: a generator. It
/// iterates (`for`, `list`, `join`) as a list does, but `tojson` refuses it
/// ("Object of type generator is not JSON serializable"), as under jinja2.
#[derive(Debug)]
struct Generator(Vec<Value>);

impl minijinja::value::Object for Generator {
    fn repr(self: &std::sync::Arc<Self>) -> minijinja::value::ObjectRepr {
        minijinja::value::ObjectRepr::Iterable
    }

    fn enumerate(self: &std::sync::Arc<Self>) -> minijinja::value::Enumerator {
        minijinja::value::Enumerator::Values(self.0.clone())
    }

    fn is_true(self: &std::sync::Arc<Self>) -> bool {
        // A Python generator object is always true, even when it yields nothing.
        true
    }
}

fn generator(items: Result<Vec<Value>, minijinja::Error>) -> Filtered {
    items.map(|v| Value::from_object(Generator(v)))
}

fn select(state: &State<'_, '_>, value: Value, test: Option<Cow<'_, str>>, args: Rest<Value>) -> Filtered {
    generator(filters::select(state, none_as_empty(value), test, args))
}

fn reject(state: &State<'_, '_>, value: Value, test: Option<Cow<'_, str>>, args: Rest<Value>) -> Filtered {
    generator(filters::reject(state, none_as_empty(value), test, args))
}

fn selectattr(
    state: &State<'_, '_>,
    value: Value,
    attr: Cow<'_, str>,
    test: Option<Cow<'_, str>>,
    args: Rest<Value>,
) -> Filtered {
    generator(filters::selectattr(state, none_as_empty(value), attr, test, args))
}

fn rejectattr(
    state: &State<'_, '_>,
    value: Value,
    attr: Cow<'_, str>,
    test: Option<Cow<'_, str>>,
    args: Rest<Value>,
) -> Filtered {
    generator(filters::rejectattr(state, none_as_empty(value), attr, test, args))
}

fn map(state: &State<'_, '_>, value: Value, args: Rest<Value>) -> Filtered {
    generator(filters::map(state, none_as_empty(value), args))
}

/// Python's `None` where the context passes it (`tools`, `documents`).
///
/// minijinja's own none iterates as an empty list, so a template that loops
/// over `tools` unguarded would render where jinja2 raises `'NoneType'
/// object is not iterable` (tool-use templates do). This value is falsy,
/// prints `None`, is `none` and not `iterable` to the tests, serializes as
/// `null`, fails when iterated or measured, and indexes to undefined, as
/// `None` does under jinja2.
#[derive(Debug)]
struct PythonNone;

impl minijinja::value::Object for PythonNone {
    fn repr(self: &std::sync::Arc<Self>) -> minijinja::value::ObjectRepr {
        minijinja::value::ObjectRepr::Plain
    }

    fn is_true(self: &std::sync::Arc<Self>) -> bool {
        false
    }

    fn render(self: &std::sync::Arc<Self>, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("None")
    }
}

fn is_python_none(v: &Value) -> bool {
    v.is_none() || v.downcast_object_ref::<PythonNone>().is_some()
}

/// Maps a minijinja error to the typed error, looking through its sources
/// for what our own functions raised.
fn classify(e: minijinja::Error) -> TemplateError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(s) = source {
        match s.downcast_ref::<Signal>() {
            Some(Signal::Raised(m)) => return TemplateError::Raised(m.clone()),
            Some(Signal::Unsupported(f)) => return TemplateError::Unsupported { feature: f.clone() },
            None => source = s.source(),
        }
    }
    let detail = e.detail().unwrap_or_default().to_owned();
    match e.kind() {
        ErrorKind::SyntaxError | ErrorKind::BadEscape => TemplateError::Malformed(e.to_string()),
        ErrorKind::UnknownFilter => TemplateError::Unsupported { feature: format!("filter ({detail})") },
        ErrorKind::UnknownTest => TemplateError::Unsupported { feature: format!("test ({detail})") },
        ErrorKind::UnknownFunction => TemplateError::Unsupported { feature: format!("function ({detail})") },
        ErrorKind::UnknownMethod => TemplateError::Unsupported { feature: format!("method ({detail})") },
        _ => TemplateError::Render(e.to_string()),
    }
}

/// Rewrites HF's `{% generation %}` / `{% endgeneration %}` (its
/// `AssistantTracker` extension) to `{% if true %}` / `{% endif %}`: HF
/// renders the body unchanged when no assistant mask is asked for, and a
/// block tag for a block tag keeps `trim_blocks`/`lstrip_blocks` and the
/// `-`/`+` markers exactly as they were.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        match generation_tag(tag) {
            Some((len, open_mark, close_mark, is_end)) => {
                let body = if is_end { "endif" } else { "if true" };
                let _ = write!(out, "{{%{open_mark} {body} {close_mark}%}}");
                rest = &tag[len..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// If `tag` starts with a generation tag: its length, its whitespace
/// markers and whether it is the end tag.
fn generation_tag(tag: &str) -> Option<(usize, &str, &str, bool)> {
    let inner = tag.strip_prefix("{%")?;
    let (open_mark, inner) = split_mark(inner);
    let trimmed = inner.trim_start();
    let (is_end, after) = if let Some(a) = trimmed.strip_prefix("endgeneration") {
        (true, a)
    } else {
        (false, trimmed.strip_prefix("generation")?)
    };
    let after_ws = after.trim_start();
    if after_ws.len() == after.len() && !after.starts_with(['-', '+', '%']) {
        return None; // `{% generationfoo %}`
    }
    let (close_mark, after_mark) = match after_ws.as_bytes().first() {
        Some(b'-') => ("-", &after_ws[1..]),
        Some(b'+') => ("+", &after_ws[1..]),
        _ => ("", after_ws),
    };
    let end = after_mark.strip_prefix("%}")?;
    Some((tag.len() - end.len(), open_mark, close_mark, is_end))
}

fn split_mark(s: &str) -> (&str, &str) {
    match s.as_bytes().first() {
        Some(b'-') => ("-", &s[1..]),
        Some(b'+') => ("+", &s[1..]),
        _ => ("", s),
    }
}

// ---- tojson -------------------------------------------------------------

/// How `json.dumps` lays out its text.
#[derive(Debug, Clone)]
struct JsonStyle {
    ensure_ascii: bool,
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
}

/// HF's `tojson`: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, each overridable by keyword.
fn tojson_filter(value: &Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
    let ensure_ascii = kwargs.get::<Option<Value>>("ensure_ascii")?.is_some_and(|v| v.is_true());
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
        Some(v) => match v.as_i64() {
            Some(n) => Some(" ".repeat(usize::try_from(n).unwrap_or(0))),
            None => return Err(unsupported(format!("tojson indent of type {}", v.kind()))),
        },
    };
    let (item_separator, key_separator) = match kwargs.get::<Option<Value>>("separators")? {
        Some(v) if !v.is_none() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                    (a.as_str().unwrap_or_default().to_owned(), b.as_str().unwrap_or_default().to_owned())
                }
                _ => return Err(unsupported("tojson separators other than two strings".into())),
            }
        }
        _ if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        _ => (", ".to_owned(), ": ".to_owned()),
    };
    let sort_keys = kwargs.get::<Option<Value>>("sort_keys")?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let style = JsonStyle { ensure_ascii, indent, item_separator, key_separator, sort_keys };
    let mut out = String::new();
    write_json(&mut out, value, &style, 0)?;
    Ok(Value::from(out))
}

/// `value` as Python's `json.dumps(value, ensure_ascii=False)` writes it
/// (HF's `tojson` with no options).
pub fn to_python_json(value: &Value) -> Result<String, TemplateError> {
    let style = JsonStyle {
        ensure_ascii: false,
        indent: None,
        item_separator: ", ".into(),
        key_separator: ": ".into(),
        sort_keys: false,
    };
    let mut out = String::new();
    write_json(&mut out, value, &style, 0).map_err(classify)?;
    Ok(out)
}

/// Deep enough for any template data; stops runaway recursion.
const MAX_JSON_DEPTH: usize = 128;

fn write_json(out: &mut String, v: &Value, style: &JsonStyle, depth: usize) -> Result<(), minijinja::Error> {
    if depth > MAX_JSON_DEPTH {
        return Err(minijinja::Error::new(ErrorKind::InvalidOperation, "tojson: value nested too deeply"));
    }
    if is_python_none(v) {
        out.push_str("null");
        return Ok(());
    }
    if v.downcast_object_ref::<Generator>().is_some() {
        return Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            "tojson: Object of type generator is not JSON serializable",
        ));
    }
    match v.kind() {
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number if v.is_integer() => {
            let _ = write!(out, "{v}");
        }
        ValueKind::Number => {
            let f = f64::try_from(v.clone())?;
            out.push_str(&python_float_json(f));
        }
        ValueKind::String => write_json_str(out, v.as_str().unwrap_or_default(), style.ensure_ascii),
        ValueKind::Map => {
            let mut pairs = Vec::new();
            for key in v.try_iter()? {
                let item = v.get_item(&key)?;
                pairs.push((json_key(&key)?, item));
            }
            if style.sort_keys {
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if pairs.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (key, item)) in pairs.iter().enumerate() {
                separate(out, style, depth, i);
                write_json_str(out, key, style.ensure_ascii);
                out.push_str(&style.key_separator);
                write_json(out, item, style, depth + 1)?;
            }
            close(out, style, depth);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                separate(out, style, depth, i);
                write_json(out, item, style, depth + 1)?;
            }
            close(out, style, depth);
            out.push(']');
        }
        other => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: object of type {other} is not JSON serializable"),
            ))
        }
    }
    Ok(())
}

/// Before item `i` of a container at `depth`.
fn separate(out: &mut String, style: &JsonStyle, depth: usize, i: usize) {
    if i > 0 {
        out.push_str(&style.item_separator);
    }
    if let Some(indent) = &style.indent {
        out.push('\n');
        for _ in 0..=depth {
            out.push_str(indent);
        }
    }
}

/// Before the closing bracket of a non-empty container at `depth`.
fn close(out: &mut String, style: &JsonStyle, depth: usize) {
    if let Some(indent) = &style.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(indent);
        }
    }
}

/// A map key as `json.dumps` turns it into a string.
fn json_key(key: &Value) -> Result<String, minijinja::Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_owned(),
        ValueKind::None => "null".to_owned(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_owned(),
        ValueKind::Number if key.is_integer() => key.to_string(),
        ValueKind::Number => python_float_json(f64::try_from(key.clone())?),
        other => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: keys must be str, int, float, bool or None, not {other}"),
            ))
        }
    })
}

/// A string as `json.dumps` quotes it.
fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            // ensure_ascii escapes everything outside ' '..='~'.
            c if ensure_ascii && !(' '..='~').contains(&c) => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A float as Python's `json.dumps` writes it: `float.__repr__`, with
/// `NaN`/`Infinity` for the non-finite values.
fn python_float_json(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    // Both languages print the shortest text that reads back to `f`; they
    // differ only in where exponents start and how they are spelled.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let plain = format!("{f}");
        if plain.contains('.') {
            plain
        } else {
            plain + ".0"
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.unsigned_abs())
    }
}

// ---- strftime_now -------------------------------------------------------

/// A UTC calendar time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CivilTime {
    year: i64,
    /// 1..=12
    month: u32,
    /// 1..=31
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
    /// 0 = Sunday, as `%w`.
    weekday: u32,
    /// 1..=366
    yday: u32,
}

impl CivilTime {
    fn from_system(t: SystemTime) -> Self {
        // A clock before 1970 reads as 1970: nothing here predates it.
        let secs = t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX / 2);
        let rem = (secs % 86_400) as u32;
        let (year, month, day) = civil_from_days(days);
        let yday = (days - days_from_civil(year, 1, 1)) as u32 + 1;
        Self {
            year,
            month,
            day,
            hour: rem / 3600,
            minute: rem % 3600 / 60,
            second: rem % 60,
            // 1970-01-01 was a Thursday (4).
            weekday: (days + 4).rem_euclid(7) as u32,
            yday,
        }
    }
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// (H. Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// (year, month, day) to days since 1970-01-01 (`days_from_civil`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

const WEEKDAYS: [&str; 7] = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Python's `datetime.strftime` in the C locale for a naive time, for the
/// directives chat templates use; any other is refused by name.
fn strftime(t: &CivilTime, format: &str) -> Result<String, minijinja::Error> {
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        // glibc's `%-d`: no padding.
        let mut directive = chars.next();
        let pad = directive != Some('-');
        if !pad {
            directive = chars.next();
        }
        let num = |out: &mut String, n: u32, width: usize| {
            let _ = if pad { write!(out, "{n:0width$}") } else { write!(out, "{n}") };
        };
        let weekday = WEEKDAYS[t.weekday as usize % 7];
        let month = MONTHS[(t.month as usize + 11) % 12];
        match directive {
            Some('Y') => {
                let _ = write!(out, "{}", t.year);
            }
            Some('y') => num(&mut out, t.year.rem_euclid(100) as u32, 2),
            Some('m') => num(&mut out, t.month, 2),
            Some('d') => num(&mut out, t.day, 2),
            Some('e') => {
                let _ = write!(out, "{:2}", t.day);
            }
            Some('j') => num(&mut out, t.yday, 3),
            Some('H') => num(&mut out, t.hour, 2),
            Some('I') => num(&mut out, (t.hour + 11) % 12 + 1, 2),
            Some('M') => num(&mut out, t.minute, 2),
            Some('S') => num(&mut out, t.second, 2),
            Some('p') => out.push_str(if t.hour < 12 { "AM" } else { "PM" }),
            Some('a') => out.push_str(&weekday[..3]),
            Some('A') => out.push_str(weekday),
            Some('b') | Some('h') => out.push_str(&month[..3]),
            Some('B') => out.push_str(month),
            Some('w') => num(&mut out, t.weekday, 1),
            // A naive datetime has no zone: Python writes nothing.
            Some('z') | Some('Z') => {}
            Some('%') => out.push('%'),
            Some(other) => return Err(unsupported(format!("strftime directive %{other}"))),
            None => return Err(unsupported("strftime format ending in %".into())),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(secs: u64) -> CivilTime {
        CivilTime::from_system(UNIX_EPOCH + Duration::from_secs(secs))
    }

    fn req(messages: &[ChatMessage]) -> RenderRequest<'_> {
        RenderRequest {
            messages,
            add_generation_prompt: true,
            bos_token: "<s>",
            eos_token: "</s>",
            tools: None,
            now: UNIX_EPOCH + Duration::from_secs(1_736_937_045),
            extra: None,
        }
    }

    fn user(text: &str) -> Vec<ChatMessage> {
        vec![ChatMessage::new("user", text)]
    }

    #[test]
    fn civil_time_matches_known_dates() {
        // 2025-01-15T10:30:45Z, a Wednesday.
        let t = at(1_736_937_045);
        assert_eq!((t.year, t.month, t.day, t.hour, t.minute, t.second), (2025, 1, 15, 10, 30, 45));
        assert_eq!((t.weekday, t.yday), (3, 15));
        // 2024-02-29 (leap day), a Thursday, day 60.
        let t = at(1_709_164_800);
        assert_eq!((t.year, t.month, t.day, t.weekday, t.yday), (2024, 2, 29, 4, 60));
        assert_eq!(at(0).year, 1970);
    }

    #[test]
    fn strftime_writes_c_locale_text() {
        let t = at(1_736_937_045);
        let f = |s: &str| strftime(&t, s).unwrap();
        assert_eq!(f("%d %b %Y"), "15 Jan 2025");
        assert_eq!(f("%B %d, %Y"), "January 15, 2025");
        assert_eq!(f("%Y-%m-%d %H:%M:%S %p %a %A %j %y %-d%%"), "2025-01-15 10:30:45 AM Wed Wednesday 015 25 15%");
    }

    #[test]
    fn refuses_unknown_strftime_directive_by_name() {
        let e = render("{{ strftime_now('%U') }}", &req(&user("x"))).unwrap_err();
        assert!(matches!(&e, TemplateError::Unsupported { feature } if feature == "strftime directive %U"), "{e:?}");
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let v = Value::from_serialize(serde_json::json!({
            "b": [1, 2.5, 1e16, 1.5e-5, true, null, "a\"\\\n\u{1}é<&>"], "a": {}, "c": []
        }));
        assert_eq!(
            to_python_json(&v).unwrap(),
            r#"{"b": [1, 2.5, 1e+16, 1.5e-05, true, null, "a\"\\\n\u0001é<&>"], "a": {}, "c": []}"#
        );
        let t = "{{ x | tojson(indent=2) }}|{{ x | tojson(ensure_ascii=True, separators=(',', ':')) }}";
        let mut env = environment(UNIX_EPOCH);
        env.add_template("t", t).unwrap();
        let x = Value::from_serialize(serde_json::json!({"k": ["é", 1.0]}));
        let out = env.get_template("t").unwrap().render(minijinja::context! { x }).unwrap();
        assert_eq!(out, "{\n  \"k\": [\n    \"é\",\n    1.0\n  ]\n}|{\"k\":[\"\\u00e9\",1.0]}");
    }

    #[test]
    fn raise_exception_is_typed() {
        let e = render("{{ raise_exception('no system role') }}", &req(&user("x"))).unwrap_err();
        assert!(matches!(&e, TemplateError::Raised(m) if m == "no system role"), "{e:?}");
        let t = "{% macro m() %}{{ raise_exception('deep') }}{% endmacro %}{{ m() }}";
        let e = render(t, &req(&user("x"))).unwrap_err();
        assert!(matches!(&e, TemplateError::Raised(m) if m == "deep"), "{e:?}");
    }

    #[test]
    fn generation_tags_render_their_body() {
        let t =
            "{% for m in messages %}\n  {%- generation -%}\n[{{ m.content }}]\n  {%+ endgeneration %}\n{% endfor %}";
        let out = render(t, &req(&user("hi"))).unwrap();
        let plain = t.replace("generation", "if true").replace("endif true", "endif");
        assert_eq!(out, render(&plain, &req(&user("hi"))).unwrap());
        assert_eq!(rewrite_generation_tags("{% generationx %}"), "{% generationx %}");
    }

    #[test]
    fn context_matches_hf() {
        let t = "{{ tools is defined }} {{ tools is none }} {{ documents is none }} {{ bos_token }}{{ eos_token }} \
                 {{ add_generation_prompt }} {% for m in messages %}{% if loop.first %}{% continue %}{% endif %}{% endfor %}";
        // Printed the Python way, as jinja2 does.
        assert_eq!(render(t, &req(&user("x"))).unwrap(), "True True True <s></s> True ");
    }

    #[test]
    fn tools_behave_as_python_none() {
        let r = |t: &str| render(t, &req(&user("x")));
        assert_eq!(
            r("{{ tools }} {{ tools is none }} {{ tools is not none }} {{ tools is defined }} {{ tools is iterable }} \
               {{ tools | tojson }} {{ 'yes' if tools else 'no' }} {{ tools | default('d', true) }} {{ tools ~ '' }}")
            .unwrap(),
            "None True False True False null no d None"
        );
        assert!(matches!(r("{% for t in tools %}{% endfor %}"), Err(TemplateError::Render(_))));
        assert!(matches!(r("{{ tools | length }}"), Err(TemplateError::Render(_))));
        assert!(matches!(r("{{ tools | list }}"), Err(TemplateError::Render(_))));
        // ... but the select/reject family and map return nothing for it.
        assert_eq!(r("{{ tools | selectattr('type', 'equalto', 'x') | list | length }}").unwrap(), "0");
        assert_eq!(r("{{ tools | map(attribute='name') | list }}").unwrap(), "[]");
        // jinja2's getitem turns `None[0]` into undefined, as minijinja does.
        assert_eq!(r("[{{ tools[0] }}{{ tools.name }}]").unwrap(), "[]");
        // A none from elsewhere is minijinja's own.
        assert_eq!(r("{{ none is none }} {{ none is iterable }}").unwrap(), "True False");
    }

    #[test]
    fn unknown_filter_is_refused_by_name() {
        let e = render("{{ 'a b' | wordcount }}", &req(&user("x"))).unwrap_err();
        assert!(matches!(&e, TemplateError::Unsupported { feature } if feature.contains("wordcount")), "{e:?}");
    }

    #[test]
    fn bad_syntax_is_malformed() {
        assert!(matches!(render("{% if %}", &req(&user("x"))), Err(TemplateError::Malformed(_))));
    }
}
