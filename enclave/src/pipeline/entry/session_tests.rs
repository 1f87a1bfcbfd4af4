//! The session core driven by hand: every action it asks for and every
//! event it gets, with no processes, sockets or model weights.

use std::time::{Duration, Instant};

use candle_core::quantized::gguf_file::Value;

use super::*;
use crate::link::frame::NO_SHADOW;
use crate::speculate::pipeline::Depth;
use crate::text::sampler::Distribution;

// The test vocabulary (byte-level BPE): ids 0 and 5 are stop tokens.
const EOS: u32 = 0;
const A: u32 = 1;
const B: u32 = 2;
const C: u32 = 3;
const SPACE: u32 = 4;
const IM_END: u32 = 5;
const D: u32 = 6;

fn tokenizer() -> Tokenizer {
    let tokens = ["<|endoftext|>", "a", "b", "c", "Ġ", "<|im_end|>", "d", "e", "x", "y", "ab"];
    let types = [3, 1, 1, 1, 1, 3, 1, 1, 1, 1, 1];
    let strings = |v: &[&str]| Value::Array(v.iter().map(|s| Value::String((*s).to_owned())).collect());
    let meta = [
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String("default".into())),
        ("tokenizer.ggml.tokens", strings(&tokens)),
        ("tokenizer.ggml.token_type", Value::Array(types.iter().map(|&t| Value::I32(t)).collect())),
        ("tokenizer.ggml.merges", strings(&["a b"])),
        ("tokenizer.ggml.eos_token_id", Value::U32(EOS)),
    ];
    crate::text::tokenizer::from_metadata(&meta).unwrap()
}

/// A session on a 3-stage route with prefill chunks of 4.
struct Harness {
    tokenizer: Tokenizer,
    counters: SpecCounters,
    t0: Instant,
}

impl Harness {
    fn new() -> Self {
        Self { tokenizer: tokenizer(), counters: SpecCounters::default(), t0: Instant::now() }
    }

    fn session(&self, prompt: &[u32], max_tokens: usize, stop: &[&str], spec: Option<SpecState>) -> SessionCore<'_> {
        self.session_with(SamplingParams::default(), prompt, max_tokens, stop, spec)
    }

    fn session_with(
        &self,
        params: SamplingParams,
        prompt: &[u32],
        max_tokens: usize,
        stop: &[&str],
        spec: Option<SpecState>,
    ) -> SessionCore<'_> {
        let cfg = SessionConfig {
            stages: 3,
            prefill_chunk: 4,
            precision: Precision::F32,
            context: 64,
            deadline: Duration::from_secs(600),
            max_reroutes: 2,
        };
        let start = SessionStart {
            id: SessionId(77),
            route: vec![0, 1],
            shadow: vec![1, NO_SHADOW],
            prompt_ids: prompt.to_vec(),
            sampler: Sampler::new(params.clone()).unwrap(),
            params,
            max_tokens,
            stop: stop.iter().map(|s| (*s).to_owned()).collect(),
            calls: None,
            spec,
            score_prompt: false,
        };
        SessionCore::new(cfg, start, &self.tokenizer, &self.counters, self.t0)
    }

    fn env(&self, secs: u64) -> Env {
        Env { now: self.t0 + Duration::from_secs(secs), client_gone: false, drafter_preparing: false }
    }
}

/// Everything the core asks for until it waits.
fn drain(core: &mut SessionCore<'_>, env: Env) -> Vec<Action> {
    std::iter::from_fn(|| core.poll(env)).collect()
}

fn jobs(actions: &[Action]) -> Vec<&Job> {
    actions.iter().filter_map(|a| if let Action::Send(j) = a { Some(j) } else { None }).collect()
}

fn text(actions: &[Action]) -> String {
    actions.iter().filter_map(|a| if let Action::Emit(t) = a { Some(t.as_str()) } else { None }).collect()
}

fn tokens(job: &Job) -> &[u32] {
    match &job.input {
        Input::Tokens(t) => t,
        Input::Hidden(_) => panic!("the entry sends tokens"),
    }
}

/// The last stage's greedy verdict: one distribution per listed token.
fn verdict(seq: u64, kv: u32, picks: &[u32]) -> SessionEvent {
    SessionEvent::Verdict(Verdict {
        session: SessionId(77),
        seq,
        positions: picks.iter().map(|&t| vec![(t, 1.0)]).collect(),
        kv_lens: vec![kv; 3],
        logprobs: Vec::new(),
    })
}

fn link_error(seq: u64, code: ErrorCode) -> SessionEvent {
    SessionEvent::Error(ErrorReport { session: Some(SessionId(77)), seq, code, message: "boom".into() })
}

fn finished(actions: &[Action]) -> Option<&Generation> {
    actions.iter().find_map(|a| if let Action::Finish(g) = a { Some(g) } else { None })
}

fn failed(actions: &[Action]) -> Option<&SessionError> {
    actions.iter().find_map(|a| if let Action::Fail(e) = a { Some(e) } else { None })
}

