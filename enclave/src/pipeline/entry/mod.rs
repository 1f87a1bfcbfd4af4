//! The entry: stage 0 of the route. Holds the embedding, the first layers,
//! the tokenizer and the sampler; verifies every shard on the route over
//! control links (heartbeats, verdicts, end-session) and keeps their
//! verified evidence; drives each session through the pipeline and re-routes
//! it to a replica when a shard dies, rebuilding the new route's KV from the
//! prompt and the committed tokens so the stream continues unchanged.
//!
//! Clients reach it through the sealed gateway (`gateway::server`); for
//! development and tests it also serves an internal newline-delimited JSON
//! endpoint bound to loopback only (see [`GenerateWire`]), which
//! `veil-shard generate --entry ADDR` speaks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Mutex};
use veil_attestation::EvidenceBundle;

use super::net::{Downstream, ForwardError, PeerInRole, Trust};
use super::route::{DrafterKind, Route};
use super::sessions::{random_id, SessionTable};
use super::worker::{Command, Output, StageWorker, WorkerCounters};
use crate::generate::{check_request, GenerateRequest, Generation};
use crate::link::frame::{Cancel, ErrorCode, ErrorReport, Frame, SessionId, NO_SHADOW};
use crate::model::LayerSlice;
use crate::speculate::model::DraftModel;
use crate::speculate::pipeline::{Depth, MAX_DEPTH};
use crate::speculate::{AdaptiveK, DraftMode, DrafterSpec, SpecStats, MAX_K};
use crate::text::sampler::{Sampler, SamplingParams};
use crate::text::tokenizer::Tokenizer;
use crate::text::tools::CallMarkers;

mod admit_error;
mod control;
pub mod format_jobs;
mod loopback;
mod metrics;
pub mod session;
mod session_error;
mod speculation;

use admit_error::{AdmitError, SpeculationError};
use control::Replica;
pub use loopback::{serve_generate, Failure, GenerateEvent, GenerateWire, SpeculationRequest, MAX_REQUEST_BYTES};
pub use metrics::SpecCounters;
use session::{Action, Env, SessionConfig, SessionCore, SessionError, SessionEvent, SessionStart, SpecState};
use speculation::Drafting;

/// What a caller asks of the pipeline: the one typed request at the
/// gateway→pipeline boundary (the OpenAI gateway builds it from a sealed
/// request; the loopback endpoint from a [`GenerateWire`]). The prompt is
/// already ids; everything else is checked by the entry before any
/// pipeline work ([`GenerateEvent::Refused`] when it is the caller's fault).
#[derive(Clone, Debug, PartialEq)]
pub struct PipelineRequest {
    /// Prompt token ids.
    pub prompt_ids: Vec<u32>,
    /// Most new tokens.
    pub max_tokens: usize,
    /// Sampling.
    pub sampling: SamplingParams,
    /// Strings that end generation (not included in the text).
    pub stop: Vec<String>,
    /// Speculative decoding for this request.
    pub speculation: SpeculationRequest,
    /// Where tool calls begin, when the request offered tools: the text
    /// streams up to a call, with special tokens written out.
    pub calls: Option<CallMarkers>,
    /// Score the prompt: [`Generation::prompt_logprobs`], with
    /// `sampling.logprobs` alternatives; with `max_tokens` 0 nothing is
    /// generated.
    pub score_prompt: bool,
}

/// How long a session waits for a stage to have a live replica.
pub const REROUTE_WAIT: Duration = Duration::from_secs(3);
/// Pause before resending a lost round on an unchanged route.
pub const WARM_RETRY_PAUSE: Duration = Duration::from_millis(200);
/// Re-routes one session may take before it fails.
pub const MAX_REROUTES: usize = 8;
/// Events queued for one session (verdicts, errors, link losses); a peer
/// that fills the queue is dropped for flooding.
pub const SESSION_EVENTS: usize = 256;
/// Longest a session may run, all rounds together (a per-request deadline).
pub const SESSION_DEADLINE: Duration = Duration::from_secs(600);

/// A shard on the route whose evidence the entry verified.
#[derive(Debug, Clone)]
pub struct ShardEvidence {
    /// Stage index (1 = after the entry).
    pub stage: usize,
    /// Replica index within the stage.
    pub replica: usize,
    /// Layers served.
    pub layers: veil_attestation::LayerRange,
    /// What the entry verified: the peer, in its role on this route.
    pub peer: PeerInRole,
    /// The bundle as the shard presented it, for clients to verify themselves.
    pub bundle: EvidenceBundle,
}

