//! Each frame kind's encoding and decoding ([`Frame::encode`], [`Frame::decode`]).

use half::{bf16, f16};
use veil_attestation::{LayerRange, ManifestRoot};

use super::wire::{Reader, Writer};
use super::{
    Cancel, ErrorCode, ErrorReport, Forward, Frame, FrameError, Hello, LinkRole, Precision, SamplingSpec, SessionId,
    Verdict, Want, MAX_DISTRIBUTION, MAX_HISTORY, MAX_MESSAGE, PAD_BIAS, PAD_FORMAT, PAD_HISTORY, PAD_ROWS,
};
use crate::text::grammar::MAX_SCHEMA_BYTES;
use crate::text::sampler::{MAX_LOGIT_BIAS, MAX_TOP_LOGPROBS};

/// Longest response format text: a schema and its JSON wrapping (quoted,
/// so at most doubled by escapes).
const MAX_FORMAT: usize = 2 * MAX_SCHEMA_BYTES + 64;

const KIND_HELLO: u8 = 1;
const KIND_FORWARD: u8 = 2;
const KIND_VERDICT: u8 = 3;
const KIND_END: u8 = 4;
const KIND_ERROR: u8 = 5;
const KIND_PING: u8 = 6;
const KIND_PONG: u8 = 7;
const KIND_CANCEL: u8 = 8;

impl Frame {
    /// The frame's name, for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Hello(_) => "hello",
            Self::Forward(_) => "forward",
            Self::Verdict(_) => "verdict",
            Self::EndSession(_) => "end-session",
            Self::Cancel(_) => "cancel",
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
                write_forward(&mut w, f);
            }
            Self::Verdict(v) => {
                w.u8(KIND_VERDICT);
                write_verdict(&mut w, v);
            }
            Self::EndSession(s) => {
                w.u8(KIND_END);
                w.u64(s.0);
            }
            Self::Cancel(c) => {
                w.u8(KIND_CANCEL);
                w.u64(c.session.0);
                w.u64(c.through);
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
            KIND_CANCEL => "cancel",
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
                let n = r.count(4, 1 << 16, "log-probability positions")?;
                if n != 0 && n != positions.len() {
                    return Err(r.bad(format!("log-probabilities for {n} of {} positions", positions.len())));
                }
                let mut logprobs = Vec::with_capacity(n);
                for _ in 0..n {
                    let k = r.count(8, MAX_DISTRIBUTION + MAX_TOP_LOGPROBS, "log-probabilities")?;
                    let mut lp = Vec::with_capacity(k);
                    for _ in 0..k {
                        let (t, l) = (r.u32()?, r.f32()?);
                        if !(l.is_finite() || l == f32::NEG_INFINITY) || l > 0.0 {
                            return Err(r.bad("log-probability above 0 or NaN"));
                        }
                        lp.push((t, l));
                    }
                    logprobs.push(lp);
                }
                Self::Verdict(Verdict { session, seq, positions, kv_lens, logprobs })
            }
            KIND_END => Self::EndSession(SessionId(r.u64()?)),
            KIND_CANCEL => Self::Cancel(Cancel { session: SessionId(r.u64()?), through: r.u64()? }),
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

