//! Frames of the shard-to-shard link protocol and their sans-IO codec.
//!
//! On the wire a frame is `len: u32 BE | kind: u8 | body`, `len` counting
//! kind and body. Integers are big-endian; vectors carry a u32 count that is
//! checked against what the remaining bytes can hold before anything is
//! allocated. A decoder never panics on input and never buffers more than
//! its frame limit: anything malformed is a typed [`FrameError`], after
//! which the link is dropped.

use half::{bf16, f16};
use veil_attestation::{LayerRange, ManifestRoot};

/// Version spoken by this build; peers must match exactly (2: padded
/// forward frames).
pub const PROTOCOL_VERSION: u16 = 2;
/// A forward frame of more than one position carries its rows padded to a
/// multiple of this many (zero rows on the wire, dropped by the receiver), so
/// the link's traffic gives a prompt's length only to within this many
/// tokens, and a verification frame hides how many drafts it carries
/// (SECURITY-CASES I3). A one-position (plain decode) frame is not padded:
/// its existence, not its size, is what the host sees.
pub const PAD_ROWS: usize = 16;
/// Sampling history is padded to a multiple of this many entries.
pub const PAD_HISTORY: usize = 64;
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
    /// Each earlier stage's KV length for this session after running this
    /// frame (the entry's first); the last shard returns them, with its own,
    /// in the verdict, so the entry can check every shard rolled back.
    pub kv_lens: Vec<u32>,
    /// The transform for the verdict (required when `want` is not `Nothing`).
    pub sampling: Option<SamplingSpec>,
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

const KIND_HELLO: u8 = 1;
const KIND_FORWARD: u8 = 2;
const KIND_VERDICT: u8 = 3;
const KIND_END: u8 = 4;
const KIND_ERROR: u8 = 5;
const KIND_PING: u8 = 6;
const KIND_PONG: u8 = 7;

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn f32(&mut self, v: f32) {
        self.u32(v.to_bits());
    }
    fn len(&mut self, n: usize) {
        // Lengths are bounded by the frame limit (< 4 GiB) on every path that writes them.
        self.u32(n as u32);
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    frame: &'static str,
}

impl<'a> Reader<'a> {
    fn bad(&self, reason: impl Into<String>) -> FrameError {
        FrameError::Malformed { frame: self.frame, reason: reason.into() }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        if self.buf.len() < n {
            return Err(self.bad(format!("needs {n} more bytes, {} left", self.buf.len())));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, FrameError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, FrameError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, FrameError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
    fn f32(&mut self) -> Result<f32, FrameError> {
        Ok(f32::from_bits(self.u32()?))
    }
    /// A count of items of `item_bytes` each, checked against the bytes left and `max`.
    fn count(&mut self, item_bytes: usize, max: usize, what: &str) -> Result<usize, FrameError> {
        let n = self.u32()? as usize;
        if n > max || n.saturating_mul(item_bytes) > self.buf.len() {
            return Err(self.bad(format!("{what}: count {n} does not fit")));
        }
        Ok(n)
    }
    fn done(&self) -> Result<(), FrameError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(self.bad(format!("{} trailing bytes", self.buf.len())))
        }
    }
}

