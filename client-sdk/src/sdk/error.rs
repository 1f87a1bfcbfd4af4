//! What a call can fail with, and the time and retry budgets it is given.

use crate::seal::SealError;

/// Why a call failed. Attestation failures carry the full check table.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// This caller's setup is wrong: the URL, a CA file, a body that does
    /// not encode. Fix the call; the host is not involved.
    #[error("{0}")]
    Config(String),
    /// The host could not be reached: connection, TLS, or the connection
    /// dropped before an answer (an entry restart looks like this too).
    #[error("host unreachable: {0}")]
    Unreachable(String),
    /// The host answered outside the protocol: an unexpected status on the
    /// attestation endpoint, a document or event that does not parse.
    #[error("host answered outside the protocol: {0}")]
    Protocol(String),
    /// A shard's evidence failed the policy.
    #[error("attestation of {who} failed: {source}")]
    Attestation {
        /// Which shard.
        who: String,
        /// The verifier's verdict (with the check table).
        source: veil_attestation::Error,
    },
    /// The host (or the entry, unauthenticated) refused the sealed request
    /// with an HTTP status: the entry's key changed (409 replay, 422 key id,
    /// 400 does not open), the request was stale, or the host chose to. Only
    /// a fresh verification can tell a key rotation from a lie.
    #[error("{status}: {message}")]
    Refused {
        /// HTTP status the host answered.
        status: u16,
        /// Its body (at most 1 KiB, as text).
        message: String,
    },
    /// The entry answered inside the seal with an OpenAI-shaped error (a
    /// bad parameter, an unknown model): authenticated, the caller's to fix.
    #[error("{status}: {message}")]
    Api {
        /// HTTP status inside the seal (200 for an error event in a stream).
        status: u16,
        /// The error's message.
        message: String,
    },
    /// The route the host presented is incomplete or inconsistent.
    #[error("route: {0}")]
    Route(String),
    /// A route check failed (the route table names it; the peer policy's
    /// gaps are listed line by line).
    #[error("{0}")]
    RouteRejected(Box<veil_attestation::route::RouteRejection>),
    /// Sealing or opening failed (a tampered or truncated response lands here).
    #[error(transparent)]
    Seal(SealError),
    /// The host did not answer within the client's limit for this stage
    /// (SECURITY-CASES H3). Nothing is retried: a sealed request the host
    /// delayed may still run, so the SDK never sends it twice on its own.
    #[error("the host did not answer within {after:?} ({stage})")]
    Timeout {
        /// Which wait ran out.
        stage: TimeoutStage,
        /// The limit that was reached.
        after: std::time::Duration,
    },
}

impl From<SealError> for ClientError {
    fn from(e: SealError) -> Self {
        Self::Seal(e)
    }
}

/// The waits a client bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TimeoutStage {
    /// Fetching the route's attestation document.
    Attest,
    /// From sending a sealed request to its response's authenticated head.
    FirstByte,
    /// Between two pieces of a streamed response.
    BetweenChunks,
}

impl std::fmt::Display for TimeoutStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Attest => "attestation document",
            Self::FirstByte => "first byte of the response",
            Self::BetweenChunks => "between response chunks",
        })
    }
}

/// How long a client waits at each stage. The defaults allow a long prompt's
/// prefill on a slow route; lower them for interactive use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// Fetching and reading the attestation document (default 30 s).
    pub attest: std::time::Duration,
    /// Sending a sealed request until its response's head opens (default 300 s).
    pub first_byte: std::time::Duration,
    /// Between two pieces of the response body (default 120 s).
    pub between_chunks: std::time::Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        use std::time::Duration;
        Self {
            attest: Duration::from_secs(30),
            first_byte: Duration::from_secs(300),
            between_chunks: Duration::from_secs(120),
        }
    }
}

/// How a client retries a sealed request the service shed for load: the
/// host's 429 or 503 (unauthenticated: the relay's queue was full, or the
/// client held its share), or the attested entry's own 429 or 503 inside
/// the seal (its ceiling, a busy compile, no verified shard for a stage).
/// Each try is sealed anew, so the entry's replay window does not refuse it;
/// a try waits the host's `Retry-After` (at most
/// `veil_wire::http::MAX_RETRY_AFTER_SECS`) plus a uniform draw up to the
/// back-off, which doubles from `first_backoff` to `max_backoff`. Nothing
/// else is retried: a timeout or a dropped connection may mean the request
/// runs (SECURITY-CASES H3).
///
/// A relay that lies with 503 while forwarding the request anyway can make
/// the entry run it up to `1 + max` times; it learns nothing it could not
/// learn from one run (THREAT_MODEL §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retries {
    /// Tries after the first (default 3; 0 never retries).
    pub max: u32,
    /// The first back-off (default 250 ms).
    pub first_backoff: std::time::Duration,
    /// The longest back-off (default 8 s).
    pub max_backoff: std::time::Duration,
}

impl Default for Retries {
    fn default() -> Self {
        use std::time::Duration;
        Self { max: 3, first_backoff: Duration::from_millis(250), max_backoff: Duration::from_secs(8) }
    }
}

impl Retries {
    /// No retries at all.
    pub const NONE: Retries =
        Retries { max: 0, first_backoff: std::time::Duration::ZERO, max_backoff: std::time::Duration::ZERO };
}

impl ClientError {
    /// The check table of an attestation failure.
    pub fn check_table(&self) -> Option<String> {
        match self {
            Self::Attestation { source: veil_attestation::Error::Rejected(r), .. } => Some(match &r.gpu {
                Some(g) => g.appraisal.to_string(),
                None => r.report.to_string(),
            }),
            Self::RouteRejected(r) => Some(r.report.to_string()),
            _ => None,
        }
    }
}
