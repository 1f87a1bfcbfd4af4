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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Mutex};
use veil_attestation::EvidenceBundle;

use super::net::{Downstream, PeerInRole, Trust};
use super::route::{DrafterKind, Route};
use super::sessions::{random_id, Admit, Said, SessionTable};
use super::worker::{Command, Input, Job, Output, StageWorker};
use crate::entry::sampler::{Sampler, SamplingParams};
use crate::entry::tokenizer::{ChatMessage, Tokenizer};
use crate::generate::{check_request, GenerateRequest, Generation, TextStream};
use crate::link::frame::{ErrorCode, Frame, LinkError, LinkRole, SamplingSpec, Verdict, Want};
use crate::model::{LayerSlice, ModelError};
use crate::speculate::model::DraftModel;
use crate::speculate::{verify_round, AdaptiveK, Draft, DraftMode, Drafter, DrafterSpec, SpecStats, MAX_K};

/// Longest request line accepted on the internal endpoint.
pub const MAX_REQUEST_BYTES: usize = 1 << 20;
/// How long a session waits for a stage to have a live replica.
pub const REROUTE_WAIT: Duration = Duration::from_secs(3);
/// How long one round may take before the session fails.
pub const ROUND_TIMEOUT: Duration = Duration::from_secs(60);
/// Re-routes one session may take before it fails.
pub const MAX_REROUTES: usize = 8;
/// Events queued for one session (verdicts, errors, link losses); a peer
/// that fills the queue is dropped for flooding.
pub const SESSION_EVENTS: usize = 256;
/// Longest a session may run, all rounds together (a per-request deadline).
pub const SESSION_DEADLINE: Duration = Duration::from_secs(600);

/// A request on the internal endpoint (one JSON line).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateWire {
    /// Prompt text (tokenized by the entry).
    #[serde(default)]
    pub prompt: Option<String>,
    /// Or prompt token ids.
    #[serde(default)]
    pub prompt_ids: Option<Vec<u32>>,
    /// Render `prompt` as one user turn with the model's chat template.
    #[serde(default)]
    pub chat: bool,
    /// Most new tokens.
    pub max_tokens: usize,
    /// Sampling temperature (0 = greedy).
    #[serde(default)]
    pub temperature: f32,
    /// Top-k (0 = off).
    #[serde(default)]
    pub top_k: usize,
    /// Top-p (1 = off).
    #[serde(default = "one")]
    pub top_p: f32,
    /// Min-p (0 = off).
    #[serde(default)]
    pub min_p: f32,
    /// Repetition penalty (1 = off).
    #[serde(default = "one")]
    pub repeat_penalty: f32,
    /// Seed.
    #[serde(default)]
    pub seed: u64,
    /// Stop strings.
    #[serde(default)]
    pub stop: Vec<String>,
    /// Speculative decoding for this request.
    #[serde(default)]
    pub speculation: SpeculationRequest,
}

/// A request's speculative decoding choices; unset fields take the route's.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SpeculationRequest {
    /// On or off; unset = the route's setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// `"ngram"`, `"model"` (the route's draft model) or `"script"`
    /// (proposes `script`: tests and benchmarks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drafter: Option<String>,
    /// A fixed k instead of adaptive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k: Option<usize>,
    /// The continuation the `"script"` drafter proposes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<Vec<u32>>,
}

fn one() -> f32 {
    1.0
}

impl GenerateWire {
    /// The prompt as ids: text tokenized as text, or (`chat`) one user turn
    /// through the chat template with the text kept out of special tokens.
    pub fn prompt_ids(&self, tokenizer: &Tokenizer) -> Result<Vec<u32>, ModelError> {
        match (&self.prompt, &self.prompt_ids) {
            (Some(text), None) if self.chat => {
                tokenizer.encode_chat(&[ChatMessage { role: "user".into(), content: text.clone() }])
            }
            (Some(text), None) => tokenizer.encode(text, false),
            (None, Some(ids)) => match ids.iter().find(|&&i| i as usize >= tokenizer.vocab_size()) {
                Some(bad) => Err(ModelError::Invalid(format!("token id {bad} is outside the vocabulary"))),
                None => Ok(ids.clone()),
            },
            _ => Err(ModelError::Invalid("give exactly one of prompt and prompt_ids".into())),
        }
    }