#[test]
fn the_prompt_goes_in_chunks_then_one_token_per_round_until_max_tokens() {
    let h = Harness::new();
    let prompt = [A, B, C, D, A, B];
    let mut core = h.session(&prompt, 3, &[], None);
    let a = drain(&mut core, h.env(0));
    let j = jobs(&a);
    assert_eq!(j.len(), 2, "6 prompt positions in chunks of 4");
    assert_eq!((j[0].seq, j[0].start, tokens(j[0])), (1, 0, &prompt[..4]));
    assert_eq!((j[1].seq, j[1].start, tokens(j[1])), (2, 4, &prompt[4..]));
    assert_eq!((j[0].want, j[1].want), (Want::Nothing, Want::Last));
    assert!(j[0].sampling.is_none() && j[1].sampling.is_some(), "only the last chunk is sampled");
    assert!(j.iter().all(|j| j.truncate_to.is_none() && j.route == [0, 1] && j.session == SessionId(77)));
    assert!(core.awaits_event());

    // A verdict on an earlier frame is not this round's.
    core.handle(verdict(1, 4, &[C]), h.t0);
    assert!(core.awaits_event());
    core.handle(verdict(2, 6, &[C]), h.t0);
    let a = drain(&mut core, h.env(1));
    assert_eq!(text(&a), "c");
    let j = jobs(&a);
    assert_eq!((j.len(), j[0].seq, j[0].start, tokens(j[0])), (1, 3, 6, &[C][..]), "the last committed token");

    core.handle(verdict(3, 7, &[SPACE]), h.t0);
    let a = drain(&mut core, h.env(1));
    core.handle(verdict(jobs(&a)[0].seq, 8, &[D]), h.t0);
    let a = drain(&mut core, h.env(1));
    assert!(jobs(&a).is_empty(), "max_tokens reached: nothing more is sent");
    let g = finished(&a).expect("finished");
    assert_eq!((g.prompt_ids.as_slice(), g.ids.as_slice(), g.text.as_str()), (&prompt[..], &[C, SPACE, D][..], "c d"));
    assert_eq!(text(&a), "d");
    assert!(core.poll(h.env(1)).is_none(), "nothing after the end");
    assert_eq!(
        h.counters.rounds.load(std::sync::atomic::Ordering::Relaxed),
        2,
        "the prompt round is not a decode round"
    );
}

#[test]
fn a_stage_that_did_not_roll_back_fails_the_session() {
    assert!(check_kv_lens(&[12, 12, 12], 3, 12).is_ok());
    // A middle stage kept two rejected drafts.
    assert!(check_kv_lens(&[12, 14, 12], 3, 12).is_err());
    // The last stage dropped a position; a stage missing from the verdict; one too many.
    assert!(check_kv_lens(&[12, 12, 11], 3, 12).is_err());
    assert!(check_kv_lens(&[12, 12], 3, 12).is_err());
    assert!(check_kv_lens(&[12, 12, 12, 12], 3, 12).is_err());

    let h = Harness::new();
    let mut core = h.session(&[A, B], 4, &[], None);
    drain(&mut core, h.env(0));
    core.handle(
        SessionEvent::Verdict(Verdict {
            session: SessionId(77),
            seq: 1,
            positions: vec![vec![(C, 1.0)]],
            kv_lens: vec![2, 3, 2],
            logprobs: Vec::new(),
        }),
        h.t0,
    );
    let a = drain(&mut core, h.env(0));
    assert_eq!(failed(&a), Some(&SessionError::KvLengths { got: vec![2, 3, 2], expected: 2 }));
    assert!(text(&a).is_empty() && jobs(&a).is_empty(), "nothing of a bad round is emitted");
}

#[test]
fn a_lost_shard_on_the_route_reroutes_and_rebuilds_from_the_committed_tokens() {
    let h = Harness::new();
    let mut core = h.session(&[A, B], 5, &[], None);
    drain(&mut core, h.env(0));
    core.handle(verdict(1, 2, &[C]), h.t0);
    let a = drain(&mut core, h.env(0));
    assert_eq!(text(&a), "c");
    let seq = jobs(&a)[0].seq;

    // Replica 0 of stage 2 is not on this session's route (it runs on replica 1).
    core.handle(SessionEvent::Down { stage: 2, replica: 0 }, h.t0);
    assert!(core.awaits_event(), "another replica's loss is not this session's");
    core.handle(SessionEvent::Down { stage: 2, replica: 1 }, h.t0);
    let a = drain(&mut core, h.env(0));
    assert!(matches!(a.as_slice(), [Action::Cancel { through }, Action::Reroute] if *through == seq), "{a:?}");
    // A verdict that arrives for the abandoned round changes nothing.
    core.handle(verdict(seq, 3, &[D]), h.t0);
    assert!(core.poll(h.env(0)).is_none());

    core.rerouted(vec![1, 0]);
    assert_eq!(core.route(), [1, 0]);
    let a = drain(&mut core, h.env(0));
    let j = jobs(&a);
    assert_eq!(tokens(j[0]), [A, B, C], "prompt and committed token, rebuilt on the new route");
    assert_eq!((j[0].start, j[0].truncate_to), (0, Some(0)), "every stage starts the session over");
    assert!(j.iter().all(|j| j.route == [1, 0]));
    core.handle(verdict(j[0].seq, 3, &[SPACE]), h.t0);
    let a = drain(&mut core, h.env(0));
    assert_eq!(text(&a), " ", "the text continues where it was");
}

