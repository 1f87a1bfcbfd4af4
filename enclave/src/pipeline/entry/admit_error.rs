//! Why the entry refused a request before any pipeline work: the caller is
//! to blame. Shown to the client as [`super::GenerateEvent::Refused`], so
//! each message is the text the client has always read.

use crate::model::ModelError;
use crate::speculate::pipeline::MAX_DEPTH;
use crate::speculate::MAX_K;

/// Why a request was refused at admission.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AdmitError {
    /// A prompt token id is not in the tokenizer's vocabulary.
    #[error("token id {id} is outside the vocabulary")]
    TokenOutOfVocab {
        /// The first such id.
        id: u32,
    },
    /// Out-of-range sampling parameters, or a length the context cannot hold.
    #[error(transparent)]
    Invalid(#[from] ModelError),
    /// The speculation the request asks for cannot be had.
    #[error(transparent)]
    Speculation(#[from] SpeculationError),
    /// The response format cannot be enforced (not JSON, too large, a
    /// schema the engine cannot compile).
    #[error("response_format: {0}")]
    Format(#[from] crate::text::grammar::GrammarError),
    /// A response format with more new tokens than the link carries.
    #[error("a response format allows at most {max} new tokens", max = crate::link::frame::MAX_HISTORY)]
    FormatTooLong,
}

/// Why the speculation a request asks for cannot be set up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SpeculationError {
    /// A draft model was asked for and this entry loaded none.
    #[error("this entry has no draft model (route speculation.draft_model)")]
    NoDraftModel,
    /// The script drafter was asked for without a script.
    #[error("drafter \"script\" needs speculation.script")]
    NoScript,
    /// `k` above [`MAX_K`].
    #[error("speculation k must be at most {max}", max = MAX_K)]
    KTooLarge,
    /// `depth` outside `1..=MAX_DEPTH`.
    #[error("speculation depth must be 1 to {max}", max = MAX_DEPTH)]
    DepthOutOfRange,
}
