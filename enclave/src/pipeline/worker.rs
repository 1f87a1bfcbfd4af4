//! The stage worker: one thread per shard that owns the slice's sessions
//! (their KV caches) and runs every frame that has arrived as one batched
//! forward — continuous batching: a decode step of one session and a
//! prefill chunk of another share every weight read.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::link::frame::{
    ErrorCode, ErrorReport, Forward, Precision, SamplingSpec, SessionId, Verdict, Want, NO_SHADOW,
};
use crate::model::{BatchItem, LayerSlice, Logits, ModelError, Rows, SessionKv, SliceOutput};
use crate::text::grammar::{Constrained, ResponseFormat};
use crate::text::sampler::{logprobs, Distribution, Sampler, SamplingParams, Seen};
use crate::text::tokenizer::Tokenizer;

/// Positions one batch may carry (beyond its first job).
pub const MAX_BATCH_POSITIONS: usize = 512;
/// Most batches in a row a shadow's copy (`mirror`) may wait while live
/// frames run: copies go at low priority, but a shadow that fell behind for
/// good could not take over.
pub const MIRROR_MAX_WAIT: u32 = 4;
/// Most sessions one stage holds KV for: a peer cannot grow per-session state
/// without limit by inventing session ids (each also counts against the KV budget).
pub const MAX_SESSIONS: usize = 4096;
/// Compiled response formats kept to fork from (see `StageWorker::compiled`).
const COMPILED_FORMATS: usize = 8;

/// What a job feeds the slice.
#[derive(Clone, Debug)]
pub enum Input {
    /// Token ids (the entry, which holds the embedding).
    Tokens(Vec<u32>),
    /// Hidden states from the previous stage.
    Hidden(Rows),
}

impl Input {
    fn len(&self) -> usize {
        match self {
            Self::Tokens(t) => t.len(),
            Self::Hidden(h) => h.n(),
        }
    }
}

/// Positions of one session to run.
#[derive(Clone, Debug)]
pub struct Job {
    /// Session id.
    pub session: SessionId,
    /// Per-session sequence number.
    pub seq: u64,
    /// Absolute position of the first input row.
    pub start: usize,
    /// Roll the cache back to this length first.
    pub truncate_to: Option<usize>,
    /// Positions that need a verdict on the last stage.
    pub want: Want,
    /// Replica per stage after the entry.
    pub route: Vec<u8>,
    /// Shadow replica per stage after the entry (see [`Forward::shadow`]).
    pub shadow: Vec<u8>,
    /// A shadow's copy: run into the KV cache only (see [`Forward::mirror`]).
    pub mirror: bool,
    /// Earlier stages' KV lengths after this job (see [`Forward::kv_lens`]).
    pub kv_lens: Vec<u32>,
    /// The verdict's sampling transform.
    pub sampling: Option<Box<SamplingSpec>>,
    /// Wire precision downstream.
    pub precision: Precision,
    /// The input rows.
    pub input: Input,
}

impl Job {
    /// The job a received forward frame asks for.
    pub fn from_forward(f: Forward) -> Result<Self, ModelError> {
        let hidden = Rows::new(f.hidden, f.width as usize)?;
        Ok(Self {
            session: f.session,
            seq: f.seq,
            start: f.start as usize,
            truncate_to: f.truncate_to.map(|t| t as usize),
            want: f.want,
            route: f.route,
            shadow: f.shadow,
            mirror: f.mirror,
            kv_lens: f.kv_lens,
            sampling: f.sampling,
            precision: f.precision,
            input: Input::Hidden(hidden),
        })
    }
}

/// Commands to the worker.
#[derive(Debug)]
pub enum Command {
    /// Run positions (boxed: a job carries its sampling spec).
    Run(Box<Job>),
    /// Free a session.
    End(SessionId),
    /// Drop the session's jobs with `seq <= through` that have not run
    /// (pipelined speculation: rounds built on rejected drafts).
    Cancel {
        /// The session.
        session: SessionId,
        /// Last sequence number dropped.
        through: u64,
    },
}

/// What a worker ran and what it dropped, across sessions (counts only).
#[derive(Debug, Default)]
pub struct WorkerCounters {
    /// Jobs run.
    pub jobs: AtomicU64,
    /// Positions run.
    pub positions: AtomicU64,
    /// Jobs dropped unrun because the entry cancelled them.
    pub cancelled_jobs: AtomicU64,
    /// Positions of those jobs.
    pub cancelled_positions: AtomicU64,
    /// Batches that ran live frames while a shadow's copy waited.
    pub mirror_waits: AtomicU64,
}

