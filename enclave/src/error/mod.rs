//! The error of starting and running a node ([`crate::node`],
//! [`crate::pipeline::shard`], [`crate::pipeline::local`]), sorted by who is
//! to blame, as the errors of the modules below it are: the operator's
//! configuration, a check this node makes on itself, the model file, this
//! node's own evidence, a peer, the operating system, or a defect.
//!
//! Module errors ([`ModelError`], [`RouteError`], [`DialError`],
//! [`LinkFailure`], …) stay what their modules return; this one wraps them
//! with the blame they carry at a node's level.

use crate::link::LinkFailure;
use crate::model::ModelError;
use net::DialError;
use route::RouteError;
use seal::GatewaySealError;

// The errors of modules above this one that it wraps live here, below it
// (re-exported where their modules return them), so no module and this
// one depend on each other.
pub(crate) mod net;
pub(crate) mod route;
pub(crate) mod seal;

/// Why a node did not start, or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The operator's configuration (route file, policy file, options) is
    /// invalid or inconsistent: fix it and start again.
    #[error("configuration: {0}")]
    Config(String),
    /// The route file itself.
    #[error(transparent)]
    Route(#[from] RouteError),
    /// A check this node makes on itself refused to start: weights that are
    /// not the route's, HOST_DATA that does not commit to the configuration,
    /// a policy unfit for serving.
    #[error("refused to start: {0}")]
    Refused(String),
    /// The model file cannot be read, or is malformed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// This node's own evidence, identity or keys.
    #[error("attestation: {0}")]
    Attestation(#[from] veil_attestation::Error),
    /// The entry's sealing key.
    #[error(transparent)]
    Seal(#[from] GatewaySealError),
    /// A peer failed its attestation or link handshake.
    #[error(transparent)]
    Dial(#[from] DialError),
    /// A peer broke the link protocol or the link failed.
    #[error(transparent)]
    Link(#[from] LinkFailure),
    /// A peer sent a frame that does not fit this stage.
    #[error("peer: {0}")]
    Peer(String),
    /// The operating system refused (an address to listen on, a file, a thread).
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// A part of this node stopped (its stage worker).
    #[error("internal: {0}")]
    Internal(String),
}

impl Error {
    /// An I/O failure while doing `what`.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| Self::Io { what, source }
    }
}

/// A node's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
