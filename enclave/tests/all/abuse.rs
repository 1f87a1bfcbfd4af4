//! One abusive client (oversized chats, absurd max_tokens, floods of tiny
//! requests and attestation fetches, slow-loris uploads) next to honest
//! concurrent sessions through the host relay: no honest request fails, no
//! shard is dropped. The latency table with and without the abuser is the
//! benchmark's (`cargo bench -p veil-enclave --bench abuse`).
//!
//! Needs the reference model (`scripts/fetch-model.sh`); SKIP without it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use crate::cluster;

use crate::abuse_support as abuse;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cluster::{model_path, Cluster};

#[test]
fn an_abusive_client_fails_no_honest_request_and_drops_no_shard() {
    let Some(path) = model_path() else { return };
    let mut c = Cluster::new("abuse", &path, &[10, 20], &[1, 1, 1]);
    c.start_all();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let host = abuse::relay(&rt, c.route.sealed_listen.unwrap());
    let policy = veil_enclave::pipeline::shard::load_policy(&c.route.policy).unwrap();
    let url = format!("http://{host}");
    let client = Arc::new(rt.block_on(veil_client::sdk::Client::connect(&url, &policy)).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(abuse::Abuse::default());
    let attacker = rt.spawn(abuse::abuser(client.clone(), host, stop.clone(), counts.clone()));
    let honest = rt.block_on(abuse::honest_load(client, 16, 2, 6));
    stop.store(true, Ordering::Relaxed);
    rt.block_on(attacker).unwrap();
    println!(
        "honest: {} ok, p50 {:.0} ms, p99 {:.0} ms; abuser: {counts:?}",
        honest.latencies_ms.len(),
        honest.quantile(0.5),
        honest.quantile(0.99)
    );
    assert!(honest.failures.is_empty(), "honest requests failed: {:#?}", honest.failures);
    assert_eq!(honest.latencies_ms.len(), 32);
    assert!(counts.many_messages.load(Ordering::Relaxed) > 0 && counts.slow_loris.load(Ordering::Relaxed) > 0);
    assert!(counts.refused.load(Ordering::Relaxed) > 0, "the abuser's bad requests were not refused");
    let entry = std::fs::read_to_string(c.log(0, 0)).unwrap();
    assert!(!entry.contains("shard lost"), "a shard was dropped under abuse:\n{entry}");
}
