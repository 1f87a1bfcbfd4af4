//! `veil-shard`: the process inside a shard's confidential VM.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use veil_attestation::{LayerRange, Nonce};
use veil_enclave::attest::{self, Source};

/// A Veil shard.
#[derive(Debug, Parser)]
#[command(name = "veil-shard", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print an evidence bundle (JSON) binding this shard's claims.
    Evidence {
        /// Use the SIMULATED root in DIR (made by `veil attest sim-init`).
        #[arg(long, value_name = "DIR", conflicts_with = "hardware")]
        simulated: Option<PathBuf>,
        /// Use the SEV-SNP guest device (build with `--features hw`).
        #[arg(long)]
        hardware: bool,
        /// VMPL to request the report at (hardware).
        #[arg(long, default_value_t = 0)]
        vmpl: u32,
        /// Layer range this shard serves, `START..END`.
        #[arg(long, value_parser = parse_range)]
        layers: Option<LayerRange>,
        /// Verifier's nonce (hex).
        #[arg(long)]
        nonce: Option<String>,
        /// Write the bundle here instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

fn parse_range(s: &str) -> Result<LayerRange, String> {
    let (a, b) = s.split_once("..").ok_or("expected START..END")?;
    LayerRange::new(a.parse().map_err(|_| "bad start")?, b.parse().map_err(|_| "bad end")?)
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    match Cli::parse().command {
        Command::Evidence { simulated, hardware, vmpl, layers, nonce, out } => {
            let source = match (simulated, hardware) {
                (Some(dir), false) => Source::Simulated(dir),
                (None, true) => Source::Hardware { vmpl },
                _ => anyhow::bail!("choose --simulated DIR or --hardware"),
            };
            let nonce = nonce.map(|n| n.parse::<Nonce>()).transpose().map_err(anyhow::Error::msg).context("--nonce")?;
            let bundle = attest::evidence(&source, &attest::claims(layers, nonce))?;
            match out {
                Some(path) => {
                    std::fs::write(&path, bundle.to_json()).with_context(|| format!("writing {}", path.display()))?
                }
                None => println!("{}", bundle.to_json()),
            }
        }
    }
    Ok(())
}
