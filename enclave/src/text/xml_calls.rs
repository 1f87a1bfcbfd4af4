//! The XML-style tool-call formats, whose arguments are written one by one
//! as raw text rather than as a JSON object:
//!
//! ```text
//! <tool_call>                       <tool_call>get_weather
//! <function=get_weather>            <arg_key>city</arg_key>
//! <parameter=city>                  <arg_value>Paris</arg_value>
//! Paris                             </tool_call>
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! (left: Qwen3-Coder, Qwen 3.5, Nemotron 3, Step 3.5; right: GLM 4.6 / 4.7,
//! Ling, Laguna.) A value's text becomes a JSON value by its parameter's
//! type in the tool's schema, as the templates write them: a `string`
//! parameter keeps the text, `integer`, `number`, `boolean`, `object`,
//! `array` and `null` parse as JSON (`True`/`False` as the booleans Python
//! prints), and a parameter the schema does not type parses as JSON when it
//! can and stays text otherwise.
//!
//! A forced call is a Lark grammar in which a string value is one terminal
//! that runs to the first closing tag (llguidance's lexer is greedy, so the
//! value cannot be a separate terminal that could itself take the closing
//! tag's text), and every other value is `%json` of its parameter's schema.

use serde_json::{json, Map, Value};

use super::calls::{ToolCall, ToolDef};

/// How a value's closing tag is written, for a forced call.
pub(crate) enum Close<'a> {
    /// As text: the value's terminal ends with it.
    Text(&'a str),
    /// As one special token (this id): the value is text until the token.
    Special(u32),
}

/// The JSON value a parameter's text stands for, by `schema` (the
/// parameter's schema, when the tool declares it).
pub fn typed(text: &str, schema: Option<&Value>) -> Value {
    let types: Vec<&str> = match schema.and_then(|s| s.get("type")) {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(list)) => list.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let parsed = || match text.trim() {
        "True" => Some(Value::Bool(true)),
        "False" => Some(Value::Bool(false)),
        "None" => Some(Value::Null),
        t => serde_json::from_str::<Value>(t).ok(),
    };
    if types.is_empty() {
        return parsed().unwrap_or_else(|| Value::String(text.to_owned()));
    }
    // A value of a declared non-string type is that value; else the text.
    parsed().filter(|v| types.iter().any(|t| type_holds(t, v))).unwrap_or_else(|| Value::String(text.to_owned()))
}

fn type_holds(t: &str, v: &Value) -> bool {
    match t {
        "integer" => v.as_i64().is_some() || v.as_u64().is_some(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        "null" => v.is_null(),
        _ => false,
    }
}

/// Where `text`'s call blocks are, `<tool_call>` to `</tool_call>` (or to
/// the end); `None` when a block is not whole or there is none.
fn blocks(text: &str) -> Option<(String, Vec<&str>)> {
    const OPEN: &str = "<tool_call>";
    const CLOSE: &str = "</tool_call>";
    let (mut content, mut found, mut rest) = (String::new(), Vec::new(), text);
    while let Some(at) = rest.find(OPEN) {
        content.push_str(&rest[..at]);
        let body = &rest[at + OPEN.len()..];
        let end = body.find(CLOSE);
        found.push(&body[..end.unwrap_or(body.len())]);
        rest = end.map_or("", |e| &body[e + CLOSE.len()..]);
    }
    content.push_str(rest);
    (!found.is_empty()).then(|| (content.trim().to_owned(), found))
}

/// The parameter schema `name` has in `tool`.
fn param<'a>(tools: &'a [ToolDef], tool: &str, name: &str) -> Option<&'a Value> {
    tools.iter().find(|t| t.name == tool)?.parameters.get("properties")?.get(name)
}

