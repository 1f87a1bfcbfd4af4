//! What an answer's tool calls are, and the tools a request offers: a leaf
//! every call format ([`super::tools`], [`super::xml_calls`],
//! [`super::harmony`]) and the reasoning readers ([`super::reasoning`])
//! share.

use serde_json::Value;

/// One tool call read from the output.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// The function's name.
    pub name: String,
    /// Its arguments, as compact JSON text (an object).
    pub arguments: String,
}

/// What an answer said: its text outside the calls, and the calls.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parsed {
    /// Text outside any call: trimmed by the call formats, as it streamed
    /// by the reasoning readers ([`super::reasoning`]).
    pub content: String,
    /// The model's reasoning, for formats that set it apart (harmony's
    /// `analysis` channel); else empty.
    pub reasoning: String,
    /// The calls, in order.
    pub calls: Vec<ToolCall>,
}

/// A function the model may call, as validated from `tools`.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolDef {
    /// Its name.
    pub name: String,
    /// What it does (a string), when given.
    pub description: Option<Value>,
    /// Its parameters' JSON schema (an object).
    pub parameters: Value,
}
