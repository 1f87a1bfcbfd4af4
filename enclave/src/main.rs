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
    /// Print the manifest root of a model (or of a layer slice of it).
    Manifest {
        /// GGUF file.
        model: PathBuf,
        /// Layer range `START..END` (default: the whole model).
        #[arg(long, value_parser = parse_range)]
        layers: Option<LayerRange>,
        /// Print every tensor record as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Generate text with the model in this process.
    Generate(GenerateArgs),
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["prompt", "prompt_ids"])))]
struct GenerateArgs {
    /// GGUF file.
    #[arg(long)]
    model: PathBuf,
    /// Prompt text.
    #[arg(long)]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids.
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long)]
    chat: bool,
    /// Most new tokens.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Top-k (0 = off).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Top-p (1 = off).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Min-p (0 = off).
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// Repetition penalty (1 = off).
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop strings (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Split the model in-process at these layers (e.g. `10,20`); output must not change.
    #[arg(long, value_delimiter = ',')]
    split: Vec<usize>,
    /// Print `{"prompt_ids": [...], "ids": [...], "text": "..."}` instead of streaming.
    #[arg(long)]
    json: bool,
}

fn parse_range(s: &str) -> Result<LayerRange, String> {
    let (a, b) = s.split_once("..").ok_or("expected START..END")?;
    LayerRange::new(a.parse().map_err(|_| "bad start")?, b.parse().map_err(|_| "bad end")?)
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("veil-shard: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
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
        Command::Manifest { model, layers, json } => {
            let mut gguf = veil_enclave::model::GgufFile::open(&model)?;
            let n = veil_enclave::model::Config::from_gguf(&gguf)?.n_layer;
            let range = layers.map(|r| r.start() as usize..r.end() as usize).unwrap_or(0..n);
            let slice = veil_enclave::model::LayerSlice::from_gguf(&mut gguf, range.clone())?;
            let root = hex::encode(slice.manifest().root());
            if json {
                let doc = serde_json::json!({ "layers": [range.start, range.end], "root": root, "tensors": slice.manifest().tensors });
                println!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                println!("{root}  layers {}..{} ({} tensors)", range.start, range.end, slice.manifest().len());
            }
        }
        Command::Generate(args) => generate(args)?,
    }
    Ok(())
}

fn generate(args: GenerateArgs) -> anyhow::Result<()> {
    use std::io::Write;
    use veil_enclave::entry::sampler::{Sampler, SamplingParams};
    use veil_enclave::entry::tokenizer::ChatMessage;
    use veil_enclave::generate::{generate, GenerateRequest, LocalModel};

    let (model, tokenizer) = LocalModel::load(&args.model, &args.split)?;
    let prompt_ids = match (&args.prompt, &args.prompt_ids) {
        (Some(text), _) if args.chat => {
            let rendered = tokenizer.render_chat(&[ChatMessage { role: "user".into(), content: text.clone() }])?;
            tokenizer.encode(&rendered, true)?
        }
        (Some(text), _) => tokenizer.encode(text, false)?,
        (None, Some(ids)) => ids.clone(),
        (None, None) => anyhow::bail!("give --prompt or --prompt-ids"),
    };
    let mut sampler = Sampler::new(SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repetition_penalty: args.repeat_penalty,
        seed: args.seed,
        ..SamplingParams::default()
    })?;
    let req = GenerateRequest { prompt_ids, max_tokens: args.max_tokens, stop: args.stop.clone() };
    let stream = !args.json;
    let mut out = std::io::stdout();
    let result = generate(&model, &tokenizer, &mut sampler, &req, |piece| {
        if stream {
            let _ = out.write_all(piece.as_bytes());
            let _ = out.flush();
        }
    })?;
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        println!();
    }
    Ok(())
}
