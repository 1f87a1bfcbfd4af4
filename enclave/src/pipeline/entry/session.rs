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
//!
//! Pipelined speculation: while rounds are in flight the session may ask
//! for another draft (`Draft`) on top of every draft in flight and send it
//! as a continuation round (its frame starts where the last round in flight
//! ends, with no rollback). The drafts of all rounds in flight form one
//! chain: each round's last distribution checks the next round's first
//! draft. Verdicts are taken oldest first; one that rejects a draft commits
//! the correction and cancels every later round (`Cancel`: the entry's
//! worker and every shard drop those frames unrun), and the next round
//! rolls every stage back to the committed positions. How many rounds go
//! in flight is [`crate::speculate::pipeline::Depth`]'s decision.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::metrics::SpecCounters;
pub use super::session_error::SessionError;
use crate::generate::{Generation, TextStream, TokenLogprob};
use crate::link::frame::{ErrorCode, ErrorReport, Precision, SamplingSpec, SessionId, Verdict, Want, NO_SHADOW};
use crate::pipeline::worker::{Input, Job};
use crate::speculate::pipeline::{Depth, InFlight};
use crate::speculate::{verify_drafts, AdaptiveK, Draft, SpecStats};
use crate::text::sampler::{Sampler, SamplingParams, PENALTY_WINDOW};
use crate::text::tokenizer::Tokenizer;
use crate::text::tools::CallMarkers;

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
    /// Draft up to `k` tokens after [`SessionCore::draft_context`]; answer
    /// with [`SessionCore::drafted`].
    Draft {
        /// Most tokens to propose.
        k: usize,
    },
    /// Hand this job to the entry's stage worker.
    Send(Job),
    /// Tell the entry's stage worker and every shard on the route to drop
    /// this session's frames up to `through` that they have not run.
    Cancel {
        /// Last sequence number cancelled.
        through: u64,
    },
    /// Send this text to the client.
    Emit(String),
    /// Log-probabilities of tokens just committed (their text follows in
    /// later [`Emit`](Self::Emit)s, possibly held back by a stop string).
    Logprobs(Vec<TokenLogprob>),
    /// Release the current route and choose another; answer with
    /// [`SessionCore::rerouted`].
    Reroute,
    /// The session is complete.
    Finish(Generation),
    /// The session failed.
    Fail(SessionError),
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
    /// Verdicts on the rounds in flight; with none in flight the next round
    /// starts on the next poll.
    Active,
    /// The drafter's proposal of up to `k` tokens: for the next round, or
    /// (`more`) for a round on top of those in flight.
    Draft { k: usize, more: bool },
    /// A new route.
    Route,
    /// Nothing more: finished or failed.
    Done,
}

/// A round in flight: frames `first..=seq`.
#[derive(Debug)]
struct Round {
    first: u64,
    seq: u64,
    /// The drafts this round's frame adds to the chain.
    draft: Draft,
    /// The frame starts with the last committed token (a round sent with
    /// nothing in flight); otherwise it is a continuation whose first draft
    /// the previous round's last distribution checks.
    base: bool,
    /// A continuation's first draft was checked and kept.
    head_kept: bool,
    /// A decode round (not the prompt, not a rebuild).
    decode: bool,
    /// Positions every stage holds after it.
    kv_end: u32,
    drafting: Duration,
    sent: Instant,
    /// Its verdict, once arrived (verdicts are taken oldest first).
    verdict: Option<Verdict>,
    /// The frames before its last that score the prompt (`echo`).
    scoring: Vec<Scoring>,
}

impl Round {
    /// Drafts not yet checked.
    fn unverified(&self) -> &[u32] {
        &self.draft.tokens[usize::from(self.head_kept)..]
    }

    /// Every verdict the round waits for is here.
    fn answered(&self) -> bool {
        self.verdict.is_some() && self.scoring.iter().all(|s| s.rows.is_some())
    }
}

/// A frame of a prompt round that scores the prompt: positions
/// `start..start + len`, each returning the log-probability of the prompt's
/// next token.
#[derive(Debug)]
struct Scoring {
    seq: u64,
    start: usize,
    len: usize,
    /// Its verdict's log-probabilities, once arrived.
    rows: Option<Vec<Vec<(u32, f32)>>>,
}