/// Issue 28 (healing): stage 1's replica 0 serves the session and replica 1
/// shadows it. When replica 0 is lost, the route moves to the shadow with
/// no re-prefill: the next round only rolls every stage back to the
/// committed positions. A shadow that turns out not to hold the session
/// (its copies were refused) is rebuilt from the prompt rather than failed.
#[test]
fn a_lost_shard_with_a_warm_shadow_continues_without_a_rebuild() {
    let h = Harness::new();
    let mut core = h.session(&[A, B, C], 8, &[], None);
    let a = drain(&mut core, h.env(0));
    assert!(jobs(&a).iter().all(|j| j.shadow == [1, NO_SHADOW]), "every frame names the shadow");
    core.handle(verdict(1, 3, &[D]), h.t0);
    let a = drain(&mut core, h.env(0));
    let seq = jobs(&a)[0].seq;
    core.handle(verdict(seq, 4, &[A]), h.t0);
    let a = drain(&mut core, h.env(0));
    assert_eq!(core.history(), [A, B, C, D, A]);
    assert!(!jobs(&a).is_empty());

    // The shadow itself going down only stops the copies.
    core.handle(SessionEvent::Down { stage: 1, replica: 1 }, h.t0);
    assert!(core.awaits_event() && core.shadow() == [NO_SHADOW, NO_SHADOW]);
    let mut core = h.session(&[A, B, C], 8, &[], None);
    drain(&mut core, h.env(0));
    core.handle(verdict(1, 3, &[D]), h.t0);
    drain(&mut core, h.env(0));

    // The serving replica goes down with a round in flight.
    core.handle(SessionEvent::Down { stage: 1, replica: 0 }, h.t0);
    assert!(matches!(drain(&mut core, h.env(0)).as_slice(), [Action::Cancel { .. }, Action::Reroute]));
    core.rerouted_warm(vec![1, 1]);
    assert_eq!((core.route(), core.shadow()), (&[1u8, 1][..], &[NO_SHADOW, NO_SHADOW][..]));
    // The shadow did not hold the session after all: rebuilt, not failed.
    a_refused_resend_is_rebuilt(&h, &mut core);
    // Once a round passed, an invalid frame is the shard's fault again.
    let mut core2 = h.session(&[A], 4, &[], None);
    drain(&mut core2, h.env(0));
    core2.handle(link_error(1, ErrorCode::Invalid), h.t0);
    assert!(matches!(failed(&drain(&mut core2, h.env(0))), Some(SessionError::Shard { .. })));
}

/// A round with no verdict in time while every replica still looks up (a
/// slow shard, not a dead one) is resent on the same route. The cancel
/// before it may have dropped the round's frames unrun, so: a lost prompt
/// round is rebuilt from position 0 (no stage is known to hold the prompt),
/// and a stage that answers a warm resend with "does not hold the session"
/// gets the session rebuilt, not failed.
#[test]
fn a_round_lost_on_an_unchanged_route_is_rebuilt_where_a_stage_lost_it() {
    let h = Harness::new();
    let mut core = h.session(&[A, B, C], 8, &[], None);
    let route = core.route().to_vec();
    drain(&mut core, h.env(0));
    core.handle(SessionEvent::Timeout, h.t0);
    assert!(matches!(drain(&mut core, h.env(0)).as_slice(), [Action::Cancel { .. }, Action::Reroute]));
    core.rerouted_warm(route.clone());
    let a = drain(&mut core, h.env(0));
    let j = jobs(&a);
    assert_eq!((j[0].start, j[0].truncate_to, tokens(j[0])), (0, Some(0), &[A, B, C][..]), "{a:?}");
    core.handle(verdict(j[0].seq, 3, &[D]), h.t0);
    let a = drain(&mut core, h.env(0));
    assert_eq!(core.history(), [A, B, C, D]);

    // A decode round lost the same way: resent from the committed positions;
    // the stage that dropped its frame says it does not hold the session.
    let seq = jobs(&a)[0].seq;
    core.handle(SessionEvent::Timeout, h.t0);
    assert!(
        matches!(drain(&mut core, h.env(0)).as_slice(), [Action::Cancel { through }, Action::Reroute] if *through == seq)
    );
    core.rerouted_warm(route);
    a_refused_resend_is_rebuilt(&h, &mut core);
}

/// After a warm re-route of the session `[A, B, C]` + `D`: the next round
/// resends only `D` from the committed positions; a stage that answers it
/// does not hold the session gets the whole session rebuilt from position
/// 0, and the text continues.
fn a_refused_resend_is_rebuilt(h: &Harness, core: &mut SessionCore<'_>) {
    let a = drain(core, h.env(0));
    let j = jobs(&a);
    assert_eq!(j.len(), 1, "one position resent, not the prompt");
    assert_eq!((j[0].start, j[0].truncate_to, tokens(j[0])), (3, Some(3), &[D][..]));
    core.handle(link_error(j[0].seq, ErrorCode::Invalid), h.t0);
    let a = drain(core, h.env(0));
    let j = jobs(&a);
    assert_eq!((j[0].start, j[0].truncate_to, tokens(j[0])), (0, Some(0), &[A, B, C, D][..]), "{a:?}");
    core.handle(verdict(j[0].seq, 4, &[A]), h.t0);
    drain(core, h.env(0));
    assert_eq!(core.history(), [A, B, C, D, A], "the text continues where it was");
}

#[test]
fn unavailable_and_timeouts_reroute_other_errors_fail_stale_errors_are_ignored() {
    let h = Harness::new();
    let mut core = h.session(&[A, B, C, D, A], 5, &[], None);
    drain(&mut core, h.env(0)); // frames 1 and 2
    core.handle(verdict(2, 5, &[C]), h.t0);
    drain(&mut core, h.env(0)); // frame 3
                                // An error about frame 1 belongs to a finished round.
    core.handle(link_error(1, ErrorCode::KvFull), h.t0);
    assert!(core.awaits_event());
    core.handle(link_error(3, ErrorCode::Unavailable), h.t0);
    assert!(matches!(drain(&mut core, h.env(0)).as_slice(), [Action::Cancel { through: 3 }, Action::Reroute]));
    core.rerouted(vec![0, 0]);
    drain(&mut core, h.env(0));
    core.handle(SessionEvent::Timeout, h.t0);
    assert!(matches!(drain(&mut core, h.env(0)).as_slice(), [Action::Cancel { through: 5 }, Action::Reroute]));
    core.rerouted(vec![0, 1]);
    let a = drain(&mut core, h.env(0));
    core.handle(link_error(jobs(&a)[0].seq, ErrorCode::KvFull), h.t0);
    let a = drain(&mut core, h.env(0));
    assert!(matches!(failed(&a), Some(SessionError::Shard { code: ErrorCode::KvFull, .. })), "{a:?}");
}