/// `<function=NAME>` then `<parameter=K>\nV\n</parameter>` per argument.
pub fn parse_function_blocks(text: &str, tools: &[ToolDef]) -> Option<(String, Vec<ToolCall>)> {
    let (content, found) = blocks(text)?;
    let mut calls = Vec::new();
    for block in found {
        let rest = block.trim_start().strip_prefix("<function=")?;
        let end = rest.find('>')?;
        let name = rest[..end].trim().to_owned();
        let mut rest = &rest[end + 1..];
        let mut args = Map::new();
        while let Some(at) = rest.find("<parameter=") {
            let after = &rest[at + "<parameter=".len()..];
            let end = after.find('>')?;
            let key = after[..end].trim().to_owned();
            let body = &after[end + 1..];
            let close = body.find("</parameter>")?;
            let raw = &body[..close];
            let raw = raw.strip_prefix('\n').unwrap_or(raw);
            let raw = raw.strip_suffix('\n').unwrap_or(raw);
            args.insert(key.clone(), typed(raw, param(tools, &name, &key)));
            rest = &body[close + "</parameter>".len()..];
        }
        let tail = rest.trim();
        if name.is_empty() || !(tail.is_empty() || tail == "</function>") {
            return None;
        }
        calls.push(ToolCall { name, arguments: Value::Object(args).to_string() });
    }
    Some((content, calls))
}

/// `NAME` then `<arg_key>K</arg_key><arg_value>V</arg_value>` per argument.
pub fn parse_arg_blocks(text: &str, tools: &[ToolDef]) -> Option<(String, Vec<ToolCall>)> {
    let (content, found) = blocks(text)?;
    let mut calls = Vec::new();
    for block in found {
        let first = block.find("<arg_key>").unwrap_or(block.len());
        let name = block[..first].trim().to_owned();
        let mut rest = &block[first..];
        let mut args = Map::new();
        while let Some(r) = rest.trim_start().strip_prefix("<arg_key>") {
            let end = r.find("</arg_key>")?;
            let key = r[..end].trim().to_owned();
            let r = r[end + "</arg_key>".len()..].trim_start().strip_prefix("<arg_value>")?;
            let end = r.find("</arg_value>")?;
            args.insert(key.clone(), typed(&r[..end], param(tools, &name, &key)));
            rest = &r[end + "</arg_value>".len()..];
        }
        if name.is_empty() || name.contains('<') || !rest.trim().is_empty() {
            return None;
        }
        calls.push(ToolCall { name, arguments: Value::Object(args).to_string() });
    }
    Some((content, calls))
}

/// The grammar of one argument's value (its parameter's `schema`) followed
/// by its closing tag: the rule expression, and a terminal it names
/// (`term`) when it needs one; `Err` names what cannot be forced.
pub(crate) fn value_then(
    schema: &Value,
    close: &Close<'_>,
    key: &str,
    term: &str,
) -> Result<(String, Option<String>), String> {
    let closing = || match close {
        Close::Text(t) => lit(t),
        Close::Special(id) => format!("<[{id}]>"),
    };
    if schema.get("type").and_then(Value::as_str) != Some("string") {
        let mut s = schema.clone();
        if let Value::Object(m) = &mut s {
            m.insert("x-guidance".into(), json!({"whitespace_flexible": false}));
        }
        return Ok((format!("%json {s} {}", closing()), None));
    }
    for unsupported in ["pattern", "format"] {
        if schema.get(unsupported).is_some() {
            return Err(format!("the string parameter {key:?} has a {unsupported}, which a forced call cannot hold"));
        }
    }
    let choices =
        schema.get("enum").and_then(Value::as_array).cloned().or_else(|| schema.get("const").map(|c| vec![c.clone()]));
    if let Some(choices) = choices {
        let texts: Option<Vec<String>> = choices.iter().map(|c| c.as_str().map(lit)).collect();
        let texts = texts.ok_or_else(|| format!("the string parameter {key:?} lists a value that is not a string"))?;
        return Ok((format!("({}) {}", texts.join(" | "), closing()), None));
    }
    let min = schema.get("minLength").and_then(Value::as_u64).unwrap_or(0);
    let repeat = match schema.get("maxLength").and_then(Value::as_u64) {
        Some(max) => format!("{{{min},{max}}}"),
        None => format!("{{{min},}}"),
    };
    Ok(match close {
        // One terminal: the text, then the first closing tag, with no
        // closing tag before it.
        Close::Text(t) => {
            let t = regex_escape(t);
            (term.to_owned(), Some(format!("{term}: /(.|\\n){repeat}{t}/ & ~/(.|\\n)*{t}(.|\\n)+/")))
        }
        Close::Special(id) => (format!("/(.|\\n){repeat}/ <[{id}]>"), None),
    })
}