/// The session's speculation state (the drafter itself is the driver's).
#[derive(Debug)]
pub struct SpecState {
    /// Chooses k per round.
    pub k: AdaptiveK,
    /// Chooses how many rounds go in flight.
    pub depth: Depth,
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
    /// Per stage after the entry, the warm replica shadowing this session's
    /// KV ([`NO_SHADOW`]: none).
    shadow: Vec<u8>,
    /// The next round rolls every stage back to the committed positions (a
    /// round was lost with a shard; the route kept its KV).
    rollback: bool,
    /// A warm resend (the same replicas, or shadows) has not been answered
    /// yet: if a stage turns out not to hold the session (a shadow whose
    /// copy was refused, a replica that dropped a cancelled frame unrun),
    /// rebuild rather than fail.
    warm: bool,
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
    /// When the last token was committed (`None` before the first).
    last_commit: Option<Instant>,
    state: Expect,
    inflight: VecDeque<Round>,
    /// The drafter proposed nothing on top of the rounds in flight: ask
    /// again only after the next verdict.
    dry: bool,
    /// Per committed token, when the request asked for log-probabilities.
    logprobs: Vec<TokenLogprob>,
    /// Score the prompt: the log-probability of each prompt token after the
    /// first, given those before it (`echo` with `logprobs`).
    score_prompt: bool,
    /// The prompt's scores, once its round is verified.
    prompt_logprobs: Option<Vec<TokenLogprob>>,
    out: VecDeque<Action>,
}

/// What a session starts from.
#[derive(Debug)]
pub struct SessionStart {
    /// Session id (random).
    pub id: SessionId,
    /// Replica per stage after the entry.
    pub route: Vec<u8>,
    /// Shadow replica per stage after the entry ([`NO_SHADOW`]: none);
    /// empty for no shadows.
    pub shadow: Vec<u8>,
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
    /// Where tool calls begin ([`PipelineRequest::calls`](super::PipelineRequest)).
    pub calls: Option<CallMarkers>,
    /// Speculation, when on.
    pub spec: Option<SpecState>,
    /// Score the prompt ([`Generation::prompt_logprobs`]); with
    /// `max_tokens` 0 nothing is generated.
    pub score_prompt: bool,
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
            shadow: if start.shadow.len() == start.route.len() {
                start.shadow
            } else {
                vec![NO_SHADOW; start.route.len()]
            },
            route: start.route,
            rollback: false,
            warm: false,
            prompt_len: start.prompt_ids.len(),
            history: start.prompt_ids,
            params: start.params,
            sampler: start.sampler,
            stop_ids: tokenizer.stop_ids(),
            stream: Some(TextStream::new(tokenizer, start.stop).with_calls(start.calls)),
            max_tokens: start.max_tokens,
            generated: 0,
            spec: start.spec,
            counters,
            pending: (0, false),
            prompt_round: true,
            reroutes: 0,
            started: now,
            last_commit: None,
            state: Expect::Active,
            inflight: VecDeque::new(),
            dry: false,
            logprobs: Vec::new(),
            score_prompt: start.score_prompt,
            prompt_logprobs: None,
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

    /// Shadow replica per stage ([`NO_SHADOW`]: none).
    pub fn shadow(&self) -> &[u8] {
        &self.shadow
    }

    /// What the next draft continues: the committed ids, then every draft
    /// in flight not yet checked.
    pub fn draft_context(&self) -> Vec<u32> {
        let mut ctx = self.history.clone();
        self.inflight.iter().for_each(|r| ctx.extend_from_slice(r.unverified()));
        ctx
    }

    /// Whether the session waits for a pipeline event (a verdict).
    pub fn awaits_event(&self) -> bool {
        self.out.is_empty() && !self.inflight.is_empty() && matches!(self.state, Expect::Active)
    }

    /// The next action, or `None` when the session waits for an input: a
    /// draft, a pipeline event ([`awaits_event`](Self::awaits_event)), a
    /// route, or nothing more (after `Finish`/`Fail`).
    pub fn poll(&mut self, env: Env) -> Option<Action> {
        if self.out.is_empty() && matches!(self.state, Expect::Active) {
            if self.inflight.is_empty() {
                self.start_round(env);
            } else if let Some(k) = self.another_round(env) {
                self.state = Expect::Draft { k, more: true };
                self.out.push_back(Action::Draft { k });
            }
        }
        self.out.pop_front()
    }