#[test]
fn a_session_gives_up_after_its_reroutes_run_out() {
    let h = Harness::new();
    let mut core = h.session(&[A], 5, &[], None);
    for _ in 0..2 {
        drain(&mut core, h.env(0));
        core.handle(SessionEvent::Timeout, h.t0);
        assert!(matches!(drain(&mut core, h.env(0)).as_slice(), [Action::Cancel { .. }, Action::Reroute]));
        core.rerouted(vec![0, 0]);
    }
    drain(&mut core, h.env(0));
    core.handle(SessionEvent::Timeout, h.t0);
    assert_eq!(failed(&drain(&mut core, h.env(0))), Some(&SessionError::TooManyReroutes));
}

#[test]
fn speculation_keeps_the_agreeing_prefix_and_rolls_every_stage_back() {
    let h = Harness::new();
    let spec = SpecState { k: AdaptiveK::new(8, Some(3)), depth: Depth::new(1, None), stats: SpecStats::default() };
    let mut core = h.session(&[A, B], 10, &[], Some(spec));
    let a = drain(&mut core, h.env(0));
    assert!(matches!(&a[0], Action::Prepare(ctx) if ctx == &[A, B]), "the drafter prefills with the target");
    let j = jobs(&a);
    assert_eq!(j[0].truncate_to, Some(0), "a speculating session always states its rollback point");
    core.handle(verdict(1, 2, &[C]), h.t0);

    // While the drafter prepares, rounds are plain.
    let busy = Env { drafter_preparing: true, ..h.env(0) };
    let a = drain(&mut core, busy);
    assert!(!a.iter().any(|a| matches!(a, Action::Draft { .. })));
    core.handle(verdict(jobs(&a)[0].seq, 3, &[SPACE]), h.t0);

    let a = drain(&mut core, h.env(0));
    assert!(matches!(a.as_slice(), [Action::Emit(_), Action::Draft { k: 3 }]), "{a:?}");
    assert_eq!(core.history(), [A, B, C, SPACE]);
    // The drafter proposes more than asked: only k are sent.
    core.drafted(Draft { tokens: vec![D, A, B, C], q: Vec::new() }, Duration::from_millis(1), h.t0);
    let a = drain(&mut core, h.env(0));
    let j = jobs(&a);
    assert_eq!(tokens(j[0]), [SPACE, D, A, B], "last committed token, then the drafts");
    assert_eq!((j[0].start, j[0].truncate_to, j[0].want), (3, Some(3), Want::All));
    // The target agrees on d and a, then wants c: d, a, c are committed.
    core.handle(verdict(j[0].seq, 7, &[D, A, C, EOS]), h.t0 + Duration::from_millis(5));
    let a = drain(&mut core, h.env(0));
    assert_eq!(core.history(), [A, B, C, SPACE, D, A, C]);
    assert_eq!(text(&a), "dac");

    // Next round: drafted 3, the stages hold 7; the round rolls back to 6.
    assert!(matches!(a.last(), Some(Action::Draft { .. })));
    core.drafted(Draft::default(), Duration::ZERO, h.t0);
    let a = drain(&mut core, h.env(0));
    let j = jobs(&a);
    assert_eq!((j[0].start, j[0].truncate_to, tokens(j[0])), (6, Some(6), &[C][..]));
    // A stage that kept a rejected draft (8 instead of 7) fails the session.
    core.handle(verdict(j[0].seq, 8, &[EOS]), h.t0);
    assert!(matches!(failed(&drain(&mut core, h.env(0))), Some(SessionError::KvLengths { expected: 7, .. })));
}

#[test]
fn a_verdict_too_short_for_the_drafts_fails() {
    let h = Harness::new();
    let spec = SpecState { k: AdaptiveK::new(8, Some(2)), depth: Depth::new(1, None), stats: SpecStats::default() };
    let mut core = h.session(&[A, B], 10, &[], Some(spec));
    drain(&mut core, h.env(0));
    core.handle(verdict(1, 2, &[C]), h.t0);
    drain(&mut core, h.env(0));
    core.drafted(Draft { tokens: vec![D, A], q: Vec::new() }, Duration::ZERO, h.t0);
    let a = drain(&mut core, h.env(0));
    core.handle(verdict(jobs(&a)[0].seq, 5, &[D, A]), h.t0);
    assert_eq!(failed(&drain(&mut core, h.env(0))), Some(&SessionError::ShortVerdict { got: 2, want: 3 }));
}

#[test]
fn stop_tokens_and_stop_strings_end_the_text_exactly() {
    let h = Harness::new();
    // A stop id ends the session and is neither text nor a generated id.
    let mut core = h.session(&[A], 10, &[], None);
    drain(&mut core, h.env(0));
    core.handle(verdict(1, 1, &[B]), h.t0);
    drain(&mut core, h.env(0));
    core.handle(verdict(2, 2, &[IM_END]), h.t0);
    let a = drain(&mut core, h.env(0));
    let g = finished(&a).expect("finished");
    assert_eq!((g.ids.as_slice(), g.text.as_str()), (&[B][..], "b"));

    // A stop string spanning tokens cuts the text before it.
    let mut core = h.session(&[A], 10, &["c d"], None);
    let mut emitted = String::new();
    let mut a = drain(&mut core, h.env(0));
    for next in [B, C, SPACE, D, A] {
        let seq = jobs(&a).last().expect("a round").seq;
        core.handle(verdict(seq, core.history().len() as u32, &[next]), h.t0);
        a = drain(&mut core, h.env(0));
        emitted += &text(&a);
        if let Some(g) = finished(&a) {
            assert_eq!(g.text, "b");
            assert_eq!(emitted, "b", "no byte of the stop string reaches the client");
            return;
        }
    }
    panic!("the stop string did not end the session");
}