impl WorkerCounters {
    /// (jobs run, positions run, jobs cancelled, positions cancelled).
    pub fn snapshot(&self) -> (u64, u64, u64, u64) {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        (l(&self.jobs), l(&self.positions), l(&self.cancelled_jobs), l(&self.cancelled_positions))
    }
}

/// What the worker produces.
#[derive(Debug)]
pub enum Output {
    /// Hidden states for the next stage, on replica `replica`.
    Downstream {
        /// Replica index of the next stage.
        replica: u8,
        /// The frame.
        frame: Forward,
    },
    /// The last stage's verdict, for the entry.
    Verdict(Verdict),
    /// A failure for the entry.
    Error(ErrorReport),
}

/// The worker's state; run it with [`StageWorker::run`] on its own thread.
#[derive(Debug)]
pub struct StageWorker {
    slice: Arc<LayerSlice>,
    /// This stage's index (0 = entry).
    stage: usize,
    budget_bytes: usize,
    sessions: HashMap<SessionId, SessionKv>,
    /// Per session, the last cancelled sequence number (a job arriving later
    /// with a sequence number up to it is dropped) and how many jobs were
    /// dropped. Bounded like `sessions`, and forgotten with the session.
    cancelled: HashMap<SessionId, (u64, u64)>,
    counters: Arc<WorkerCounters>,
    /// The vocabulary (the last stage, for response formats: its grammar
    /// engine is built on the first one).
    vocabulary: Option<Arc<Tokenizer>>,
    /// Per session with a response format: its text and matcher.
    formats: HashMap<SessionId, (String, Constrained)>,
    /// Recently compiled formats at their start, by text: the sessions of
    /// one request (its `n` choices) and repeated schemas fork one compile.
    compiled: VecDeque<(String, Constrained)>,
}

impl StageWorker {
    /// A worker for stage `stage` holding at most `budget_bytes` of KV.
    pub fn new(slice: Arc<LayerSlice>, stage: usize, budget_bytes: usize) -> Self {
        Self {
            slice,
            stage,
            budget_bytes,
            sessions: HashMap::new(),
            cancelled: HashMap::new(),
            counters: Arc::new(WorkerCounters::default()),
            vocabulary: None,
            formats: HashMap::new(),
            compiled: VecDeque::new(),
        }
    }

    /// Enforces response formats over `vocabulary` (the last stage's).
    pub fn with_vocabulary(mut self, vocabulary: Arc<Tokenizer>) -> Self {
        self.vocabulary = Some(vocabulary);
        self
    }

    /// The worker's counts, readable from other threads while it runs.
    pub fn counters(&self) -> Arc<WorkerCounters> {
        self.counters.clone()
    }

    /// Whether a job was cancelled before it ran.
    fn is_cancelled(&self, job: &Job) -> bool {
        self.cancelled.get(&job.session).is_some_and(|&(through, _)| job.seq <= through)
    }

    fn count_cancelled(&mut self, job: &Job) {
        if let Some((_, n)) = self.cancelled.get_mut(&job.session) {
            *n += 1;
        }
        self.counters.cancelled_jobs.fetch_add(1, Ordering::Relaxed);
        self.counters.cancelled_positions.fetch_add(job.input.len() as u64, Ordering::Relaxed);
    }

    /// Records a cancel, dropping matching jobs from `queued` (not yet run).
    fn cancel(&mut self, session: SessionId, through: u64, queued: &mut Vec<Job>) {
        if !self.cancelled.contains_key(&session) && self.cancelled.len() >= MAX_SESSIONS {
            // A bounded record: forget the cancels of sessions no longer held.
            let sessions = &self.sessions;
            self.cancelled.retain(|s, _| sessions.contains_key(s));
            if self.cancelled.len() >= MAX_SESSIONS {
                return;
            }
        }
        let t = &mut self.cancelled.entry(session).or_insert((0, 0)).0;
        *t = (*t).max(through);
        let (dead, live): (Vec<Job>, Vec<Job>) =
            queued.drain(..).partition(|j| j.session == session && j.seq <= through);
        *queued = live;
        dead.iter().for_each(|j| self.count_cancelled(j));
    }

