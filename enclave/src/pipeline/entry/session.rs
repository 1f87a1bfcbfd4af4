//! One decode session as a synchronous state machine: no sockets, no tasks,
//! no clock of its own.
//!
//! The driver ([`super::Entry::run_session`]) feeds it what happened —
//! a draft, a verdict, a link error, a lost shard, a timeout, a new route,
//! and the time — and performs what it asks for: send a job to the entry's
//! stage worker, emit text, draft, re-route, finish. Everything that decides
//! what a session's output is lives here, so it is tested byte by byte
//! without processes (see the tests below):
//!
//! ```text
//!            ┌──────────── poll: Send(job)… ─────────────┐
//!  ExpectRound ── poll: Draft{k} ──▶ ExpectDraft ── drafted ┤
//!      ▲                                                    ▼
//!      │◀── verdict: commit tokens, Emit(text) ──── ExpectVerdict
//!      │                                               │ link down / Unavailable / timeout
//!      └──────────── rerouted(route) ◀── ExpectRoute ◀──┘ (Reroute)
//!   any state ── stop id / stop string / max tokens ──▶ Finish; bad verdict ──▶ Fail
//! ```
//!
//! Invariants it keeps: every round first rolls every stage back to the
//! committed positions it sends from (rejected drafts never stay in any KV);
//! after each round every stage must report exactly the committed positions
//! plus those just verified; a re-route rebuilds the new route's KV from the
//! prompt and the committed tokens, so the text continues unchanged.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::metrics::SpecCounters;
use crate::generate::{Generation, TextStream};
use crate::link::frame::{ErrorCode, ErrorReport, Precision, SamplingSpec, SessionId, Verdict, Want};
use crate::pipeline::worker::{Input, Job};
use crate::speculate::{verify_round, AdaptiveK, Draft, SpecStats};
use crate::text::sampler::{Sampler, SamplingParams};
use crate::text::tokenizer::Tokenizer;

/// What the session hears from the pipeline while it waits for a round.
#[derive(Debug)]
pub enum SessionEvent {
    /// The last stage's verdict on a frame.
    Verdict(Verdict),
    /// A stage reported an error for a frame.
    Error(ErrorReport),
    /// The control link of (`stage`, `replica`) went down.
    Down {
        /// Stage index (1 = after the entry).
        stage: usize,
        /// Replica index within the stage.
        replica: u8,
    },
    /// No verdict within the round timeout (a frame lost with a link).
    Timeout,
}

/// What the session asks its driver to do.
#[derive(Debug)]
pub enum Action {
    /// Start the drafter's background preparation (a draft model's prefill)
    /// on this context; fire and forget.
    Prepare(Vec<u32>),
    /// Draft up to `k` tokens after [`SessionCore::history`]; answer with
    /// [`SessionCore::drafted`].
    Draft {
        /// Most tokens to propose.
        k: usize,
    },
    /// Hand this job to the entry's stage worker.
    Send(Job),
    /// Send this text to the client.
    Emit(String),
    /// Release the current route and choose another; answer with
    /// [`SessionCore::rerouted`].
    Reroute,
    /// The session is complete.
    Finish(Generation),
    /// The session failed.
    Fail(SessionError),
}

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
            | SessionError::ShuttingDown => Blame::Pipeline,
        }
    }
}

/// The route settings a session runs under.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Stages on the route, the entry included.
    pub stages: usize,
    /// Positions per prefill frame.
    pub prefill_chunk: usize,
    /// Wire precision downstream.
    pub precision: Precision,
    /// The model's context window.
    pub context: usize,
    /// Longest the session may run.
    pub deadline: Duration,
    /// Re-routes before the session fails.
    pub max_reroutes: usize,
}

/// What the driver observes when it asks for the next action.
#[derive(Debug, Clone, Copy)]
pub struct Env {
    /// Now.
    pub now: Instant,
    /// The client's receiver is gone.
    pub client_gone: bool,
    /// The drafter is still preparing (plain rounds meanwhile).
    pub drafter_preparing: bool,
}

/// What the session waits for.
#[derive(Debug)]
enum Expect {
    /// Nothing: the next round starts on the next poll.
    Round,
    /// The drafter's proposal of up to `k` tokens.
    Draft { k: usize },
    /// The verdict on the round whose frames are `first..=seq`.
    Verdict { first: u64, seq: u64, draft: Draft, drafting: Duration, sent: Instant },
    /// A new route.
    Route,
    /// Nothing more: finished or failed.
    Done,
}

