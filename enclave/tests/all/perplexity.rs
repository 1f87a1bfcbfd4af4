//! `veil-shard perplexity` on real weights against llama.cpp's figures
//! (`testdata/perplexity`): the reference model (Q4_1 on Veil's kernels) and
//! Gemma 3 270M Q4_K_M as shipped (Q5_0 fallbacks on candle's kernels,
//! Q4_K/Q6_K/Q8_0 on Veil's), each within 1% of llama.cpp over the same
//! windows; and the reference model split in three stages scores exactly as
//! one process. Needs the models (SKIP without them unless required).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::cluster::model_path;

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/perplexity")
}

fn llamacpp(file: &str) -> f64 {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(testdata().join("llamacpp.json")).unwrap()).unwrap();
    v["perplexity"][file].as_f64().unwrap_or_else(|| panic!("no llama.cpp figure for {file}"))
}

/// Veil's perplexity of `model` over the fixture text (`extra` arguments added).
fn veil(model: &Path, extra: &[&str]) -> f64 {
    let o = Command::new(env!("CARGO_BIN_EXE_veil-shard"))
        .args(["perplexity", "--ctx", "512", "--chunks", "2", "--model"])
        .arg(model)
        .arg("--file")
        .arg(testdata().join("prose.txt"))
        .args(extra)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}\n{}", out, String::from_utf8_lossy(&o.stderr));
    out.lines().find_map(|l| l.strip_prefix("perplexity: ")).and_then(|v| v.parse().ok()).unwrap()
}

fn within(name: &str, veil: f64, reference: f64) {
    let diff = (veil - reference) / reference;
    println!("{name}: Veil {veil:.4}, llama.cpp {reference:.4} ({:+.2}%)", 100.0 * diff);
    assert!(
        diff.abs() < 0.01,
        "{name}: Veil's perplexity {veil} is {:+.2}% from llama.cpp's {reference}",
        100.0 * diff
    );
}

#[test]
fn the_reference_model_scores_as_llama_cpp_and_the_same_split_in_three() {
    let Some(path) = model_path() else { return };
    let whole = veil(&path, &[]);
    within("SmolLM2-135M Q4_1", whole, llamacpp("SmolLM2-135M-Instruct.Q4_1.gguf"));
    assert_eq!(veil(&path, &["--split", "10,20"]), whole, "three stages score differently from one process");
}

#[test]
fn gemma3_as_shipped_scores_as_llama_cpp() {
    let Some(path) = crate::gemma3::model_path() else { return };
    within("Gemma 3 270M Q4_K_M", veil(&path, &[]), llamacpp("gemma-3-270m-q4_k_m.gguf"));
}
