//! Cheap structural limits on a response format, checked before the grammar
//! compiler sees it.
//!
//! The compiler (llguidance) recurses once per `$ref` it follows and once per
//! level of nesting, and intersects every `pattern` that an `allOf` puts on
//! one string. A chain of a few hundred `$ref`s overflows a thread's stack (a
//! crash of the whole process, not an error), and the intersection of a few
//! dozen patterns makes one derivative step of the regex engine exponential,
//! which its fuel, counted between steps, does not stop. These limits refuse
//! such shapes by name in microseconds; what passes them still compiles in a
//! budgeted job (`pipeline::entry::format_jobs`). The limits are far above
//! what real schemas use (OpenAI's own structured outputs allow 5 levels of
//! nesting and 100 properties).
//!
//! The walk is iterative: a schema cannot make the check itself recurse.

use serde_json::Value;

use super::{ResponseFormat, MAX_SCHEMA_BYTES};

/// Deepest nesting of objects and arrays in a schema's JSON text.
pub const MAX_DEPTH: usize = 32;
/// Most `$ref`s in one format (every chain of references is at most this long).
pub const MAX_REFS: usize = 64;
/// Most branches of one `allOf`, `anyOf` or `oneOf`.
pub const MAX_BRANCHES: usize = 32;
/// Most branches of all `allOf`, `anyOf` and `oneOf` together.
pub const MAX_TOTAL_BRANCHES: usize = 256;
/// Most regular expressions (`pattern` values and `patternProperties` keys).
/// Patterns an `allOf` puts on one string are intersected, and the
/// engine's cost grows exponentially with their number (measured on 2
/// cores: 8 in 1.6 ms, 12 in 30 ms, 16 in 1.5 s, each ending in the
/// engine's refusal); 12 keeps the worst case far inside the compile budget.
pub const MAX_PATTERNS: usize = 12;
/// Longest regular expression, in bytes.
pub const MAX_PATTERN_BYTES: usize = 512;
/// Most JSON values (objects, arrays, scalars) in one format.
pub const MAX_NODES: usize = 4096;
/// Most `%json` schemas embedded in one Lark grammar (one per forced tool).
pub const MAX_EMBEDDED_SCHEMAS: usize = 64;

/// A limit a format exceeds: its name (as the error tells the client), the
/// most allowed, and what the format has (at least; the walk stops at the
/// first limit crossed).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the response format exceeds the limit `{limit}`: at most {max}, found {found}")]
pub struct LimitExceeded {
    /// The limit's name.
    pub limit: &'static str,
    /// Its value.
    pub max: usize,
    /// What the format has.
    pub found: usize,
}

/// What the walk has counted so far, over every schema of one format.
#[derive(Default)]
struct Tally {
    refs: usize,
    branches: usize,
    patterns: usize,
    nodes: usize,
}

fn over(limit: &'static str, max: usize, found: usize) -> Result<(), LimitExceeded> {
    if found > max {
        return Err(LimitExceeded { limit, max, found });
    }
    Ok(())
}

/// Checks `format` against every limit above. Text that is not JSON passes:
/// the compiler's own parse names that error.
pub fn check(format: &ResponseFormat) -> Result<(), LimitExceeded> {
    let mut tally = Tally::default();
    match format {
        ResponseFormat::JsonObject => Ok(()),
        ResponseFormat::JsonSchema { schema } => {
            over("schema_bytes", MAX_SCHEMA_BYTES, schema.len())?;
            match serde_json::from_str::<Value>(schema) {
                Ok(v) => walk(&v, &mut tally),
                Err(_) => Ok(()),
            }
        }
        ResponseFormat::Lark { grammar } => {
            over("schema_bytes", MAX_SCHEMA_BYTES, grammar.len())?;
            // Each `%json` is followed by a schema (a forced tool call's
            // parameters, the client's text).
            let mut embedded = 0;
            for (at, _) in grammar.match_indices("%json") {
                embedded += 1;
                over("embedded_schemas", MAX_EMBEDDED_SCHEMAS, embedded)?;
                let rest = &grammar[at + "%json".len()..];
                if let Some(Ok(v)) = serde_json::Deserializer::from_str(rest).into_iter::<Value>().next() {
                    walk(&v, &mut tally)?;
                }
            }
            Ok(())
        }
    }
}

