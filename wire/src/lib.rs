//! Veil's wire contracts, in one place for the enclave, the untrusted host
//! and the client: what each side writes and reads.
//!
//! ```text
//!  client (veil, SDK) ──HTTP──▶ host relay ──HTTP──▶ entry gateway
//!        paths, media types, fields: [`http`]     errors → status: [`Blame`]
//!  every listener's accept loop with back-off: [`net`] (feature `tokio`)
//!  route file (TOML) ──▶ veil-shard (every shard) and veil-host cluster: [`route`]
//! ```
//!
//! No cryptography and no trust decisions live here: these are the shapes of
//! bytes that anyone on the path can write. The attestation document (which
//! is verified) is `veil_attestation::route::AttestationDoc`.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod http;
pub mod metrics;
#[cfg(feature = "tokio")]
pub mod net;
pub mod route;

/// Who is to blame for a failed request, and so the HTTP status it gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Blame {
    /// The request itself is malformed or invalid: the caller's to fix.
    Request,
    /// Too many requests from this client or in total: retry later.
    Busy,
    /// A shard, a link or capacity failed: the pipeline's.
    Pipeline,
    /// The pipeline did not answer in time.
    Timeout,
    /// The service's own defect.
    Internal,
}

impl Blame {
    /// The HTTP status code for it.
    pub const fn status(self) -> u16 {
        match self {
            Blame::Request => 400,
            Blame::Busy => 429,
            Blame::Pipeline => 503,
            Blame::Timeout => 504,
            Blame::Internal => 500,
        }
    }

    /// The blame an HTTP status code states, if it is an error.
    pub const fn of_status(status: u16) -> Option<Self> {
        Some(match status {
            429 => Blame::Busy,
            504 => Blame::Timeout,
            400..=499 => Blame::Request,
            500 => Blame::Internal,
            501..=599 => Blame::Pipeline,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Blame;

    #[test]
    fn every_blame_round_trips_through_its_status() {
        for b in [Blame::Request, Blame::Busy, Blame::Pipeline, Blame::Timeout, Blame::Internal] {
            assert_eq!(Blame::of_status(b.status()), Some(b));
        }
        assert_eq!(Blame::of_status(200), None);
        assert_eq!(Blame::of_status(404), Some(Blame::Request));
        assert_eq!(Blame::of_status(502), Some(Blame::Pipeline));
    }
}