    /// k for another round on top of those in flight, when one should go.
    fn another_round(&mut self, env: Env) -> Option<usize> {
        if self.dry || env.client_gone || env.drafter_preparing || !self.inflight.iter().all(|r| r.decode) {
            return None;
        }
        let front = self.inflight.front()?;
        let unverified: usize = self.inflight.iter().map(|r| r.unverified().len()).sum();
        let sp = self.spec.as_mut()?;
        // Committed at most: history, the drafts in flight, this round's, one more.
        let pending = self.history.len() + unverified;
        let room = self.cfg.context.saturating_sub(pending + 1);
        let limit = self.max_tokens.saturating_sub(self.generated + unverified + 1).min(room);
        let k = sp.k.best_k(limit);
        let now = InFlight {
            rounds: self.inflight.len(),
            drafts: unverified,
            acceptance: sp.k.acceptance(),
            k,
            oldest_elapsed: env.now.saturating_duration_since(front.sent),
            oldest_expected: sp.k.round_estimate(front.draft.tokens.len()),
            next_draft: sp.k.draft_estimate(k.max(1)),
        };
        (k > 0 && sp.depth.another(now)).then_some(k)
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
                    self.state = Expect::Draft { k, more: false };
                    self.out.push_back(Action::Draft { k });
                    return;
                }
            }
        }
        self.send_round(from, rebuild, Draft::default(), Duration::ZERO, env.now);
    }

    /// The drafter's proposal (answers [`Action::Draft`]), the time drafting
    /// took, and now; ignored in any other state (a verdict that arrived
    /// meanwhile voids a draft built on the rounds in flight).
    pub fn drafted(&mut self, mut draft: Draft, drafting: Duration, now: Instant) {
        let Expect::Draft { k, more } = self.state else { return };
        self.state = Expect::Active;
        draft.tokens.truncate(k);
        draft.q.truncate(k);
        if !more {
            let from = self.pending.0;
            return self.send_round(from, false, draft, drafting, now);
        }
        if draft.tokens.is_empty() {
            self.dry = true;
            return;
        }
        let Some(start) = self.inflight.back().map(|r| r.kv_end as usize) else { return };
        self.seq += 1;
        let job = Job {
            session: self.id,
            seq: self.seq,
            start,
            truncate_to: None,
            want: Want::All,
            route: self.route.clone(),
            shadow: self.shadow.clone(),
            mirror: false,
            kv_lens: Vec::new(),
            sampling: Some(Box::new(self.sampling_spec(start, &draft.tokens, Want::All))),
            precision: self.cfg.precision,
            input: Input::Tokens(draft.tokens.clone()),
        };
        self.out.push_back(Action::Send(job));
        let kv_end = (start + draft.tokens.len()) as u32;
        self.inflight.push_back(Round {
            first: self.seq,
            seq: self.seq,
            draft,
            base: false,
            head_kept: false,
            decode: true,
            kv_end,
            drafting,
            sent: now,
            verdict: None,
            scoring: Vec::new(),
        });
        if let Some(sp) = self.spec.as_mut() {
            sp.stats.pipelined_rounds += 1;
            self.counters.pipelined_rounds.fetch_add(1, Ordering::Relaxed);
            sp.stats.max_depth = sp.stats.max_depth.max(self.inflight.len() as u64);
        }
    }

    /// Sends positions `[from, history)` in prefill-sized chunks, then the
    /// drafts after them; the last chunk wants a verdict (for every position
    /// when there are drafts, which travel in one frame with the last
    /// committed token).
    fn send_round(&mut self, from: usize, rebuild: bool, draft: Draft, drafting: Duration, now: Instant) {
        // After a round that verified drafts the shards hold positions past
        // the committed ones: every round of a speculating session rolls
        // back to what it sends from.
        let truncate_to = if rebuild || self.rollback || self.spec.is_some() { Some(from) } else { None };
        self.rollback = false;
        let first = self.seq + 1;
        let end = self.history.len();
        let chunk = self.cfg.prefill_chunk.max(1);
        // A scored prompt's positions but the last go in frames that return
        // each next prompt token's log-probability; the last position, which
        // decides the first new token, goes alone with the request's sampling.
        let scoring = self.score_prompt && self.prompt_round && self.prompt_logprobs.is_none();
        let mut frames: Vec<(usize, usize, bool)> = Vec::new();
        let mut start = from;
        while start < end {
            let stop = (start + chunk).min(end);
            if scoring && stop == end && stop - start > 1 {
                frames.push((start, stop - 1, true));
                frames.push((stop - 1, stop, false));
            } else {
                frames.push((start, stop, scoring && stop < end));
            }
            start = stop;
        }
        let mut scored = Vec::new();
        for (start, stop, scores) in frames {
            let last = stop == end;
            self.seq += 1;
            let mut tokens = self.history[start..stop].to_vec();
            if last {
                tokens.extend_from_slice(&draft.tokens);
            }
            let want = match (last, draft.tokens.is_empty()) {
                _ if scores => Want::All,
                (false, _) => Want::Nothing,
                (true, true) => Want::Last,
                (true, false) => Want::All,
            };
            let sampling = if scores {
                scored.push(Scoring { seq: self.seq, start, len: stop - start, rows: None });
                Some(Box::new(SamplingSpec {
                    logprobs: Some(self.params.logprobs.unwrap_or(0)),
                    scored: self.history[start + 1..=stop].to_vec(),
                    ..SamplingSpec::greedy()
                }))
            } else {
                last.then(|| Box::new(self.sampling_spec(start, &tokens, want)))
            };
            let job = Job {
                session: self.id,
                seq: self.seq,
                start,
                truncate_to: if start == from { truncate_to } else { None },
                want,
                route: self.route.clone(),
                shadow: self.shadow.clone(),
                mirror: false,
                kv_lens: Vec::new(),
                sampling,
                precision: self.cfg.precision,
                input: Input::Tokens(tokens),
            };
            self.out.push_back(Action::Send(job));
        }
        let kv_end = (self.history.len() + draft.tokens.len()) as u32;
        self.inflight.push_back(Round {
            first,
            seq: self.seq,
            draft,
            base: true,
            head_kept: false,
            decode: !self.prompt_round && !rebuild,
            kv_end,
            drafting,
            sent: now,
            verdict: None,
            scoring: scored,
        });
        if let Some(sp) = self.spec.as_mut() {
            sp.stats.max_depth = sp.stats.max_depth.max(1);
        }
    }

    /// The transform for a frame of `frame` tokens from position `start`
    /// that wants `want`.
    fn sampling_spec(&self, start: usize, frame: &[u32], want: Want) -> SamplingSpec {
        let p = &self.params;
        let window = p.repetition_window;
        let penalised = p.presence_penalty != 0.0 || p.frequency_penalty != 0.0;
        // The output through the frame's last position: committed tokens,
        // the drafts of rounds in flight before it, then its own.
        let (output, output_at) = if penalised || p.response_format.is_some() {
            let mut full = self.draft_context();
            full.truncate(start);
            full.extend_from_slice(frame);
            let first = match want {
                Want::All => start + 1,
                _ => start + frame.len(),
            };
            let mut output = full.get(self.prompt_len..).unwrap_or_default().to_vec();
            let mut at = first.saturating_sub(self.prompt_len);
            if p.response_format.is_none() && output.len() > PENALTY_WINDOW {
                // Penalties alone look at the last PENALTY_WINDOW tokens.
                let cut = output.len() - PENALTY_WINDOW;
                output.drain(..cut);
                at = at.saturating_sub(cut);
            }
            (output, at as u32)
        } else {
            (Vec::new(), 0)
        };
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
            presence_penalty: p.presence_penalty,
            frequency_penalty: p.frequency_penalty,
            output,
            output_at,
            logit_bias: p.logit_bias.clone(),
            logprobs: p.logprobs,
            scored: Vec::new(),
            response_format: p.response_format.as_ref().map(|f| f.to_wire()),
        }
    }

    /// An event from the pipeline; only a session with rounds in flight
    /// acts on one (the driver reads events only then).
    pub fn handle(&mut self, event: SessionEvent, now: Instant) {
        if self.inflight.is_empty() || matches!(self.state, Expect::Route | Expect::Done) {
            return;
        }
        match event {
            SessionEvent::Verdict(v) => {
                let scoring = self.inflight.iter_mut().flat_map(|r| r.scoring.iter_mut()).find(|s| s.seq == v.seq);
                if let Some(s) = scoring {
                    s.rows = Some(v.logprobs);
                    return self.take_verdicts(now);
                }
                let Some(round) = self.inflight.iter_mut().find(|r| r.seq == v.seq) else { return };
                round.verdict = Some(v);
                if matches!(self.state, Expect::Draft { more: true, .. }) {
                    // The draft asked for builds on rounds this verdict may settle.
                    self.state = Expect::Active;
                }
                self.take_verdicts(now);
            }
            // Any chunk of a round in flight failing fails it; errors about
            // finished or cancelled rounds are stale.
            SessionEvent::Error(e) if !self.inflight.iter().any(|r| (r.first..=r.seq).contains(&e.seq)) => {}
            SessionEvent::Error(e) if e.code == ErrorCode::Unavailable => self.reroute(),
            // A shadow taken over that does not hold the session after all
            // (its copy was refused, or lost): rebuild on the same route.
            SessionEvent::Error(e) if self.warm && e.code == ErrorCode::Invalid => self.rebuild(),
            SessionEvent::Error(e) => self.fail(SessionError::Shard { code: e.code, message: e.message }),
            SessionEvent::Down { stage, replica } if self.route.get(stage.wrapping_sub(1)) == Some(&replica) => {
                self.reroute()
            }
            SessionEvent::Down { stage, replica } => {
                // A lost shadow shadows nothing: stop copying to it.
                if let Some(s) = self.shadow.get_mut(stage.wrapping_sub(1)).filter(|s| **s == replica) {
                    *s = NO_SHADOW;
                }
            }
            // A round that never answers (a frame lost with a link) is re-routed too.
            SessionEvent::Timeout => self.reroute(),
        }
    }

    /// A shard on the route died: new route, rebuild from what is committed.
    fn reroute(&mut self) {
        // The entry's worker may still hold frames of the rounds in flight.
        self.cancel_in_flight(false);
        self.reroutes += 1;
        if self.reroutes > self.cfg.max_reroutes {
            return self.fail(SessionError::TooManyReroutes);
        }
        self.state = Expect::Route;
        self.out.push_back(Action::Reroute);
    }

    /// Drops every round in flight and asks for their frames to be cancelled;
    /// `rejected`: because a verdict rejected a draft they build on (counted).
    fn cancel_in_flight(&mut self, rejected: bool) {
        if self.inflight.is_empty() {
            return;
        }
        let n = self.inflight.len() as u64;
        self.inflight.clear();
        if rejected {
            if let Some(sp) = self.spec.as_mut() {
                sp.stats.cancelled_rounds += n;
            }
            self.counters.cancelled_rounds.fetch_add(n, Ordering::Relaxed);
        }
        self.out.push_back(Action::Cancel { through: self.seq });
    }

    /// The new route (answers [`Action::Reroute`]); its KV is rebuilt from
    /// the prompt and the committed tokens next round.
    pub fn rerouted(&mut self, route: Vec<u8>) {
        if !matches!(self.state, Expect::Route) {
            return;
        }
        self.shadow = vec![NO_SHADOW; route.len()];
        self.route = route;
        self.pending = (0, true);
        self.state = Expect::Active;
    }

    /// The new route when every stage kept its replica or moved to its
    /// shadow (answers [`Action::Reroute`]): every stage already holds the
    /// committed positions, so the next round only rolls back to them and
    /// continues, with no re-prefill. Other stages keep their shadows.
    pub fn rerouted_warm(&mut self, route: Vec<u8>) {
        if !matches!(self.state, Expect::Route) || route.len() != self.route.len() {
            return;
        }
        if self.prompt_round {
            // The lost round was the prompt's: no stage is known to hold any
            // of it (its frames may have been cancelled unrun).
            return self.rerouted(route);
        }
        self.warm = true;
        for (i, &r) in route.iter().enumerate() {
            if r != self.route[i] {
                self.shadow[i] = NO_SHADOW;
            }
        }
        self.route = route;
        self.pending = (self.history.len() - 1, false);
        self.rollback = true;
        self.state = Expect::Active;
    }

    /// Rebuilds the session's KV on the same route, from the prompt.
    fn rebuild(&mut self) {
        self.cancel_in_flight(false);
        self.warm = false;
        self.shadow = vec![NO_SHADOW; self.route.len()];
        self.pending = (0, true);
        self.state = Expect::Active;
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
                let logprobs = self.params.logprobs.map(|_| {
                    let mut lp = std::mem::take(&mut self.logprobs);
                    lp.truncate(ids.len());
                    lp
                });
                let prompt_logprobs = self.prompt_logprobs.take();
                self.out.push_back(Action::Finish(Generation {
                    prompt_ids,
                    ids,
                    text,
                    speculation,
                    logprobs,
                    prompt_logprobs,
                }));
            }
        }
    }

    fn fail(&mut self, e: SessionError) {
        self.state = Expect::Done;
        self.out.push_back(Action::Fail(e));
    }
}

#[path = "session_verdict.rs"]
mod verdict;
#[cfg(test)]
use verdict::check_kv_lens;

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