    /// Frees a session, noting how many of its frames were cancelled unrun.
    fn end(&mut self, session: SessionId) {
        self.sessions.remove(&session);
        self.formats.remove(&session);
        if let Some((_, dropped)) = self.cancelled.remove(&session) {
            if dropped > 0 {
                tracing::info!(stage = self.stage, %session, dropped, "session ended; cancelled frames dropped unrun");
            }
        }
    }

    /// Sessions held.
    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }

    /// KV bytes held across sessions.
    pub fn kv_bytes(&self) -> usize {
        self.sessions.values().map(SessionKv::bytes).sum()
    }

    /// Serves commands until the channel closes. Each round takes everything
    /// queued (one job per session per batch, order kept per session) and
    /// runs it as one forward. A shadow's copies go at low priority: while
    /// other sessions' live frames are queued they wait, for at most
    /// [`MIRROR_MAX_WAIT`] batches in a row, so a mirrored prefill does not
    /// slow the sessions this replica serves.
    pub fn run(mut self, mut rx: mpsc::Receiver<Command>, out: mpsc::Sender<Output>) {
        let mut queue: VecDeque<Command> = VecDeque::new();
        let mut mirror_waited = 0;
        loop {
            if queue.is_empty() {
                match rx.blocking_recv() {
                    Some(c) => queue.push_back(c),
                    None => return,
                }
            }
            while let Ok(c) = rx.try_recv() {
                queue.push_back(c);
            }
            let mut batch = Vec::new();
            let mut busy = HashSet::new();
            let mut positions = 0;
            let mut rest = VecDeque::new();
            // Sessions with live frames queued. A copy waits only for other
            // sessions' frames: one whose own session has live frames behind
            // it (this replica took the session over) runs first, in order.
            let live: HashSet<SessionId> = (queue.iter())
                .filter_map(|c| match c {
                    Command::Run(j) if !j.mirror && !self.is_cancelled(j) => Some(j.session),
                    _ => None,
                })
                .collect();
            let waits = |j: &Job| mirror_waited < MIRROR_MAX_WAIT && live.iter().any(|&s| s != j.session);
            let mut held = false;
            while let Some(c) = queue.pop_front() {
                match c {
                    Command::End(s) if !busy.contains(&s) => self.end(s),
                    Command::Cancel { session, through } => {
                        // Takes effect at once, on this batch and on the
                        // commands still queued behind it.
                        self.cancel(session, through, &mut batch);
                        let mut kept = VecDeque::with_capacity(rest.len());
                        for c in rest.drain(..) {
                            match c {
                                Command::Run(j) if j.session == session && j.seq <= through => self.count_cancelled(&j),
                                other => kept.push_back(other),
                            }
                        }
                        rest = kept;
                    }
                    Command::Run(j) if self.is_cancelled(&j) => self.count_cancelled(&j),
                    Command::Run(j) if j.mirror && !busy.contains(&j.session) && waits(&j) => {
                        held = true;
                        busy.insert(j.session);
                        rest.push_back(Command::Run(j));
                    }
                    Command::Run(j)
                        if !busy.contains(&j.session)
                            && (batch.is_empty() || positions + j.input.len() <= MAX_BATCH_POSITIONS) =>
                    {
                        busy.insert(j.session);
                        positions += j.input.len();
                        batch.push(*j);
                    }
                    other => {
                        // Later work of a session already in this batch, or
                        // no room: next round, in order.
                        if let Command::Run(j) = &other {
                            busy.insert(j.session);
                        }
                        if let Command::End(s) = &other {
                            busy.insert(*s);
                        }
                        rest.push_back(other);
                    }
                }
            }
            queue = rest;
            mirror_waited = if held { mirror_waited + 1 } else { 0 };
            if held {
                self.counters.mirror_waits.fetch_add(1, Ordering::Relaxed);
            }
            for o in self.step_contained(batch) {
                if out.blocking_send(o).is_err() {
                    return;
                }
            }
        }
    }

    /// [`step`](Self::step), with a panic failing the batch's frames (each
    /// gets an internal error, and their sessions' state here is dropped)
    /// instead of the stage.
    fn step_contained(&mut self, batch: Vec<Job>) -> Vec<Output> {
        let jobs: Vec<(SessionId, u64, bool)> = batch.iter().map(|j| (j.session, j.seq, j.mirror)).collect();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.step(batch))) {
            Ok(outputs) => outputs,
            Err(_) => {
                crate::contain::CONTAINED.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    stage = self.stage,
                    frames = jobs.len(),
                    "a panic failed one batch; the stage keeps serving"
                );
                for (session, ..) in &jobs {
                    self.sessions.remove(session);
                    self.formats.remove(session);
                }
                (jobs.iter().filter(|j| !j.2))
                    .map(|&(session, seq, _)| {
                        Output::Error(ErrorReport {
                            session: Some(session),
                            seq,
                            code: ErrorCode::Internal,
                            message: "an internal fault at this stage failed the frame".into(),
                        })
                    })
                    .collect()
            }
        }
    }

    /// Runs one batch; every job gets an output or an error, except a
    /// shadow's copy (`mirror`), which answers nothing: if it cannot run
    /// (KV budget full, positions missing) the shadow's state for that
    /// session is dropped here, and a fail-over to this replica rebuilds.
    pub fn step(&mut self, jobs: Vec<Job>) -> Vec<Output> {
        let mirrors: HashSet<(SessionId, u64)> = jobs.iter().filter(|j| j.mirror).map(|j| (j.session, j.seq)).collect();
        let mut outputs = self.step_all(jobs);
        if !mirrors.is_empty() {
            let mut dropped = Vec::new();
            outputs.retain(|o| match o {
                Output::Error(e) if e.session.is_some_and(|s| mirrors.contains(&(s, e.seq))) => {
                    dropped.push((e.session, e.code));
                    false
                }
                _ => true,
            });
            for (session, code) in dropped {
                if let Some(s) = session {
                    self.sessions.remove(&s);
                    tracing::warn!(stage = self.stage, session = %s, ?code, "shadow copy refused; this replica no longer shadows the session");
                }
            }
        }
        outputs
    }

    fn step_all(&mut self, jobs: Vec<Job>) -> Vec<Output> {
        let mut outputs = Vec::new();
        let mut ready = Vec::new();
        let per_position = self.slice.new_session(0).bytes_per_position();
        let mut used = self.kv_bytes();
        for mut job in jobs {
            if !self.sessions.contains_key(&job.session) && job.start != 0 {
                // A late frame of a session already ended (or never begun
                // here): refused without creating state for it.
                outputs.push(Output::Error(ErrorReport {
                    session: Some(job.session),
                    seq: job.seq,
                    code: ErrorCode::Invalid,
                    message: format!("start position {} for a session this shard does not hold", job.start),
                }));
                continue;
            }
            if !self.sessions.contains_key(&job.session) && self.sessions.len() >= MAX_SESSIONS {
                outputs.push(Output::Error(ErrorReport {
                    session: Some(job.session),
                    seq: job.seq,
                    code: ErrorCode::KvFull,
                    message: format!("this shard holds {MAX_SESSIONS} sessions already"),
                }));
                continue;
            }
            let kv = self.sessions.entry(job.session).or_insert_with(|| self.slice.new_session(self.budget_bytes));
            let mut rollback = Ok(());
            if let Some(t) = job.truncate_to {
                used -= kv.bytes();
                rollback = kv.truncate(t);
                used += kv.bytes();
            }
            let error = if let Err(e) = rollback {
                Some((ErrorCode::Invalid, e.to_string()))
            } else if job.start != kv.len() {
                Some((
                    ErrorCode::Invalid,
                    format!("start position {} but {} positions are cached", job.start, kv.len()),
                ))
            } else if used + job.input.len() * per_position > self.budget_bytes {
                Some((
                    ErrorCode::KvFull,
                    format!("shard KV memory full ({} of {} bytes in use)", used, self.budget_bytes),
                ))
            } else {
                None
            };
            if let Some((code, message)) = error {
                outputs.push(Output::Error(ErrorReport { session: Some(job.session), seq: job.seq, code, message }));
                continue;
            }
            used += job.input.len() * per_position;
            let hidden = match std::mem::replace(&mut job.input, Input::Tokens(Vec::new())) {
                Input::Tokens(ids) => self.slice.embed(&ids),
                Input::Hidden(h) => Ok(h),
            };
            match hidden {
                Ok(h) => ready.push((job, h)),
                Err(e) => outputs.push(self.failure(&job, &e)),
            }
        }
        if ready.is_empty() {
            return outputs;
        }
        let results = self.forward(&mut ready);
        self.counters.jobs.fetch_add(ready.len() as u64, Ordering::Relaxed);
        let positions: usize = ready.iter().map(|(_, h)| h.n()).sum();
        self.counters.positions.fetch_add(positions as u64, Ordering::Relaxed);
        for ((job, _), result) in ready.into_iter().zip(results) {
            match result {
                Ok(out) => outputs.extend(self.deliver(job, out)),
                Err(e) => outputs.push(self.failure(&job, &e)),
            }
        }
        outputs
    }

    /// One batched forward; if the batch is refused, each job alone so
    /// that one bad job fails only itself.
    fn forward(&mut self, ready: &mut [(Job, Rows)]) -> Vec<Result<SliceOutput, ModelError>> {
        let logits = |w: Want| match w {
            Want::Nothing => Logits::None,
            Want::Last => Logits::Last,
            Want::All => Logits::All,
        };
        let mut kvs: Vec<(SessionId, SessionKv)> = ready
            .iter()
            .map(|(j, _)| {
                (
                    j.session,
                    self.sessions.remove(&j.session).unwrap_or_else(|| self.slice.new_session(self.budget_bytes)),
                )
            })
            .collect();
        let result = {
            let mut items: Vec<BatchItem<'_>> = ready
                .iter()
                .zip(kvs.iter_mut())
                .map(|((j, h), (_, kv))| BatchItem { hidden: h.clone(), kv, start: j.start, logits: logits(j.want) })
                .collect();
            self.slice.forward_batch(&mut items)
        };
        let results = match result {
            Ok(outs) => outs.into_iter().map(Ok).collect(),
            Err(_) if ready.len() > 1 => ready
                .iter()
                .zip(kvs.iter_mut())
                .map(|((j, h), (_, kv))| self.slice.forward(h.clone(), kv, j.start, logits(j.want)))
                .collect(),
            Err(e) => vec![Err(e)],
        };
        for (id, kv) in kvs {
            self.sessions.insert(id, kv);
        }
        results
    }

    fn deliver(&mut self, job: Job, out: SliceOutput) -> Vec<Output> {
        if job.mirror {
            // A shadow computes its KV and nothing more.
            return Vec::new();
        }
        match out {
            SliceOutput::Hidden(rows) => {
                let Some(&replica) = job.route.get(self.stage) else {
                    return vec![self.failure(&job, &ModelError::Invalid("the route names no next replica".into()))];
                };
                let frame = Forward {
                    session: job.session,
                    seq: job.seq,
                    start: job.start as u32,
                    truncate_to: job.truncate_to.map(|t| t as u32),
                    want: job.want,
                    route: job.route,
                    shadow: job.shadow,
                    mirror: false,
                    kv_lens: [job.kv_lens, vec![self.kv_len(job.session)]].concat(),
                    sampling: job.sampling,
                    precision: job.precision,
                    width: rows.width() as u32,
                    hidden: rows.into_vec(),
                };
                let mut out = Vec::with_capacity(2);
                // The next stage's shadow gets the same rows, to run into its KV only.
                if let Some(&shadow) = frame.shadow.get(self.stage).filter(|&&r| r != NO_SHADOW && r != replica) {
                    let copy = Forward { mirror: true, want: Want::Nothing, sampling: None, ..frame.clone() };
                    out.push(Output::Downstream { replica: shadow, frame: copy });
                }
                out.insert(0, Output::Downstream { replica, frame });
                out
            }
            SliceOutput::CacheOnly => Vec::new(),
            SliceOutput::Logits(rows) => vec![match self.verdict(&job, &rows) {
                Ok(v) => Output::Verdict(v),
                Err(e) => self.failure(&job, &e),
            }],
        }
    }

    /// The last stage's verdict on `rows` (one per wanted position): each
    /// masked by the session's response format when it has one, then
    /// transformed as the frame's sampling spec says.
    fn verdict(&mut self, job: &Job, rows: &Rows) -> Result<Verdict, ModelError> {
        let spec = job.sampling.as_deref().cloned().unwrap_or_else(SamplingSpec::greedy);
        let sampler = Sampler::new(SamplingParams {
            temperature: spec.temperature,
            top_k: spec.top_k as usize,
            top_p: spec.top_p,
            min_p: spec.min_p,
            repetition_penalty: spec.repetition_penalty,
            repetition_window: spec.history.len(),
            presence_penalty: spec.presence_penalty,
            frequency_penalty: spec.frequency_penalty,
            logit_bias: spec.logit_bias.clone(),
            logprobs: spec.logprobs,
            response_format: None,
            seed: 0,
        })?;
        let at = spec.output_at as usize;
        if (spec.presence_penalty != 0.0 || spec.frequency_penalty != 0.0 || spec.response_format.is_some())
            && at + rows.n() - 1 > spec.output.len()
        {
            return Err(ModelError::Invalid("the frame's output ends before its last position".into()));
        }
        let mut format = match &spec.response_format {
            None => None,
            Some(text) => Some(self.format_state(job.session, text)?),
        };
        let mut positions: Vec<Distribution> = Vec::with_capacity(rows.n());
        for i in 0..rows.n() {
            let before = &spec.output[..(at + i).min(spec.output.len())];
            let mut logits = std::borrow::Cow::Borrowed(rows.row(i));
            if let Some(f) = format.as_deref_mut() {
                // Past a token the format does not allow, no distribution is
                // read: that token is a draft (committed tokens were drawn
                // under the mask), rejected at the position before it, in
                // this frame or an earlier one in flight, and the entry
                // cancels what follows. Any valid distribution will do.
                match f.sync(before) {
                    Ok(()) => f.mask(logits.to_mut()).map_err(|e| ModelError::Invalid(e.to_string()))?,
                    Err(_) => {
                        if let Some(last) = positions.last().cloned() {
                            positions.push(last);
                            continue;
                        }
                    }
                }
            }
            positions.push(sampler.distribution(&logits, Seen { recent: &spec.history, output: before })?);
        }
        // Raw log-probabilities of the top alternatives, of every token the
        // entry may draw at each position, and of the token scored there.
        let logprobs = match spec.logprobs {
            Some(top) => positions
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    let also: Vec<u32> = d.iter().map(|e| e.0).chain(spec.scored.get(i).copied()).collect();
                    logprobs(rows.row(i), usize::from(top), &also)
                })
                .collect(),
            None => Vec::new(),
        };
        Ok(Verdict {
            session: job.session,
            seq: job.seq,
            positions,
            kv_lens: [job.kv_lens.clone(), vec![self.kv_len(job.session)]].concat(),
            logprobs,
        })
    }

    /// The session's matcher for the response format `text`, compiled on
    /// first use (and again if the format changes).
    fn format_state(&mut self, session: SessionId, text: &str) -> Result<&mut Constrained, ModelError> {
        let Some(vocabulary) = &self.vocabulary else {
            return Err(ModelError::Invalid("this stage has no vocabulary to enforce response formats with".into()));
        };
        let grammars = vocabulary.grammars().map_err(|e| ModelError::Invalid(e.to_string()))?;
        let entry = self.formats.entry(session);
        let held = match entry {
            std::collections::hash_map::Entry::Occupied(o) if o.get().0 == text => o.into_mut(),
            other => {
                let state = match self.compiled.iter().find(|(t, _)| t == text) {
                    Some((_, fresh)) => fresh.fork(),
                    None => {
                        let format = ResponseFormat::from_wire(text).map_err(|e| ModelError::Invalid(e.to_string()))?;
                        // The entry vetted it in a budgeted job: a failure
                        // here is not the client's text to echo.
                        let fresh = grammars
                            .compile(&format)
                            .map_err(|_| ModelError::Invalid("an unusable response format".into()))?;
                        let state = fresh.fork();
                        if self.compiled.len() >= COMPILED_FORMATS {
                            self.compiled.pop_front();
                        }
                        self.compiled.push_back((text.to_owned(), fresh));
                        state
                    }
                };
                match other {
                    std::collections::hash_map::Entry::Occupied(mut o) => {
                        o.insert((text.to_owned(), state));
                        o.into_mut()
                    }
                    std::collections::hash_map::Entry::Vacant(v) => v.insert((text.to_owned(), state)),
                }
            }
        };
        Ok(&mut held.1)
    }

    /// The session's cached positions now (observed, not inferred).
    fn kv_len(&self, session: SessionId) -> u32 {
        self.sessions.get(&session).map_or(0, |kv| kv.len() as u32)
    }

    fn failure(&self, job: &Job, e: &ModelError) -> Output {
        let code = match e {
            ModelError::KvBudget { .. } => ErrorCode::KvFull,
            ModelError::Invalid(_) => ErrorCode::Invalid,
            _ => ErrorCode::Internal,
        };
        Output::Error(ErrorReport { session: Some(job.session), seq: job.seq, code, message: e.to_string() })
    }
}