/// A Lark string literal.
pub(crate) fn lit(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

fn regex_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            c if "\\.+*?()|[]{}^$/#&~-".contains(c) => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<ToolDef> {
        vec![ToolDef {
            name: "f".into(),
            description: None,
            parameters: json!({"type": "object", "properties": {
                "city": {"type": "string"}, "n": {"type": "integer"}, "ok": {"type": "boolean"},
                "tags": {"type": "array"}, "code": {"type": "string"},
            }}),
        }]
    }

    #[test]
    fn values_become_json_by_their_parameter_type() {
        let t = tools();
        let text = "Sure.\n<tool_call>\n<function=f>\n<parameter=city>\n123\n</parameter>\n<parameter=n>\n7\n</parameter>\n\
                    <parameter=ok>\nTrue\n</parameter>\n<parameter=tags>\n[\"a\"]\n</parameter>\n<parameter=code>\n\
                    if a < b:\n    x = \"</q>\"\n</parameter>\n<parameter=extra>\n{\"k\": 1}\n</parameter>\n</function>\n</tool_call>";
        let (content, calls) = parse_function_blocks(text, &t).unwrap();
        assert_eq!(content, "Sure.");
        let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert_eq!(
            args,
            json!({"city": "123", "n": 7, "ok": true, "tags": ["a"], "code": "if a < b:\n    x = \"</q>\"", "extra": {"k": 1}})
        );
        // A value that is not of its type stays text, as the model wrote it.
        assert_eq!(typed("seven", Some(&json!({"type": "integer"}))), json!("seven"));
        assert_eq!(typed("null", Some(&json!({"type": ["string", "null"]}))), json!(null));
        let glm = "<tool_call>f\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>n</arg_key><arg_value>2</arg_value>\n</tool_call>";
        let (_, calls) = parse_arg_blocks(glm, &t).unwrap();
        assert_eq!(calls, vec![ToolCall { name: "f".into(), arguments: r#"{"city":"Paris","n":2}"#.into() }]);
    }

    #[test]
    fn broken_blocks_are_not_calls() {
        let t = tools();
        for text in [
            "<tool_call>\n<function=f>\n<parameter=city>\nParis\n</function>",
            "<tool_call>\n<function=f>\nstray words\n</function>\n</tool_call>",
            "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
            "no call at all",
        ] {
            assert!(parse_function_blocks(text, &t).is_none_or(|(_, c)| c.is_empty()), "{text}");
        }
        assert!(parse_arg_blocks("<tool_call>f<arg_key>city</arg_key>Paris</tool_call>", &t).is_none());
    }

    #[test]
    fn a_string_value_is_one_terminal_up_to_its_closing_tag() {
        let close = Close::Text("\n</parameter>");
        let (rule, term) = value_then(&json!({"type": "string", "maxLength": 24}), &close, "city", "V0").unwrap();
        assert_eq!(rule, "V0");
        assert_eq!(
            term.as_deref(),
            Some("V0: /(.|\\n){0,24}\\n<\\/parameter>/ & ~/(.|\\n)*\\n<\\/parameter>(.|\\n)+/")
        );
        let (rule, term) =
            value_then(&json!({"type": "string", "enum": ["a", "b"]}), &Close::Special(9), "u", "V1").unwrap();
        assert_eq!((rule.as_str(), term), ("(\"a\" | \"b\") <[9]>", None));
        assert!(value_then(&json!({"type": "string", "pattern": "x+"}), &close, "p", "V2").is_err());
        assert!(value_then(&json!({"type": "integer"}), &close, "n", "V3").unwrap().0.starts_with("%json {"));
    }
}