#[test]
fn a_gone_client_or_a_passed_deadline_ends_the_session_at_the_next_round() {
    let h = Harness::new();
    let mut core = h.session(&[A], 10, &[], None);
    drain(&mut core, h.env(0));
    core.handle(verdict(1, 1, &[B]), h.t0);
    let gone = Env { client_gone: true, ..h.env(0) };
    let a = drain(&mut core, gone);
    assert_eq!(failed(&a), Some(&SessionError::ClientGone));
    assert!(jobs(&a).is_empty(), "no more work for a client that left");

    let mut core = h.session(&[A], 10, &[], None);
    drain(&mut core, h.env(0));
    core.handle(verdict(1, 1, &[B]), h.t0);
    assert_eq!(failed(&drain(&mut core, h.env(601))), Some(&SessionError::Deadline(600)));
}

#[test]
fn failures_are_blamed_on_who_caused_them() {
    use veil_wire::Blame;
    assert_eq!(SessionError::Deadline(600).blame(), Blame::Timeout);
    assert_eq!(SessionError::ClientGone.blame(), Blame::Request);
    assert_eq!(SessionError::TooManyReroutes.blame(), Blame::Pipeline);
    assert_eq!(SessionError::ShortVerdict { got: 1, want: 2 }.blame(), Blame::Pipeline);
    assert_eq!(SessionError::Text("bad utf-8".into()).blame(), Blame::Internal);
    assert_eq!(Blame::Timeout.status(), 504);
}

// ---- Pipelined speculation, against a toy target ----

/// The toy target's greedy next token after `ctx` (never a stop id).
fn toy_next(ctx: &[u32]) -> u32 {
    let h = ctx.iter().fold(7u64, |h, &t| h.wrapping_mul(31).wrapping_add(u64::from(t)));
    [A, B, C, D][(h % 4) as usize]
}

/// The toy target's sampling distribution after `last`: a Markov chain on a, b, c, d.
fn toy_p(last: u32) -> Distribution {
    match last {
        A => vec![(A, 0.1), (B, 0.2), (C, 0.3), (D, 0.4)],
        B => vec![(A, 0.7), (B, 0.1), (C, 0.1), (D, 0.1)],
        C => vec![(C, 0.6), (D, 0.4)],
        _ => vec![(A, 0.25), (B, 0.25), (C, 0.25), (D, 0.25)],
    }
}

/// The pipeline as the session sees it, in one process: every stage holds
/// the same positions, frames run in order, one at a time, when the driver
/// lets the oldest run. A cancel drops queued frames unrun (`honour_cancel`).
struct ToyPipeline {
    kv: Vec<u32>,
    queue: VecDeque<Job>,
    greedy: bool,
    honour_cancel: bool,
    /// Frames run, and (seq) those that ran although cancelled.
    ran: usize,
    ran_cancelled: Vec<u64>,
    cancelled_through: u64,
    dropped: usize,
}

impl ToyPipeline {
    fn new(greedy: bool, honour_cancel: bool) -> Self {
        Self {
            kv: Vec::new(),
            queue: VecDeque::new(),
            greedy,
            honour_cancel,
            ran: 0,
            ran_cancelled: Vec::new(),
            cancelled_through: 0,
            dropped: 0,
        }
    }

    fn cancel(&mut self, through: u64) {
        self.cancelled_through = self.cancelled_through.max(through);
        if self.honour_cancel {
            let before = self.queue.len();
            self.queue.retain(|j| j.seq > through);
            self.dropped += before - self.queue.len();
        }
    }

    /// Runs the oldest frame; its verdict or error, if it yields one.
    fn step(&mut self) -> Option<SessionEvent> {
        let job = self.queue.pop_front().expect("the session waits with no frame in flight");
        self.ran += 1;
        if job.seq <= self.cancelled_through {
            self.ran_cancelled.push(job.seq);
        }
        if let Some(t) = job.truncate_to {
            assert!(t <= self.kv.len(), "rolled back to {t} of {}", self.kv.len());
            self.kv.truncate(t);
        }
        assert_eq!(
            job.start,
            self.kv.len(),
            "frame {} starts at {} over {} positions",
            job.seq,
            job.start,
            self.kv.len()
        );
        self.kv.extend_from_slice(tokens(&job));
        let n = tokens(&job).len();
        let dist = |i: usize| {
            if self.greedy {
                vec![(toy_next(&self.kv[..=i]), 1.0)]
            } else {
                toy_p(self.kv[i])
            }
        };
        let at: Vec<usize> = match job.want {
            Want::Nothing => return None,
            Want::Last => vec![self.kv.len() - 1],
            Want::All => (self.kv.len() - n..self.kv.len()).collect(),
        };
        let positions: Vec<Distribution> = at.iter().map(|&i| dist(i)).collect();
        // Log-probabilities that name their position: `toy_logprob(i, t)`,
        // of every candidate and of the token scored there.
        let scored = job.sampling.as_ref().map(|s| s.scored.clone()).unwrap_or_default();
        let logprobs = match job.sampling.as_ref().and_then(|s| s.logprobs) {
            None => Vec::new(),
            Some(_) => at
                .iter()
                .zip(&positions)
                .enumerate()
                .map(|(j, (&i, d))| {
                    let also = scored.get(j).filter(|t| !d.iter().any(|e| e.0 == **t));
                    d.iter().map(|e| e.0).chain(also.copied()).map(|t| (t, toy_logprob(i, t))).collect()
                })
                .collect(),
        };
        Some(SessionEvent::Verdict(Verdict {
            session: job.session,
            seq: job.seq,
            positions,
            kv_lens: vec![self.kv.len() as u32; 3],
            logprobs,
        }))
    }
}