/// A forward frame's body after its kind.
fn write_forward(w: &mut Writer, f: &Forward) {
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
    w.len(f.shadow.len());
    w.0.extend_from_slice(&f.shadow);
    w.u8(u8::from(f.mirror));
    w.len(f.kv_lens.len());
    f.kv_lens.iter().for_each(|&l| w.u32(l));
    match &f.sampling {
        None => w.u8(0),
        Some(s) => {
            w.u8(1);
            write_sampling(w, s);
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

/// The sampling transform a forward frame carries for the last stage.
fn write_sampling(w: &mut Writer, s: &SamplingSpec) {
    w.f32(s.temperature);
    w.u32(s.top_k);
    w.f32(s.top_p);
    w.f32(s.min_p);
    w.f32(s.repetition_penalty);
    write_tokens(w, &s.history);
    w.f32(s.presence_penalty);
    w.f32(s.frequency_penalty);
    write_tokens(w, &s.output);
    w.u32(s.output_at);
    w.len(s.logit_bias.len());
    let padded = s.logit_bias.len().div_ceil(PAD_BIAS) * PAD_BIAS;
    w.len(padded);
    s.logit_bias.iter().for_each(|&(t, b)| {
        w.u32(t);
        w.f32(b);
    });
    (s.logit_bias.len()..padded).for_each(|_| w.u64(0));
    match s.logprobs {
        None => w.u8(0),
        Some(n) => {
            w.u8(1);
            w.u8(n);
        }
    }
    write_tokens(w, &s.scored);
    match &s.response_format {
        None => w.u8(0),
        Some(f) => {
            w.u8(1);
            w.len(f.len());
            let padded = f.len().div_ceil(PAD_FORMAT) * PAD_FORMAT;
            w.len(padded);
            w.0.extend_from_slice(f.as_bytes());
            w.0.resize(w.0.len() + padded - f.len(), 0);
        }
    }
}

/// A verdict frame's body after its kind.
fn write_verdict(w: &mut Writer, v: &Verdict) {
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
    w.len(v.logprobs.len());
    for lp in &v.logprobs {
        w.len(lp.len());
        for &(t, l) in lp {
            w.u32(t);
            w.f32(l);
        }
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
    let n = r.count(1, 255, "shadow")?;
    let shadow = r.take(n)?.to_vec();
    if !shadow.is_empty() && shadow.len() != route.len() {
        return Err(r.bad(format!("{} shadows for a route of {} stages", shadow.len(), route.len())));
    }
    let mirror = match r.u8()? {
        0 => false,
        1 => true,
        other => return Err(r.bad(format!("mirror flag {other}"))),
    };
    let n = r.count(4, 256, "KV lengths")?;
    let kv_lens = (0..n).map(|_| r.u32()).collect::<Result<_, _>>()?;
    let sampling = match r.u8()? {
        0 => None,
        1 => Some(Box::new(read_sampling(r)?)),
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
        shadow,
        mirror,
        kv_lens,
        sampling,
        precision,
        width: width as u32,
        hidden,
    }))
}

/// The sampling transform of a forward frame (after its flag).
fn read_sampling(r: &mut Reader<'_>) -> Result<SamplingSpec, FrameError> {
    let temperature = r.f32()?;
    let top_k = r.u32()?;
    let top_p = r.f32()?;
    let min_p = r.f32()?;
    let repetition_penalty = r.f32()?;
    let history = read_tokens(r, "history")?;
    let presence_penalty = r.f32()?;
    let frequency_penalty = r.f32()?;
    let output = read_tokens(r, "output")?;
    let output_at = r.u32()?;
    if output_at as usize > output.len() {
        return Err(r.bad(format!("output position {output_at} past {} output tokens", output.len())));
    }
    let n = r.u32()? as usize;
    let padded = r.count(8, MAX_LOGIT_BIAS + PAD_BIAS, "logit bias")?;
    if n > MAX_LOGIT_BIAS || padded != n.div_ceil(PAD_BIAS) * PAD_BIAS {
        return Err(r.bad(format!("logit bias of {n} entries padded to {padded}")));
    }
    let logit_bias = (0..n).map(|_| Ok((r.u32()?, r.f32()?))).collect::<Result<_, FrameError>>()?;
    if r.take((padded - n) * 8)?.iter().any(|b| *b != 0) {
        return Err(r.bad("non-zero logit bias padding"));
    }
    let logprobs = match r.u8()? {
        0 => None,
        1 => match r.u8()? {
            n if usize::from(n) <= MAX_TOP_LOGPROBS => Some(n),
            n => return Err(r.bad(format!("{n} top log-probabilities"))),
        },
        other => return Err(r.bad(format!("log-probability flag {other}"))),
    };
    let scored = read_tokens(r, "scored tokens")?;
    if !scored.is_empty() && logprobs.is_none() {
        return Err(r.bad("scored tokens without log-probabilities"));
    }
    let response_format = match r.u8()? {
        0 => None,
        1 => {
            let n = r.u32()? as usize;
            let padded = r.count(1, MAX_FORMAT + PAD_FORMAT, "response format")?;
            if n > MAX_FORMAT || padded != n.div_ceil(PAD_FORMAT) * PAD_FORMAT {
                return Err(r.bad(format!("response format of {n} bytes padded to {padded}")));
            }
            let text = std::str::from_utf8(r.take(n)?).map_err(|_| r.bad("response format is not UTF-8"))?;
            let text = text.to_owned();
            if r.take(padded - n)?.iter().any(|b| *b != 0) {
                return Err(r.bad("non-zero response format padding"));
            }
            Some(text)
        }
        other => return Err(r.bad(format!("response format flag {other}"))),
    };
    Ok(SamplingSpec {
        temperature,
        top_k,
        top_p,
        min_p,
        repetition_penalty,
        history,
        presence_penalty,
        frequency_penalty,
        output,
        output_at,
        logit_bias,
        logprobs,
        scored,
        response_format,
    })
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

/// A token list padded to whole [`PAD_HISTORY`] blocks of zeros.
fn write_tokens(w: &mut Writer, tokens: &[u32]) {
    w.len(tokens.len());
    let padded = tokens.len().div_ceil(PAD_HISTORY) * PAD_HISTORY;
    w.len(padded);
    tokens.iter().for_each(|&t| w.u32(t));
    (tokens.len()..padded).for_each(|_| w.u32(0));
}

fn read_tokens(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<u32>, FrameError> {
    let n = r.u32()? as usize;
    let padded = r.count(4, MAX_HISTORY + PAD_HISTORY, what)?;
    if n > MAX_HISTORY || padded != n.div_ceil(PAD_HISTORY) * PAD_HISTORY {
        return Err(r.bad(format!("{what} of {n} entries padded to {padded}")));
    }
    let tokens = (0..n).map(|_| r.u32()).collect::<Result<_, _>>()?;
    if r.take((padded - n) * 4)?.iter().any(|b| *b != 0) {
        return Err(r.bad(format!("non-zero {what} padding")));
    }
    Ok(tokens)
}
