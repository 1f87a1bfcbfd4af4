//! Honest latency with and without one abusive client, through the host
//! relay to a 3-stage cluster on loopback: 64 concurrent sessions × 4
//! sealed chat requests (8 tokens, greedy), then the same next to a client
//! sending oversized chats, absurd max_tokens, floods of tiny requests and
//! attestation fetches, and slow-loris uploads. Prints p50/p99 side by side
//! and the failures (which must be none).
//!
//! `cargo bench -p veil-enclave --bench abuse` (needs `scripts/fetch-model.sh`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

#[path = "../tests/support/cluster.rs"]
mod cluster;

#[path = "../tests/support/abuse.rs"]
mod abuse;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cluster::{model_path, Cluster};

const SESSIONS: usize = 64;
const PER_SESSION: usize = 4;
const TOKENS: usize = 8;
/// Route verifications (`veil verify`'s work) per row.
const VERIFICATIONS: usize = 20;

fn main() {
    let Some(path) = model_path() else { return };
    let mut c = Cluster::new("abusebench", &path, &[10, 20], &[1, 1, 1]);
    c.start_all();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let host = abuse::relay(&rt, c.route.sealed_listen.unwrap(), SESSIONS);
    let policy = veil_enclave::pipeline::shard::load_policy(&c.route.policy).unwrap();
    let client = Arc::new(rt.block_on(veil_client::sdk::Client::connect(&format!("http://{host}"), &policy)).unwrap());
    let url = format!("http://{host}");
    let alone = rt.block_on(abuse::honest_load(client.clone(), SESSIONS, PER_SESSION, TOKENS));
    let verified_alone = rt.block_on(abuse::honest_verifications(&url, &policy, VERIFICATIONS));
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(abuse::Abuse::default());
    let bad = Arc::new(rt.block_on(abuse::abuser_client(&url, &policy)));
    let attacker = rt.spawn(abuse::abuser(bad, host, stop.clone(), counts.clone()));
    std::thread::sleep(std::time::Duration::from_secs(1));
    let verifier = {
        let (url, policy) = (url.clone(), policy.clone());
        rt.spawn(async move { abuse::honest_verifications(&url, &policy, VERIFICATIONS).await })
    };
    let abused = rt.block_on(abuse::honest_load(client, SESSIONS, PER_SESSION, TOKENS));
    let verified_abused = rt.block_on(verifier).unwrap();
    stop.store(true, Ordering::Relaxed);
    rt.block_on(attacker).unwrap();
    let entry = std::fs::read_to_string(c.log(0, 0)).unwrap();
    println!(
        "{SESSIONS} concurrent sessions x {PER_SESSION} sealed chat requests ({TOKENS} tokens), 3 stages, host relay"
    );
    println!("| | honest ok / failed | p50 ms | p99 ms |");
    println!("|---|---|---|---|");
    for (name, h) in [
        ("chat, alone", &alone),
        ("chat, next to the abuser", &abused),
        ("route verification, alone", &verified_alone),
        ("route verification, next to the abuser", &verified_abused),
    ] {
        println!(
            "| {name} | {} / {} | {:.0} | {:.0} |",
            h.latencies_ms.len(),
            h.failures.len(),
            h.quantile(0.5),
            h.quantile(0.99)
        );
    }
    println!(
        "abuser sent: {} oversized chats, {} absurd max_tokens, {} tiny requests, {} attestation fetches (64 \
         keep-alive clients), {} abandoned non-streamed requests, {} slow-loris uploads; {} refused",
        counts.many_messages.load(Ordering::Relaxed),
        counts.huge_max_tokens.load(Ordering::Relaxed),
        counts.tiny.load(Ordering::Relaxed),
        counts.attestations.load(Ordering::Relaxed),
        counts.abandoned.load(Ordering::Relaxed),
        counts.slow_loris.load(Ordering::Relaxed),
        counts.refused.load(Ordering::Relaxed)
    );
    println!("shards dropped during the run: {}", entry.matches("shard lost").count());
    for f in alone.failures.iter().chain(&abused.failures).chain(&verified_abused.failures).take(10) {
        println!("FAILED: {f}");
    }
}
