//! Why a peer could not be linked (returned by [`crate::pipeline::net`]): it
//! imports nothing from this crate but the link failure.

use std::net::SocketAddr;

use veil_attestation::LayerRange;

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
    /// The peer's attested claims are not those of the stage dialled.
    #[error("{addr}: {source}")]
    NotInRole {
        /// Where.
        addr: SocketAddr,
        /// What differs.
        source: RoleMismatch,
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

/// Why a verified peer is not the stage it was expected to be: its attested
/// claims differ from the route's (the peer, or the route, is to blame).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RoleMismatch {
    /// The evidence carries no Veil claims at all.
    #[error("peer evidence carries no claims")]
    NoClaims,
    /// The attested layer range is not the stage's.
    #[error("attested layers {attested:?}, expected {expected}")]
    Layers {
        /// What the peer attested.
        attested: Option<LayerRange>,
        /// The stage's layers.
        expected: LayerRange,
    },
    /// The attested manifest root is not the stage's.
    #[error("attested manifest root differs from the route's")]
    ManifestRoot,
    /// The attested peer policy is not ours.
    #[error("attested peer policy differs from ours")]
    PeerPolicy,
    /// The attested route shape is not ours.
    #[error("attested route shape differs from ours")]
    RouteShape,
}

/// Why a frame could not be forwarded to the next stage.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ForwardError {
    /// This stage is the last one: there is no next stage (a defect).
    #[error("no next stage")]
    NoNextStage,
    /// The route has no such replica of the next stage (a defect).
    #[error("no replica {0}")]
    NoReplica(u8),
    /// The link closed as soon as it was dialled.
    #[error("link to {addr} closed")]
    LinkClosed {
        /// Where.
        addr: SocketAddr,
    },
    /// The replica could not be (re)dialled.
    #[error(transparent)]
    Dial(#[from] DialError),
}
