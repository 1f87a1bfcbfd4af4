//! The sharded pipeline's speed, next to one process measured in the same
//! run: loopback 3 shards vs one process, aggregate decode with concurrent
//! sessions, decode over WAN-like links (the `veil-host` shim) against the
//! latency bound, and the time to detect and heal a killed shard.
//!
//! `cargo bench -p veil-enclave --bench pipeline` (needs `scripts/fetch-model.sh`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

#[path = "../tests/support/cluster.rs"]
mod cluster;

use std::time::{Duration, Instant};

use cluster::{greedy, local, model_path, Cluster};
use veil_enclave::generate::LocalModel;

const PROMPT: [u32; 5] = [504, 3575, 282, 4649, 314]; // "The capital of France is"

fn tok_s(tokens: usize, t: Duration) -> f64 {
    tokens as f64 / t.as_secs_f64()
}

fn main() {
    let Some(path) = model_path() else { return };
    let (model, tok) = LocalModel::load(&path, &[]).unwrap();
    let req = greedy(&PROMPT, 128);
    local(&model, &tok, &req); // warm
    let mut one = 0f64;
    let mut g = None;
    for _ in 0..3 {
        let t = Instant::now();
        let out = local(&model, &tok, &req);
        one = one.max(tok_s(out.ids.len(), t.elapsed()));
        g = Some(out);
    }
    let g = g.unwrap();
    let per_token = 1.0 / one;

    let mut c = Cluster::new("bench", &path, &[10, 20], &[1, 1, 1]);
    c.start_all();
    c.generate(&req).unwrap(); // warm links
    let mut three = 0f64;
    for _ in 0..3 {
        let t = Instant::now();
        let g3 = c.generate(&req).unwrap();
        three = three.max(tok_s(g3.ids.len(), t.elapsed()));
        assert_eq!(g3.ids, g.ids, "the pipeline's output differs from one process");
    }
    println!("\nSmolLM2-135M-Instruct Q4_1, greedy decode of 128 tokens (best of 3), 2-core CPU, separate processes on loopback");
    println!("{:<44} {:>12} {:>14} {:>8}", "setup", "tokens/s", "reference", "ratio");
    println!("{:<44} {:>12.1} {:>14} {:>8}", "one process", one, "", "");
    println!("{:<44} {:>12.1} {:>14.1} {:>7.2}x", "3 shards, loopback", three, one, three / one);

    let mut single = 0.0;
    for sessions in [1usize, 4, 8, 16] {
        let reqs: Vec<_> = (0..sessions)
            .map(|i| {
                let mut r = greedy(&PROMPT, 64);
                r.prompt_ids.as_mut().unwrap().push(200 + i as u32);
                r
            })
            .collect();
        let t = Instant::now();
        let total: usize = std::thread::scope(|s| {
            let c = &c;
            let hs: Vec<_> = reqs.iter().map(|r| s.spawn(move || c.generate(r).unwrap().ids.len())).collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        let agg = tok_s(total, t.elapsed());
        if sessions == 1 {
            single = agg;
        }
        println!(
            "{:<44} {:>12.1} {:>14.1} {:>7.2}x",
            format!("3 shards, {sessions} concurrent sessions (aggregate)"),
            agg,
            single,
            agg / single
        );
    }
    drop(c);

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    for delay_ms in [10u64, 25, 50] {
        let mut c = Cluster::new(&format!("wan{delay_ms}"), &path, &[10, 20], &[1, 1, 1]);
        let shims = c.start_behind_shims(&rt, Duration::from_millis(delay_ms));
        let req = greedy(&PROMPT, 32);
        c.generate(&req).unwrap();
        let t = Instant::now();
        let g = c.generate(&req).unwrap();
        let got = tok_s(g.ids.len(), t.elapsed());
        let bound = 1.0 / (3.0 * delay_ms as f64 / 1000.0 + per_token);
        println!(
            "{:<44} {:>12.1} {:>14.1} {:>7.2}x",
            format!("3 shards, {delay_ms} ms one-way per hop (vs bound)"),
            got,
            bound,
            got / bound
        );
        drop(c);
        rt.block_on(async {
            for s in shims {
                s.shutdown().await;
            }
        });
    }

    let mut c = Cluster::new("heal", &path, &[10, 20], &[1, 2, 1]);
    c.spawn(2, 0);
    c.spawn(1, 0);
    c.spawn(0, 0);
    c.wait_log(0, 0, "ready", 1);
    c.spawn(1, 1);
    c.wait_log(0, 0, "control link up", 3);
    let victim = c.children.iter().find(|((s, r), _)| (*s, *r) == (1, 0)).map(|(_, ch)| ch.id()).unwrap();
    let req = greedy(&PROMPT, 200);
    let mut times = Vec::new();
    let mut killed_at = None;
    c.stream(&req, |_| {
        times.push(Instant::now());
        if times.len() == 20 {
            std::process::Command::new("kill").args(["-KILL", &victim.to_string()]).status().unwrap();
            killed_at = Some(Instant::now());
        }
    })
    .unwrap();
    let killed_at = killed_at.unwrap();
    // The stall: the longest gap between tokens around the kill.
    let stall = times
        .windows(2)
        .filter(|w| w[1] > killed_at && w[0] < killed_at + Duration::from_secs(10))
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1000.0)
        .fold(0.0, f64::max);
    let gaps: Vec<f64> = times.windows(2).take(19).map(|w| (w[1] - w[0]).as_secs_f64() * 1000.0).collect();
    let normal = gaps.iter().sum::<f64>() / gaps.len() as f64;
    println!("{:<44} {:>10.0}ms {:>12.1}ms {:>8}", "kill -9 of the serving shard: longest stall", stall, normal, "");
    println!("(reference column: one process; for the heal row, the normal gap between tokens)");
}
