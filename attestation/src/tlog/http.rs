//! The log's read API over HTTP, without the HTTP: what `veil log serve`
//! and the host's relay (`/v1/log/…`) answer, and what clients parse.
//! Everything served is public and checked by the reader (signatures,
//! proofs), so any untrusted party may serve it.
//!
//! ```text
//! GET {base}/checkpoint                              the signed checkpoint (text/plain)
//! GET {base}/entry/N                                 entry N (application/octet-stream)
//! GET {base}/proof/inclusion?leaf=HEX&size=N         {"index": I, "hashes": [BASE64, …]}
//! GET {base}/proof/consistency?from=M&size=N         {"hashes": [BASE64, …]}
//! ```

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::{Hash, LogError, LogSource, MAX_PROOF_HASHES};

/// Where the host's relay serves its copy of a log.
pub const RELAY_PREFIX: &str = "/v1/log";

/// A proof as served.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProofWire {
    /// The entry's index (inclusion proofs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u64>,
    /// The proof's hashes, base64.
    pub hashes: Vec<String>,
}

impl ProofWire {
    fn of(index: Option<u64>, hashes: &[Hash]) -> Self {
        Self { index, hashes: hashes.iter().map(|h| B64.encode(h.0)).collect() }
    }

    /// The hashes, decoded (at most [`MAX_PROOF_HASHES`]).
    pub fn decode(&self) -> Result<Vec<Hash>, LogError> {
        if self.hashes.len() > MAX_PROOF_HASHES {
            return Err(LogError::Malformed(format!("a proof of {} hashes", self.hashes.len())));
        }
        self.hashes
            .iter()
            .map(|h| {
                let b = B64.decode(h).map_err(|_| LogError::Malformed("a proof hash is not base64".into()))?;
                Ok(Hash(b.try_into().map_err(|_| LogError::Malformed("a proof hash is not 32 bytes".into()))?))
            })
            .collect()
    }
}

/// An answer: status, content type, body.
#[derive(Debug)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// Content type.
    pub content_type: &'static str,
    /// Body.
    pub body: Vec<u8>,
}

fn answer(status: u16, content_type: &'static str, body: impl Into<Vec<u8>>) -> Answer {
    Answer { status, content_type, body: body.into() }
}

fn query<'a>(q: &'a str, key: &str) -> Option<&'a str> {
    q.split('&').find_map(|kv| kv.split_once('=').filter(|(k, _)| *k == key).map(|(_, v)| v))
}

fn number(q: &str, key: &str) -> Result<u64, Answer> {
    query(q, key)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| answer(400, "text/plain", format!("query parameter {key} must be a whole number\n")))
}

/// Answers a GET of `path` (below the base) with query `query`.
pub fn serve(log: &dyn LogSource, path: &str, query_text: Option<&str>) -> Answer {
    let q = query_text.unwrap_or("");
    let result = (|| -> Result<Answer, Answer> {
        let failed = |e: LogError| match e {
            LogError::Inclusion { .. } => answer(404, "text/plain", "no such entry in the log at that size\n"),
            LogError::Malformed(m) => answer(400, "text/plain", format!("{m}\n")),
            other => answer(500, "text/plain", format!("{other}\n")),
        };
        let size_ok = |size: u64| -> Result<(), Answer> {
            let cp = log.checkpoint().map_err(failed)?;
            let (_, current, _) = super::parse_body(&super::Note::parse(&cp).map_err(failed)?.text).map_err(failed)?;
            if size > current {
                return Err(answer(400, "text/plain", format!("size {size} is beyond the log's {current}\n")));
            }
            Ok(())
        };
        match path {
            "/checkpoint" => Ok(answer(200, "text/plain; charset=utf-8", log.checkpoint().map_err(failed)?)),
            "/proof/inclusion" => {
                let size = number(q, "size")?;
                size_ok(size)?;
                let leaf = query(q, "leaf")
                    .and_then(|h| hex::decode(h).ok())
                    .and_then(|b| <[u8; 32]>::try_from(b).ok())
                    .ok_or_else(|| answer(400, "text/plain", "query parameter leaf must be 64 hex digits\n"))?;
                let (index, hashes) = log.inclusion(&Hash(leaf), size).map_err(failed)?;
                Ok(json(&ProofWire::of(Some(index), &hashes)))
            }
            "/proof/consistency" => {
                let (from, size) = (number(q, "from")?, number(q, "size")?);
                size_ok(size)?;
                if from == 0 || from > size {
                    return Err(answer(400, "text/plain", "need 1 <= from <= size\n"));
                }
                Ok(json(&ProofWire::of(None, &log.consistency(from, size).map_err(failed)?)))
            }
            p => match p.strip_prefix("/entry/").and_then(|n| n.parse::<u64>().ok()) {
                Some(n) => {
                    size_ok(n.saturating_add(1))?;
                    Ok(answer(200, "application/octet-stream", log.entry(n).map_err(failed)?))
                }
                None => Err(answer(404, "text/plain", "unknown log endpoint\n")),
            },
        }
    })();
    result.unwrap_or_else(|a| a)
}

fn json(p: &ProofWire) -> Answer {
    answer(200, "application/json", serde_json::to_vec(p).unwrap_or_default())
}
