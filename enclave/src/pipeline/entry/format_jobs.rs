//! Response-format compiles as budgeted jobs.
//!
//! A JSON schema or a forced tool call's grammar is the client's text, and
//! compiling it is the one piece of request handling whose cost the client
//! chooses: the grammar engine recurses per `$ref` (a deep chain overflows a
//! thread's stack, which aborts the process) and intersects regular
//! expressions in steps its fuel does not bound (minutes of CPU and
//! gigabytes). So before a session starts, its format is vetted:
//!
//! ```text
//! vet(format) ─▶ structural limits (text::grammar::limits, microseconds) ─▶ 400 naming the limit
//!             ─▶ verdict cache (SHA-256 of the format; n choices compile once)
//!             ─▶ a permit (FormatBudget::workers at once, FormatBudget::queue waiting, else 503)
//!             ─▶ a worker process (`veil-shard format-worker`): compile on a thread
//!                of FORMAT_STACK_BYTES, watched for time and resident memory,
//!                killed past either or when the caller goes away (the client left)
//! ```
//!
//! A worker that crashes (its stack) takes only itself down. Only formats a
//! worker compiled within budget reach the in-process compiles, which run
//! on the stage worker threads with [`STAGE_STACK_BYTES`] of stack, four
//! times a worker's. [`FormatWorker::InProcess`] (library embedding and
//! tests without the binary) runs the compile on a thread of this process
//! instead: the same stack and time limit for the caller, but a compile
//! past its time keeps its thread (and its permit) until it ends, and
//! memory is not watched.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use crate::text::grammar::limits::{self, LimitExceeded};
use crate::text::grammar::{GrammarError, Grammars, ResponseFormat, Vocabulary, MAX_SCHEMA_BYTES};

/// Stack of the thread a format compiles on, in a worker process or in
/// process.
pub const FORMAT_STACK_BYTES: usize = 16 << 20;
/// Stack of a stage worker thread, which compiles vetted formats for its
/// sessions: four times [`FORMAT_STACK_BYTES`], so whatever compiled in a
/// worker compiles there.
pub const STAGE_STACK_BYTES: usize = 4 * FORMAT_STACK_BYTES;
/// Verdicts remembered (by the format's digest).
const CACHED_VERDICTS: usize = 256;
/// How long a time-limit refusal is remembered (it depends on load, unlike
/// the others).
const TIME_VERDICT_TTL: Duration = Duration::from_secs(60);
/// How often a worker's resident memory is read.
const MEMORY_POLL: Duration = Duration::from_millis(10);
/// Largest vocabulary a worker accepts (tokens, bytes of one token).
const MAX_WORDS: usize = 1 << 22;
const MAX_WORD_BYTES: usize = 1 << 16;

/// Where formats compile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FormatWorker {
    /// In worker processes of this executable (`veil-shard format-worker`).
    Process(PathBuf),
    /// On threads of this process (no memory limit, no kill; see the module
    /// documentation).
    InProcess,
}

impl FormatWorker {
    /// Worker processes of the running executable, when it is known.
    pub fn this_executable() -> Self {
        std::env::current_exe().map_or(Self::InProcess, Self::Process)
    }
}

/// What one format compile may cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FormatBudget {
    /// Longest compile.
    pub time: Duration,
    /// Most resident memory of a worker process while it compiles (its
    /// vocabulary included).
    pub memory_bytes: u64,
    /// Compiles at once.
    pub workers: usize,
    /// Compiles waiting for a worker; more are refused as busy.
    pub queue: usize,
}

impl Default for FormatBudget {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self { time: Duration::from_secs(2), memory_bytes: 512 << 20, workers: (cores / 2).max(1), queue: 16 }
    }
}

