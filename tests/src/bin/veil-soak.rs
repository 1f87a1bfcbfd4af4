//! `veil-soak`: the load side of `scripts/soak.sh`. An open-loop mix of
//! streamed and non-streamed greedy chats against a Veil host, through the
//! SDK (route verified, every request sealed), while the script kills
//! processes under it.
//!
//! ```text
//! veil-soak --url URL --policy FILE --seconds N [--rate R] [--seed S]
//!           [--ready FILE] [--report FILE]
//! ```
//!
//! 1. Reference: every (prompt, max_tokens) pair of the mix is asked once,
//!    one at a time, before any fault; its answer is the reference. Then
//!    `--ready` is created (the script starts killing).
//! 2. Load: for `--seconds`, requests arrive as a Poisson process of `--rate`
//!    per second (open loop: an arrival is sent whether or not earlier ones
//!    answered; at most [`MAX_IN_FLIGHT`] at once, arrivals past that are
//!    counted as `skipped`), each a random pair, streamed or not. An answer
//!    is compared with its pair's reference.
//! 3. Report (stdout, and `--report` as JSON): sent, completed, identical,
//!    failed by reason, time to first token and between tokens (p50/p99,
//!    streamed requests), ending with one line
//!    `soak: S sent, C completed, F failed, I identical, p99 ttft T ms`.
//!
//! Exit status: 0 when every completed answer is identical to its reference
//! and at least one request completed after the last quarter of the run
//! began (the service recovered from the faults); 1 otherwise; 2 for bad
//! arguments or a route that does not verify.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use veil_attestation::Policy;
use veil_client::sdk::{Client, ClientError, ConnectOptions, TextStream};

/// Requests in flight at most; arrivals past it are skipped and counted.
const MAX_IN_FLIGHT: usize = 64;
/// The mix: prompts (one a line, shared with scripts/bench-serving.py), and
/// the `max_tokens` each may ask for.
const PROMPT_LINES: &str = include_str!("../../data/chat-prompts.txt");
const LENGTHS: [u32; 3] = [8, 24, 48];

struct Args {
    url: String,
    policy: Policy,
    seconds: u64,
    rate: f64,
    seed: u64,
    ready: Option<std::path::PathBuf>,
    report: Option<std::path::PathBuf>,
}

fn args() -> anyhow::Result<Args> {
    let mut it = std::env::args().skip(1);
    let (mut url, mut policy, mut seconds, mut rate, mut seed, mut ready, mut report) =
        (None, None, None, 1.0, 1u64, None, None);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--url" => url = Some(value()?),
            "--policy" => policy = Some(value()?),
            "--seconds" => seconds = Some(value()?.parse::<u64>().context("--seconds")?),
            "--rate" => rate = value()?.parse::<f64>().context("--rate")?,
            "--seed" => seed = value()?.parse::<u64>().context("--seed")?,
            "--ready" => ready = Some(value()?.into()),
            "--report" => report = Some(value()?.into()),
            other => bail!("unknown argument {other} (see the file's header)"),
        }
    }
    if !(rate > 0.0 && rate <= 100.0) {
        bail!("--rate must be in (0, 100] requests per second");
    }
    let policy_path = policy.context("--policy FILE is required")?;
    let text = std::fs::read_to_string(&policy_path).with_context(|| format!("reading {policy_path}"))?;
    Ok(Args {
        url: url.context("--url URL is required")?,
        policy: Policy::from_toml(&text).with_context(|| policy_path.clone())?,
        seconds: seconds.context("--seconds N is required")?,
        rate,
        seed,
        ready,
        report,
    })
}

/// A small deterministic generator (SplitMix64): the mix and the arrival
/// times repeat for a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// The client in use; replaced when the entry restarts with a new key.
struct Shared {
    client: Mutex<Arc<Client>>,
    policy: Policy,
    options: ConnectOptions,
}