fn walk(root: &Value, tally: &mut Tally) -> Result<(), LimitExceeded> {
    let mut stack: Vec<(&Value, usize)> = vec![(root, 1)];
    while let Some((v, depth)) = stack.pop() {
        tally.nodes += 1;
        over("nodes", MAX_NODES, tally.nodes)?;
        over("depth", MAX_DEPTH, depth)?;
        match v {
            Value::Array(items) => stack.extend(items.iter().map(|i| (i, depth + 1))),
            Value::Object(map) => {
                for (key, value) in map {
                    match (key.as_str(), value) {
                        ("$ref", Value::String(_)) => {
                            tally.refs += 1;
                            over("refs", MAX_REFS, tally.refs)?;
                        }
                        ("allOf" | "anyOf" | "oneOf", Value::Array(branches)) => {
                            over("branches", MAX_BRANCHES, branches.len())?;
                            tally.branches += branches.len();
                            over("total_branches", MAX_TOTAL_BRANCHES, tally.branches)?;
                        }
                        ("pattern", Value::String(p)) => pattern(p, tally)?,
                        ("patternProperties", Value::Object(props)) => {
                            for p in props.keys() {
                                pattern(p, tally)?;
                            }
                        }
                        _ => {}
                    }
                    stack.push((value, depth + 1));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn pattern(p: &str, tally: &mut Tally) -> Result<(), LimitExceeded> {
    over("pattern_bytes", MAX_PATTERN_BYTES, p.len())?;
    tally.patterns += 1;
    over("patterns", MAX_PATTERNS, tally.patterns)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(v: Value) -> ResponseFormat {
        ResponseFormat::JsonSchema { schema: v.to_string() }
    }

    fn limit_of(f: &ResponseFormat) -> Option<&'static str> {
        check(f).err().map(|e| e.limit)
    }

    /// Issue 53, C1: ~400 chained `$defs`, each `anyOf [ {$ref: next}, integer ]`.
    pub(crate) fn ref_chain(n: usize) -> Value {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            let next = if i + 1 < n {
                serde_json::json!({"anyOf": [{"$ref": format!("#/$defs/d{}", i + 1)}, {"type": "integer"}]})
            } else {
                serde_json::json!({"type": "integer"})
            };
            defs.insert(format!("d{i}"), next);
        }
        serde_json::json!({"$defs": defs, "$ref": "#/$defs/d0"})
    }

    /// Issue 53, C2: an `allOf` of many `.*x.*` patterns on one string.
    pub(crate) fn pattern_pile(n: usize) -> Value {
        let all: Vec<Value> =
            (0..n).map(|i| serde_json::json!({"type": "string", "pattern": format!(".*{}.*", (b'a' + (i % 26) as u8) as char)})).collect();
        serde_json::json!({"allOf": all})
    }

    #[test]
    fn refuses_the_reviews_ref_chain_by_the_refs_limit() {
        assert_eq!(limit_of(&schema(ref_chain(400))), Some("refs"));
        assert_eq!(limit_of(&schema(ref_chain(MAX_REFS))), None);
    }

    #[test]
    fn refuses_a_pile_of_patterns_by_the_branches_or_patterns_limit() {
        assert_eq!(limit_of(&schema(pattern_pile(40))), Some("branches"));
        assert_eq!(limit_of(&schema(pattern_pile(MAX_PATTERNS + 1))), Some("patterns"));
        assert_eq!(limit_of(&schema(pattern_pile(MAX_PATTERNS))), None);
    }

    #[test]
    fn refuses_deep_nesting_and_long_patterns() {
        let mut v = serde_json::json!({"type": "integer"});
        for _ in 0..MAX_DEPTH {
            v = serde_json::json!({"type": "array", "items": v});
        }
        assert_eq!(limit_of(&schema(v)), Some("depth"));
        let long = serde_json::json!({"type": "string", "pattern": "a".repeat(MAX_PATTERN_BYTES + 1)});
        assert_eq!(limit_of(&schema(long)), Some("pattern_bytes"));
        let many = serde_json::json!({"type": "object", "patternProperties":
            (0..=MAX_PATTERNS).map(|i| (format!("^p{i}"), serde_json::json!({}))).collect::<serde_json::Map<_, _>>()});
        assert_eq!(limit_of(&schema(many)), Some("patterns"));
    }

    #[test]
    fn keywords_used_as_property_names_are_not_counted() {
        let props: serde_json::Map<String, Value> = ["pattern", "$ref", "allOf"]
            .iter()
            .map(|k| (k.to_string(), serde_json::json!({"type": "string"})))
            .collect();
        let v = serde_json::json!({"type": "object", "properties": props});
        assert_eq!(check(&schema(v)), Ok(()));
    }

    #[test]
    fn counts_schemas_embedded_in_a_lark_grammar() {
        let pile = pattern_pile(MAX_PATTERNS + 1).to_string();
        let grammar = format!("start: \"<call>\" %json {pile} \"</call>\"\n");
        assert_eq!(limit_of(&ResponseFormat::Lark { grammar }), Some("patterns"));
        let fine = format!("start: %json {}\n", serde_json::json!({"type": "object"}));
        assert_eq!(check(&ResponseFormat::Lark { grammar: fine }), Ok(()));
    }

    #[test]
    fn real_schemas_pass() {
        let person = serde_json::json!({"type": "object", "properties": {
            "name": {"type": "string", "pattern": "^[A-Z][a-z]+$"},
            "age": {"type": "integer", "minimum": 0},
            "tags": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/tag"}]}}},
            "required": ["name", "age"], "$defs": {"tag": {"type": "object", "properties": {"k": {"type": "string"}}}}});
        assert_eq!(check(&schema(person)), Ok(()));
        assert_eq!(check(&ResponseFormat::JsonObject), Ok(()));
    }
}