/// Why a format was refused. All but [`Busy`](Self::Busy) and
/// [`Unavailable`](Self::Unavailable) are the client's to fix (400).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FormatRefusal {
    /// Over a structural limit.
    #[error(transparent)]
    Limit(#[from] LimitExceeded),
    /// The engine cannot compile it (its reason, which may quote the
    /// client's own schema).
    #[error("{0}")]
    Invalid(String),
    /// The compile ran past [`FormatBudget::time`].
    #[error("the response format exceeds the limit `compile_time`: it did not compile within {} ms", .0.as_millis())]
    TimeLimit(Duration),
    /// The compile needed more than [`FormatBudget::memory_bytes`].
    #[error("the response format exceeds the limit `compile_memory`: it needed more than {} MiB to compile", .0 >> 20)]
    MemoryLimit(u64),
    /// The compile crashed its worker (its stack).
    #[error("the response format exceeds the limit `compile_stack`: it crashed the compiler")]
    Crashed,
    /// Every worker is busy and the queue is full.
    #[error("the response-format compiler is busy; retry later")]
    Busy,
    /// No worker could be started (the entry's fault).
    #[error("the response-format compiler is unavailable")]
    Unavailable(String),
}

impl FormatRefusal {
    /// Whether the client's request is at fault (400), not the entry (5xx).
    pub fn is_clients(&self) -> bool {
        !matches!(self, Self::Busy | Self::Unavailable(_))
    }
}

/// The entry's vetting service (see the module documentation).
pub struct FormatJobs {
    worker: FormatWorker,
    budget: FormatBudget,
    /// The vocabulary, encoded once for every worker process.
    vocabulary: Arc<Vec<u8>>,
    /// In process: the engine, built on first use.
    grammars: Arc<dyn Fn() -> Result<Arc<Grammars>, GrammarError> + Send + Sync>,
    permits: Arc<Semaphore>,
    waiting: AtomicUsize,
    idle: Mutex<Vec<WorkerProcess>>,
    verdicts: Mutex<Verdicts>,
    counters: FormatCounters,
}

impl std::fmt::Debug for FormatJobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FormatJobs").field("worker", &self.worker).field("budget", &self.budget).finish_non_exhaustive()
    }
}

/// What vetting has done (for metrics and tests).
#[derive(Debug, Default)]
pub struct FormatCounters {
    /// Compiles run (in a worker or in process), not counting cache hits.
    pub compiles: AtomicUsize,
    /// Worker processes started.
    pub spawned: AtomicUsize,
    /// Worker processes killed (time, memory, or the caller left).
    pub killed: AtomicUsize,
}

impl FormatCounters {
    /// The counters in Prometheus' text format.
    pub fn render(&self) -> String {
        let g = |c: &AtomicUsize| c.load(Ordering::Relaxed);
        let mut out = String::new();
        out += "# HELP veil_entry_format_compiles_total Response formats compiled to vet them (cache hits not counted).\n# TYPE veil_entry_format_compiles_total counter\n";
        out += &format!("veil_entry_format_compiles_total {}\n", g(&self.compiles));
        out += "# HELP veil_entry_format_workers_spawned_total Format worker processes started.\n# TYPE veil_entry_format_workers_spawned_total counter\n";
        out += &format!("veil_entry_format_workers_spawned_total {}\n", g(&self.spawned));
        out += "# HELP veil_entry_format_workers_killed_total Format worker processes killed (over time or memory, crashed, or the client left).\n# TYPE veil_entry_format_workers_killed_total counter\n";
        out += &format!("veil_entry_format_workers_killed_total {}\n", g(&self.killed));
        out
    }
}