impl Shared {
    fn current(&self) -> Arc<Client> {
        self.client.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// One chat: the answer's text, and for a stream the time to its first
    /// piece and the gaps between pieces.
    async fn chat(&self, prompt: &str, max_tokens: u32, stream: bool) -> Result<Answer, ClientError> {
        let body = serde_json::json!({
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0, "stream": stream,
        });
        let bytes = serde_json::to_vec(&body).map_err(|e| ClientError::Config(e.to_string()))?;
        let client = self.current();
        let started = Instant::now();
        let (resp, fresh) =
            client.call_reverifying(&self.policy, &self.options, "POST", "/v1/chat/completions", bytes).await?;
        if let Some(fresh) = fresh {
            *self.client.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(fresh);
        }
        if !stream {
            if resp.status != 200 {
                return Err(veil_client::sdk::api_error(resp).await);
            }
            let body = resp.collect().await?;
            let v: serde_json::Value =
                serde_json::from_slice(&body).map_err(|e| ClientError::Protocol(e.to_string()))?;
            let text = v["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_owned();
            return Ok(Answer { text, ttft: None, gaps: Vec::new() });
        }
        let mut pieces = TextStream::new(resp).await?;
        let (mut text, mut ttft, mut gaps, mut last) = (String::new(), None, Vec::new(), Instant::now());
        while let Some(piece) = pieces.next_text().await? {
            let now = Instant::now();
            match ttft {
                None => ttft = Some(now - started),
                Some(_) => gaps.push(now - last),
            }
            last = now;
            text += &piece;
        }
        Ok(Answer { text, ttft, gaps })
    }
}

struct Answer {
    text: String,
    ttft: Option<Duration>,
    gaps: Vec<Duration>,
}

/// Why a request failed, in a few words (the error's kind, never content).
fn reason(e: &ClientError) -> String {
    match e {
        ClientError::Unreachable(_) => "unreachable".into(),
        ClientError::Refused { status, .. } => format!("refused {status}"),
        ClientError::Api { status, .. } => format!("api {status}"),
        ClientError::Timeout { stage, .. } => format!("timeout ({stage})"),
        ClientError::Seal(s) => match s {
            veil_client::seal::SealError::Open(_) => "truncated or altered".into(),
            veil_client::seal::SealError::Stalled(_) => "stalled".into(),
            veil_client::seal::SealError::Receipt(_) => "receipt".into(),
            _ => "seal".into(),
        },
        ClientError::Protocol(_) => "protocol".into(),
        ClientError::Attestation { .. } | ClientError::RouteRejected(_) | ClientError::Route(_) => {
            "route verification".into()
        }
        ClientError::Config(_) => "config".into(),
        _ => "other".into(),
    }
}

#[derive(Default)]
struct Tally {
    sent: u64,
    skipped: u64,
    completed: u64,
    identical: u64,
    late_completed: u64,
    failed: BTreeMap<String, u64>,
    different: Vec<String>,
    ttft: Vec<Duration>,
    gaps: Vec<Duration>,
}

fn quantile_ms(v: &mut [Duration], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort();
    let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[i].as_secs_f64() * 1e3
}

fn main() -> std::process::ExitCode {
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("veil-soak: {e:#}");
            return std::process::ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("veil-soak: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    match rt.block_on(run(args)) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("veil-soak: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

async fn run(args: Args) -> anyhow::Result<bool> {
    let options = ConnectOptions::default();
    let client = Client::connect_with(&args.url, &args.policy, &options).await.context("verifying the route")?;
    let shared = Arc::new(Shared { client: Mutex::new(Arc::new(client)), policy: args.policy.clone(), options });
    let prompts: Arc<Vec<&'static str>> = Arc::new(PROMPT_LINES.lines().filter(|l| !l.is_empty()).collect());

    // 1. The reference answers, before any fault.
    let mut reference = BTreeMap::new();
    for (p, prompt) in prompts.iter().enumerate() {
        for &n in &LENGTHS {
            let answer = shared.chat(prompt, n, false).await.with_context(|| format!("reference for prompt {p}"))?;
            reference.insert((p, n), answer.text);
        }
    }
    println!("soak: {} reference answers, the faults may start", reference.len());
    if let Some(ready) = &args.ready {
        std::fs::write(ready, b"ready\n").with_context(|| format!("writing {}", ready.display()))?;
    }
    let reference = Arc::new(reference);

    // 2. Open-loop load.
    let tally = Arc::new(Mutex::new(Tally::default()));
    let in_flight = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    let mut rng = Rng(args.seed);
    let started = Instant::now();
    let length = Duration::from_secs(args.seconds);
    let late = length.mul_f64(0.75);
    let mut next = Duration::ZERO;
    let mut tasks = Vec::new();
    let mut sent_last_report = Instant::now();
    while next < length {
        tokio::time::sleep_until(tokio::time::Instant::from_std(started + next)).await;
        // Exponential gaps: a Poisson process of `rate` per second.
        next += Duration::from_secs_f64(-(1.0 - rng.unit()).ln() / args.rate);
        let (p, n, stream) = (rng.below(prompts.len()), LENGTHS[rng.below(LENGTHS.len())], rng.below(2) == 0);
        let Ok(permit) = in_flight.clone().try_acquire_owned() else {
            tally.lock().unwrap_or_else(|e| e.into_inner()).skipped += 1;
            continue;
        };
        tally.lock().unwrap_or_else(|e| e.into_inner()).sent += 1;
        let (shared, reference, record, prompt) = (shared.clone(), reference.clone(), tally.clone(), prompts[p]);
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            let result = shared.chat(prompt, n, stream).await;
            let done = started.elapsed();
            let mut t = record.lock().unwrap_or_else(|e| e.into_inner());
            match result {
                Ok(answer) => {
                    t.completed += 1;
                    t.late_completed += u64::from(done >= late);
                    if reference.get(&(p, n)) == Some(&answer.text) {
                        t.identical += 1;
                    } else {
                        t.different.push(format!("prompt {p}, max_tokens {n}, stream {stream}"));
                    }
                    t.ttft.extend(answer.ttft);
                    t.gaps.extend(answer.gaps);
                }
                Err(e) => *t.failed.entry(reason(&e)).or_default() += 1,
            }
        }));
        if sent_last_report.elapsed() >= Duration::from_secs(30) {
            sent_last_report = Instant::now();
            let t = tally.lock().unwrap_or_else(|e| e.into_inner());
            let failed: u64 = t.failed.values().sum();
            println!(
                "soak: {:>4} s: {} sent, {} completed, {failed} failed",
                started.elapsed().as_secs(),
                t.sent,
                t.completed
            );
        }
    }
    for t in tasks {
        let _ = t.await;
    }

    // 3. The report.
    let mut t = tally.lock().unwrap_or_else(|e| e.into_inner());
    let failed: u64 = t.failed.values().sum();
    let (ttft50, ttft99) = (quantile_ms(&mut t.ttft, 0.5), quantile_ms(&mut t.ttft, 0.99));
    let (gap50, gap99) = (quantile_ms(&mut t.gaps, 0.5), quantile_ms(&mut t.gaps, 0.99));
    println!("soak: failed by reason: {:?}", t.failed);
    if t.skipped > 0 {
        println!("soak: {} arrivals skipped ({MAX_IN_FLIGHT} requests were in flight)", t.skipped);
    }
    for d in &t.different {
        println!("soak: DIFFERENT from the reference: {d}");
    }
    println!("soak: streamed: ttft p50 {ttft50:.0} ms, p99 {ttft99:.0} ms; between pieces p50 {gap50:.1} ms, p99 {gap99:.1} ms");
    println!(
        "soak: {} sent, {} completed, {failed} failed, {} identical, p99 ttft {ttft99:.0} ms",
        t.sent, t.completed, t.identical
    );
    if let Some(path) = &args.report {
        let report = serde_json::json!({
            "seconds": args.seconds, "rate": args.rate, "seed": args.seed,
            "sent": t.sent, "skipped": t.skipped, "completed": t.completed, "identical": t.identical,
            "completed_in_last_quarter": t.late_completed, "failed": t.failed, "different": t.different,
            "ttft_ms": {"p50": ttft50, "p99": ttft99}, "between_pieces_ms": {"p50": gap50, "p99": gap99},
        });
        std::fs::write(path, serde_json::to_vec_pretty(&report)?).with_context(|| format!("{}", path.display()))?;
    }
    let ok = t.identical == t.completed && t.late_completed > 0;
    if t.late_completed == 0 {
        println!("soak: FAIL: nothing completed in the last quarter of the run (the service did not recover)");
    }
    if t.identical != t.completed {
        println!("soak: FAIL: {} completed answers differ from the reference", t.completed - t.identical);
    }
    Ok(ok)
}