    /// The request's sampling parameters.
    pub fn sampling(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repeat_penalty,
            seed: self.seed,
            ..SamplingParams::default()
        }
    }
}

/// One line of the endpoint's answer.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum GenerateEvent {
    /// A piece of text.
    Text(String),
    /// Finished.
    Done(Generation),
    /// Failed in the pipeline (a shard, capacity); the message names the cause.
    Error(String),
    /// Refused: the request itself is invalid (the caller's to fix; a 400).
    Refused(String),
}

#[derive(Debug)]
enum Event {
    Verdict(Verdict),
    Error(LinkError),
    Down { stage: usize, replica: u8 },
}

#[derive(Debug, Default)]
struct Replica {
    control: Option<mpsc::Sender<Frame>>,
    evidence: Option<(PeerInRole, EvidenceBundle)>,
    sessions: usize,
}

/// A shard on the route whose evidence the entry verified.
#[derive(Debug, Clone)]
pub struct ShardEvidence {
    /// Stage index (1 = after the entry).
    pub stage: usize,
    /// Replica index within the stage.
    pub replica: usize,
    /// Layers served.
    pub layers: (u32, u32),
    /// What the entry verified: the peer, in its role on this route.
    pub peer: PeerInRole,
    /// The bundle as the shard presented it, for clients to verify themselves.
    pub bundle: EvidenceBundle,
}

/// The entry's shared state.
#[derive(Debug)]
pub struct Entry {
    route: Route,
    tokenizer: Tokenizer,
    context: usize,
    trust: Arc<Trust>,
    worker: mpsc::Sender<Command>,
    sessions: Mutex<SessionTable<mpsc::Sender<Event>>>,
    /// Per stage after the entry, per replica.
    replicas: Mutex<Vec<Vec<Replica>>>,
    draft_model: Option<Arc<DraftModel>>,
    counters: SpecCounters,
}

/// Entry-wide speculation counts (no content): for `/metrics`.
#[derive(Debug, Default)]
pub struct SpecCounters {
    /// Decode rounds of every session.
    pub rounds: AtomicU64,
    /// Rounds that carried drafted tokens.
    pub spec_rounds: AtomicU64,
    /// Tokens drafted.
    pub drafted: AtomicU64,
    /// Drafted tokens kept.
    pub accepted: AtomicU64,
    /// Tokens committed by decode rounds.
    pub committed: AtomicU64,
}

impl SpecCounters {
    /// Prometheus text.
    pub fn render(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut out = String::new();
        out += "# HELP veil_entry_decode_rounds_total Pipeline rounds after the prompt.\n# TYPE veil_entry_decode_rounds_total counter\n";
        out += &format!("veil_entry_decode_rounds_total {}\n", g(&self.rounds));
        out += "# HELP veil_entry_spec_rounds_total Rounds that verified drafted tokens.\n# TYPE veil_entry_spec_rounds_total counter\n";
        out += &format!("veil_entry_spec_rounds_total {}\n", g(&self.spec_rounds));
        out += "# HELP veil_entry_drafted_tokens_total Tokens proposed by drafters.\n# TYPE veil_entry_drafted_tokens_total counter\n";
        out += &format!("veil_entry_drafted_tokens_total {}\n", g(&self.drafted));
        out += "# HELP veil_entry_accepted_tokens_total Drafted tokens the target kept.\n# TYPE veil_entry_accepted_tokens_total counter\n";
        out += &format!("veil_entry_accepted_tokens_total {}\n", g(&self.accepted));
        out += "# HELP veil_entry_committed_tokens_total Tokens committed by decode rounds (tokens per round = this / rounds).\n# TYPE veil_entry_committed_tokens_total counter\n";
        out += &format!("veil_entry_committed_tokens_total {}\n", g(&self.committed));
        out
    }
}

/// A drafter preparing in the background, handed back when done.
type Preparing = tokio::task::JoinHandle<(Box<dyn Drafter>, Result<(), ModelError>)>;

