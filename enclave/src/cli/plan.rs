//! `veil-shard plan`: a pipeline split balanced by weight bytes, per stage
//! its weights, its KV cache per 1,000 positions and whether it fits a
//! device's memory; optionally written out as a route to complete with
//! addresses and `veil-shard prepare`.

use std::path::PathBuf;

use anyhow::Context as _;

use crate::model::plan::Weights;

/// Arguments of `veil-shard plan`.
#[derive(clap::Args, Debug)]
pub(crate) struct PlanArgs {
    /// The GGUF to split (only its header is read).
    #[arg(long, conflicts_with = "shape")]
    model: Option<PathBuf>,
    /// Or a named shape (`synth-model`'s names), for a model too large to have at hand.
    #[arg(long)]
    shape: Option<String>,
    /// With `--shape`: the matrices' quantization (`q4_0`, `q8_0`, `q4_k`, `q6_k`, `f16`).
    #[arg(long, default_value = "q4_k")]
    dtype: String,
    /// Stages.
    #[arg(long)]
    stages: usize,
    /// Memory of each stage's device, bytes (suffixes k, M, G, T and KiB, MiB, GiB, TiB).
    #[arg(long, value_parser = parse_bytes)]
    gpu_mem: Option<u64>,
    /// Write the route (stages and layer ranges; addresses to fill in) here.
    #[arg(long)]
    out: Option<PathBuf>,
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("{s:?} is not a size"))?;
    let mult: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "k" | "kB" | "K" => 1e3,
        "M" | "MB" => 1e6,
        "G" | "GB" => 1e9,
        "T" | "TB" => 1e12,
        "KiB" => 1024.0,
        "MiB" => 1024f64.powi(2),
        "GiB" => 1024f64.powi(3),
        "TiB" => 1024f64.powi(4),
        other => return Err(format!("unknown unit {other:?}")),
    };
    Ok((n * mult) as u64)
}

fn gb(b: u64) -> String {
    format!("{:.2} GB", b as f64 / 1e9)
}

/// Runs `veil-shard plan`.
pub(crate) fn plan(args: PlanArgs) -> anyhow::Result<()> {
    let (weights, label) = match (&args.model, &args.shape) {
        (Some(path), None) => {
            let g = crate::model::GgufFile::open(path)?;
            (Weights::from_gguf(&g)?, path.display().to_string())
        }
        (None, Some(name)) => {
            let shape = crate::model::synth::Shape::named(name)
                .ok_or_else(|| anyhow::anyhow!("unknown shape {name:?} (see synth-model --help)"))?;
            let dtype = super::synth_dtype(&args.dtype)?;
            (Weights::from_shape(&shape, dtype), format!("shape {name}, {} matrices", args.dtype))
        }
        _ => anyhow::bail!("give --model GGUF or --shape NAME"),
    };
    let stages = weights.plan(args.stages)?;
    println!("{label}: {} layers, {} of weights, {} stages", weights.layers.len(), gb(weights.total()), stages.len());
    println!(
        "{:<6} {:>9} {:>12} {:>16} {:>6} {:>22}",
        "stage", "layers", "weights", "KV / 1000 pos", "fits", "KV positions that fit"
    );
    let mut kv_fit = Vec::new();
    for (i, s) in stages.iter().enumerate() {
        let (fits, room) = match args.gpu_mem {
            Some(mem) if mem > s.weight_bytes => {
                let positions = (mem - s.weight_bytes) * 1000 / s.kv_bytes_per_1000.max(1);
                kv_fit.push(mem - s.weight_bytes);
                ("yes", positions.to_string())
            }
            Some(_) => ("NO", "0".to_owned()),
            None => ("-", "-".to_owned()),
        };
        println!(
            "{:<6} {:>9} {:>12} {:>16} {:>6} {:>22}",
            i,
            format!("{}..{}", s.layers.start, s.layers.end),
            gb(s.weight_bytes),
            format!("{:.1} MB", s.kv_bytes_per_1000 as f64 / 1e6),
            fits,
            room
        );
    }
    if let Some(out) = args.out {
        let model = args.model.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "MODEL.gguf".into());
        // Every stage gets the KV memory the fullest one has room for (or 512 MiB without --gpu-mem).
        let kv_mib = kv_fit.iter().min().map(|b| (b / (1 << 20)).max(1)).unwrap_or(512);
        let mut t = format!(
            "# Written by `veil-shard plan --stages {}`: layer ranges balanced by weight bytes.\n\
             # Fill in the policy and each stage's replicas, then run `veil-shard prepare`\n\
             # to pin every stage's manifest root.\n\n\
             model = {model:?}\npolicy = \"policy.toml\"\nkv_budget_mib = {kv_mib}\n\n\
             [entry]\ngenerate_listen = \"127.0.0.1:7700\"\n",
            stages.len()
        );
        for (i, s) in stages.iter().enumerate() {
            t.push_str(&format!(
                "\n[[stage]]   # {} of weights\nlayers = [{}, {}]\nreplicas = [\"127.0.0.1:{}\"]\n",
                gb(s.weight_bytes),
                s.layers.start,
                s.layers.end,
                7710 + 10 * i
            ));
        }
        std::fs::write(&out, t).with_context(|| format!("writing {}", out.display()))?;
        eprintln!("wrote {}", out.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_bytes("141G"), Ok(141_000_000_000));
        assert_eq!(parse_bytes("80GiB"), Ok(80 * (1 << 30)));
        assert_eq!(parse_bytes("1024"), Ok(1024));
        assert!(parse_bytes("12 parsecs").is_err());
    }
}
