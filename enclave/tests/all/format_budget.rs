//! Response formats compile as budgeted jobs (issue 53, C1/C2): in worker
//! processes of `veil-shard` that are killed past their time or memory, when
//! the caller goes away, or that crash alone; the reviewer's two schemas are
//! refused by the structural limit they exceed, in milliseconds.
//!
//! Needs the reference model's vocabulary (`scripts/fetch-model.sh`); SKIP
//! without it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use veil_enclave::generate::LocalModel;
use veil_enclave::pipeline::entry::format_jobs::{FormatBudget, FormatJobs, FormatRefusal, FormatWorker};
use veil_enclave::text::grammar::ResponseFormat;
use veil_enclave::text::tokenizer::Tokenizer;

use crate::cluster::model_path;

const GENEROUS: FormatBudget =
    FormatBudget { time: Duration::from_secs(30), memory_bytes: 4 << 30, workers: 1, queue: 4 };

fn tokenizer() -> Option<Arc<Tokenizer>> {
    let path = model_path()?;
    Some(Arc::new(LocalModel::load(&path, &[]).unwrap().1))
}

fn jobs(tok: &Arc<Tokenizer>, worker: FormatWorker, budget: FormatBudget) -> FormatJobs {
    let engine = tok.clone();
    FormatJobs::new(worker, budget, &tok.vocabulary(), move || engine.grammars())
}

fn worker() -> FormatWorker {
    FormatWorker::Process(env!("CARGO_BIN_EXE_veil-shard").into())
}

fn schema(v: Value) -> ResponseFormat {
    ResponseFormat::JsonSchema { schema: v.to_string() }
}

/// The review's C1: ~400 chained `$defs`, each `anyOf [ {$ref: next}, integer ]`
/// (27 KB; it overflowed a tokio worker's stack and aborted the entry).
pub fn ref_chain(n: usize) -> Value {
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        let next = match i + 1 < n {
            true => json!({"anyOf": [{"$ref": format!("#/$defs/d{}", i + 1)}, {"type": "integer"}]}),
            false => json!({"type": "integer"}),
        };
        defs.insert(format!("d{i}"), next);
    }
    json!({"$defs": defs, "$ref": "#/$defs/d0"})
}

/// The review's C2: an `allOf` of `n` patterns like `".*a.*"` (about 1 KB at
/// 40; it ran the regex engine on a reactor thread for minutes).
pub fn pattern_pile(n: usize) -> Value {
    let all: Vec<Value> = (0..n)
        .map(|i| json!({"type": "string", "pattern": format!(".*{}.*", char::from(b'a' + (i % 26) as u8))}))
        .collect();
    json!({ "allOf": all })
}

/// `n` patterns intersected through nested `allOf`s of two (no one `allOf`
/// is wide).
fn nested_patterns(n: usize) -> Value {
    let mut v = json!({"type": "string", "pattern": ".*z.*"});
    for i in 0..n - 1 {
        v = json!({"allOf": [{"type": "string", "pattern": format!(".*{}.*", char::from(b'a' + i as u8))}, v]});
    }
    v
}

fn person() -> ResponseFormat {
    schema(json!({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}))
}

fn limit(r: Result<(), FormatRefusal>) -> &'static str {
    match r {
        Err(FormatRefusal::Limit(e)) => e.limit,
        other => panic!("not refused by a limit: {other:?}"),
    }
}

#[test]
fn the_reviews_schemas_are_refused_by_the_limit_they_exceed_in_milliseconds() {
    let Some(tok) = tokenizer() else { return };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let jobs = jobs(&tok, worker(), GENEROUS);
    let started = Instant::now();
    let c1 = schema(ref_chain(400));
    assert!(c1.to_wire().len() > 20_000, "the review's schema was about 27 KB");
    assert_eq!(limit(rt.block_on(jobs.vet(&c1))), "refs");
    assert_eq!(limit(rt.block_on(jobs.vet(&schema(pattern_pile(40))))), "branches");
    assert_eq!(limit(rt.block_on(jobs.vet(&schema(nested_patterns(13))))), "patterns");
    assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
    assert_eq!(jobs.counters().compiles.load(Ordering::Relaxed), 0, "refused before any compile");
    // At the limits, they compile (or are refused by the engine) in a worker.
    assert_eq!(rt.block_on(jobs.vet(&schema(ref_chain(64)))), Ok(()));
    let at_limit = rt.block_on(jobs.vet(&schema(nested_patterns(12))));
    assert!(matches!(at_limit, Err(FormatRefusal::Invalid(_))), "{at_limit:?}");
    assert_eq!(rt.block_on(jobs.vet(&person())), Ok(()));
    // n choices, or the same schema again: one compile.
    let compiles = jobs.counters().compiles.load(Ordering::Relaxed);
    for _ in 0..8 {
        assert_eq!(rt.block_on(jobs.vet(&person())), Ok(()));
    }
    assert_eq!(jobs.counters().compiles.load(Ordering::Relaxed), compiles);
    assert_eq!(jobs.counters().spawned.load(Ordering::Relaxed), 1, "one worker served every compile");
}

