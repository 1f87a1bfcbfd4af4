//! Reading a sealed answer as it streams: server-sent events split as the
//! authenticated pieces arrive, and text pieces up to the seal's end.

use super::error::ClientError;
use crate::seal::OpenedResponse;

/// The server-sent events of a streamed answer, split as bytes arrive: an
/// event (or a character) cut across two pieces waits for the rest.
#[derive(Debug, Default)]
pub struct SseEvents {
    pending: Vec<u8>,
}

impl SseEvents {
    /// Appends the next authenticated piece of the body.
    pub fn push(&mut self, piece: &[u8]) {
        self.pending.extend_from_slice(piece);
    }

    /// The next whole event's data (its `data:` lines joined); events of
    /// comment lines only (the entry's padding) are skipped. `None`: no
    /// whole event is buffered yet.
    pub fn next_data(&mut self) -> Result<Option<String>, ClientError> {
        while let Some(end) = self.pending.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = self.pending.drain(..end + 2).collect();
            let event = String::from_utf8(event).map_err(|_| ClientError::Protocol("an event is not UTF-8".into()))?;
            let data: Vec<&str> = event.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim_start).collect();
            if !data.is_empty() {
                return Ok(Some(data.join("\n")));
            }
        }
        Ok(None)
    }

    /// Whether bytes of an unfinished event are buffered.
    pub fn has_partial(&self) -> bool {
        self.pending.iter().any(|b| !b.is_ascii_whitespace())
    }
}

/// The error an answer with a non-200 status inside the seal carries (an
/// OpenAI-shaped `{"error": {"message"}}` body, authenticated by the seal).
pub async fn api_error(resp: OpenedResponse) -> ClientError {
    let status = resp.status;
    match resp.collect().await {
        Ok(body) => {
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            let message = v["error"]["message"]
                .as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(1024)]).into_owned());
            ClientError::Api { status, message }
        }
        Err(e) => e.into(),
    }
}

/// A streamed chat or completion answer (`"stream": true`), read as text
/// pieces. It ends only at the seal's authenticated end: a stream the host
/// cut or altered is an error, never a shorter answer.
#[derive(Debug)]
pub struct TextStream {
    resp: OpenedResponse,
    events: SseEvents,
    finish_reason: Option<String>,
    usage: Option<serde_json::Value>,
    ended: bool,
}

impl TextStream {
    /// Starts reading `resp`; an answer with an error status becomes
    /// [`ClientError::Api`].
    pub async fn new(resp: OpenedResponse) -> Result<Self, ClientError> {
        if resp.status != 200 {
            return Err(api_error(resp).await);
        }
        Ok(Self { resp, events: SseEvents::default(), finish_reason: None, usage: None, ended: false })
    }

    /// The next piece of text; `None` at the authenticated end. An error
    /// event inside the stream is [`ClientError::Api`] (status 200).
    pub async fn next_text(&mut self) -> Result<Option<String>, ClientError> {
        loop {
            if self.ended {
                return Ok(None);
            }
            while let Some(data) = self.events.next_data()? {
                if data == "[DONE]" {
                    continue;
                }
                let v: serde_json::Value =
                    serde_json::from_str(&data).map_err(|e| ClientError::Protocol(format!("an event: {e}")))?;
                if let Some(err) = v.get("error") {
                    let message = err["message"].as_str().map(str::to_owned).unwrap_or_else(|| err.to_string());
                    return Err(ClientError::Api { status: 200, message });
                }
                if v.get("usage").is_some_and(|u| !u.is_null()) {
                    self.usage = v.get("usage").cloned();
                }
                let choice = &v["choices"][0];
                if let Some(reason) = choice["finish_reason"].as_str() {
                    self.finish_reason = Some(reason.to_owned());
                }
                // Chat chunks carry `delta.content`, completion chunks `text`.
                let text = choice["delta"]["content"].as_str().or_else(|| choice["text"].as_str());
                if let Some(t) = text.filter(|t| !t.is_empty()) {
                    return Ok(Some(t.to_owned()));
                }
            }
            match self.resp.next().await? {
                Some(piece) => self.events.push(&piece),
                None => {
                    self.ended = true;
                    if self.events.has_partial() {
                        return Err(ClientError::Protocol("the stream ended inside an event".into()));
                    }
                }
            }
        }
    }

    /// Why the model stopped (`stop`, `length`), once the stream said so.
    pub fn finish_reason(&self) -> Option<&str> {
        self.finish_reason.as_deref()
    }

    /// The token counts, when the stream carried them.
    pub fn usage(&self) -> Option<&serde_json::Value> {
        self.usage.as_ref()
    }

    /// The authenticated response (its route and drafter fields, complete
    /// once the stream has ended).
    pub fn response(&self) -> &OpenedResponse {
        &self.resp
    }
}