/// One session's speculation.
#[derive(Debug)]
struct Speculation {
    drafter: Option<Box<dyn Drafter>>,
    preparing: Option<Preparing>,
    k: AdaptiveK,
    mode: DraftMode,
    stats: SpecStats,
}

impl Speculation {
    /// Waits for any background preparation (a draft model's prefill), so
    /// that its time is not charged to drafting.
    async fn ready(&mut self) {
        if let Some(h) = self.preparing.take() {
            match h.await {
                Ok((d, Ok(()))) => self.drafter = Some(d),
                Ok((_, Err(e))) => tracing::warn!(error = %e, "drafter preparation failed: speculation off"),
                Err(e) => tracing::warn!(error = %e, "drafter preparation panicked: speculation off"),
            }
        }
    }

    /// Up to `k` drafted tokens for `context`, and the time drafting took
    /// (not counting a wait for preparation); an error turns speculation
    /// off for the session (plain decoding continues).
    async fn draft(&mut self, context: &[u32], k: usize) -> (Draft, Duration) {
        self.ready().await;
        let started = Instant::now();
        let draft = self.draft_now(context, k).await;
        (draft, started.elapsed())
    }

    async fn draft_now(&mut self, context: &[u32], k: usize) -> Draft {
        let Some(mut d) = self.drafter.take() else { return Draft::default() };
        let mode = self.mode.clone();
        let result = if d.is_cheap() {
            let r = d.draft(context, k, &mode);
            Some((d, r))
        } else {
            let ctx = context.to_vec();
            tokio::task::spawn_blocking(move || {
                let r = d.draft(&ctx, k, &mode);
                (d, r)
            })
            .await
            .ok()
        };
        match result {
            Some((d, Ok(mut draft))) => {
                self.drafter = Some(d);
                draft.tokens.truncate(k);
                draft.q.truncate(k);
                draft
            }
            Some((_, Err(e))) => {
                tracing::warn!(error = %e, "drafter failed: speculation off for this session");
                Draft::default()
            }
            None => Draft::default(),
        }
    }
}

