//! `veil-shard stage-memory`: loads one stage as `serve` would and reports
//! its memory against the bound docs/models.md states, computed from the
//! file's header before anything is loaded:
//!
//! ```text
//! peak RSS ≤ RSS before loading + 5/4 × the stage's weight bytes in the file
//!            + its largest tensor + 64 MiB
//! ```
//!
//! 5/4 covers the forms weights take in memory (MXFP4 kept at 20 bytes per
//! block of 17; a quantized embedding expanded to Q8_0); the largest tensor
//! is the one transient copy (its bytes as read, while the kernel's form is
//! built); 64 MiB covers the allocator, buffers and the tokenizer. Sessions'
//! KV caches come on top, each within the route's `kv_budget_mib`.

use std::path::PathBuf;

use crate::model::plan::{layer_of, Weights};
use crate::model::{Config, GgufFile, LayerSlice};

/// The constant of the bound.
const CONSTANT_BYTES: u64 = 64 << 20;

#[derive(Debug, clap::Args)]
pub(super) struct StageMemoryArgs {
    /// GGUF file (the first file of a split model).
    #[arg(long)]
    model: PathBuf,
    /// Layer range `START..END`.
    #[arg(long, value_parser = super::parse_range)]
    layers: veil_attestation::LayerRange,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(serde::Serialize)]
struct Report {
    layers: [usize; 2],
    weight_bytes: u64,
    largest_tensor_bytes: u64,
    rss_before: u64,
    rss_loaded: u64,
    peak_rss: u64,
    /// Wall time of the load: read, hash, prove the root, build the kernels' forms.
    load_seconds: f64,
    bound: u64,
    within: bool,
    manifest_proof: String,
}

fn status_bytes(key: &str) -> anyhow::Result<u64> {
    let s = std::fs::read_to_string("/proc/self/status")?;
    let line =
        s.lines().find(|l| l.starts_with(key)).ok_or_else(|| anyhow::anyhow!("no {key} in /proc/self/status"))?;
    let kib: u64 = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    Ok(kib * 1024)
}

pub(super) fn stage_memory(args: &StageMemoryArgs) -> anyhow::Result<bool> {
    let range = args.layers.start() as usize..args.layers.end() as usize;
    let mut gguf = GgufFile::open(&args.model)?;
    let n = Config::from_gguf(&gguf)?.n_layer;
    let w = Weights::from_gguf(&gguf)?;
    let in_range = |name: &str| match layer_of(name) {
        Some(i) => range.contains(&i),
        None => (name == "token_embd.weight" && range.start == 0) || range.end == n,
    };
    let largest = gguf.tensor_names().iter().filter(|t| in_range(t)).filter_map(|t| gguf.tensor_bytes(t)).max();
    let weight_bytes = w.layers.get(range.clone()).map_or(0, |l| l.iter().sum::<u64>())
        + if range.start == 0 { w.first } else { 0 }
        + if range.end == n { w.last } else { 0 };
    let rss_before = status_bytes("VmRSS:")?;
    let bound = rss_before + weight_bytes * 5 / 4 + largest.unwrap_or(0) + CONSTANT_BYTES;
    let started = std::time::Instant::now();
    let slice = LayerSlice::from_gguf(&mut gguf, range.clone())?;
    let load_seconds = started.elapsed().as_secs_f64();
    let (rss_loaded, peak_rss) = (status_bytes("VmRSS:")?, status_bytes("VmHWM:")?);
    let report = Report {
        layers: [range.start, range.end],
        weight_bytes,
        largest_tensor_bytes: largest.unwrap_or(0),
        rss_before,
        rss_loaded,
        peak_rss,
        load_seconds,
        bound,
        within: peak_rss <= bound,
        manifest_proof: format!("{:?}", slice.manifest().proof),
    };
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "layers {}..{}: weights {:.1} MiB in the file, largest tensor {:.1} MiB\n\
             loaded in {:.2} s; RSS {:.1} MiB before loading, {:.1} MiB loaded, peak {:.1} MiB; bound {:.1} MiB: {}\n\
             other stages' leaves: {}",
            range.start,
            range.end,
            mib(weight_bytes),
            mib(report.largest_tensor_bytes),
            report.load_seconds,
            mib(rss_before),
            mib(report.rss_loaded),
            mib(report.peak_rss),
            mib(bound),
            if report.within { "within" } else { "EXCEEDED" },
            report.manifest_proof
        );
    }
    Ok(report.within)
}