/// The entry's shared state.
#[derive(Debug)]
pub struct Entry {
    route: Route,
    tokenizer: Arc<Tokenizer>,
    context: usize,
    trust: Arc<Trust>,
    worker: mpsc::Sender<Command>,
    sessions: Mutex<SessionTable<mpsc::Sender<SessionEvent>>>,
    /// Per stage after the entry, per replica.
    replicas: Mutex<Vec<Vec<Replica>>>,
    draft_model: Option<Arc<DraftModel>>,
    counters: SpecCounters,
    stage_counters: Arc<WorkerCounters>,
    /// Response formats are vetted here, in budgeted jobs, before a session starts.
    formats: format_jobs::FormatJobs,
}

impl Entry {
    /// Starts the entry: worker thread, output dispatch, control links to
    /// every shard. Returns once they are started (links come up on their own).
    pub fn start(
        route: Route,
        slice: Arc<LayerSlice>,
        tokenizer: Arc<Tokenizer>,
        trust: Arc<Trust>,
        draft_model: Option<Arc<DraftModel>>,
        format_worker: format_jobs::FormatWorker,
    ) -> Arc<Self> {
        let (cmd_tx, cmd_rx) = mpsc::channel::<Command>(1024);
        let (out_tx, mut out_rx) = mpsc::channel::<Output>(1024);
        // Response formats are compiled at admission with the vocabulary's
        // grammar engine (built on first use), and enforced by the last
        // stage: this one on a route of one stage.
        let worker = StageWorker::new(slice.clone(), 0, route.kv_budget_bytes).with_vocabulary(tokenizer.clone());
        let stage_counters = worker.counters();
        std::thread::Builder::new()
            .name("stage-0".into())
            .stack_size(format_jobs::STAGE_STACK_BYTES)
            .spawn(move || worker.run(cmd_rx, out_tx))
            .map_err(|e| tracing::error!(error = %e, "cannot start the entry worker"))
            .ok();
        let replicas =
            route.stages[1..].iter().map(|s| s.replicas.iter().map(|_| Replica::default()).collect()).collect();
        let vocabulary = tokenizer.vocabulary();
        let engine = tokenizer.clone();
        let formats =
            format_jobs::FormatJobs::new(format_worker, format_jobs::FormatBudget::default(), &vocabulary, move || {
                engine.grammars()
            });
        let entry = Arc::new(Self {
            formats,
            context: slice.config().context_length,
            route: route.clone(),
            tokenizer,
            trust: trust.clone(),
            worker: cmd_tx,
            sessions: Mutex::new(SessionTable::new(route.stages.len() - 1)),
            replicas: Mutex::new(replicas),
            draft_model,
            counters: SpecCounters::default(),
            stage_counters,
        });
        let downstream = route.stages.get(1).map(|s| Downstream::new(trust, s.clone()));
        let e = entry.clone();
        tokio::spawn(async move {
            while let Some(out) = out_rx.recv().await {
                match out {
                    Output::Downstream { replica, frame } => {
                        let (session, seq, mirror) = (frame.session, frame.seq, frame.mirror);
                        let sent = match &downstream {
                            Some(d) => d.send(replica, Frame::Forward(frame)).await,
                            None => Err(ForwardError::NoNextStage),
                        };
                        match sent {
                            // A shadow out of reach shadows nothing; the session goes on.
                            Err(e) if mirror => tracing::debug!(%session, error = %e, "cannot reach a shadow replica"),
                            Err(failed) => {
                                let message = failed.to_string();
                                let err =
                                    ErrorReport { session: Some(session), seq, code: ErrorCode::Unavailable, message };
                                e.dispatch(session, SessionEvent::Error(err)).await;
                            }
                            Ok(()) => {}
                        }
                    }
                    Output::Verdict(v) => e.dispatch(v.session, SessionEvent::Verdict(v)).await,
                    Output::Error(err) => {
                        if let Some(s) = err.session {
                            e.dispatch(s, SessionEvent::Error(err)).await;
                        }
                    }
                }
            }
        });
        for stage in 1..route.stages.len() {
            for replica in 0..route.stages[stage].replicas.len() {
                tokio::spawn(entry.clone().control_loop(stage, replica as u8));
            }
        }
        entry
    }

    /// Whether every stage has a live, verified replica.
    pub async fn ready(&self) -> bool {
        self.replicas.lock().await.iter().all(|s| s.iter().any(|r| r.control.is_some()))
    }

