//! Loading a model larger than one machine, stage by stage, next to
//! llama.cpp loading it whole, measured in the same run.
//!
//! `VEIL_SPLIT_MODEL=FIRST.gguf cargo bench -p veil-enclave --bench stages`
//! (`scripts/bench-models.sh` writes an 8.6 GB three-file model). Each stage
//! loads in a fresh `veil-shard stage-memory` process (load time, peak RSS,
//! the stated bound); the manifest file that lets a stage prove the model
//! root without reading other stages' tensors is written once first, and
//! timed. llama.cpp (`scripts/reference/load_llamacpp.py`, when
//! llama-cpp-python is installed) loads the whole model, memory-mapped (its
//! default) and read into memory. The page cache is warm for both.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

fn shard() -> Command {
    Command::new(env!("CARGO_BIN_EXE_veil-shard"))
}

fn json_of(out: &std::process::Output) -> Option<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout).lines().rev().find_map(|l| serde_json::from_str(l).ok())
}

fn llamacpp(path: &Path, mode: &str) -> Option<serde_json::Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/reference/load_llamacpp.py");
    let out = Command::new("python3").arg(script).arg(path).arg(mode).output().ok()?;
    out.status.success().then(|| json_of(&out)).flatten()
}

/// The files of a model: `PREFIX-0000i-of-0000N.gguf` beside a split
/// model's first file, or the one file.
fn split_files(first: &Path, count: usize) -> Vec<PathBuf> {
    let name = first.file_name().unwrap_or_default().to_string_lossy().into_owned();
    match name.strip_suffix(&format!("-00001-of-{count:05}.gguf")) {
        Some(prefix) if count > 1 => {
            (1..=count).map(|i| first.with_file_name(format!("{prefix}-{i:05}-of-{count:05}.gguf"))).collect()
        }
        _ => vec![first.to_path_buf()],
    }
}

fn layer_count(path: &Path) -> usize {
    let gguf = veil_enclave::model::GgufFile::open(path).unwrap();
    veil_enclave::model::Config::from_gguf(&gguf).unwrap().n_layer
}

fn main() {
    if std::env::args().any(|a| a == "--test") {
        return; // `cargo test --benches`: nothing to time.
    }
    let Some(path) = std::env::var_os("VEIL_SPLIT_MODEL").map(PathBuf::from) else {
        println!("VEIL_SPLIT_MODEL not set: run scripts/bench-models.sh DIR, then point it at DIR/qwen3-30b-a3b-24l-q4_k-00001-of-00003.gguf (bench skipped)");
        return;
    };
    let stages: usize = std::env::var("VEIL_STAGES").ok().and_then(|s| s.parse().ok()).unwrap_or(3);
    let files = veil_enclave::model::GgufFile::open(&path).unwrap().files();
    let disk: u64 = split_files(&path, files).iter().map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0)).sum();
    let n = layer_count(&path);
    let gib = |b: f64| b / (1u64 << 30) as f64;
    let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
    println!(
        "\n{name}: {files} files, {:.2} GiB on disk, {n} layers, {stages} stages; page cache warm",
        gib(disk as f64)
    );

    let t = Instant::now();
    let written = shard().args(["manifest"]).arg(&path).arg("--write").output().unwrap();
    assert!(written.status.success(), "manifest --write failed: {}", String::from_utf8_lossy(&written.stderr));
    println!("manifest file written once per model (hashes every tensor): {:.1} s", t.elapsed().as_secs_f64());

    println!("\n{:<24} {:>12} {:>10} {:>14} {:>12}", "load", "weights GiB", "load s", "peak RSS GiB", "bound GiB");
    let per = n.div_ceil(stages);
    for s in 0..stages {
        let (a, b) = (s * per, ((s + 1) * per).min(n));
        let out = shard()
            .args(["stage-memory", "--model"])
            .arg(&path)
            .args(["--layers", &format!("{a}..{b}"), "--json"])
            .output()
            .unwrap();
        let Some(r) = json_of(&out) else {
            println!("stage {s}: no report ({})", String::from_utf8_lossy(&out.stderr).trim());
            continue;
        };
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        println!(
            "{:<24} {:>12.2} {:>10.2} {:>14.2} {:>12.2}",
            format!("veil stage {s} ({a}..{b})"),
            gib(f("weight_bytes")),
            f("load_seconds"),
            gib(f("peak_rss")),
            gib(f("bound"))
        );
    }
    for mode in ["mmap", "read"] {
        match llamacpp(&path, mode) {
            Some(r) => println!(
                "{:<24} {:>12.2} {:>10.2} {:>14.2} {:>12}",
                format!("llama.cpp whole ({mode})"),
                gib(disk as f64),
                r["load_seconds"].as_f64().unwrap_or(f64::NAN),
                gib(r["peak_rss"].as_f64().unwrap_or(f64::NAN)),
                "-"
            ),
            None => println!("llama.cpp ({mode}) unavailable: pip install llama-cpp-python==0.3.36"),
        }
    }
}