/// Drives `core` against `pipe` to the end, drafting with `draft(context, k)`.
fn drive(
    core: &mut SessionCore<'_>,
    pipe: &mut ToyPipeline,
    env: Env,
    mut draft: impl FnMut(&[u32], usize) -> Draft,
) -> Generation {
    for _ in 0..100_000 {
        match core.poll(env) {
            Some(Action::Draft { k }) => {
                let d = draft(&core.draft_context(), k);
                core.drafted(d, Duration::from_micros(10), env.now);
            }
            Some(Action::Send(job)) => pipe.queue.push_back(job),
            Some(Action::Cancel { through }) => pipe.cancel(through),
            Some(Action::Finish(g)) => return g,
            Some(Action::Fail(e)) => panic!("the session failed: {e}"),
            Some(Action::Reroute) => panic!("no shard was lost"),
            Some(Action::Prepare(_) | Action::Emit(_) | Action::Logprobs(_)) => {}
            None => {
                assert!(core.awaits_event(), "the session waits for nothing");
                if let Some(event) = pipe.step() {
                    core.handle(event, env.now);
                }
            }
        }
    }
    panic!("the session did not finish in 100,000 actions");
}

fn spec(k: usize, depth: usize) -> Option<SpecState> {
    Some(SpecState { k: AdaptiveK::new(8, Some(k)), depth: Depth::new(4, Some(depth)), stats: SpecStats::default() })
}

/// Greedy drafters: right, always wrong, or wrong at every third position.
fn toy_draft(kind: &str, ctx: &[u32], k: usize) -> Draft {
    let mut ctx = ctx.to_vec();
    let mut tokens = Vec::new();
    for _ in 0..k {
        let right = toy_next(&ctx);
        let wrong = if right == A { B } else { A };
        let t = match kind {
            "oracle" => right,
            "wrong" => wrong,
            _ if ctx.len().is_multiple_of(3) => wrong,
            _ => right,
        };
        tokens.push(t);
        ctx.push(t);
    }
    Draft { tokens, q: Vec::new() }
}

/// Issue 28: greedy output of pipelined speculation is token for token
/// plain decoding's, for every drafter, at depths 1–4 and k = 1–8; a
/// rejected round cancels the rounds after it, which no stage then runs;
/// an oracle cancels nothing.
#[test]
fn pipelined_rounds_keep_greedy_output_and_cancel_what_a_rejection_invalidates() {
    let h = Harness::new();
    let prompt = [A, B, C, D, A];
    let mut pipe = ToyPipeline::new(true, true);
    let want = drive(&mut h.session(&prompt, 40, &[], None), &mut pipe, h.env(0), |_, _| unreachable!());
    assert_eq!(want.ids.len(), 40);
    for kind in ["oracle", "wrong", "mixed"] {
        for depth in 1..=4 {
            for k in 1..=8 {
                let mut pipe = ToyPipeline::new(true, true);
                let mut core = h.session(&prompt, 40, &[], spec(k, depth));
                let got = drive(&mut core, &mut pipe, h.env(0), |ctx, k| toy_draft(kind, ctx, k));
                let case = format!("{kind} drafter, depth {depth}, k {k}");
                assert_eq!(got.ids, want.ids, "{case}: output differs from plain decoding");
                let s = got.speculation.expect("speculated");
                assert!(pipe.ran_cancelled.is_empty(), "{case}: cancelled frames ran: {:?}", pipe.ran_cancelled);
                assert_eq!(s.max_depth as usize, depth, "{case}");
                match (kind, depth) {
                    (_, 1) => assert_eq!((s.pipelined_rounds, s.cancelled_rounds, pipe.dropped), (0, 0, 0), "{case}"),
                    ("oracle", _) => {
                        assert!(s.pipelined_rounds > 0, "{case}");
                        assert_eq!((s.cancelled_rounds, pipe.dropped), (0, 0), "{case}: an oracle is never cancelled");
                        assert_eq!(s.accepted, s.drafted, "{case}");
                    }
                    _ => {
                        assert!(s.cancelled_rounds > 0 && pipe.dropped > 0, "{case}: {s:?}");
                        assert!(pipe.dropped as u64 <= s.cancelled_rounds, "{case}");
                    }
                }
            }
        }
    }
}

fn toy_logprob(position: usize, token: u32) -> f32 {
    -(position as f32) - token as f32 / 1000.0
}