impl FormatJobs {
    /// Vetting for `vocabulary`; `grammars` gives the in-process engine.
    pub fn new(
        worker: FormatWorker,
        budget: FormatBudget,
        vocabulary: &Vocabulary,
        grammars: impl Fn() -> Result<Arc<Grammars>, GrammarError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            worker,
            budget,
            vocabulary: Arc::new(encode_vocabulary(vocabulary)),
            grammars: Arc::new(grammars),
            permits: Arc::new(Semaphore::new(budget.workers.max(1))),
            waiting: AtomicUsize::new(0),
            idle: Mutex::new(Vec::new()),
            verdicts: Mutex::new(Verdicts::default()),
            counters: FormatCounters::default(),
        }
    }

    /// What vetting has done so far.
    pub fn counters(&self) -> &FormatCounters {
        &self.counters
    }

    /// Whether `format` compiles within the budget. Dropping the future
    /// (the client left) kills the compile.
    pub async fn vet(&self, format: &ResponseFormat) -> Result<(), FormatRefusal> {
        if matches!(format, ResponseFormat::JsonObject) {
            return Ok(());
        }
        // Each of a request's `n` sessions vets its format again: a hash and
        // a cache hit, not another parse.
        let wire = format.to_wire();
        let key: [u8; 32] = Sha256::digest(wire.as_bytes()).into();
        if let Some(v) = self.verdicts.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return v;
        }
        if let Err(e) = limits::check(format) {
            let refused = Err(FormatRefusal::Limit(e));
            self.verdicts.lock().unwrap_or_else(|p| p.into_inner()).put(key, refused.clone());
            return refused;
        }
        let permit = self.permit().await?;
        // Another request may have compiled it while this one waited.
        if let Some(v) = self.verdicts.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return v;
        }
        self.counters.compiles.fetch_add(1, Ordering::Relaxed);
        let verdict = match &self.worker {
            FormatWorker::Process(exe) => self.in_worker(exe, &wire).await,
            FormatWorker::InProcess => self.in_process(format.clone(), permit).await,
        };
        if !matches!(verdict, Err(FormatRefusal::Busy | FormatRefusal::Unavailable(_))) {
            self.verdicts.lock().unwrap_or_else(|p| p.into_inner()).put(key, verdict.clone());
        }
        verdict
    }

    async fn permit(&self) -> Result<OwnedSemaphorePermit, FormatRefusal> {
        if let Ok(p) = self.permits.clone().try_acquire_owned() {
            return Ok(p);
        }
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.budget.queue {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(FormatRefusal::Busy);
        }
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let _waiting = Waiting(&self.waiting);
        // Each compile ahead ends within its time, so a queue this long
        // drains within this wait unless workers hang.
        let wait = self.budget.time * (self.budget.queue as u32 + 1);
        match tokio::time::timeout(wait, self.permits.clone().acquire_owned()).await {
            Ok(Ok(p)) => Ok(p),
            _ => Err(FormatRefusal::Busy),
        }
    }

    async fn in_worker(&self, exe: &Path, wire: &str) -> Result<(), FormatRefusal> {
        // Until it answers, this future dropped (the caller left) kills the
        // worker, a new one included.
        let mut guard = KillCount(Some(&self.counters.killed));
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut worker = match idle {
            Some(w) => w,
            None => {
                self.counters.spawned.fetch_add(1, Ordering::Relaxed);
                match WorkerProcess::spawn(exe, &self.vocabulary).await {
                    Ok(w) => w,
                    Err(e) => {
                        guard.0 = None;
                        return Err(FormatRefusal::Unavailable(e));
                    }
                }
            }
        };
        let verdict = worker.compile(wire, &self.budget).await;
        match &verdict {
            Err(FormatRefusal::TimeLimit(_) | FormatRefusal::MemoryLimit(_) | FormatRefusal::Crashed) => {}
            Err(FormatRefusal::Unavailable(_)) => guard.0 = None,
            _ => {
                guard.0 = None;
                self.idle.lock().unwrap_or_else(|p| p.into_inner()).push(worker);
            }
        }
        verdict
    }

    async fn in_process(&self, format: ResponseFormat, permit: OwnedSemaphorePermit) -> Result<(), FormatRefusal> {
        let (tx, rx) = oneshot::channel();
        let grammars = self.grammars.clone();
        std::thread::Builder::new()
            .name("format-compile".into())
            .stack_size(FORMAT_STACK_BYTES)
            .spawn(move || {
                let _permit = permit;
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    grammars().and_then(|g| g.compile(&format)).map(|_| ())
                }));
                let _ = tx.send(result.unwrap_or(Err(GrammarError::Engine)));
            })
            .map_err(|e| FormatRefusal::Unavailable(e.to_string()))?;
        match tokio::time::timeout(self.budget.time, rx).await {
            Ok(Ok(r)) => r.map_err(|e| FormatRefusal::Invalid(e.to_string())),
            Ok(Err(_)) => Err(FormatRefusal::Crashed),
            Err(_) => Err(FormatRefusal::TimeLimit(self.budget.time)),
        }
    }
}

