//! The loopback development endpoint: one newline-delimited JSON request per
//! connection, answered with one JSON [`GenerateEvent`] per line. Bound to
//! loopback only; `veil-shard generate --entry ADDR` speaks it. Clients reach
//! the entry through the sealed gateway instead.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::{Entry, PipelineRequest};
use crate::generate::Generation;
use crate::model::ModelError;
use crate::text::sampler::SamplingParams;
use crate::text::tokenizer::{ChatMessage, Tokenizer};

/// Longest request line accepted on the internal endpoint.
pub const MAX_REQUEST_BYTES: usize = 1 << 20;
/// A request on the internal endpoint (one JSON line).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateWire {
    /// Prompt text (tokenized by the entry).
    #[serde(default)]
    pub prompt: Option<String>,
    /// Or prompt token ids.
    #[serde(default)]
    pub prompt_ids: Option<Vec<u32>>,
    /// Render `prompt` as one user turn with the model's chat template.
    #[serde(default)]
    pub chat: bool,
    /// Most new tokens.
    pub max_tokens: usize,
    /// Sampling (unset fields: greedy, no penalty, seed 0).
    #[serde(default)]
    pub sampling: SamplingParams,
    /// Stop strings.
    #[serde(default)]
    pub stop: Vec<String>,
    /// Speculative decoding for this request.
    #[serde(default)]
    pub speculation: SpeculationRequest,
    /// Score the prompt (`sampling.logprobs` sets the alternatives); with
    /// `max_tokens` 0 nothing is generated.
    #[serde(default)]
    pub score_prompt: bool,
}

/// A request's speculative decoding choices; unset fields take the route's.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SpeculationRequest {
    /// On or off; unset = the route's setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// `"ngram"`, `"model"` (the route's draft model), `"ngram+model"`
    /// (prompt lookup, the draft model where it finds nothing) or `"script"`
    /// (proposes `script`: tests and benchmarks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drafter: Option<veil_wire::route::Drafter>,
    /// A fixed k instead of adaptive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k: Option<usize>,
    /// A fixed number of rounds in flight (1 = one round per trip around
    /// the ring) instead of adaptive pipelining.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<usize>,
    /// The continuation the `"script"` drafter proposes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<Vec<u32>>,
}

impl GenerateWire {
    /// The prompt as ids: text tokenized as text, or (`chat`) one user turn
    /// through the chat template with the text kept out of special tokens.
    pub fn prompt_ids(&self, tokenizer: &Tokenizer) -> Result<Vec<u32>, ModelError> {
        match (&self.prompt, &self.prompt_ids) {
            (Some(text), None) if self.chat => tokenizer.encode_chat(&[ChatMessage::new("user", text.clone())]),
            (Some(text), None) => tokenizer.encode(text, false),
            (None, Some(ids)) => match ids.iter().find(|&&i| i as usize >= tokenizer.vocab_size()) {
                Some(bad) => Err(ModelError::Invalid(format!("token id {bad} is outside the vocabulary"))),
                None => Ok(ids.clone()),
            },
            _ => Err(ModelError::Invalid("give exactly one of prompt and prompt_ids".into())),
        }
    }

    /// The typed request: the prompt as ids, the rest as given.
    pub fn into_request(self, tokenizer: &Tokenizer) -> Result<PipelineRequest, ModelError> {
        Ok(PipelineRequest {
            prompt_ids: self.prompt_ids(tokenizer)?,
            max_tokens: self.max_tokens,
            sampling: self.sampling,
            stop: self.stop,
            speculation: self.speculation,
            calls: None,
            score_prompt: self.score_prompt,
        })
    }
}

/// Why an accepted request failed.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct Failure {
    /// What failed (no prompt or output text).
    pub message: String,
    /// Who is to blame (the HTTP status).
    pub blame: veil_wire::Blame,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// One line of the endpoint's answer.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum GenerateEvent {
    /// A piece of text.
    Text(String),
    /// Log-probabilities of tokens just committed, when asked for; their
    /// text comes in later `Text` events.
    Logprobs(Vec<crate::generate::TokenLogprob>),
    /// Finished.
    Done(Box<Generation>),
    /// Failed after it was accepted (a shard, capacity, a deadline); the
    /// message names the cause, the blame decides the status.
    Error(Failure),
    /// Refused: the request itself is invalid (the caller's to fix; a 400).
    Refused(String),
}

/// Serves the internal endpoint: one request per connection.
pub async fn serve_generate(entry: Arc<Entry>, listener: tokio::net::TcpListener) {
    loop {
        let (tcp, _) = crate::pipeline::net::accept(&listener).await;
        let entry = entry.clone();
        tokio::spawn(async move {
            if let Err(e) = handle_generate(entry, tcp).await {
                tracing::debug!(error = %e, "generate connection ended");
            }
        });
    }
}

async fn handle_generate(entry: Arc<Entry>, tcp: TcpStream) -> std::io::Result<()> {
    let (r, mut w) = tcp.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(r.take(MAX_REQUEST_BYTES as u64));
    reader.read_line(&mut line).await?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    match serde_json::from_str::<GenerateWire>(&line) {
        Err(e) => {
            let _ = tx.send(GenerateEvent::Refused(format!("bad request: {e}")));
            drop(tx);
        }
        Ok(req) => match req.into_request(entry.tokenizer()) {
            Err(e) => {
                let _ = tx.send(GenerateEvent::Refused(e.to_string()));
                drop(tx);
            }
            Ok(req) => {
                let entry = entry.clone();
                tokio::spawn(async move {
                    let failed = tx.clone();
                    if crate::contain::contain(entry.generate(req, tx), "a session").await.is_none() {
                        let message = "the session failed (an internal fault)".into();
                        let _ =
                            failed.send(GenerateEvent::Error(Failure { message, blame: veil_wire::Blame::Internal }));
                    }
                });
            }
        },
    }
    while let Some(ev) = rx.recv().await {
        let mut text = serde_json::to_string(&ev).unwrap_or_else(|_| "{\"error\":\"encoding\"}".into());
        text.push('\n');
        w.write_all(text.as_bytes()).await?;
    }
    w.shutdown().await
}