/// The session's speculation state (the drafter itself is the driver's).
#[derive(Debug)]
pub struct SpecState {
    /// Chooses k per round.
    pub k: AdaptiveK,
    /// The counts reported with the generation.
    pub stats: SpecStats,
}

/// One session's decoding, without I/O.
#[derive(Debug)]
pub struct SessionCore<'e> {
    cfg: SessionConfig,
    id: SessionId,
    seq: u64,
    route: Vec<u8>,
    history: Vec<u32>,
    prompt_len: usize,
    params: SamplingParams,
    sampler: Sampler,
    stop_ids: &'e [u32],
    stream: Option<TextStream<'e>>,
    max_tokens: usize,
    generated: usize,
    spec: Option<SpecState>,
    counters: &'e SpecCounters,
    /// First position the next round sends, and whether it rebuilds a route.
    pending: (usize, bool),
    prompt_round: bool,
    reroutes: usize,
    started: Instant,
    state: Expect,
    out: VecDeque<Action>,
}

/// What a session starts from.
#[derive(Debug)]
pub struct SessionStart {
    /// Session id (random).
    pub id: SessionId,
    /// Replica per stage after the entry.
    pub route: Vec<u8>,
    /// The prompt.
    pub prompt_ids: Vec<u32>,
    /// Sampling parameters.
    pub params: SamplingParams,
    /// The sampler (its random stream).
    pub sampler: Sampler,
    /// Most new tokens.
    pub max_tokens: usize,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Speculation, when on.
    pub spec: Option<SpecState>,
}

impl<'e> SessionCore<'e> {
    /// A session about to send its prompt.
    pub fn new(
        cfg: SessionConfig,
        start: SessionStart,
        tokenizer: &'e Tokenizer,
        counters: &'e SpecCounters,
        now: Instant,
    ) -> Self {
        Self {
            cfg,
            id: start.id,
            seq: 0,
            route: start.route,
            prompt_len: start.prompt_ids.len(),
            history: start.prompt_ids,
            params: start.params,
            sampler: start.sampler,
            stop_ids: tokenizer.stop_ids(),
            stream: Some(TextStream::new(tokenizer, start.stop)),
            max_tokens: start.max_tokens,
            generated: 0,
            spec: start.spec,
            counters,
            pending: (0, false),
            prompt_round: true,
            reroutes: 0,
            started: now,
            state: Expect::Round,
            out: VecDeque::new(),
        }
    }

    /// The committed ids: the prompt, then every generated token.
    pub fn history(&self) -> &[u32] {
        &self.history
    }

    /// Replica per stage the session runs on.
    pub fn route(&self) -> &[u8] {
        &self.route
    }

    /// Whether the session waits for a pipeline event (a verdict).
    pub fn awaits_event(&self) -> bool {
        self.out.is_empty() && matches!(self.state, Expect::Verdict { .. })
    }

    /// The next action, or `None` when the session waits for an input: a
    /// draft, a pipeline event ([`awaits_event`](Self::awaits_event)), a
    /// route, or nothing more (after `Finish`/`Fail`).
    pub fn poll(&mut self, env: Env) -> Option<Action> {
        if self.out.is_empty() && matches!(self.state, Expect::Round) {
            self.start_round(env);
        }
        self.out.pop_front()
    }

    fn start_round(&mut self, env: Env) {
        if env.client_gone {
            return self.fail(SessionError::ClientGone);
        }
        if env.now.saturating_duration_since(self.started) > self.cfg.deadline {
            return self.fail(SessionError::Deadline(self.cfg.deadline.as_secs()));
        }
        let (from, rebuild) = self.pending;
        if let Some(sp) = self.spec.as_mut() {
            if self.prompt_round && !rebuild {
                // A draft model prefills while the target does.
                self.out.push_back(Action::Prepare(self.history.clone()));
            } else if env.drafter_preparing {
                // Still prefilling: plain rounds meanwhile, rather than waiting.
            } else if !rebuild {
                let room = self.cfg.context.saturating_sub(self.history.len() + 1);
                let limit = self.max_tokens.saturating_sub(self.generated + 1).min(room);
                let k = sp.k.next_k(limit);
                if k > 0 {
                    self.state = Expect::Draft { k };
                    self.out.push_back(Action::Draft { k });
                    return;
                }
            }
        }
        self.send_round(from, rebuild, Draft::default(), Duration::ZERO, env.now);
    }

