//! Why a peer could not be linked: a leaf (it imports nothing from this
//! crate but the link failure), so [`crate::error`] can wrap it without a cycle.

use std::net::SocketAddr;

use crate::link::LinkFailure;

/// Why a peer could not be linked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DialError {
    /// TCP failed.
    #[error("cannot reach {addr}: {source}")]
    Connect {
        /// Where.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Attestation or the TLS handshake failed (names the failed check).
    #[error("attestation of {addr} failed: {source}")]
    Attestation {
        /// Where.
        addr: SocketAddr,
        /// Why.
        source: veil_attestation::Error,
    },
    /// The peer's evidence or hello does not match the route.
    #[error("{addr}: {reason}")]
    WrongPeer {
        /// Where.
        addr: SocketAddr,
        /// What differs.
        reason: String,
    },
    /// The link protocol failed while opening.
    #[error("link to {addr}: {source}")]
    Link {
        /// Where.
        addr: SocketAddr,
        /// Why.
        source: LinkFailure,
    },
    /// Took too long.
    #[error("{addr} timed out")]
    Timeout {
        /// Where.
        addr: SocketAddr,
    },
}
