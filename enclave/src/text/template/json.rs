//! `tojson` as Python's `json.dumps` writes it (Hugging Face's templates
//! call it with `ensure_ascii`, `indent`, `separators`, `sort_keys`).

use super::*;

/// How `json.dumps` lays out its text.
#[derive(Debug, Clone)]
pub(super) struct JsonStyle {
    ensure_ascii: bool,
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
}

/// HF's `tojson`: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, each overridable by keyword.
pub(super) fn tojson_filter(value: &Value, kwargs: Kwargs) -> Result<Value, minijinja::Error> {
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
pub(super) const MAX_JSON_DEPTH: usize = 128;

pub(super) fn write_json(out: &mut String, v: &Value, style: &JsonStyle, depth: usize) -> Result<(), minijinja::Error> {
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
pub(super) fn separate(out: &mut String, style: &JsonStyle, depth: usize, i: usize) {
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
pub(super) fn close(out: &mut String, style: &JsonStyle, depth: usize) {
    if let Some(indent) = &style.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(indent);
        }
    }
}

/// A map key as `json.dumps` turns it into a string.
pub(super) fn json_key(key: &Value) -> Result<String, minijinja::Error> {
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
pub(super) fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
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
pub(super) fn python_float_json(f: f64) -> String {
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