/// Counts a kill when dropped armed (the worker went with it).
struct KillCount<'a>(Option<&'a AtomicUsize>);

impl Drop for KillCount<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.0 {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Remembered verdicts, oldest out first.
#[derive(Default)]
struct Verdicts {
    map: HashMap<[u8; 32], (Result<(), FormatRefusal>, Instant)>,
    order: VecDeque<[u8; 32]>,
}

impl Verdicts {
    fn get(&self, key: &[u8; 32]) -> Option<Result<(), FormatRefusal>> {
        let (v, at) = self.map.get(key)?;
        if matches!(v, Err(FormatRefusal::TimeLimit(_))) && at.elapsed() > TIME_VERDICT_TTL {
            return None;
        }
        Some(v.clone())
    }

    fn put(&mut self, key: [u8; 32], v: Result<(), FormatRefusal>) {
        if self.map.insert(key, (v, Instant::now())).is_none() {
            self.order.push_back(key);
        }
        while self.order.len() > CACHED_VERDICTS {
            if let Some(old) = self.order.pop_front() {
                self.map.remove(&old);
            }
        }
    }
}

/// One worker process and its pipes; killed when dropped.
struct WorkerProcess {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::process::ChildStdout,
}

impl WorkerProcess {
    async fn spawn(exe: &Path, vocabulary: &[u8]) -> Result<Self, String> {
        let mut child = tokio::process::Command::new(exe)
            .arg("format-worker")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting a format worker: {e}"))?;
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("a format worker without pipes".into());
        };
        stdin.write_all(vocabulary).await.map_err(|e| format!("sending the vocabulary: {e}"))?;
        Ok(Self { child, stdin, stdout })
    }

    async fn compile(&mut self, wire: &str, budget: &FormatBudget) -> Result<(), FormatRefusal> {
        let gone = |e: std::io::Error| FormatRefusal::Unavailable(format!("the format worker: {e}"));
        self.stdin.write_all(&(wire.len() as u32).to_le_bytes()).await.map_err(gone)?;
        self.stdin.write_all(wire.as_bytes()).await.map_err(gone)?;
        self.stdin.flush().await.map_err(gone)?;
        let pid = self.child.id();
        let answer = async {
            let code = self.stdout.read_u8().await?;
            let len = self.stdout.read_u32_le().await? as usize;
            let mut message = vec![0; len.min(MAX_SCHEMA_BYTES)];
            self.stdout.read_exact(&mut message).await?;
            Ok::<_, std::io::Error>((code, String::from_utf8_lossy(&message).into_owned()))
        };
        let watch = async {
            loop {
                tokio::time::sleep(MEMORY_POLL).await;
                if pid.and_then(resident_bytes).is_some_and(|b| b > budget.memory_bytes) {
                    return;
                }
            }
        };
        let verdict = tokio::select! {
            a = answer => match a {
                Ok((0, _)) => Ok(()),
                Ok((_, m)) => Err(FormatRefusal::Invalid(m)),
                // It died mid-compile: its stack, or a signal.
                Err(_) => Err(FormatRefusal::Crashed),
            },
            () = watch => Err(FormatRefusal::MemoryLimit(budget.memory_bytes)),
            () = tokio::time::sleep(budget.time) => Err(FormatRefusal::TimeLimit(budget.time)),
        };
        if verdict.is_err() && !matches!(verdict, Err(FormatRefusal::Invalid(_))) {
            let _ = self.child.start_kill();
        }
        verdict
    }
}

/// Resident memory of process `pid` (Linux; `None` elsewhere).
fn resident_bytes(pid: u32) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // x86_64 and aarch64 Linux with 4 KiB pages, as the shard images are.
    Some(pages * 4096)
}

fn encode_vocabulary(v: &Vocabulary) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(v.words.len() as u32).to_le_bytes());
    for w in &v.words {
        out.extend_from_slice(&(w.len() as u32).to_le_bytes());
        out.extend_from_slice(w);
    }
    out.extend_from_slice(&v.eos.to_le_bytes());
    out.extend_from_slice(&(v.stop_ids.len() as u32).to_le_bytes());
    for s in &v.stop_ids {
        out.extend_from_slice(&s.to_le_bytes());
    }
    out
}

