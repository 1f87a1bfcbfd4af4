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

mod json;
mod strftime;
pub use json::*;
use strftime::*;

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