    /// The drafter's proposal (answers [`Action::Draft`]), the time drafting
    /// took, and now; ignored in any other state.
    pub fn drafted(&mut self, mut draft: Draft, drafting: Duration, now: Instant) {
        let Expect::Draft { k } = self.state else { return };
        draft.tokens.truncate(k);
        draft.q.truncate(k);
        let from = self.pending.0;
        self.send_round(from, false, draft, drafting, now);
    }

    /// Sends positions `[from, history)` in prefill-sized chunks, then the
    /// drafts after them; the last chunk wants a verdict (for every position
    /// when there are drafts, which travel in one frame with the last
    /// committed token).
    fn send_round(&mut self, from: usize, rebuild: bool, draft: Draft, drafting: Duration, now: Instant) {
        // After a round that verified drafts the shards hold positions past
        // the committed ones: every round of a speculating session rolls
        // back to what it sends from.
        let truncate_to = if rebuild || self.spec.is_some() { Some(from) } else { None };
        let first = self.seq + 1;
        let end = self.history.len();
        let chunk = self.cfg.prefill_chunk.max(1);
        let mut start = from;
        while start < end {
            let stop = (start + chunk).min(end);
            let last = stop == end;
            self.seq += 1;
            let mut tokens = self.history[start..stop].to_vec();
            if last {
                tokens.extend_from_slice(&draft.tokens);
            }
            let job = Job {
                session: self.id,
                seq: self.seq,
                start,
                truncate_to: if start == from { truncate_to } else { None },
                want: match (last, draft.tokens.is_empty()) {
                    (false, _) => Want::Nothing,
                    (true, true) => Want::Last,
                    (true, false) => Want::All,
                },
                route: self.route.clone(),
                kv_lens: Vec::new(),
                sampling: last.then(|| self.sampling_spec()),
                precision: self.cfg.precision,
                input: Input::Tokens(tokens),
            };
            self.out.push_back(Action::Send(job));
            start = stop;
        }
        self.state = Expect::Verdict { first, seq: self.seq, draft, drafting, sent: now };
    }

    fn sampling_spec(&self) -> SamplingSpec {
        let p = &self.params;
        let window = p.repetition_window;
        SamplingSpec {
            temperature: p.temperature,
            top_k: p.top_k as u32,
            top_p: p.top_p,
            min_p: p.min_p,
            repetition_penalty: p.repetition_penalty,
            history: if p.repetition_penalty == 1.0 {
                Vec::new()
            } else {
                self.history[self.history.len().saturating_sub(window)..].to_vec()
            },
        }
    }

    /// An event from the pipeline; only a session awaiting a verdict acts on
    /// one (the driver reads events only then).
    pub fn handle(&mut self, event: SessionEvent, now: Instant) {
        let Expect::Verdict { first, seq, .. } = self.state else { return };
        match event {
            SessionEvent::Verdict(v) if v.seq == seq => self.on_verdict(v, now),
            SessionEvent::Verdict(_) => {}
            // Any chunk of this round failing fails the round; older rounds' errors are stale.
            SessionEvent::Error(e) if !(first..=seq).contains(&e.seq) => {}
            SessionEvent::Error(e) if e.code == ErrorCode::Unavailable => self.reroute(),
            SessionEvent::Error(e) => self.fail(SessionError::Shard { code: e.code, message: e.message }),
            SessionEvent::Down { stage, replica } if self.route.get(stage.wrapping_sub(1)) == Some(&replica) => {
                self.reroute()
            }
            SessionEvent::Down { .. } => {}
            // A round that never answers (a frame lost with a link) is re-routed too.
            SessionEvent::Timeout => self.reroute(),
        }
    }

    /// A shard on the route died: new route, rebuild from what is committed.
    fn reroute(&mut self) {
        self.reroutes += 1;
        if self.reroutes > self.cfg.max_reroutes {
            return self.fail(SessionError::TooManyReroutes);
        }
        self.state = Expect::Route;
        self.out.push_back(Action::Reroute);
    }

    /// The new route (answers [`Action::Reroute`]); its KV is rebuilt from
    /// the prompt and the committed tokens next round.
    pub fn rerouted(&mut self, route: Vec<u8>) {
        if !matches!(self.state, Expect::Route) {
            return;
        }
        self.route = route;
        self.pending = (0, true);
        self.state = Expect::Round;
    }

