//! Frames of the shard-to-shard link protocol and their sans-IO codec.
//!
//! On the wire a frame is `len: u32 BE | kind: u8 | body`, `len` counting
//! kind and body. Integers are big-endian; vectors carry a u32 count that is
//! checked against what the remaining bytes can hold before anything is
//! allocated. A decoder never panics on input and never buffers more than
//! its frame limit: anything malformed is a typed [`FrameError`], after
//! which the link is dropped.

mod codec;
mod decoder;
#[cfg(test)]
mod tests;
mod wire;

use veil_attestation::{LayerRange, ManifestRoot};

pub use self::decoder::FrameDecoder;

/// No shadow replica for a stage (see [`Forward::shadow`]).
pub const NO_SHADOW: u8 = u8::MAX;

/// Version spoken by this build; peers must match exactly (2: padded
/// forward frames; 3: cancel frames, shadow replicas; 5: scored tokens).
pub const PROTOCOL_VERSION: u16 = 5;
/// A forward frame of more than one position carries its rows padded to a
/// multiple of this many (zero rows on the wire, dropped by the receiver), so
/// the link's traffic gives a prompt's length only to within this many
/// tokens, and a verification frame hides how many drafts it carries
/// (SECURITY-CASES I3). A one-position (plain decode) frame is not padded:
/// its existence, not its size, is what the host sees.
pub const PAD_ROWS: usize = 16;
/// Sampling history (and the output the penalties count) is padded to a
/// multiple of this many entries.
pub const PAD_HISTORY: usize = 64;
/// `logit_bias` is padded to a multiple of this many entries.
pub const PAD_BIAS: usize = 16;
/// A response format's text is padded to a multiple of this many bytes.
pub const PAD_FORMAT: usize = 256;
/// Default largest frame accepted (kind + body).
pub const DEFAULT_MAX_FRAME: usize = 64 << 20;
/// Most entries in a sparse distribution: a whole vocabulary of up to 262,144
/// tokens (Llama 3's 128,256 and Qwen2/3's 151,936 fit), since a sampled
/// position with no top-k or top-p keeps every token. A full distribution of
/// this size is 2 MiB; a verdict of nine positions fits the frame limit.
pub const MAX_DISTRIBUTION: usize = 1 << 18;
/// Most tokens of sampling history carried.
pub const MAX_HISTORY: usize = 1 << 16;
/// Longest error message carried.
pub const MAX_MESSAGE: usize = 4096;

/// What a link is for, declared in its hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkRole {
    /// Activations downstream (forward frames), errors back up.
    Data,
    /// Entry ↔ shard: heartbeats, verdicts, end-session, errors.
    Control,
}

/// First frame on every link, from each side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Protocol version.
    pub version: u16,
    /// What the link is for.
    pub role: LinkRole,
    /// Layers the sender serves, `[start, end)`.
    pub layers: LayerRange,
    /// Manifest root of the sender's slice.
    pub manifest_root: ManifestRoot,
}

/// Which positions of a forward frame need a verdict from the last shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// None (a prefill chunk that is not the last).
    Nothing,
    /// The last position (plain decoding).
    Last,
    /// Every position (speculative verification).
    All,
}

/// Encoding of hidden states on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// Exact (default): the pipeline equals one process bit for bit.
    F32,
    /// Half the bytes, lossy.
    F16,
    /// Half the bytes, lossy, f32's range.
    Bf16,
}

impl Precision {
    fn bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::Bf16 => 2,
        }
    }
}

/// The sampling transform the last shard applies before returning a verdict.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingSpec {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: u32,
    /// 1 = off.
    pub top_p: f32,
    /// 0 = off.
    pub min_p: f32,
    /// 1 = off.
    pub repetition_penalty: f32,
    /// Tokens the penalty looks at (already windowed by the entry).
    pub history: Vec<u32>,
    /// 0 = off.
    pub presence_penalty: f32,
    /// 0 = off.
    pub frequency_penalty: f32,
    /// The output through this frame's last position (the committed tokens,
    /// then any this frame or an earlier one in flight assumes), which the
    /// presence and frequency penalties count and a response format is
    /// matched against; empty when neither is on. The penalties look at the
    /// last [`PENALTY_WINDOW`](crate::text::sampler::PENALTY_WINDOW).
    pub output: Vec<u32>,
    /// How many of `output` come before the token the first returned
    /// distribution is for; the `i`-th distribution follows `output_at + i`
    /// of them.
    pub output_at: u32,
    /// Added to tokens' logits first (ascending distinct ids).
    pub logit_bias: Vec<(u32, f32)>,
    /// Return the raw log-probabilities of the chosen token's candidates and
    /// of this many top alternatives (`None`: none).
    pub logprobs: Option<u8>,
    /// Per position, a token whose raw log-probability the verdict also
    /// returns (with `logprobs`): the prompt's next token, when a prompt is
    /// scored (`echo`). Empty: none.
    pub scored: Vec<u32>,
    /// What the answer must be
    /// ([`ResponseFormat::to_wire`](crate::text::grammar::ResponseFormat::to_wire)'s
    /// text): the last stage masks what cannot continue it.
    pub response_format: Option<String>,
}

