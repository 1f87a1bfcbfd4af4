//! Codec tests: round trips through split reads, typed errors, padding.

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
        shadow: vec![NO_SHADOW, 2],
        mirror: true,
        kv_lens: vec![13],
        sampling: Some(Box::new(SamplingSpec {
            temperature: 0.7,
            top_k: 40,
            top_p: 0.9,
            min_p: 0.05,
            repetition_penalty: 1.1,
            history: vec![1, 2, 3],
            presence_penalty: 0.5,
            frequency_penalty: -0.25,
            output: vec![3, 3, 9],
            output_at: 2,
            logit_bias: vec![(4, 1.5), (70, -100.0)],
            logprobs: Some(5),
            scored: vec![8, 11],
            response_format: Some(r#"{"type":"json_object"}"#.into()),
        })),
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
            logprobs: vec![vec![(5, -0.5), (1, -1.5)], vec![(2, -0.1), (1, f32::NEG_INFINITY)]],
        }),
        Frame::EndSession(SessionId(7)),
        Frame::Cancel(Cancel { session: SessionId(7), through: 9 }),
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
        logprobs: Vec::new(),
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
    let v = Verdict {
        session: SessionId(1),
        seq: 1,
        positions: vec![vec![(1, 0.5)]],
        kv_lens: vec![],
        logprobs: Vec::new(),
    };
    let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
    d.push(&Frame::Verdict(v).encode());
    assert!(matches!(d.next_frame(), Err(FrameError::Malformed { frame: "verdict", .. })));
    // Wanting a verdict without a transform.
    let mut f = forward(Precision::F32);
    f.sampling = None;
    let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
    d.push(&Frame::Forward(f).encode());
    assert!(matches!(d.next_frame(), Err(FrameError::Malformed { .. })));
    // Log-probabilities: above 0, NaN, or for another number of positions.
    let verdict = |logprobs: Vec<Vec<(u32, f32)>>| {
        Frame::Verdict(Verdict {
            session: SessionId(1),
            seq: 1,
            positions: vec![vec![(1, 1.0)], vec![(2, 1.0)]],
            kv_lens: vec![],
            logprobs,
        })
    };
    for bad in [vec![vec![(1, 0.5)], vec![]], vec![vec![(1, f32::NAN)], vec![]], vec![vec![(1, -1.0)]]] {
        let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
        d.push(&verdict(bad.clone()).encode());
        assert!(matches!(d.next_frame(), Err(FrameError::Malformed { frame: "verdict", .. })), "{bad:?}");
    }
    // More top alternatives than any request may ask for.
    let mut f = forward(Precision::F32);
    f.sampling.as_mut().unwrap().logprobs = Some(21);
    let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
    d.push(&Frame::Forward(f).encode());
    assert!(matches!(d.next_frame(), Err(FrameError::Malformed { .. })));
}

/// The output the penalties count, the logit bias and a response format's
/// text are padded to buckets (zeros the receiver checks), like the history;
/// an output position past the output is refused.
#[test]
fn penalty_output_and_logit_bias_are_padded_and_checked() {
    let frame = |output: usize, bias: usize| {
        let mut f = forward(Precision::F32);
        let s = f.sampling.as_mut().unwrap();
        s.output = (0..output as u32).collect();
        s.output_at = 0;
        s.logit_bias = (0..bias as u32).map(|t| (t, 0.5)).collect();
        f
    };
    let size = |o, b| Frame::Forward(frame(o, b)).encode().len();
    let with_format = |n: usize| {
        let mut f = frame(3, 1);
        f.sampling.as_mut().unwrap().response_format = Some("x".repeat(n));
        Frame::Forward(f).encode().len()
    };
    assert_eq!((1..=256).map(with_format).collect::<std::collections::BTreeSet<_>>().len(), 1);
    assert!(with_format(257) > with_format(256));
    let mut past = frame(3, 1);
    past.sampling.as_mut().unwrap().output_at = 4;
    let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
    d.push(&Frame::Forward(past).encode());
    assert!(matches!(d.next_frame(), Err(FrameError::Malformed { .. })));
    assert_eq!((1..=64).map(|o| size(o, 1)).collect::<std::collections::BTreeSet<_>>().len(), 1);
    assert_eq!((1..=16).map(|b| size(1, b)).collect::<std::collections::BTreeSet<_>>().len(), 1);
    assert!(size(65, 1) > size(64, 1) && size(1, 17) > size(1, 16));
    // A non-zero byte in the bias padding (one entry padded to 16).
    let f = frame(1, 1);
    let wire = Frame::Forward(f.clone()).encode();
    let at = (0..wire.len() - 8).rev().find(|&i| {
        let mut dirty = wire.clone();
        dirty[i] ^= 0x40;
        let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
        d.push(&dirty);
        matches!(d.next_frame(), Err(FrameError::Malformed { ref reason, .. }) if reason.contains("logit bias padding"))
    });
    assert!(at.is_some(), "a dirty bias pad is refused by name");
    let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
    d.push(&wire);
    assert_eq!(d.next_frame().unwrap(), Some(Frame::Forward(f)));
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

/// A scored prompt's tokens (`echo`) are padded like the other token lists,
/// and a frame that names scored tokens but asks for no log-probabilities
/// (what a peer that broke the protocol would send) is refused by name.
#[test]
fn scored_tokens_are_padded_and_need_log_probabilities() {
    let frame = |scored: usize, logprobs: Option<u8>| {
        let mut f = forward(Precision::F32);
        let s = f.sampling.as_mut().unwrap();
        s.scored = (0..scored as u32).collect();
        s.logprobs = logprobs;
        f
    };
    let size = |n: usize| Frame::Forward(frame(n, Some(0))).encode().len();
    assert_eq!((1..=64).map(size).collect::<std::collections::BTreeSet<_>>().len(), 1);
    assert!(size(65) > size(64));
    let f = frame(70, Some(2));
    let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
    d.push(&Frame::Forward(f.clone()).encode());
    assert_eq!(d.next_frame().unwrap(), Some(Frame::Forward(f)));
    let mut d = FrameDecoder::new(DEFAULT_MAX_FRAME);
    d.push(&Frame::Forward(frame(3, None)).encode());
    assert!(
        matches!(d.next_frame(), Err(FrameError::Malformed { ref reason, .. }) if reason.contains("scored tokens without")),
        "scored tokens without logprobs"
    );
}