fn read_u32(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_bounded(r: &mut impl Read, max: usize) -> std::io::Result<Vec<u8>> {
    let len = read_u32(r)? as usize;
    if len > max {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "a length over its bound"));
    }
    let mut buf = vec![0; len];
    r.read_exact(&mut buf)?;
    Ok(buf)
}

fn decode_vocabulary(r: &mut impl Read) -> std::io::Result<Vocabulary> {
    let n = read_u32(r)? as usize;
    if n > MAX_WORDS {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "too many tokens"));
    }
    let mut words = Vec::with_capacity(n);
    for _ in 0..n {
        words.push(read_bounded(r, MAX_WORD_BYTES)?);
    }
    let eos = read_u32(r)?;
    let stops = read_u32(r)? as usize;
    if stops > n.max(1) {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "too many stop tokens"));
    }
    let stop_ids = (0..stops).map(|_| read_u32(r)).collect::<std::io::Result<_>>()?;
    Ok(Vocabulary { words, eos, stop_ids })
}

/// `veil-shard format-worker`: reads a vocabulary, then compiles formats
/// one at a time from stdin, answering each on stdout (0 = compiles, 1 =
/// refused, with the engine's reason). Runs on a thread of
/// [`FORMAT_STACK_BYTES`]; a format that overflows it ends this process.
pub fn run_worker() -> std::io::Result<()> {
    let handle =
        std::thread::Builder::new().name("format-worker".into()).stack_size(FORMAT_STACK_BYTES).spawn(|| {
            let mut input = std::io::stdin().lock();
            let mut output = std::io::stdout().lock();
            let vocabulary = decode_vocabulary(&mut input)?;
            let grammars = Grammars::from_vocabulary(&vocabulary);
            loop {
                let job = match read_bounded(&mut input, MAX_SCHEMA_BYTES + 4096) {
                    Ok(j) => j,
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
                    Err(e) => return Err(e),
                };
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let grammars = grammars.as_ref().map_err(Clone::clone)?;
                    let format = ResponseFormat::from_wire(&String::from_utf8_lossy(&job))?;
                    grammars.compile(&format).map(|_| ())
                }))
                .unwrap_or(Err(GrammarError::Engine));
                let (code, message) = match result {
                    Ok(()) => (0u8, String::new()),
                    Err(e) => (1u8, e.to_string()),
                };
                output.write_all(&[code])?;
                output.write_all(&(message.len() as u32).to_le_bytes())?;
                output.write_all(message.as_bytes())?;
                output.flush()?;
            }
        })?;
    handle.join().unwrap_or_else(|_| Err(std::io::Error::other("the format worker panicked")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vocabulary_round_trips_through_its_encoding() {
        let v = Vocabulary { words: vec![b"a".to_vec(), vec![], vec![0xff; 300]], eos: 2, stop_ids: vec![2, 0] };
        assert_eq!(decode_vocabulary(&mut encode_vocabulary(&v).as_slice()).unwrap(), v);
        let mut short = encode_vocabulary(&v);
        short.truncate(short.len() - 3);
        assert!(decode_vocabulary(&mut short.as_slice()).is_err());
        let mut huge = (MAX_WORDS as u32 + 1).to_le_bytes().to_vec();
        huge.extend_from_slice(&[0; 16]);
        assert!(decode_vocabulary(&mut huge.as_slice()).is_err());
    }

    #[test]
    fn verdicts_forget_the_oldest_and_expire_time_refusals() {
        let mut v = Verdicts::default();
        for i in 0..=CACHED_VERDICTS {
            let mut key = [0; 32];
            key[..8].copy_from_slice(&(i as u64).to_le_bytes());
            v.put(key, Ok(()));
        }
        assert_eq!(v.map.len(), CACHED_VERDICTS);
        assert!(v.get(&[0; 32]).is_none(), "the oldest verdict is gone");
        let key = [9; 32];
        v.map.insert(
            key,
            (Err(FormatRefusal::TimeLimit(Duration::from_secs(1))), Instant::now() - TIME_VERDICT_TTL * 2),
        );
        assert!(v.get(&key).is_none(), "an old time refusal is compiled again");
    }
}