    /// The verified evidence of every live shard on the route.
    pub async fn verified_shards(&self) -> Vec<ShardEvidence> {
        let reps = self.replicas.lock().await;
        let mut out = Vec::new();
        for (s, stage) in reps.iter().enumerate() {
            for (r, rep) in stage.iter().enumerate() {
                if let (Some(_), Some((peer, bundle))) = (&rep.control, &rep.evidence) {
                    out.push(ShardEvidence {
                        stage: s + 1,
                        replica: r,
                        layers: self.route.stages[s + 1].layers,
                        peer: peer.clone(),
                        bundle: bundle.clone(),
                    });
                }
            }
        }
        out
    }

    /// The route this entry serves.
    pub fn route(&self) -> &Route {
        &self.route
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The context window.
    pub fn context(&self) -> usize {
        self.context
    }

    /// Speculation counts across sessions.
    pub fn counters(&self) -> &SpecCounters {
        &self.counters
    }

    /// What the entry's own stage ran and dropped (counts only).
    pub fn stage_counters(&self) -> &WorkerCounters {
        &self.stage_counters
    }

    /// The session's speculation, from the request and the route.
    fn speculation_for(
        &self,
        req: &PipelineRequest,
        prompt_len: usize,
    ) -> Result<Option<(Drafting, SpecState)>, SpeculationError> {
        let r = &req.speculation;
        let route = &self.route.speculation;
        if r.enabled == Some(false) {
            return Ok(None);
        }
        let model =
            |spec: fn(_) -> DrafterSpec| self.draft_model.clone().map(spec).ok_or(SpeculationError::NoDraftModel);
        let spec = match r.drafter {
            None => match route.drafter {
                DrafterKind::None if r.enabled == Some(true) => DrafterSpec::Ngram,
                DrafterKind::None | DrafterKind::Script => return Ok(None),
                DrafterKind::Ngram => DrafterSpec::Ngram,
                DrafterKind::Model => model(DrafterSpec::Model)?,
                DrafterKind::NgramModel => model(DrafterSpec::NgramModel)?,
            },
            Some(DrafterKind::None) => return Ok(None),
            Some(DrafterKind::Ngram) => DrafterSpec::Ngram,
            Some(DrafterKind::Model) => model(DrafterSpec::Model)?,
            Some(DrafterKind::NgramModel) => model(DrafterSpec::NgramModel)?,
            Some(DrafterKind::Script) => {
                DrafterSpec::Script { prompt_len, tokens: r.script.clone().ok_or(SpeculationError::NoScript)? }
            }
        };
        if r.k.is_some_and(|k| k > MAX_K) {
            return Err(SpeculationError::KTooLarge);
        }
        if r.depth.is_some_and(|d| d == 0 || d > MAX_DEPTH) {
            return Err(SpeculationError::DepthOutOfRange);
        }
        if req.sampling.repetition_penalty != 1.0 {
            // The repetition penalty's window (prompt and output) travels
            // once per frame, without the frame's drafts: plain decoding
            // instead. Presence and frequency penalties read the frame's
            // output, drafts included position by position, so they verify
            // losslessly.
            return Ok(None);
        }
        let Some(drafter) = spec.instantiate() else { return Ok(None) };
        let mode =
            if req.sampling.temperature == 0.0 { DraftMode::Greedy } else { DraftMode::Sample(req.sampling.clone()) };
        let stats = SpecStats { drafter: drafter.name().to_owned(), ..SpecStats::default() };
        let k = AdaptiveK::new(route.k_max, r.k.or(route.k));
        let depth = Depth::new(route.depth_max, r.depth.or(route.depth));
        Ok(Some((Drafting::new(drafter, mode), SpecState { k, depth, stats })))
    }

    /// A route for a new or re-routed session: per stage the live replica
    /// with fewest sessions, waiting briefly for one to come (back) up.
    async fn choose_route(&self) -> Result<Vec<u8>, SessionError> {
        let deadline = Instant::now() + REROUTE_WAIT;
        loop {
            {
                let mut reps = self.replicas.lock().await;
                let mut route = Vec::with_capacity(reps.len());
                let mut missing = None;
                for (s, stage) in reps.iter().enumerate() {
                    match stage.iter().enumerate().filter(|(_, r)| r.control.is_some()).min_by_key(|(_, r)| r.sessions)
                    {
                        Some((i, _)) => route.push(i as u8),
                        None => {
                            missing = Some(s + 1);
                            break;
                        }
                    }
                }
                match missing {
                    None => {
                        for (s, &r) in route.iter().enumerate() {
                            reps[s][usize::from(r)].sessions += 1;
                        }
                        return Ok(route);
                    }
                    Some(s) if Instant::now() >= deadline => {
                        let l = self.route.stages[s].layers;
                        let (first, end) = (l.start(), l.end());
                        return Err(SessionError::NoReplica { stage: s, first, end });
                    }
                    Some(_) => {}
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A session's route as the client may see it: per stage after the
    /// entry, `s{stage}r{replica}:{first 8 bytes of the shard's attested TLS
    /// key hash, hex}`, comma-separated. The key hash names the very
    /// evidence the attestation document listed (its claims carry it).
    pub async fn describe_route(&self, route: &[u8]) -> String {
        let reps = self.replicas.lock().await;
        route
            .iter()
            .enumerate()
            .map(|(i, &r)| {
                let key = reps
                    .get(i)
                    .and_then(|s| s.get(usize::from(r)))
                    .and_then(|rep| rep.evidence.as_ref())
                    .and_then(|(p, _)| p.peer().evidence().claims().and_then(|c| c.tls_key_hash))
                    .map(|k| hex::encode(&k.0[..8]))
                    .unwrap_or_else(|| "unknown".into());
                format!("s{}r{r}:{key}", i + 1)
            })
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Per stage, a live replica other than the route's to shadow a new
    /// session's KV (the one with fewest sessions), or [`NO_SHADOW`].
    async fn choose_shadows(&self, route: &[u8]) -> Vec<u8> {
        let reps = self.replicas.lock().await;
        route
            .iter()
            .enumerate()
            .map(|(s, &serving)| {
                reps[s]
                    .iter()
                    .enumerate()
                    .filter(|(i, r)| *i != usize::from(serving) && r.control.is_some())
                    .min_by_key(|(_, r)| r.sessions)
                    .map_or(NO_SHADOW, |(i, _)| i as u8)
            })
            .collect()
    }

    /// The route after a lost round when every stage's replica is still up
    /// or its shadow is: the session's KV is then already everywhere.
    async fn warm_route(&self, route: &[u8], shadow: &[u8]) -> Option<Vec<u8>> {
        let reps = self.replicas.lock().await;
        let up = |s: usize, r: u8| r != NO_SHADOW && reps[s].get(usize::from(r)).is_some_and(|x| x.control.is_some());
        route
            .iter()
            .enumerate()
            .map(|(s, &r)| if up(s, r) { Some(r) } else { shadow.get(s).copied().filter(|&sh| up(s, sh)) })
            .collect()
    }

    /// Counts a session on every replica of `route` (as `choose_route` does).
    async fn hold(&self, route: &[u8]) {
        let mut reps = self.replicas.lock().await;
        for (s, &r) in route.iter().enumerate() {
            reps[s][usize::from(r)].sessions += 1;
        }
    }

    /// Drops the session's frames up to `through` that the entry's worker,
    /// the shards on `route` and its shadows have not run yet.
    async fn cancel(&self, session: SessionId, route: &[u8], shadow: &[u8], through: u64) {
        let _ = self.worker.send(Command::Cancel { session, through }).await;
        let controls = self.controls(route, shadow).await;
        for c in controls {
            let _ = c.send(Frame::Cancel(Cancel { session, through })).await;
        }
    }

    /// The control links of `route`'s replicas and of the shadows.
    async fn controls(&self, route: &[u8], shadow: &[u8]) -> Vec<mpsc::Sender<Frame>> {
        let reps = self.replicas.lock().await;
        let picked = route.iter().chain(shadow).enumerate().filter(|(_, &r)| r != NO_SHADOW);
        picked.filter_map(|(i, &r)| reps.get(i % route.len().max(1))?.get(usize::from(r))?.control.clone()).collect()
    }

    /// Stops counting the session on `route`; with `end`, also frees its
    /// state on the route's replicas and its shadows (not on a warm
    /// re-route, which keeps that state).
    async fn release(&self, session: SessionId, route: &[u8], shadow: &[u8], end: bool) {
        {
            let mut reps = self.replicas.lock().await;
            for (s, &r) in route.iter().enumerate() {
                let rep = &mut reps[s][usize::from(r)];
                rep.sessions = rep.sessions.saturating_sub(1);
            }
        }
        if end {
            for c in self.controls(route, shadow).await {
                let _ = c.send(Frame::EndSession(session)).await;
            }
        }
    }

    /// Runs one request through the pipeline, sending events to `out`.
    pub async fn generate(self: &Arc<Self>, req: PipelineRequest, out: mpsc::UnboundedSender<GenerateEvent>) {
        self.generate_traced(req, out, None).await
    }

    /// [`generate`](Self::generate), also sending to `routes` each route the
    /// session runs on (the first, then one per re-route) as
    /// [`describe_route`](Self::describe_route) writes it.
    pub async fn generate_traced(
        self: &Arc<Self>,
        req: PipelineRequest,
        out: mpsc::UnboundedSender<GenerateEvent>,
        routes: Option<mpsc::UnboundedSender<String>>,
    ) {
        // The format first: its compile is the one cost the client picks.
        if let Some(format) = &req.sampling.response_format {
            if let Err(e) = self.formats.vet(format).await {
                let blame = match e {
                    format_jobs::FormatRefusal::Busy => veil_wire::Blame::Busy,
                    format_jobs::FormatRefusal::Unavailable(_) => veil_wire::Blame::Internal,
                    _ => veil_wire::Blame::Request,
                };
                let _ = out.send(match blame {
                    veil_wire::Blame::Request => GenerateEvent::Refused(e.to_string()),
                    _ => GenerateEvent::Error(Failure { message: e.to_string(), blame }),
                });
                return;
            }
        }
        let event = match self.admit_request(&req) {
            Err(e) => GenerateEvent::Refused(e.to_string()),
            Ok(admitted) => match self.run_session(req, admitted, &out, routes.as_ref()).await {
                Ok(g) => GenerateEvent::Done(Box::new(g)),
                Err(e) => GenerateEvent::Error(Failure { message: e.to_string(), blame: e.blame() }),
            },
        };
        let _ = out.send(event);
    }

    /// Whether the request's response format (if any) compiles within the
    /// budget ([`format_jobs`]); each choice's session finds the verdict
    /// cached. Dropping the future (the client left) kills the compile.
    pub async fn check_format(&self, sampling: &SamplingParams) -> Result<(), format_jobs::FormatRefusal> {
        match &sampling.response_format {
            Some(format) => self.formats.vet(format).await,
            None => Ok(()),
        }
    }

    /// What format vetting has done (compiles, worker processes).
    pub fn format_counters(&self) -> &format_jobs::FormatCounters {
        self.formats.counters()
    }

    /// Everything about a request that is the caller's to get right, checked
    /// before any pipeline work: its prompt, sampling, length and speculation.
    fn admit_request(&self, req: &PipelineRequest) -> Result<Admitted, AdmitError> {
        if let Some(&id) = req.prompt_ids.iter().find(|&&i| i as usize >= self.tokenizer.vocab_size()) {
            return Err(AdmitError::TokenOutOfVocab { id });
        }
        let sampler = Sampler::new(req.sampling.clone())?;
        let gen =
            GenerateRequest { prompt_ids: req.prompt_ids.clone(), max_tokens: req.max_tokens, stop: req.stop.clone() };
        let max_tokens = check_request(&gen, self.context)?;
        let spec = self.speculation_for(req, req.prompt_ids.len())?;
        // The format itself was vetted (`generate_traced`); the last stage
        // compiles it for the session.
        if req.sampling.response_format.is_some() && max_tokens > crate::link::frame::MAX_HISTORY {
            return Err(AdmitError::FormatTooLong);
        }
        Ok(Admitted { prompt_ids: req.prompt_ids.clone(), sampler, max_tokens, spec })
    }

    /// Drives one session: performs what its [`SessionCore`] asks (send to
    /// the stage worker, draft, emit, re-route) and feeds it what happened.
    async fn run_session(
        self: &Arc<Self>,
        req: PipelineRequest,
        admitted: Admitted,
        out: &mpsc::UnboundedSender<GenerateEvent>,
        routes: Option<&mpsc::UnboundedSender<String>>,
    ) -> Result<Generation, SessionError> {
        let Admitted { prompt_ids, sampler, max_tokens, spec } = admitted;
        let (mut drafting, spec) = match spec {
            Some((d, s)) => (Some(d), Some(s)),
            None => (None, None),
        };
        let (tx, mut events) = mpsc::channel(SESSION_EVENTS);
        let id = self.sessions.lock().await.open(tx, random_id);
        let route = match self.choose_route().await {
            Ok(r) => r,
            Err(e) => {
                self.sessions.lock().await.close(id);
                return Err(e);
            }
        };
        self.sessions.lock().await.route(id, &route);
        if let Some(tx) = routes {
            let _ = tx.send(self.describe_route(&route).await);
        }
        let shadow = if self.route.shadows { self.choose_shadows(&route).await } else { Vec::new() };
        let cfg = SessionConfig {
            stages: self.route.stages.len(),
            prefill_chunk: self.route.prefill_chunk,
            precision: self.route.precision,
            context: self.context,
            deadline: SESSION_DEADLINE,
            max_reroutes: MAX_REROUTES,
        };
        let start = SessionStart {
            id,
            route,
            shadow,
            prompt_ids,
            params: req.sampling,
            sampler,
            max_tokens,
            stop: req.stop,
            calls: req.calls,
            spec,
            score_prompt: req.score_prompt,
        };
        let mut core = SessionCore::new(cfg, start, &self.tokenizer, &self.counters, Instant::now());
        let result = loop {
            let env = Env {
                now: Instant::now(),
                client_gone: out.is_closed(),
                drafter_preparing: drafting.as_ref().is_some_and(Drafting::is_preparing),
            };
            match core.poll(env) {
                Some(Action::Prepare(context)) => {
                    if let Some(d) = drafting.as_mut() {
                        d.prepare(context);
                    }
                }
                Some(Action::Draft { k }) => {
                    let (draft, took) = match drafting.as_mut() {
                        Some(d) => d.draft(&core.draft_context(), k).await,
                        None => Default::default(),
                    };
                    core.drafted(draft, took, Instant::now());
                }
                Some(Action::Cancel { through }) => self.cancel(id, core.route(), core.shadow(), through).await,
                Some(Action::Send(job)) => {
                    if self.worker.send(Command::Run(Box::new(job))).await.is_err() {
                        break Err(SessionError::WorkerStopped);
                    }
                }
                Some(Action::Emit(text)) => {
                    let _ = out.send(GenerateEvent::Text(text));
                }
                Some(Action::Logprobs(lp)) => {
                    let _ = out.send(GenerateEvent::Logprobs(lp));
                }
                Some(Action::Reroute) => {
                    let warm = self.warm_route(core.route(), core.shadow()).await;
                    self.release(id, core.route(), core.shadow(), warm.is_none()).await;
                    let (route, warm) = match warm {
                        Some(r) => (r, true),
                        None => match self.choose_route().await {
                            Ok(r) => (r, false),
                            Err(e) => break Err(e),
                        },
                    };
                    if warm {
                        self.hold(&route).await;
                        if route == core.route() {
                            // Every replica still looks up: a lost frame, or a
                            // shard whose loss the heartbeats have not shown
                            // yet. Resend after a pause rather than spend the
                            // session's re-routes in a burst.
                            tokio::time::sleep(WARM_RETRY_PAUSE).await;
                        }
                    }
                    self.sessions.lock().await.route(id, &route);
                    if let Some(tx) = routes {
                        let _ = tx.send(self.describe_route(&route).await);
                    }
                    if warm {
                        tracing::info!(session = %id, "re-routed to warm replicas; no re-prefill");
                        core.rerouted_warm(route);
                    } else {
                        tracing::info!(session = %id, "re-routed; rebuilding the session's KV on the new route");
                        core.rerouted(route);
                    }
                }
                Some(Action::Finish(g)) => break Ok(g),
                Some(Action::Fail(e)) => break Err(e),
                None if core.awaits_event() => {
                    let event = match tokio::time::timeout(self.route.round_timeout, events.recv()).await {
                        Err(_) => {
                            tracing::warn!(session = %id, "no verdict in time");
                            SessionEvent::Timeout
                        }
                        Ok(None) => break Err(SessionError::ShuttingDown),
                        Ok(Some(e)) => e,
                    };
                    core.handle(event, Instant::now());
                }
                // Waiting for nothing the driver can give: a defect.
                None => break Err(SessionError::ShuttingDown),
            }
        };
        if let Some(d) = drafting.as_mut() {
            d.abort();
        }
        self.sessions.lock().await.close(id);
        self.release(id, core.route(), core.shadow(), true).await;
        let _ = self.worker.send(Command::End(id)).await;
        result
    }
}

/// A request that passed [`Entry::admit_request`].
#[derive(Debug)]
struct Admitted {
    prompt_ids: Vec<u32>,
    sampler: Sampler,
    max_tokens: usize,
    spec: Option<(Drafting, SpecState)>,
}