impl Frame {
    /// The frame's name, for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Hello(_) => "hello",
            Self::Forward(_) => "forward",
            Self::Verdict(_) => "verdict",
            Self::EndSession(_) => "end-session",
            Self::Error(_) => "error",
            Self::Ping(_) => "ping",
            Self::Pong(_) => "pong",
        }
    }

    /// Wire bytes: length prefix, kind, body.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer(vec![0, 0, 0, 0]);
        match self {
            Self::Hello(h) => {
                w.u8(KIND_HELLO);
                w.u16(h.version);
                w.u8(match h.role {
                    LinkRole::Data => 1,
                    LinkRole::Control => 2,
                });
                w.u32(h.layers.start());
                w.u32(h.layers.end());
                w.0.extend_from_slice(&h.manifest_root.0);
            }
            Self::Forward(f) => {
                w.u8(KIND_FORWARD);
                w.u64(f.session.0);
                w.u64(f.seq);
                w.u32(f.start);
                match f.truncate_to {
                    None => w.u8(0),
                    Some(t) => {
                        w.u8(1);
                        w.u32(t);
                    }
                }
                w.u8(match f.want {
                    Want::Nothing => 0,
                    Want::Last => 1,
                    Want::All => 2,
                });
                w.len(f.route.len());
                w.0.extend_from_slice(&f.route);
                w.len(f.kv_lens.len());
                f.kv_lens.iter().for_each(|&l| w.u32(l));
                match &f.sampling {
                    None => w.u8(0),
                    Some(s) => {
                        w.u8(1);
                        w.f32(s.temperature);
                        w.u32(s.top_k);
                        w.f32(s.top_p);
                        w.f32(s.min_p);
                        w.f32(s.repetition_penalty);
                        w.len(s.history.len());
                        let padded = s.history.len().div_ceil(PAD_HISTORY) * PAD_HISTORY;
                        w.len(padded);
                        s.history.iter().for_each(|&t| w.u32(t));
                        (s.history.len()..padded).for_each(|_| w.u32(0));
                    }
                }
                w.u8(match f.precision {
                    Precision::F32 => 0,
                    Precision::F16 => 1,
                    Precision::Bf16 => 2,
                });
                w.u32(f.width);
                w.len(f.hidden.len());
                let padded = padded_values(f.hidden.len(), f.width as usize);
                w.len(padded);
                let zeros = padded - f.hidden.len();
                match f.precision {
                    Precision::F32 => f.hidden.iter().for_each(|&v| w.f32(v)),
                    Precision::F16 => f.hidden.iter().for_each(|&v| w.u16(f16::from_f32(v).to_bits())),
                    Precision::Bf16 => f.hidden.iter().for_each(|&v| w.u16(bf16::from_f32(v).to_bits())),
                }
                w.0.resize(w.0.len() + zeros * f.precision.bytes(), 0);
            }
            Self::Verdict(v) => {
                w.u8(KIND_VERDICT);
                w.u64(v.session.0);
                w.u64(v.seq);
                w.len(v.positions.len());
                for dist in &v.positions {
                    w.len(dist.len());
                    for &(t, p) in dist {
                        w.u32(t);
                        w.f32(p);
                    }
                }
                w.len(v.kv_lens.len());
                v.kv_lens.iter().for_each(|&l| w.u32(l));
            }
            Self::EndSession(s) => {
                w.u8(KIND_END);
                w.u64(s.0);
            }
            Self::Error(e) => {
                w.u8(KIND_ERROR);
                match e.session {
                    None => w.u8(0),
                    Some(s) => {
                        w.u8(1);
                        w.u64(s.0);
                    }
                }
                w.u64(e.seq);
                w.u8(match e.code {
                    ErrorCode::KvFull => 1,
                    ErrorCode::Invalid => 2,
                    ErrorCode::Unavailable => 3,
                    ErrorCode::Internal => 4,
                });
                let msg = truncate_utf8(&e.message, MAX_MESSAGE);
                w.len(msg.len());
                w.0.extend_from_slice(msg.as_bytes());
            }
            Self::Ping(n) => {
                w.u8(KIND_PING);
                w.u64(*n);
            }
            Self::Pong(n) => {
                w.u8(KIND_PONG);
                w.u64(*n);
            }
        }
        let len = (w.0.len() - 4) as u32;
        w.0[..4].copy_from_slice(&len.to_be_bytes());
        w.0
    }

    /// Decodes one frame's kind and body (without the length prefix).
    pub fn decode(kind: u8, body: &[u8]) -> Result<Self, FrameError> {
        let name = match kind {
            KIND_HELLO => "hello",
            KIND_FORWARD => "forward",
            KIND_VERDICT => "verdict",
            KIND_END => "end-session",
            KIND_ERROR => "error",
            KIND_PING => "ping",
            KIND_PONG => "pong",
            other => return Err(FrameError::UnknownKind(other)),
        };
        let mut r = Reader { buf: body, frame: name };
        let frame = match kind {
            KIND_HELLO => {
                let version = r.u16()?;
                let role = match r.u8()? {
                    1 => LinkRole::Data,
                    2 => LinkRole::Control,
                    other => return Err(r.bad(format!("link role {other}"))),
                };
                let (start, end) = (r.u32()?, r.u32()?);
                let layers = LayerRange::new(start, end).map_err(|_| r.bad("empty layer range"))?;
                let mut manifest_root = ManifestRoot([0u8; 32]);
                manifest_root.0.copy_from_slice(r.take(32)?);
                Self::Hello(Hello { version, role, layers, manifest_root })
            }
            KIND_FORWARD => decode_forward(&mut r)?,
            KIND_VERDICT => {
                let session = SessionId(r.u64()?);
                let seq = r.u64()?;
                let n = r.count(4, 1 << 16, "positions")?;
                let mut positions = Vec::with_capacity(n);
                for _ in 0..n {
                    let k = r.count(8, MAX_DISTRIBUTION, "distribution")?;
                    if k == 0 {
                        return Err(r.bad("empty distribution"));
                    }
                    let mut dist = Vec::with_capacity(k);
                    let mut total = 0f64;
                    for _ in 0..k {
                        let (t, p) = (r.u32()?, r.f32()?);
                        if !(p.is_finite() && (0.0..=1.0).contains(&p)) {
                            return Err(r.bad("probability outside [0, 1]"));
                        }
                        total += f64::from(p);
                        dist.push((t, p));
                    }
                    if (total - 1.0).abs() > 1e-3 {
                        return Err(r.bad(format!("probabilities sum to {total}")));
                    }
                    positions.push(dist);
                }
                let n = r.count(4, 256, "KV lengths")?;
                let kv_lens = (0..n).map(|_| r.u32()).collect::<Result<_, _>>()?;
                Self::Verdict(Verdict { session, seq, positions, kv_lens })
            }
            KIND_END => Self::EndSession(SessionId(r.u64()?)),
            KIND_ERROR => {
                let session = match r.u8()? {
                    0 => None,
                    1 => Some(SessionId(r.u64()?)),
                    other => return Err(r.bad(format!("session flag {other}"))),
                };
                let seq = r.u64()?;
                let code = match r.u8()? {
                    1 => ErrorCode::KvFull,
                    2 => ErrorCode::Invalid,
                    3 => ErrorCode::Unavailable,
                    4 => ErrorCode::Internal,
                    other => return Err(r.bad(format!("error code {other}"))),
                };
                let n = r.count(1, MAX_MESSAGE, "message")?;
                let message = std::str::from_utf8(r.take(n)?).map_err(|_| r.bad("message is not UTF-8"))?.to_owned();
                Self::Error(ErrorReport { session, seq, code, message })
            }
            KIND_PING => Self::Ping(r.u64()?),
            _ => Self::Pong(r.u64()?),
        };
        r.done()?;
        Ok(frame)
    }
}

