//! The OpenAI-compatible API, as it runs inside the seal: request parsing
//! and validation, response and server-sent-event shapes, OpenAI-shaped
//! errors. `POST /v1/chat/completions`, `POST /v1/completions`,
//! `GET /v1/models`. Pure functions over bytes: the gateway feeds them the
//! opened Binary HTTP request and seals what they produce.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use veil_wire::http::openai::{CHAT_COMPLETIONS_PATH, COMPLETIONS_PATH, MODELS_PATH};

use crate::generate::TokenLogprob;
use crate::pipeline::entry::{PipelineRequest, SpeculationRequest};
use crate::text::grammar::{ResponseFormat, MAX_SCHEMA_BYTES};
use crate::text::reasoning::ReasoningFormat;
use crate::text::sampler::{SamplingParams, MAX_LOGIT_BIAS, MAX_TOP_LOGPROBS};
use crate::text::template::RESERVED_VARIABLES;
use crate::text::tokenizer::{ChatMessage, Tokenizer};
use crate::text::tools::{CallMarkers, ToolCall, ToolDef, ToolFormat, MAX_TOOLS};
use veil_attestation::Nonce;

/// Prompt bytes allowed per token of context, checked before tokenizing.
pub const MAX_BYTES_PER_TOKEN: usize = 32;
/// Most chat messages in one request.
pub const MAX_MESSAGES: usize = 1024;
/// Default `max_tokens` of `/v1/completions` (as OpenAI's).
pub const DEFAULT_COMPLETION_TOKENS: usize = 16;
/// Largest request body accepted inside the seal.
pub const MAX_BODY: usize = 1 << 20;

/// An error as OpenAI shapes it, with its HTTP status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// `invalid_request_error`, `not_found_error`, `server_error`, …
    pub kind: &'static str,
    /// The offending parameter, if one.
    pub param: Option<&'static str>,
    /// For the developer; never echoes prompt text.
    pub message: String,
}

impl ApiError {
    /// A 400 about `param`.
    pub fn invalid(param: &'static str, message: impl Into<String>) -> Self {
        Self { status: 400, kind: "invalid_request_error", param: Some(param), message: message.into() }
    }

    /// OpenAI's 404 for a model this endpoint does not serve.
    pub fn model_not_found(asked: &str) -> Self {
        let shown: String = asked.chars().take(64).collect();
        Self {
            status: 404,
            kind: "invalid_request_error",
            param: Some("model"),
            message: format!("The model `{shown}` does not exist or you do not have access to it."),
        }
    }

    /// OpenAI's machine-readable code, where it has one.
    pub fn code(&self) -> Option<&'static str> {
        (self.status == 404 && self.param == Some("model")).then_some("model_not_found")
    }

    /// The JSON body.
    pub fn body(&self) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "error": { "message": self.message, "type": self.kind, "param": self.param, "code": self.code() }
        }))
        .unwrap_or_default()
    }
}

mod request;
mod response;

pub use request::*;
pub use response::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_and_bodies_pad_to_their_buckets_and_stay_parseable() {
        for len in [0usize, 1, 100, 251, 252, 253, 254, 255, 256, 600] {
            let event = [b"data: ".as_slice(), &vec![b'x'; len], b"\n\n"].concat();
            let padded = pad_event(event.clone());
            assert_eq!(padded.len() % SSE_PAD, 0, "{len}");
            assert!(padded.len() >= event.len() + 2 && padded.len() < event.len() + 2 + SSE_PAD, "{len}");
            let text = String::from_utf8(padded).unwrap();
            // One event: a data line, a comment line, a blank line.
            assert!(text.ends_with("\n\n") && text.matches("\n\n").count() == 1);
            let data: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
            assert_eq!(data, vec!["x".repeat(len)]);
            assert!(text.lines().filter(|l| !l.is_empty()).all(|l| l.starts_with("data: ") || l.starts_with(':')));
        }
        let body = pad_body(br#"{"a":1}"#.to_vec());
        assert_eq!(body.len(), BODY_PAD);
        assert_eq!(serde_json::from_slice::<serde_json::Value>(&body).unwrap()["a"], 1);
        assert_eq!(pad_body(vec![b' '; BODY_PAD + 1]).len(), 2 * BODY_PAD);
    }
}