impl SamplingSpec {
    /// Greedy, nothing else: what a verdict uses when a frame names no transform.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            history: Vec::new(),
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            output: Vec::new(),
            output_at: 0,
            logit_bias: Vec::new(),
            logprobs: None,
            scored: Vec::new(),
            response_format: None,
        }
    }
}

/// A session's id on every link: drawn at random by the entry (so one
/// session's id tells nothing about another's), unique among its open
/// sessions, and never meaningful to anyone but the entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

impl std::fmt::Display for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Hidden states of `n` positions of one session, downstream.
#[derive(Clone, Debug, PartialEq)]
pub struct Forward {
    /// Session id (chosen by the entry).
    pub session: SessionId,
    /// Per-session sequence number, increasing; echoed in the verdict.
    pub seq: u64,
    /// Absolute position of the first row.
    pub start: u32,
    /// Drop cached positions at and after this before running (rollback,
    /// or 0 to rebuild a session on a new route).
    pub truncate_to: Option<u32>,
    /// Which positions need a verdict.
    pub want: Want,
    /// Replica index chosen for every stage after the entry.
    pub route: Vec<u8>,
    /// Per stage after the entry, a warm replica that shadows the session's
    /// KV ([`NO_SHADOW`] for none; empty: no shadows): the stage before it
    /// sends it a copy of each frame (`mirror`), so a fail-over there needs
    /// no re-prefill.
    pub shadow: Vec<u8>,
    /// This frame is a shadow's copy: run it into the KV cache, answer and
    /// pass on nothing.
    pub mirror: bool,
    /// Each earlier stage's KV length for this session after running this
    /// frame (the entry's first); the last shard returns them, with its own,
    /// in the verdict, so the entry can check every shard rolled back.
    pub kv_lens: Vec<u32>,
    /// The transform for the verdict (required when `want` is not `Nothing`).
    pub sampling: Option<Box<SamplingSpec>>,
    /// Wire encoding of `hidden`.
    pub precision: Precision,
    /// Values per position.
    pub width: u32,
    /// `n × width` values.
    pub hidden: Vec<f32>,
}

/// The last shard's answer for the positions a forward frame wanted:
/// per position the sparse post-transform distribution (greedy: one entry
/// with probability 1). Never full-vocabulary logits.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    /// Session id.
    pub session: SessionId,
    /// The forward frame's sequence number.
    pub seq: u64,
    /// One distribution per wanted position.
    pub positions: Vec<Vec<(u32, f32)>>,
    /// Every stage's KV length for the session after the frame, stage 0 first.
    pub kv_lens: Vec<u32>,
    /// When the frame asked for log-probabilities: per wanted position the
    /// raw log-probability of the top alternatives asked for (most likely
    /// first) and of every other token of that position's distribution, so
    /// the entry has the one it draws. Empty otherwise.
    pub logprobs: Vec<Vec<(u32, f32)>>,
}

/// Why a peer reports failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    /// The shard's KV memory budget is exhausted.
    KvFull,
    /// The request is invalid for this shard (position, session, size).
    Invalid,
    /// The next stage cannot be reached.
    Unavailable,
    /// A defect or device failure.
    Internal,
}

/// An error report, about one session or the link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorReport {
    /// The session it concerns, if any.
    pub session: Option<SessionId>,
    /// The frame it answers, if any.
    pub seq: u64,
    /// Why.
    pub code: ErrorCode,
    /// For operators; never contains activations or tokens.
    pub message: String,
}

/// The entry's order to drop a session's frames: every frame of `session`
/// with a sequence number up to `through` that the shard has not run yet is
/// dropped unrun (and not passed on); frames it already ran are unaffected.
/// The next valid frame rolls the KV back (`truncate_to`), so a shard that
/// ran a cancelled frame anyway wastes work but computes nothing wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cancel {
    /// The session.
    pub session: SessionId,
    /// Last sequence number dropped.
    pub through: u64,
}

/// Every frame.
#[derive(Clone, Debug, PartialEq)]
pub enum Frame {
    /// Link opening.
    Hello(Hello),
    /// Activations.
    Forward(Forward),
    /// Sampling verdict (last shard → entry).
    Verdict(Verdict),
    /// Free a session's state.
    EndSession(SessionId),
    /// Drop a session's frames that are no longer valid (entry → shard, on
    /// the control link): pipelined speculation sent rounds built on drafts
    /// a verdict has since rejected.
    Cancel(Cancel),
    /// Failure report.
    Error(ErrorReport),
    /// Heartbeat.
    Ping(u64),
    /// Heartbeat answer.
    Pong(u64),
}

/// Why bytes are not a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// Larger than the receiver accepts.
    #[error("frame of {len} bytes exceeds the limit of {limit}")]
    TooLarge {
        /// Declared length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// Unknown frame kind.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// A field is malformed.
    #[error("malformed {frame} frame: {reason}")]
    Malformed {
        /// Frame kind.
        frame: &'static str,
        /// What is wrong.
        reason: String,
    },
}