fn decode_forward(r: &mut Reader<'_>) -> Result<Frame, FrameError> {
    let session = SessionId(r.u64()?);
    let seq = r.u64()?;
    let start = r.u32()?;
    let truncate_to = match r.u8()? {
        0 => None,
        1 => Some(r.u32()?),
        other => return Err(r.bad(format!("truncate flag {other}"))),
    };
    let want = match r.u8()? {
        0 => Want::Nothing,
        1 => Want::Last,
        2 => Want::All,
        other => return Err(r.bad(format!("want {other}"))),
    };
    let n = r.count(1, 255, "route")?;
    let route = r.take(n)?.to_vec();
    let n = r.count(4, 256, "KV lengths")?;
    let kv_lens = (0..n).map(|_| r.u32()).collect::<Result<_, _>>()?;
    let sampling = match r.u8()? {
        0 => None,
        1 => {
            let temperature = r.f32()?;
            let top_k = r.u32()?;
            let top_p = r.f32()?;
            let min_p = r.f32()?;
            let repetition_penalty = r.f32()?;
            let n = r.u32()? as usize;
            let padded = r.count(4, MAX_HISTORY + PAD_HISTORY, "history")?;
            if n > MAX_HISTORY || padded != n.div_ceil(PAD_HISTORY) * PAD_HISTORY {
                return Err(r.bad(format!("history of {n} entries padded to {padded}")));
            }
            let history = (0..n).map(|_| r.u32()).collect::<Result<_, _>>()?;
            if r.take((padded - n) * 4)?.iter().any(|b| *b != 0) {
                return Err(r.bad("non-zero history padding"));
            }
            Some(SamplingSpec { temperature, top_k, top_p, min_p, repetition_penalty, history })
        }
        other => return Err(r.bad(format!("sampling flag {other}"))),
    };
    if want != Want::Nothing && sampling.is_none() {
        return Err(r.bad("a verdict is wanted but no sampling transform given"));
    }
    let precision = match r.u8()? {
        0 => Precision::F32,
        1 => Precision::F16,
        2 => Precision::Bf16,
        other => return Err(r.bad(format!("precision {other}"))),
    };
    let width = r.u32()? as usize;
    let count = r.u32()? as usize;
    let padded = r.count(precision.bytes(), usize::MAX, "hidden states")?;
    if width == 0 || count == 0 || !count.is_multiple_of(width) {
        return Err(r.bad(format!("{count} values are not whole positions of width {width}")));
    }
    if padded != padded_values(count, width) {
        return Err(r.bad(format!("{count} values padded to {padded}, not to whole {PAD_ROWS}-row buckets")));
    }
    let raw = r.take(count * precision.bytes())?;
    if r.take((padded - count) * precision.bytes())?.iter().any(|b| *b != 0) {
        return Err(r.bad("non-zero padding rows"));
    }
    let hidden: Vec<f32> = match precision {
        Precision::F32 => raw.chunks_exact(4).map(|b| f32::from_be_bytes([b[0], b[1], b[2], b[3]])).collect(),
        Precision::F16 => {
            raw.chunks_exact(2).map(|b| f16::from_bits(u16::from_be_bytes([b[0], b[1]])).to_f32()).collect()
        }
        Precision::Bf16 => {
            raw.chunks_exact(2).map(|b| bf16::from_bits(u16::from_be_bytes([b[0], b[1]])).to_f32()).collect()
        }
    };
    if hidden.iter().any(|v| !v.is_finite()) {
        return Err(r.bad("non-finite hidden state"));
    }
    Ok(Frame::Forward(Forward {
        session,
        seq,
        start,
        truncate_to,
        want,
        route,
        kv_lens,
        sampling,
        precision,
        width: width as u32,
        hidden,
    }))
}