impl Entry {
    /// Starts the entry: worker thread, output dispatch, control links to
    /// every shard. Returns once they are started (links come up on their own).
    pub fn start(
        route: Route,
        slice: Arc<LayerSlice>,
        tokenizer: Tokenizer,
        trust: Arc<Trust>,
        draft_model: Option<Arc<DraftModel>>,
    ) -> Arc<Self> {
        let (cmd_tx, cmd_rx) = mpsc::channel::<Command>(1024);
        let (out_tx, mut out_rx) = mpsc::channel::<Output>(1024);
        let worker = StageWorker::new(slice.clone(), 0, route.kv_budget_bytes);
        std::thread::Builder::new()
            .name("stage-0".into())
            .spawn(move || worker.run(cmd_rx, out_tx))
            .map_err(|e| tracing::error!(error = %e, "cannot start the entry worker"))
            .ok();
        let replicas =
            route.stages[1..].iter().map(|s| s.replicas.iter().map(|_| Replica::default()).collect()).collect();
        let entry = Arc::new(Self {
            context: slice.config().context_length,
            route: route.clone(),
            tokenizer,
            trust: trust.clone(),
            worker: cmd_tx,
            sessions: Mutex::new(SessionTable::new(route.stages.len() - 1)),
            replicas: Mutex::new(replicas),
            draft_model,
            counters: SpecCounters::default(),
        });
        let downstream = route.stages.get(1).map(|s| Downstream::new(trust, s.clone()));
        let e = entry.clone();
        tokio::spawn(async move {
            while let Some(out) = out_rx.recv().await {
                match out {
                    Output::Downstream { replica, frame } => {
                        let (session, seq) = (frame.session, frame.seq);
                        let sent = match &downstream {
                            Some(d) => d.send(replica, Frame::Forward(frame)).await,
                            None => Err("no next stage".into()),
                        };
                        if let Err(message) = sent {
                            let err = LinkError { session: Some(session), seq, code: ErrorCode::Unavailable, message };
                            e.dispatch(session, Event::Error(err)).await;
                        }
                    }
                    Output::Verdict(v) => e.dispatch(v.session, Event::Verdict(v)).await,
                    Output::Error(err) => {
                        if let Some(s) = err.session {
                            e.dispatch(s, Event::Error(err)).await;
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

    /// Hands an event from the entry's own stage to its session.
    async fn dispatch(&self, session: u64, event: Event) {
        if let Some(tx) = self.sessions.lock().await.sink(session) {
            let _ = tx.try_send(event);
        }
    }

    /// Hands a frame that arrived on the control link of (`stage`,
    /// `replica`) to its session if that link carries it; a violation (a
    /// frame for a session the link does not carry) drops the link.
    async fn admit(&self, stage: usize, replica: u8, session: u64, event: Event) -> Result<(), &'static str> {
        let said = if matches!(event, Event::Verdict(_)) { Said::Verdict } else { Said::Error };
        let sessions = self.sessions.lock().await;
        match sessions.admit(stage, replica, session, said) {
            // A session reads one event per answer it awaits: a peer that
            // fills its queue is flooding it.
            (Admit::Deliver, Some(tx)) => match tx.try_send(event) {
                Err(mpsc::error::TrySendError::Full(_)) => Err("a flood of frames for one session"),
                _ => Ok(()),
            },
            (Admit::Deliver | Admit::Ignore, _) => Ok(()),
            (Admit::Violation(why), _) => Err(why),
        }
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

    /// The session's speculation, from the request and the route.
    fn speculation_for(&self, req: &GenerateWire, prompt_len: usize) -> Result<Option<Speculation>, String> {
        let r = &req.speculation;
        let route = &self.route.speculation;
        if r.enabled == Some(false) {
            return Ok(None);
        }
        let model = || {
            self.draft_model
                .clone()
                .map(DrafterSpec::Model)
                .ok_or_else(|| "this entry has no draft model (route speculation.draft_model)".to_owned())
        };
        let spec = match r.drafter.as_deref() {
            None => match route.drafter {
                DrafterKind::None if r.enabled == Some(true) => DrafterSpec::Ngram,
                DrafterKind::None => return Ok(None),
                DrafterKind::Ngram => DrafterSpec::Ngram,
                DrafterKind::Model => model()?,
            },
            Some("none") => return Ok(None),
            Some("ngram") => DrafterSpec::Ngram,
            Some("model") => model()?,
            Some("script") => DrafterSpec::Script {
                prompt_len,
                tokens: r.script.clone().ok_or("drafter \"script\" needs speculation.script")?,
            },
            Some(other) => return Err(format!("unknown drafter {other:?} (ngram, model or script)")),
        };
        if r.k.is_some_and(|k| k > MAX_K) {
            return Err(format!("speculation k must be at most {MAX_K}"));
        }
        if req.repeat_penalty != 1.0 {
            // The last shard would need each drafted token in the penalty's
            // history to verify losslessly; plain decoding instead.
            return Ok(None);
        }
        let Some(drafter) = spec.instantiate() else { return Ok(None) };
        let mode = if req.temperature == 0.0 { DraftMode::Greedy } else { DraftMode::Sample(req.sampling()) };
        Ok(Some(Speculation {
            stats: SpecStats { drafter: drafter.name().to_owned(), ..SpecStats::default() },
            drafter: Some(drafter),
            preparing: None,
            k: AdaptiveK::new(route.k_max, r.k.or(route.k)),
            mode,
        }))
    }

    async fn control_loop(self: Arc<Self>, stage: usize, replica: u8) {
        let spec = self.route.stages[stage].clone();
        let addr = spec.replicas[usize::from(replica)];
        let mut backoff = Duration::from_millis(100);
        let mut warned = false;
        loop {
            match self.trust.dial(addr, &spec, LinkRole::Control).await {
                Err(e) => {
                    if !warned {
                        tracing::warn!(stage, %addr, error = %e, "shard not available (retrying with backoff)");
                        warned = true;
                    }
                }
                Ok((tx, mut reader, peer, bundle)) => {
                    tracing::info!(stage, %addr, layers = ?spec.layers, "shard verified; control link up");
                    backoff = Duration::from_millis(100);
                    warned = false;
                    {
                        let mut reps = self.replicas.lock().await;
                        let r = &mut reps[stage - 1][usize::from(replica)];
                        r.control = Some(tx.clone());
                        r.evidence = Some((peer, bundle));
                    }
                    let hb = self.route.heartbeat;
                    let pinger = tx.clone();
                    let heartbeat = tokio::spawn(async move {
                        let mut n = 0u64;
                        loop {
                            tokio::time::sleep(hb).await;
                            n += 1;
                            if pinger.send(Frame::Ping(n)).await.is_err() {
                                return;
                            }
                        }
                    });
                    let why = loop {
                        match tokio::time::timeout(hb * 4, reader.next()).await {
                            Err(_) => break "missed heartbeats".to_owned(),
                            Ok(Ok(None)) => break "closed".to_owned(),
                            Ok(Err(e)) => break e.to_string(),
                            Ok(Ok(Some(Frame::Verdict(v)))) => {
                                if let Err(why) = self.admit(stage, replica, v.session, Event::Verdict(v)).await {
                                    break format!("protocol violation: {why}");
                                }
                            }
                            Ok(Ok(Some(Frame::Error(err)))) => match err.session {
                                Some(s) => {
                                    if let Err(why) = self.admit(stage, replica, s, Event::Error(err)).await {
                                        break format!("protocol violation: {why}");
                                    }
                                }
                                None => {
                                    tracing::warn!(stage, %addr, code = ?err.code, message = %err.message, "shard error")
                                }
                            },
                            Ok(Ok(Some(_))) => {}
                        }
                    };
                    heartbeat.abort();
                    tracing::warn!(stage, %addr, reason = %why, "shard lost");
                    {
                        let mut reps = self.replicas.lock().await;
                        let r = &mut reps[stage - 1][usize::from(replica)];
                        r.control = None;
                        r.evidence = None;
                    }
                    for tx in self.sessions.lock().await.sinks() {
                        let _ = tx.try_send(Event::Down { stage, replica });
                    }
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    /// A route for a new or re-routed session: per stage the live replica
    /// with fewest sessions, waiting briefly for one to come (back) up.
    async fn choose_route(&self) -> Result<Vec<u8>, String> {
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
                        return Err(format!("stage {s} (layers {}..{}) has no live replica", l.0, l.1));
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

    async fn release(&self, session: u64, route: &[u8]) {
        let controls: Vec<mpsc::Sender<Frame>> = {
            let mut reps = self.replicas.lock().await;
            route
                .iter()
                .enumerate()
                .filter_map(|(s, &r)| {
                    let rep = &mut reps[s][usize::from(r)];
                    rep.sessions = rep.sessions.saturating_sub(1);
                    rep.control.clone()
                })
                .collect()
        };
        for c in controls {
            let _ = c.send(Frame::EndSession(session)).await;
        }
    }

    /// Runs one request through the pipeline, sending events to `out`.
    pub async fn generate(self: &Arc<Self>, req: GenerateWire, out: mpsc::UnboundedSender<GenerateEvent>) {
        self.generate_traced(req, out, None).await
    }

    /// [`generate`](Self::generate), also sending to `routes` each route the
    /// session runs on (the first, then one per re-route) as
    /// [`describe_route`](Self::describe_route) writes it.
    pub async fn generate_traced(
        self: &Arc<Self>,
        req: GenerateWire,
        out: mpsc::UnboundedSender<GenerateEvent>,
        routes: Option<mpsc::UnboundedSender<String>>,
    ) {
        let event = match self.admit_request(&req) {
            Err(e) => GenerateEvent::Refused(e),
            Ok(admitted) => match self.run_session(req, admitted, &out, routes.as_ref()).await {
                Ok(g) => GenerateEvent::Done(g),
                Err(e) => GenerateEvent::Error(e),
            },
        };
        let _ = out.send(event);
    }

    /// Everything about a request that is the caller's to get right, checked
    /// before any pipeline work: its prompt, sampling, length and speculation.
    fn admit_request(&self, req: &GenerateWire) -> Result<Admitted, String> {
        let prompt_ids = req.prompt_ids(&self.tokenizer).map_err(|e| e.to_string())?;
        let sampler = Sampler::new(req.sampling()).map_err(|e| e.to_string())?;
        let gen =
            GenerateRequest { prompt_ids: prompt_ids.clone(), max_tokens: req.max_tokens, stop: req.stop.clone() };
        let max_tokens = check_request(&gen, self.context).map_err(|e| e.to_string())?;
        let spec = self.speculation_for(req, prompt_ids.len())?;
        Ok(Admitted { prompt_ids, sampler, max_tokens, spec })
    }

    async fn run_session(
        self: &Arc<Self>,
        req: GenerateWire,
        admitted: Admitted,
        out: &mpsc::UnboundedSender<GenerateEvent>,
        routes: Option<&mpsc::UnboundedSender<String>>,
    ) -> Result<Generation, String> {
        let Admitted { prompt_ids, mut sampler, max_tokens, mut spec } = admitted;
        let params = req.sampling();
        let (tx, mut events) = mpsc::channel(SESSION_EVENTS);
        let id = self.sessions.lock().await.open(tx, random_id);
        let mut route = match self.choose_route().await {
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
        let mut s = Session { id, seq: 0, history: prompt_ids.clone(), params };
        let greedy = s.params.temperature == 0.0;
        let result = async {
            let mut stream = TextStream::new(&self.tokenizer, req.stop.clone());
            let mut stopped = false;
            let mut reroutes = 0;
            // Send the whole prompt (chunked), then per round the last
            // committed token and any drafted tokens after it.
            let mut pending: (usize, bool) = (0, false); // (first position to send, rebuild)
            let mut generated = 0;
            let mut prompt_round = true;
            let started = Instant::now();
            'rounds: loop {
                // The client went away (its receiver is gone): stop computing.
                if out.is_closed() {
                    return Err("the client went away".into());
                }
                if started.elapsed() > SESSION_DEADLINE {
                    return Err(format!("the request ran past its deadline of {} s", SESSION_DEADLINE.as_secs()));
                }
                let (from, rebuild) = pending;
                let mut draft = Draft::default();
                let mut drafting = Duration::ZERO;
                if let Some(sp) = spec.as_mut() {
                    if prompt_round && !rebuild {
                        // A draft model prefills while the target does.
                        if let Some(mut d) = sp.drafter.take() {
                            let ctx = s.history.clone();
                            sp.preparing = Some(tokio::task::spawn_blocking(move || {
                                let r = d.prepare(&ctx);
                                (d, r)
                            }));
                        }
                    } else if sp.preparing.as_ref().is_some_and(|h| !h.is_finished()) {
                        // The draft model is still prefilling: plain rounds
                        // meanwhile, rather than waiting for it.
                    } else if !rebuild {
                        let room = self.context.saturating_sub(s.history.len() + 1);
                        let limit = max_tokens.saturating_sub(generated + 1).min(room);
                        let k = sp.k.next_k(limit);
                        if k > 0 {
                            (draft, drafting) = sp.draft(&s.history, k).await;
                        }
                    }
                }
                // After a round that verified drafts the shards hold
                // positions past the committed ones: every round of a
                // speculating session rolls back to what it sends from.
                let truncate_to = if rebuild || spec.is_some() { Some(from) } else { None };
                let first = s.seq + 1;
                let sent = Instant::now();
                let seq = self.send_positions(&mut s, &route, from, truncate_to, &draft.tokens).await?;
                let verdict = loop {
                    // A round that never answers (a frame lost with a link) is re-routed too.
                    let Ok(event) = tokio::time::timeout(ROUND_TIMEOUT, events.recv()).await else {
                        tracing::warn!(session = id, "no verdict in time");
                        break None;
                    };
                    match event.ok_or("the entry is shutting down")? {
                        Event::Verdict(v) if v.seq == seq => break Some(v),
                        Event::Verdict(_) => {}
                        // Any chunk of this round failing fails the round; older rounds' errors are stale.
                        Event::Error(e) if !(first..=seq).contains(&e.seq) => {}
                        Event::Error(e) if e.code == ErrorCode::Unavailable => break None,
                        Event::Error(e) => return Err(format!("shard error ({:?}): {}", e.code, e.message)),
                        Event::Down { stage, replica } if route.get(stage - 1) == Some(&replica) => break None,
                        Event::Down { .. } => {}
                    }
                };
                let round = sent.elapsed();
                let Some(v) = verdict else {
                    // A shard on the route died: new route, rebuild from what is committed.
                    reroutes += 1;
                    if reroutes > MAX_REROUTES {
                        return Err("too many re-routes".into());
                    }
                    self.release(id, &route).await;
                    route = self.choose_route().await?;
                    self.sessions.lock().await.route(id, &route);
                    if let Some(tx) = routes {
                        let _ = tx.send(self.describe_route(&route).await);
                    }
                    tracing::info!(session = id, "re-routed; rebuilding the session's KV on the new route");
                    pending = (0, true);
                    continue;
                };
                // Every stage must hold exactly the positions just sent on
                // top of the committed ones: rejected drafts were rolled back.
                let expected = (s.history.len() + draft.tokens.len()) as u32;
                check_kv_lens(&v.kv_lens, self.route.stages.len(), expected)?;
                let tokens = if draft.tokens.is_empty() {
                    vec![sampler.draw(v.positions.first().ok_or("empty verdict")?)]
                } else {
                    // The final frame carried the last committed token and the drafts.
                    let n = draft.tokens.len() + 1;
                    if v.positions.len() < n {
                        return Err(format!("a verdict of {} positions for {n} verified", v.positions.len()));
                    }
                    verify_round(&draft, &v.positions[v.positions.len() - n..], greedy, &mut sampler).tokens
                };
                if let Some(sp) = spec.as_mut() {
                    sp.stats.kv_checked += 1;
                    if !prompt_round && !rebuild {
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
                        let c = &self.counters;
                        c.rounds.fetch_add(1, Ordering::Relaxed);
                        c.spec_rounds.fetch_add(u64::from(k > 0), Ordering::Relaxed);
                        c.drafted.fetch_add(k as u64, Ordering::Relaxed);
                        c.accepted.fetch_add(accepted as u64, Ordering::Relaxed);
                        c.committed.fetch_add(tokens.len() as u64, Ordering::Relaxed);
                    }
                } else if !prompt_round && !rebuild {
                    self.counters.rounds.fetch_add(1, Ordering::Relaxed);
                    self.counters.committed.fetch_add(1, Ordering::Relaxed);
                }
                prompt_round = false;
                for next in tokens {
                    if self.tokenizer.stop_ids().contains(&next) {
                        break 'rounds;
                    }
                    s.history.push(next);
                    generated += 1;
                    let step = stream.push(next).map_err(|e| e.to_string())?;
                    if !step.piece.is_empty() {
                        let _ = out.send(GenerateEvent::Text(step.piece));
                    }
                    if step.stopped {
                        stopped = true;
                        break 'rounds;
                    }
                    if generated >= max_tokens {
                        break 'rounds;
                    }
                }
                pending = (s.history.len() - 1, false);
            }
            let (rest, ids, text) = stream.finish(stopped).map_err(|e| e.to_string())?;
            if !rest.is_empty() {
                let _ = out.send(GenerateEvent::Text(rest));
            }
            let speculation = spec.as_ref().map(|sp| sp.stats.clone());
            Ok(Generation { prompt_ids: prompt_ids.clone(), ids, text, speculation })
        }
        .await;
        if let Some(h) = spec.and_then(|mut sp| sp.preparing.take()) {
            h.abort();
        }
        self.sessions.lock().await.close(id);
        self.release(id, &route).await;
        let _ = self.worker.send(Command::End(id)).await;
        result
    }

    /// Sends positions `[from, history.len())` in prefill-sized chunks, then
    /// `drafts` after them; the last chunk wants a verdict (for every
    /// position when there are drafts, which then travel in one frame with
    /// the last committed token). `truncate_to` rolls every stage back first.
    async fn send_positions(
        &self,
        s: &mut Session,
        route: &[u8],
        from: usize,
        truncate_to: Option<usize>,
        drafts: &[u32],
    ) -> Result<u64, String> {
        let chunk = self.route.prefill_chunk;
        let mut start = from;
        let end = s.history.len();
        let window = s.params.repetition_window;
        while start < end {
            let stop = (start + chunk).min(end);
            let last = stop == end;
            s.seq += 1;
            let history = &s.history[..end];
            let mut tokens = s.history[start..stop].to_vec();
            if last {
                tokens.extend_from_slice(drafts);
            }
            let job = Job {
                session: s.id,
                seq: s.seq,
                start,
                truncate_to: if start == from { truncate_to } else { None },
                want: match (last, drafts.is_empty()) {
                    (false, _) => Want::Nothing,
                    (true, true) => Want::Last,
                    (true, false) => Want::All,
                },
                route: route.to_vec(),
                kv_lens: Vec::new(),
                sampling: last.then(|| SamplingSpec {
                    temperature: s.params.temperature,
                    top_k: s.params.top_k as u32,
                    top_p: s.params.top_p,
                    min_p: s.params.min_p,
                    repetition_penalty: s.params.repetition_penalty,
                    history: if s.params.repetition_penalty == 1.0 {
                        Vec::new()
                    } else {
                        history[history.len().saturating_sub(window)..].to_vec()
                    },
                }),
                precision: self.route.precision,
                input: Input::Tokens(tokens),
            };
            self.worker.send(Command::Run(job)).await.map_err(|_| "the entry worker stopped".to_owned())?;
            start = stop;
        }
        Ok(s.seq)
    }
}

/// After a round every stage (the entry first) must hold exactly `expected`
/// positions of the session: the committed ones plus those just verified, so
/// drafts a previous round rejected were rolled back everywhere.
fn check_kv_lens(kv_lens: &[u32], stages: usize, expected: u32) -> Result<(), String> {
    if kv_lens.len() != stages || kv_lens.iter().any(|&l| l != expected) {
        return Err(format!("KV lengths {kv_lens:?} after a round; every stage should hold {expected} positions"));
    }
    Ok(())
}

/// A request that passed [`Entry::admit_request`].
#[derive(Debug)]
struct Admitted {
    prompt_ids: Vec<u32>,
    sampler: Sampler,
    max_tokens: usize,
    spec: Option<Speculation>,
}

#[derive(Debug)]
struct Session {
    id: u64,
    seq: u64,
    history: Vec<u32>,
    params: SamplingParams,
}

/// Serves the internal endpoint: one request per connection.
pub async fn serve_generate(entry: Arc<Entry>, listener: tokio::net::TcpListener) {
    loop {
        let (tcp, _) = super::net::accept(&listener).await;
        let entry = entry.clone();
        tokio::spawn(async move {
            if let Err(e) = handle_generate(entry, tcp).await {
                tracing::debug!(error = %e, "generate connection ended");
            }
        });
    }
}

async fn handle_generate(entry: Arc<Entry>, tcp: TcpStream) -> std::io::Result<()> {
    let (r, mut w) = tcp.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(r.take(MAX_REQUEST_BYTES as u64));
    reader.read_line(&mut line).await?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    match serde_json::from_str::<GenerateWire>(&line) {
        Err(e) => {
            let _ = tx.send(GenerateEvent::Refused(format!("bad request: {e}")));
            drop(tx);
        }
        Ok(req) => {
            let entry = entry.clone();
            tokio::spawn(async move { entry.generate(req, tx).await });
        }
    }
    while let Some(ev) = rx.recv().await {
        let mut text = serde_json::to_string(&ev).unwrap_or_else(|_| "{\"error\":\"encoding\"}".into());
        text.push('\n');
        w.write_all(text.as_bytes()).await?;
    }
    w.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::check_kv_lens;

    #[test]
    fn a_stage_that_did_not_roll_back_fails_the_session() {
        assert!(check_kv_lens(&[12, 12, 12], 3, 12).is_ok());
        // A middle stage kept two rejected drafts.
        assert!(check_kv_lens(&[12, 14, 12], 3, 12).is_err());
        // The last stage dropped a position; a stage missing from the verdict.
        assert!(check_kv_lens(&[12, 12, 11], 3, 12).is_err());
        assert!(check_kv_lens(&[12, 12], 3, 12).is_err());
        assert!(check_kv_lens(&[12, 12, 12, 12], 3, 12).is_err());
    }
}