    fn on_verdict(&mut self, v: Verdict, now: Instant) {
        let Expect::Verdict { draft, drafting, sent, .. } = std::mem::replace(&mut self.state, Expect::Round) else {
            return;
        };
        let round = now.saturating_duration_since(sent);
        let rebuild = self.pending.1;
        // Every stage must hold exactly the positions just sent on top of
        // the committed ones: rejected drafts were rolled back.
        let expected = (self.history.len() + draft.tokens.len()) as u32;
        if let Err(e) = check_kv_lens(&v.kv_lens, self.cfg.stages, expected) {
            return self.fail(e);
        }
        let greedy = self.params.temperature == 0.0;
        let tokens = if draft.tokens.is_empty() {
            let Some(p) = v.positions.first() else {
                return self.fail(SessionError::ShortVerdict { got: 0, want: 1 });
            };
            vec![self.sampler.draw(p)]
        } else {
            // The final frame carried the last committed token and the drafts.
            let n = draft.tokens.len() + 1;
            if v.positions.len() < n {
                return self.fail(SessionError::ShortVerdict { got: v.positions.len(), want: n });
            }
            verify_round(&draft, &v.positions[v.positions.len() - n..], greedy, &mut self.sampler).tokens
        };
        let decode_round = !self.prompt_round && !rebuild;
        let c = self.counters;
        if let Some(sp) = self.spec.as_mut() {
            sp.stats.kv_checked += 1;
            if decode_round {
                let accepted = tokens.len() - 1;
                let k = draft.tokens.len();
                sp.k.observe(k, accepted, round, drafting);
                sp.stats.rounds += 1;
                sp.stats.spec_rounds += u64::from(k > 0);
                sp.stats.drafted += k as u64;
                sp.stats.accepted += accepted as u64;
                sp.stats.draft_micros += drafting.as_micros() as u64;
                sp.stats.round_micros += round.as_micros() as u64;
                if sp.stats.rounds_by_k.len() <= k {
                    sp.stats.rounds_by_k.resize(k + 1, 0);
                }
                sp.stats.rounds_by_k[k] += 1;
                c.rounds.fetch_add(1, Ordering::Relaxed);
                c.spec_rounds.fetch_add(u64::from(k > 0), Ordering::Relaxed);
                c.drafted.fetch_add(k as u64, Ordering::Relaxed);
                c.accepted.fetch_add(accepted as u64, Ordering::Relaxed);
                c.committed.fetch_add(tokens.len() as u64, Ordering::Relaxed);
            }
        } else if decode_round {
            c.rounds.fetch_add(1, Ordering::Relaxed);
            c.committed.fetch_add(1, Ordering::Relaxed);
        }
        self.prompt_round = false;
        for next in tokens {
            if self.stop_ids.contains(&next) {
                return self.finish(false);
            }
            self.history.push(next);
            self.generated += 1;
            let Some(stream) = self.stream.as_mut() else { return };
            let step = match stream.push(next) {
                Ok(step) => step,
                Err(e) => return self.fail(SessionError::Text(e.to_string())),
            };
            if !step.piece.is_empty() {
                self.out.push_back(Action::Emit(step.piece));
            }
            if step.stopped {
                return self.finish(true);
            }
            if self.generated >= self.max_tokens {
                return self.finish(false);
            }
        }
        self.pending = (self.history.len() - 1, false);
    }

    fn finish(&mut self, stopped: bool) {
        self.state = Expect::Done;
        let Some(stream) = self.stream.take() else { return };
        match stream.finish(stopped) {
            Err(e) => self.out.push_back(Action::Fail(SessionError::Text(e.to_string()))),
            Ok((rest, ids, text)) => {
                if !rest.is_empty() {
                    self.out.push_back(Action::Emit(rest));
                }
                let speculation = self.spec.as_ref().map(|sp| sp.stats.clone());
                let prompt_ids = self.history[..self.prompt_len].to_vec();
                self.out.push_back(Action::Finish(Generation { prompt_ids, ids, text, speculation }));
            }
        }
    }

    fn fail(&mut self, e: SessionError) {
        self.state = Expect::Done;
        self.out.push_back(Action::Fail(e));
    }
}

/// After a round every stage (the entry first) must hold exactly `expected`
/// positions of the session: the committed ones plus those just verified, so
/// drafts a previous round rejected were rolled back everywhere.
fn check_kv_lens(kv_lens: &[u32], stages: usize, expected: u32) -> Result<(), SessionError> {
    if kv_lens.len() != stages || kv_lens.iter().any(|&l| l != expected) {
        return Err(SessionError::KvLengths { got: kv_lens.to_vec(), expected });
    }
    Ok(())
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