/// Each committed token's log-probability is the one the last stage gave at
/// the position that decided it, through pipelined rounds, rejections and
/// cancels; a verdict without them fails the session.
#[test]
fn logprobs_follow_each_token_through_pipelined_rounds() {
    let h = Harness::new();
    let prompt = [A, B, C, D, A];
    let params = SamplingParams { logprobs: Some(0), ..SamplingParams::default() };
    for (kind, k, depth) in [("none", 0, 1), ("oracle", 4, 3), ("mixed", 3, 4), ("wrong", 2, 2)] {
        let mut pipe = ToyPipeline::new(true, true);
        let spec = if kind == "none" { None } else { spec(k, depth) };
        let mut core = h.session_with(params.clone(), &prompt, 30, &[], spec);
        let g = drive(&mut core, &mut pipe, h.env(0), |ctx, k| toy_draft(kind, ctx, k));
        let lp = g.logprobs.expect("asked for");
        assert_eq!(lp.len(), g.ids.len(), "{kind}");
        for (j, (e, &id)) in lp.iter().zip(&g.ids).enumerate() {
            // Token j follows position prompt_len − 1 + j.
            assert_eq!((e.token, e.logprob), (id, toy_logprob(prompt.len() - 1 + j, id)), "{kind}: token {j}");
        }
    }
    // A last stage that drops them breaks the protocol.
    let mut core = h.session_with(params, &[A, B], 4, &[], None);
    drain(&mut core, h.env(0));
    core.handle(verdict(1, 2, &[C]), h.t0);
    let a = drain(&mut core, h.env(0));
    assert!(matches!(failed(&a), Some(SessionError::NoLogprobs { .. })), "{a:?}");
}

/// A drafter with nothing to propose on top of the rounds in flight is not
/// asked again and again: the session waits for the next verdict.
#[test]
fn an_empty_pipelined_draft_waits_for_the_next_verdict() {
    let h = Harness::new();
    let mut core = h.session(&[A, B], 20, &[], spec(2, 3));
    let mut pipe = ToyPipeline::new(true, true);
    let mut asks = 0;
    let g = drive(&mut core, &mut pipe, h.env(0), |ctx, k| {
        asks += 1;
        // Proposes only for the base round (nothing in flight: context = history).
        if ctx.len() % 2 == 0 {
            toy_draft("oracle", ctx, k)
        } else {
            Draft::default()
        }
    });
    assert_eq!(g.ids.len(), 20);
    assert!(asks < 60, "asked the drafter {asks} times for 20 tokens");
}

/// A stage that ignores cancels (runs every frame, answers every verdict)
/// wastes work but changes nothing: stale verdicts are ignored and the next
/// round rolls its KV back.
#[test]
fn a_stage_that_ignores_cancels_changes_no_output() {
    let h = Harness::new();
    let prompt = [B, A, D];
    let want = drive(
        &mut h.session(&prompt, 30, &[], None),
        &mut ToyPipeline::new(true, true),
        h.env(0),
        |_, _| unreachable!(),
    );
    for kind in ["wrong", "mixed"] {
        let mut pipe = ToyPipeline::new(true, false);
        let got =
            drive(&mut h.session(&prompt, 30, &[], spec(3, 4)), &mut pipe, h.env(0), |ctx, k| toy_draft(kind, ctx, k));
        assert_eq!(got.ids, want.ids, "{kind}");
        assert!(!pipe.ran_cancelled.is_empty(), "{kind}: the double ran cancelled frames");
    }
}

/// Sampled output keeps the target's distribution across pipelined rounds:
/// a drafter far from the target (its own fixed `q`), k = 1 at depth 3, so
/// the chain of drafts crosses rounds at every token. The joint
/// distribution of the second to fourth tokens (the first comes from the
/// prompt round; these three from base and continuation rounds) over 30,000
/// sessions must be the target's (chi-square over 64 cells, 63 degrees of
/// freedom, below 103.4, the 0.999 quantile; the seeds are fixed).
#[test]
fn pipelined_sampling_keeps_the_target_distribution() {
    let h = Harness::new();
    let q: Distribution = vec![(A, 0.4), (B, 0.1), (C, 0.1), (D, 0.4)];
    let idx = |t: u32| [A, B, C, D].iter().position(|&x| x == t).unwrap();
    let mut counts = [0u64; 64];
    let mut drafter = Sampler::new(SamplingParams { temperature: 1.0, seed: 5, ..SamplingParams::default() }).unwrap();
    let (mut pipelined, mut cancelled) = (0, 0);
    for seed in 0..30_000u64 {
        let params = SamplingParams { temperature: 1.0, seed: seed + 1, ..SamplingParams::default() };
        let mut core = h.session_with(params, &[A], 5, &[], spec(1, 3));
        let g = drive(&mut core, &mut ToyPipeline::new(false, true), h.env(0), |_, k| {
            let tokens: Vec<u32> = (0..k).map(|_| drafter.draw(&q)).collect();
            Draft { q: vec![q.clone(); tokens.len()], tokens }
        });
        let s = g.speculation.unwrap();
        (pipelined, cancelled) = (pipelined + s.pipelined_rounds, cancelled + s.cancelled_rounds);
        counts[idx(g.ids[1]) * 16 + idx(g.ids[2]) * 4 + idx(g.ids[3])] += 1;
    }
    assert!(pipelined > 10_000 && cancelled > 1_000, "the chains crossed rounds: {pipelined} / {cancelled}");
    let p = |a: u32, b: u32| toy_p(a).iter().find(|e| e.0 == b).map_or(0.0, |e| f64::from(e.1));
    let tok = [A, B, C, D];
    // Σ over the first token t1 of p(t1 | a) p(t2 | t1) p(t3 | t2) p(t4 | t3).
    let joint = |first: &dyn Fn(u32) -> f64| -> Vec<f64> {
        (0..64)
            .map(|c| {
                let (t2, t3, t4) = (tok[c / 16], tok[c / 4 % 4], tok[c % 4]);
                tok.iter().map(|&t1| first(t1) * p(t1, t2)).sum::<f64>() * p(t2, t3) * p(t3, t4)
            })
            .collect()
    };
    let expected = joint(&|t1| p(A, t1));
    let chi = |expected: &[f64]| -> f64 {
        let n: u64 = counts.iter().sum();
        counts
            .iter()
            .zip(expected)
            .map(|(&c, &e)| {
                let m = e * n as f64;
                if m == 0.0 {
                    if c == 0 {
                        0.0
                    } else {
                        f64::INFINITY
                    }
                } else {
                    (c as f64 - m).powi(2) / m
                }
            })
            .sum()
    };
    let got = chi(&expected);
    assert!(got < 103.4, "chi-square {got:.1} over 63 degrees of freedom: {counts:?}");
    // The test can fail: with the fourth token drawn after the second
    // (as if the third were skipped) the counts are far off.
    let skipped: Vec<f64> = (0..64)
        .map(|c| {
            let (t2, t3, t4) = (tok[c / 16], tok[c / 4 % 4], tok[c % 4]);
            tok.iter().map(|&t1| p(A, t1) * p(t1, t2)).sum::<f64>() * p(t2, t3) * p(t2, t4)
        })
        .collect();
    assert!(chi(&skipped) > 1000.0, "{}", chi(&skipped));
}