#[test]
fn a_compile_past_its_time_or_memory_is_killed_and_the_next_gets_a_new_worker() {
    let Some(tok) = tokenizer() else { return };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // A new worker builds the vocabulary's trie before its first compile:
    // more than 5 ms, and more than 1 MiB resident.
    let tight = FormatBudget { time: Duration::from_millis(5), ..GENEROUS };
    let jobs_t = jobs(&tok, worker(), tight);
    assert_eq!(rt.block_on(jobs_t.vet(&person())), Err(FormatRefusal::TimeLimit(tight.time)));
    assert_eq!(rt.block_on(jobs_t.vet(&schema(ref_chain(3)))), Err(FormatRefusal::TimeLimit(tight.time)));
    let c = jobs_t.counters();
    assert_eq!((c.spawned.load(Ordering::Relaxed), c.killed.load(Ordering::Relaxed)), (2, 2));
    let small = FormatBudget { memory_bytes: 1 << 20, ..GENEROUS };
    let jobs_m = jobs(&tok, worker(), small);
    assert_eq!(rt.block_on(jobs_m.vet(&person())), Err(FormatRefusal::MemoryLimit(small.memory_bytes)));
    assert_eq!(jobs_m.counters().killed.load(Ordering::Relaxed), 1);
    let e = FormatRefusal::TimeLimit(tight.time).to_string();
    assert!(e.contains("compile_time") && e.contains("5 ms"), "the 400 names the limit: {e}");
}

#[test]
fn a_caller_that_leaves_kills_its_compile_and_a_full_queue_is_busy() {
    let Some(tok) = tokenizer() else { return };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let jobs = jobs(&tok, worker(), FormatBudget { queue: 0, ..GENEROUS });
    rt.block_on(async {
        // The client leaves while its compile runs (a new worker is still
        // building its trie after 1 ms).
        let left = tokio::time::timeout(Duration::from_millis(1), jobs.vet(&person())).await;
        assert!(left.is_err());
        assert_eq!(jobs.counters().killed.load(Ordering::Relaxed), 1, "the compile was killed with its caller");
        // One worker, no queue: a second compile while one runs is refused.
        let first = person();
        let (a, b) = tokio::join!(jobs.vet(&first), async {
            tokio::task::yield_now().await;
            jobs.vet(&schema(ref_chain(2))).await
        });
        assert_eq!(a, Ok(()));
        assert_eq!(b, Err(FormatRefusal::Busy));
        assert!(!FormatRefusal::Busy.is_clients());
    });
}

#[test]
fn a_worker_that_dies_fails_its_format_alone() {
    let Some(tok) = tokenizer() else { return };
    let dir = std::env::temp_dir().join(format!("veil-format-worker-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A worker that reads its vocabulary and its job, then dies as a stack
    // overflow ends a process (SIGABRT) before it answers.
    let fake = dir.join("dies");
    std::fs::write(&fake, "#!/bin/sh\nexec 3<&0\ncat <&3 >/dev/null &\nsleep 0.5\nkill -ABRT $$\n").unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let jobs = jobs(&tok, FormatWorker::Process(fake), GENEROUS);
    assert_eq!(rt.block_on(jobs.vet(&person())), Err(FormatRefusal::Crashed));
    let _ = std::fs::remove_dir_all(&dir);
    // In process (no binary): the same limits, and a compile on a sized stack.
    let inproc = self::jobs(&tok, FormatWorker::InProcess, GENEROUS);
    assert_eq!(rt.block_on(inproc.vet(&person())), Ok(()));
    assert_eq!(limit(rt.block_on(inproc.vet(&schema(ref_chain(400))))), "refs");
}
