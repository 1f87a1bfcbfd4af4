//! Inference speed and memory of the layer-slice engine next to llama.cpp
//! measured in the same run (through `scripts/reference/bench_llamacpp.py`
//! when llama-cpp-python is installed).
//!
//! `cargo bench -p veil-enclave --bench model` (needs `scripts/fetch-model.sh`).
//! The parent re-runs itself once per configuration so thread count and
//! resident memory are measured in clean processes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use veil_enclave::generate::{LocalModel, DEFAULT_KV_BUDGET_BYTES};
use veil_enclave::model::LayerSlice;

fn model_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("VEIL_MODEL") {
        return Some(PathBuf::from(p));
    }
    let dir = std::env::var_os("VEIL_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/veil/models"));
    let p = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    p.exists().then_some(p)
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

/// Child: measure speed with the thread count set in the environment.
fn child_speed(path: &Path) {
    let (model, _) = LocalModel::load(path, &[]).unwrap();
    let base: Vec<u32> = (0..512u32).map(|i| 200 + (i * 37) % 20_000).collect();
    let mut out = serde_json::Map::new();
    for n in [128usize, 512] {
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let mut s = model.session(DEFAULT_KV_BUDGET_BYTES);
            let t = Instant::now();
            model.step_last(&mut s, &base[..n]).unwrap();
            best = best.min(t.elapsed().as_secs_f64());
        }
        out.insert(format!("prefill_{n}_tok_s"), (n as f64 / best).into());
    }
    let mut s = model.session(DEFAULT_KV_BUDGET_BYTES);
    model.step_last(&mut s, &base[..16]).unwrap();
    let t = Instant::now();
    for i in 0..128 {
        model.step_last(&mut s, &[base[16 + i]]).unwrap();
    }
    out.insert("decode_128_tok_s".into(), (128.0 / t.elapsed().as_secs_f64()).into());
    println!("{}", serde_json::Value::Object(out));
}

fn layer_count(path: &Path) -> usize {
    let gguf = veil_enclave::model::GgufFile::open(path).unwrap();
    veil_enclave::model::Config::from_gguf(&gguf).unwrap().n_layer
}

/// Child: resident memory after loading `layers` (all when None).
fn child_memory(path: &Path, layers: Option<usize>) {
    let before = rss_mib();
    let slice = LayerSlice::load(path, 0..layers.unwrap_or_else(|| layer_count(path))).unwrap();
    let after = rss_mib();
    println!(
        "{}",
        serde_json::json!({ "rss_mib": after, "loaded_mib": after - before, "tensors": slice.manifest().len() })
    );
    drop(slice);
}

fn run_child(args: &[&str], threads: usize) -> Option<serde_json::Value> {
    run_child_with(args, threads, None)
}

/// A child with `VEIL_KERNELS` set to `kernels` (the kernels' A/B in one run).
fn run_child_with(args: &[&str], threads: usize, kernels: Option<&str>) -> Option<serde_json::Value> {
    let exe = std::env::current_exe().ok()?;
    let mut command = Command::new(exe);
    command.args(args).env("RAYON_NUM_THREADS", threads.to_string());
    if let Some(k) = kernels {
        command.env("VEIL_KERNELS", k);
    }
    let out = command.output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().rev().find_map(|l| serde_json::from_str(l).ok())
}

fn llamacpp(path: &Path, threads: usize) -> Option<serde_json::Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/reference/bench_llamacpp.py");
    let out = Command::new("python3").arg(script).arg(path).arg(threads.to_string()).output().ok()?;
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = model_path() else {
        println!("model not found: run scripts/fetch-model.sh (bench skipped)");
        return;
    };
    match args.get(1).map(String::as_str) {
        Some("child-speed") => return child_speed(&path),
        Some("child-memory") => return child_memory(&path, args.get(2).and_then(|a| a.parse().ok())),
        _ => {}
    }
    if args.iter().any(|a| a == "--test") {
        return; // `cargo test --benches`: nothing to time.
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    println!("\n{name}, CPU; best of 3 for prefill, 128 sequential steps for decode");
    println!("veil's kernels here: {}", veil_enclave::model::kernels::kernel_name());
    println!("{:<18} {:>8} {:>14} {:>14} {:>14}", "engine", "threads", "prefill 128/s", "prefill 512/s", "decode/s");
    let metrics = ["prefill_128_tok_s", "prefill_512_tok_s", "decode_128_tok_s"];
    let vnni_here = veil_enclave::model::kernels::vnni_available();
    for threads in [1usize, 2] {
        let ours = run_child(&["child-speed"], threads);
        // Where the CPU has VNNI, the AVX2 kernels beside the default ones in the same run.
        let avx2 = vnni_here.then(|| run_child_with(&["child-speed"], threads, Some("avx2"))).flatten();
        let theirs = llamacpp(&path, threads);
        let row = |name: &str, v: &Option<serde_json::Value>| {
            let cell = |k: &str| {
                v.as_ref().and_then(|v| v[k].as_f64()).map(|x| format!("{x:.1}")).unwrap_or_else(|| "n/a".into())
            };
            println!(
                "{:<18} {:>8} {:>14} {:>14} {:>14}",
                name,
                threads,
                cell(metrics[0]),
                cell(metrics[1]),
                cell(metrics[2])
            );
        };
        row("veil", &ours);
        if avx2.is_some() {
            row("veil, AVX2 only", &avx2);
        }
        row("llama.cpp", &theirs);
        if let (Some(a), Some(b)) = (&ours, &theirs) {
            let ratio = |k: &str| format!("{:.2}x", a[k].as_f64().unwrap_or(0.0) / b[k].as_f64().unwrap_or(f64::NAN));
            println!(
                "{:<18} {:>8} {:>14} {:>14} {:>14}",
                "ratio",
                threads,
                ratio(metrics[0]),
                ratio(metrics[1]),
                ratio(metrics[2])
            );
        }
    }
    if llamacpp(&path, 1).is_none() {
        println!("(llama.cpp reference unavailable: pip install llama-cpp-python==0.3.36)");
    }
    println!("\nresident memory after load (separate processes)");
    let n = layer_count(&path);
    let third = (n / 3).max(1).to_string();
    for (label, arg) in
        [(format!("full model ({n} layers)"), None), (format!("slice 0..{third}"), Some(third.as_str()))]
    {
        let mut a = vec!["child-memory"];
        if let Some(x) = arg {
            a.push(x);
        }
        let m = run_child(&a, 1);
        let f =
            |k: &str| m.as_ref().and_then(|m| m[k].as_f64()).map(|x| format!("{x:.1}")).unwrap_or_else(|| "n/a".into());
        println!("{label:<24} RSS {:>8} MiB (weights loaded {:>7} MiB)", f("rss_mib"), f("loaded_mib"));
    }
}
