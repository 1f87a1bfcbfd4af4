//! Speculative decoding over WAN-like links: a 3-shard ring behind the
//! `veil-host` shim at 0, 10, 25 and 50 ms one way per hop; per drafter the
//! decode speed next to plain decoding in the same run, the measured
//! acceptance a, mean k and tokens per round, and the analytic bound
//! E[g]/T: Σ over rounds of (1 − a^(k+1)) / (1 − a) for the k each round
//! used, over the rounds' time (round trip plus drafting).
//!
//! Drafters: prompt lookup (n-gram), a draft model derived from the target
//! (its first 24 layers, `veil-shard derive-draft`), the target itself as a
//! draft model (a strong drafter: a near 1 for greedy), and a useless
//! drafter (always wrong) that adaptive k must back off from. Prompts: novel
//! prose, and a code edit whose answer repeats the prompt (draftable).
//!
//! `cargo bench -p veil-enclave --bench speculation` (needs `scripts/fetch-model.sh`;
//! `VEIL_SPEC_DELAYS=0,25` runs only those delays).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

#[path = "../tests/support/cluster.rs"]
mod cluster;

use std::path::Path;
use std::time::{Duration, Instant};

use cluster::{greedy, model_path, Cluster};
use veil_enclave::generate::Generation;
use veil_enclave::pipeline::entry::{GenerateWire, SpeculationRequest};
use veil_host::wan::WanShim;

const TOKENS: usize = 48;

const PROSE: &str = "Write a short story about a lighthouse keeper who finds a message in a bottle.";
const EDIT: &str = "Rename the function `add` to `sum_two` and change nothing else:\n\n```python\ndef add(a, b):\n    \"\"\"Return the sum of a and b.\"\"\"\n    result = a + b\n    return result\n\n\nprint(add(2, 3))\nprint(add(10, 20))\n```";

/// A cluster whose processes reach each other through shims adding
/// `delay_ms` one way per hop, with `draft` as the entry's draft model.
fn start(
    name: &str,
    model: &Path,
    draft: &Path,
    delay_ms: u64,
    rt: &tokio::runtime::Runtime,
) -> (Cluster, Vec<WanShim>) {
    let mut c = Cluster::new(name, model, &[10, 20], &[1, 1, 1]);
    c.set_draft_model(draft, 8);
    if delay_ms == 0 {
        c.start_all();
        return (c, Vec::new());
    }
    let shims = c.start_behind_shims(rt, Duration::from_millis(delay_ms));
    (c, shims)
}

/// Decode tokens per second (after the first token) and the generation.
fn run(c: &Cluster, req: &GenerateWire) -> (f64, Generation) {
    let start = Instant::now();
    let mut first = None;
    let g = c.stream(req, |_| {
        first.get_or_insert_with(Instant::now);
    });
    let g = g.unwrap();
    let end = Instant::now();
    let decode = end - first.unwrap_or(start);
    ((g.ids.len().saturating_sub(1)) as f64 / decode.as_secs_f64(), g)
}

fn request(prompt: &str, drafter: Option<&str>, script: Option<Vec<u32>>) -> GenerateWire {
    let mut r = greedy(&[], TOKENS);
    (r.prompt, r.prompt_ids, r.chat) = (Some(prompt.into()), None, true);
    r.speculation = match drafter {
        None => SpeculationRequest { enabled: Some(false), ..Default::default() },
        Some(d) => SpeculationRequest {
            enabled: Some(true),
            drafter: Some(d.parse().unwrap()),
            k: None,
            depth: Some(1),
            script,
        },
    };
    r
}

fn main() {
    let Some(path) = model_path() else { return };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = std::env::temp_dir().join(format!("veil-specbench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let derived = dir.join("draft-24-layers.gguf");
    veil_enclave::speculate::derive::derive_draft(&path, &derived, &(0..24).collect::<Vec<_>>(), None).unwrap();

    println!("\nSmolLM2-135M-Instruct Q4_1, 3 shards, greedy, {TOKENS} tokens, adaptive k ≤ 8; decode tok/s after the first token");
    println!(
        "{:>5} {:<6} {:<22} {:>8} {:>8} {:>7} {:>6} {:>6} {:>9} {:>8} {:>9}",
        "delay", "prompt", "drafter", "tok/s", "plain", "speedup", "a", "k", "tok/round", "bound", "of bound"
    );
    // `VEIL_SPEC_DELAYS=0,25` runs a subset.
    let delays: Vec<u64> = std::env::var("VEIL_SPEC_DELAYS")
        .ok()
        .map(|v| v.split(',').filter_map(|d| d.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![0, 10, 25, 50]);
    for delay_ms in delays {
        // Two clusters per delay: the entry's draft model is the derived
        // draft in one and the target itself in the other.
        for (draft_name, draft) in [("derived 24/30 layers", derived.as_path()), ("target as draft", path.as_path())] {
            let (c, shims) = start(&format!("spec{delay_ms}-{}", draft_name.len()), &path, draft, delay_ms, &rt);
            for (pname, prompt) in [("prose", PROSE), ("edit", EDIT)] {
                run(&c, &request(prompt, None, None)); // warm
                let (plain, want) = run(&c, &request(prompt, None, None));
                let wrong: Vec<u32> = want.ids.iter().map(|t| t ^ 1).collect();
                let mut drafters: Vec<(String, GenerateWire)> =
                    vec![(format!("model: {draft_name}"), request(prompt, Some("model"), None))];
                if draft_name.starts_with("derived") {
                    drafters.push(("ngram".into(), request(prompt, Some("ngram"), None)));
                    drafters.push(("useless (always wrong)".into(), request(prompt, Some("script"), Some(wrong))));
                }
                for (name, req) in drafters {
                    let (speed, g) = run(&c, &req);
                    assert_eq!(g.ids, want.ids, "{name}: speculation changed greedy output");
                    let s = g.speculation.clone().unwrap();
                    let a = s.acceptance();
                    let k = if s.spec_rounds == 0 { 0.0 } else { s.drafted as f64 / s.spec_rounds as f64 };
                    let per_round = g.ids.len() as f64 / (s.rounds + 1) as f64;
                    // The bound for the measured a, the k each round used
                    // and the time the rounds took (drafting included).
                    let t = (s.round_micros + s.draft_micros) as f64 / 1e6;
                    let bound = s.expected_tokens() / t;
                    println!(
                        "{:>3}ms {:<6} {:<22} {:>8.1} {:>8.1} {:>6.2}x {:>6.2} {:>6.1} {:>9.2} {:>8.1} {:>8.0}%",
                        delay_ms,
                        pname,
                        name,
                        speed,
                        plain,
                        speed / plain,
                        a,
                        k,
                        per_round,
                        bound,
                        100.0 * speed / bound
                    );
                }
            }
            drop(c);
            rt.block_on(async {
                for s in shims {
                    s.shutdown().await;
                }
            });
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