/// `core` scoring its prompt (what `SessionStart::score_prompt` sets).
fn scoring(mut core: SessionCore<'_>) -> SessionCore<'_> {
    core.score_prompt = true;
    core
}

/// `echo` with `logprobs`: every prompt token after the first gets the
/// last stage's log-probability at the position before it, from frames that
/// return them (all but the last position, which samples alone); the
/// answer is what it is without scoring, with or without speculation, and
/// with `max_tokens` 0 nothing is generated. A last stage that leaves a
/// scored token out fails the session.
#[test]
fn a_scored_prompt_gets_each_tokens_log_probability_and_the_same_answer() {
    let h = Harness::new();
    let prompt = [A, B, C, D, A, B];
    let params = SamplingParams { logprobs: Some(1), ..SamplingParams::default() };
    let want = drive(
        &mut h.session_with(params.clone(), &prompt, 12, &[], None),
        &mut ToyPipeline::new(true, true),
        h.env(0),
        |_, _| unreachable!(),
    );
    assert!(want.prompt_logprobs.is_none(), "not asked for");
    let expected: Vec<(u32, f32)> =
        (0..prompt.len() - 1).map(|i| (prompt[i + 1], toy_logprob(i, prompt[i + 1]))).collect();
    for (case, max_tokens, spec) in
        [("plain", 12, None), ("speculating", 12, spec(3, 2)), ("nothing generated", 0, None)]
    {
        let mut core = scoring(h.session_with(params.clone(), &prompt, max_tokens, &[], spec));
        let mut pipe = ToyPipeline::new(true, true);
        let g = drive(&mut core, &mut pipe, h.env(0), |ctx, k| toy_draft("mixed", ctx, k));
        let got: Vec<(u32, f32)> =
            g.prompt_logprobs.as_deref().expect(case).iter().map(|e| (e.token, e.logprob)).collect();
        assert_eq!(got, expected, "{case}");
        assert!(g.prompt_logprobs.unwrap().iter().all(|e| e.top.len() == 1), "{case}: one alternative each");
        if max_tokens == 0 {
            assert!(g.ids.is_empty() && g.text.is_empty(), "{case}");
        } else {
            assert_eq!(g.ids, want.ids, "{case}: scoring changed the answer");
        }
    }

    // The frames: [0, 4) and [4, 5) return scores, [5, 6) samples alone.
    let mut core = scoring(h.session_with(params.clone(), &prompt, 4, &[], None));
    let a = drain(&mut core, h.env(0));
    let j = jobs(&a);
    let shape: Vec<(usize, usize, Want, Vec<u32>)> =
        j.iter().map(|j| (j.start, tokens(j).len(), j.want, j.sampling.as_ref().unwrap().scored.clone())).collect();
    assert_eq!(shape, [(0, 4, Want::All, vec![B, C, D, A]), (4, 1, Want::All, vec![B]), (5, 1, Want::Last, vec![])]);
    // The last frame's verdict first, then the scores: the round waits for both.
    let row = |i: usize, t: u32| vec![(A, toy_logprob(i, A)), (t, toy_logprob(i, t))];
    let scores = |seq: u64, from: usize, n: usize, leave_out: bool| {
        SessionEvent::Verdict(Verdict {
            session: SessionId(77),
            seq,
            positions: vec![vec![(A, 1.0)]; n],
            kv_lens: vec![(from + n) as u32; 3],
            logprobs: (from..from + n)
                .map(|i| if leave_out && i == 2 { vec![(A, -0.1)] } else { row(i, prompt[i + 1]) })
                .collect(),
        })
    };
    let last = SessionEvent::Verdict(Verdict {
        session: SessionId(77),
        seq: 3,
        positions: vec![vec![(C, 1.0)]],
        kv_lens: vec![6; 3],
        logprobs: vec![vec![(C, -0.5)]],
    });
    core.handle(last, h.t0);
    assert!(core.awaits_event() && drain(&mut core, h.env(0)).is_empty(), "the scores are not all here");
    core.handle(scores(2, 4, 1, false), h.t0);
    core.handle(scores(1, 0, 4, false), h.t0);
    let a = drain(&mut core, h.env(0));
    assert_eq!(text(&a), "c", "{a:?}");

    // A last stage that leaves out a scored token breaks the protocol.
    let mut core = scoring(h.session_with(params, &prompt, 4, &[], None));
    drain(&mut core, h.env(0));
    core.handle(scores(1, 0, 4, true), h.t0);
    core.handle(scores(2, 4, 1, false), h.t0);
    core.handle(verdict(3, 6, &[C]), h.t0);
    let a = drain(&mut core, h.env(0));
    assert!(matches!(failed(&a), Some(SessionError::NoLogprobs { .. })), "{a:?}");
}
