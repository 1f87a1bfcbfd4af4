//! Why a session failed, and who is to blame for it.

use crate::link::frame::ErrorCode;

/// Why a session failed. Sorted by blame: the client, the pipeline (a shard
/// or capacity), or a shard that broke the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The client stopped listening.
    #[error("the client went away")]
    ClientGone,
    /// The session ran past its deadline, all rounds together.
    #[error("the request ran past its deadline of {0} s")]
    Deadline(u64),
    /// A stage has no live replica to route through.
    #[error("stage {stage} (layers {first}..{end}) has no live replica")]
    NoReplica {
        /// Stage index.
        stage: usize,
        /// First layer of the stage.
        first: u32,
        /// One past its last layer.
        end: u32,
    },
    /// Shards kept failing under the session.
    #[error("too many re-routes")]
    TooManyReroutes,
    /// A stage refused or failed the work (KV budget, defect).
    #[error("shard error ({code:?}): {message}")]
    Shard {
        /// The stage's error code.
        code: ErrorCode,
        /// What it said.
        message: String,
    },
    /// After a round some stage holds other positions than it must.
    #[error("KV lengths {got:?} after a round; every stage should hold {expected} positions")]
    KvLengths {
        /// Per stage, entry first.
        got: Vec<u32>,
        /// Committed plus just verified positions.
        expected: u32,
    },
    /// A verdict with fewer distributions than positions to verify.
    #[error("a verdict of {got} positions for {want} verified")]
    ShortVerdict {
        /// Distributions in the verdict.
        got: usize,
        /// Positions the round verifies.
        want: usize,
    },
    /// Log-probabilities were asked for, and a verdict lacks them.
    #[error("a verdict carries log-probabilities for {got} positions, not {want}")]
    NoLogprobs {
        /// Positions (or the chosen token's entries) it carries.
        got: usize,
        /// What the round needs.
        want: usize,
    },
    /// Committed ids could not be turned into text.
    #[error("detokenizing: {0}")]
    Text(String),
    /// The entry's own stage worker is gone.
    #[error("the entry worker stopped")]
    WorkerStopped,
    /// The entry is shutting down.
    #[error("the entry is shutting down")]
    ShuttingDown,
}

impl SessionError {
    /// Who is to blame, and so the status a client gets.
    pub fn blame(&self) -> veil_wire::Blame {
        use veil_wire::Blame;
        match self {
            SessionError::ClientGone => Blame::Request,
            SessionError::Deadline(_) => Blame::Timeout,
            SessionError::Text(_) | SessionError::WorkerStopped => Blame::Internal,
            SessionError::NoReplica { .. }
            | SessionError::TooManyReroutes
            | SessionError::Shard { .. }
            | SessionError::KvLengths { .. }
            | SessionError::ShortVerdict { .. }
            | SessionError::NoLogprobs { .. }
            | SessionError::ShuttingDown => Blame::Pipeline,
        }
    }
}