/// Values on the wire for `count` values of rows of `width`: one row as is,
/// more rows rounded up to a multiple of [`PAD_ROWS`].
fn padded_values(count: usize, width: usize) -> usize {
    let rows = count / width.max(1);
    if rows <= 1 {
        count
    } else {
        rows.div_ceil(PAD_ROWS) * PAD_ROWS * width
    }
}

fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Sans-IO decoder: feed bytes as they arrive, take frames out.
#[derive(Debug)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    max_frame: usize,
}

impl FrameDecoder {
    /// A decoder refusing frames over `max_frame` bytes (kind + body).
    pub fn new(max_frame: usize) -> Self {
        Self { buf: Vec::new(), max_frame }
    }

    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes the next frame still needs before [`next_frame`](Self::next_frame)
    /// can return it (at least 1 when incomplete), or 0 when one is ready.
    pub fn wanted(&self) -> usize {
        if self.buf.len() < 4 {
            return 4 - self.buf.len();
        }
        let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        (4 + len).saturating_sub(self.buf.len())
    }

    /// The next complete frame, `None` when more bytes are needed.
    /// An error is final: the stream cannot be resynchronised.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if len > self.max_frame {
            return Err(FrameError::TooLarge { len, limit: self.max_frame });
        }
        if len == 0 {
            return Err(FrameError::Malformed { frame: "(none)", reason: "empty frame".into() });
        }
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        let frame = Frame::decode(self.buf[4], &self.buf[5..4 + len]);
        self.buf.drain(..4 + len);
        frame.map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn forward(precision: Precision) -> Forward {
        Forward {
            session: SessionId(7),
            seq: 3,
            start: 12,
            truncate_to: Some(12),
            want: Want::Last,
            route: vec![0, 1],
            kv_lens: vec![13],
            sampling: Some(SamplingSpec {
                temperature: 0.7,
                top_k: 40,
                top_p: 0.9,
                min_p: 0.05,
                repetition_penalty: 1.1,
                history: vec![1, 2, 3],
            }),
            precision,
            width: 4,
            hidden: vec![0.5, -1.25, 3.0, 0.0, 1.0, 2.0, -0.5, 8.0],
        }
    }

    fn all_frames() -> Vec<Frame> {
        vec![
            Frame::Hello(Hello {
                version: PROTOCOL_VERSION,
                role: LinkRole::Data,
                layers: LayerRange::new(10, 20).unwrap(),
                manifest_root: ManifestRoot([9; 32]),
            }),
            Frame::Forward(forward(Precision::F32)),
            Frame::Forward(forward(Precision::F16)),
            Frame::Forward(forward(Precision::Bf16)),
            Frame::Verdict(Verdict {
                session: SessionId(7),
                seq: 3,
                positions: vec![vec![(5, 1.0)], vec![(1, 0.25), (2, 0.75)]],
                kv_lens: vec![12, 12, 12],
            }),
            Frame::EndSession(SessionId(7)),
            Frame::Error(ErrorReport {
                session: Some(SessionId(7)),
                seq: 3,
                code: ErrorCode::KvFull,
                message: "full".into(),
            }),
            Frame::Ping(1),
            Frame::Pong(1),
        ]
    }

    #[test]
    fn every_frame_round_trips_through_split_reads() {
        let frames = all_frames();
        let wire: Vec<u8> = frames.iter().flat_map(Frame::encode).collect();
        for chunk in [1, 3, 7, 64, wire.len()] {
            let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
            let mut got = Vec::new();
            for piece in wire.chunks(chunk) {
                d.push(piece);
                while let Some(f) = d.next_frame().unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(got, frames, "chunk {chunk}");
            assert_eq!(d.wanted(), 4);
        }
    }

    /// A sampled verdict over a whole large vocabulary (Qwen2/3: 151,936
    /// tokens; temperature 1, no top-k/top-p) crosses the link.
    #[test]
    fn a_full_distribution_over_a_large_vocabulary_round_trips() {
        let vocab = 151_936u32;
        let p = 1.0 / vocab as f32;
        let dist: Vec<(u32, f32)> = (0..vocab).map(|i| (i, p)).collect();
        let v = Frame::Verdict(Verdict {
            session: SessionId(1),
            seq: 2,
            positions: vec![dist.clone(), dist],
            kv_lens: vec![3, 3],
        });
        let wire = v.encode();
        let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
        d.push(&wire);
        assert_eq!(d.next_frame().unwrap(), Some(v));
    }

    #[test]
    fn bad_frames_get_typed_errors() {
        let mut d = FrameDecoder::new(16);
        d.push(&1000u32.to_be_bytes());
        assert!(matches!(d.next_frame(), Err(FrameError::TooLarge { len: 1000, limit: 16 })));
        let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
        d.push(&[0, 0, 0, 1, 99]);
        assert_eq!(d.next_frame(), Err(FrameError::UnknownKind(99)));
        // Trailing bytes after a ping.
        let mut ping = Frame::Ping(1).encode();
        ping.push(0);
        ping[3] += 1;
        let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
        d.push(&ping);
        assert!(matches!(d.next_frame(), Err(FrameError::Malformed { .. })));
        // A NaN in the hidden states.
        let mut f = forward(Precision::F32);
        f.hidden[2] = f32::NAN;
        let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
        d.push(&Frame::Forward(f).encode());
        assert!(matches!(d.next_frame(), Err(FrameError::Malformed { frame: "forward", .. })));
        // A verdict whose probabilities do not sum to one.
        let v = Verdict { session: SessionId(1), seq: 1, positions: vec![vec![(1, 0.5)]], kv_lens: vec![] };
        let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
        d.push(&Frame::Verdict(v).encode());
        assert!(matches!(d.next_frame(), Err(FrameError::Malformed { frame: "verdict", .. })));
        // Wanting a verdict without a transform.
        let mut f = forward(Precision::F32);
        f.sampling = None;
        let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
        d.push(&Frame::Forward(f).encode());
        assert!(matches!(d.next_frame(), Err(FrameError::Malformed { .. })));
    }

    proptest! {
        /// Arbitrary bytes never panic the decoder and never make it hold
        /// more than one frame limit.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let mut d = FrameDecoder::new(1024);
            d.push(&bytes);
            while let Ok(Some(_)) = d.next_frame() {}
        }

        /// Every truncation of a valid frame is incomplete, never a wrong frame.
        #[test]
        fn truncations_are_incomplete(cut in 0usize..100) {
            let wire = Frame::Forward(forward(Precision::F16)).encode();
            let cut = cut.min(wire.len() - 1);
            let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
            d.push(&wire[..cut]);
            prop_assert_eq!(d.next_frame(), Ok(None));
        }
    }

    /// SECURITY-CASES I3: what the host sees of the link's traffic. Every
    /// prefill chunk of 17 to 32 positions, and every verification frame of 2
    /// to 16, has one encoded size; the receiver gets exactly the real rows.
    #[test]
    fn forward_frames_are_padded_to_row_buckets() {
        let frame = |rows: usize, history: usize| {
            let mut f = forward(Precision::F16);
            f.width = 8;
            f.hidden = (0..rows * 8).map(|i| i as f32 * 0.25).collect();
            f.sampling.as_mut().unwrap().history = (0..history as u32).collect();
            f
        };
        let size = |rows, history| Frame::Forward(frame(rows, history)).encode().len();
        let bucket: std::collections::BTreeSet<usize> = (17..=32).map(|r| size(r, 3)).collect();
        assert_eq!(bucket.len(), 1, "{bucket:?}");
        let drafts: std::collections::BTreeSet<usize> = (2..=16).map(|r| size(r, 3)).collect();
        assert_eq!(drafts.len(), 1, "{drafts:?}");
        assert!(size(1, 3) < size(2, 3), "a single decode position is not padded");
        let histories: std::collections::BTreeSet<usize> = (1..=64).map(|h| size(1, h)).collect();
        assert_eq!(histories.len(), 1, "{histories:?}");
        for rows in [1, 2, 15, 16, 17, 33] {
            let f = frame(rows, 5);
            let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
            d.push(&Frame::Forward(f.clone()).encode());
            assert_eq!(d.next_frame().unwrap(), Some(Frame::Forward(f)), "{rows} rows");
        }
    }

    #[test]
    fn padding_that_is_not_zero_or_not_a_bucket_is_refused() {
        let mut f = forward(Precision::F32);
        f.hidden = (0..3 * f.width as usize).map(|i| i as f32).collect();
        let wire = Frame::Forward(f).encode();
        // The last byte is padding (3 rows padded to 16).
        let mut dirty = wire.clone();
        *dirty.last_mut().unwrap() = 1;
        let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
        d.push(&dirty);
        assert!(matches!(d.next_frame(), Err(FrameError::Malformed { .. })));
    }
}
