//! The `veil-shard` command line: the process inside a shard's confidential
//! VM. One module per larger subcommand (`serve`, `generate`); the binary's
//! `main.rs` only calls [`main`].

use std::path::{Path, PathBuf};

use crate::attest::{self, Source};
use anyhow::Context;
use clap::{Parser, Subcommand};
use veil_attestation::{LayerRange, Nonce};

mod device_bench;
mod device_check;
mod generate;
mod memory;
mod perplexity;
mod plan;
mod serve;
mod tokenize;

use generate::{generate, generate_remote};
use serve::serve;

/// A Veil shard.
#[derive(Debug, Parser)]
#[command(name = "veil-shard", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// A model's perplexity over a text by llama.cpp's method (windows of
    /// `--ctx`, the second half of each scored), and its KL divergence from
    /// a base model's saved log-probabilities; ends with `perplexity: X`.
    Perplexity(perplexity::PerplexityArgs),
    /// Compile response formats for the entry under its budget (the entry
    /// starts these itself; it speaks a binary protocol on stdin/stdout).
    #[command(hide = true)]
    FormatWorker,
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
    /// Hash every tensor of a model once and print its manifest root (the
    /// one root every stage of it attests, whatever its layers). `--write`
    /// saves the manifest file where shards look for it, so that each reads
    /// only its own tensors.
    Manifest {
        /// GGUF file (the first file of a split model).
        model: PathBuf,
        /// Write the manifest file next to the model (`NAME.veil-manifest.json`).
        #[arg(long)]
        write: bool,
        /// Write the manifest file here instead.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print the manifest (every tensor record) as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Generate text with the model in this process, or through a running
    /// pipeline's entry (`--entry`).
    Generate(GenerateArgs),
    /// Check a compute device against the fused CPU kernels and llama.cpp's fixtures
    /// (the reference model), then measure it: one table; exit 1 when a check fails.
    DeviceCheck(DeviceCheckArgs),
    /// Prefill and decode speed of a whole model on a device, beside the device's
    /// memory-bandwidth bound measured in the same run (any Llama-family GGUF).
    DeviceBench(DeviceBenchArgs),
    /// Write a Llama-family GGUF of a real shape with random weights (for speed
    /// measurements where no large weights can be downloaded).
    SynthModel(SynthModelArgs),
    /// Serve one stage of a route (the entry for stage 0).
    Serve(ServeArgs),
    /// Split a model into stages balanced by weight bytes: per stage its weights, KV per
    /// 1,000 positions and whether it fits `--gpu-mem`; `--out` writes the route.
    Plan(plan::PlanArgs),
    /// Print the ids this shard's tokenizer gives a text (no BOS), as llama.cpp's
    /// `llama-tokenize` would; a vocabulary-only GGUF will do.
    Tokenize(tokenize::TokenizeArgs),
    /// Load one stage as `serve` would and report its peak RSS against the
    /// stated bound (1.25 × its weight bytes + its largest tensor + 64 MiB over
    /// the process before loading); exit 1 when over it.
    StageMemory(memory::StageMemoryArgs),
    /// Print the digest a shard's SEV-SNP HOST_DATA must hold for `serve --bind-config`:
    /// the route (paths left out) and its peer policy. Give it to the VMM at launch
    /// (QEMU `-object sev-snp-guest,host-data=BASE64`) and pin it in clients' policies.
    ConfigDigest {
        /// Route file (complete: every stage's manifest_root set).
        #[arg(long)]
        config: PathBuf,
        /// Print base64 (QEMU's `host-data=` form) instead of hex.
        #[arg(long)]
        base64: bool,
    },
    /// Complete a development route: create its simulated root and policy if
    /// missing, compute every stage's manifest root, write the result.
    Prepare {
        /// Route file.
        #[arg(long)]
        config: PathBuf,
        /// Where to write the completed route.
        #[arg(long)]
        out: PathBuf,
        /// Use this model file instead of the route's.
        #[arg(long)]
        model: Option<PathBuf>,
    },
    /// Record the canary answers of a local model, for `veil canary URL --reference FILE`.
    Canary {
        /// The GGUF the route should serve.
        #[arg(long)]
        model: PathBuf,
        /// Where to write the reference (JSON).
        #[arg(long)]
        out: PathBuf,
    },
    /// Write a draft model derived from a target: some of its blocks (its
    /// first `--layers`, an explicit `--keep` list, or with `--auto` the set
    /// measured to speed up speculation most) sharing the target's
    /// vocabulary and head, optionally requantized; for speculative decoding
    /// when no second model is at hand.
    DeriveDraft(DeriveDraftArgs),
}

#[derive(Debug, clap::Args)]
struct SynthModelArgs {
    /// `llama3-8b`, `llama3.2-1b`, `qwen3-30b-a3b`, `qwen3-235b-a22b`, `gpt-oss-20b`, `gpt-oss-120b`,
    /// `gemma3-1b`, or the tiny `smoke`, `qwen3moe-smoke`, `mixtral-smoke`, `gpt-oss-smoke`,
    /// `gemma3-smoke` (for tests and tooling).
    #[arg(long, default_value = "llama3-8b")]
    shape: String,
    /// Quantization of the matrices: `q4_0`, `q4_1`, `q5_0`, `q5_1`, `q8_0`, `q2_k`, `q3_k`,
    /// `q4_k`, `q5_k`, `q6_k`, `bf16`, `f16`, `f32`, `mxfp4` (experts MXFP4, the other
    /// matrices Q8_0) or `iq2_xxs` (experts random but valid IQ2_XXS blocks, the other
    /// matrices Q8_0).
    #[arg(long, default_value = "q4_0")]
    dtype: String,
    /// Write Llama 3.1-style RoPE frequency factors (`rope_freqs.weight`; factor 8 over an
    /// original context of 16 positions, so short prompts already depend on them).
    #[arg(long)]
    rope_freqs: bool,
    /// Keep only this many layers (fewer bytes to write; per-layer speed is unchanged).
    #[arg(long)]
    layers: Option<usize>,
    /// Carry this GGUF's tokenizer (a real vocabulary; llama.cpp's vocab files will do).
    #[arg(long)]
    vocab: Option<std::path::PathBuf>,
    /// Carry this chat template (a Jinja file) instead of the vocabulary's.
    #[arg(long)]
    chat_template: Option<std::path::PathBuf>,
    /// Append this control token to the vocabulary (repeatable; e.g. gpt-oss's harmony
    /// markers on a vocabulary that lacks them).
    #[arg(long = "add-special")]
    add_special: Vec<String>,
    /// Multiply the LM head and router weights (random weights give near-ties everywhere).
    #[arg(long, default_value_t = 1.0)]
    sharpen: f32,
    /// Seed of the weights.
    #[arg(long, default_value_t = 0x5eed)]
    seed: u64,
    /// Split into this many files as llama.cpp's gguf-split does; `--out` then names
    /// the first, `PREFIX-00001-of-0000N.gguf`.
    #[arg(long, default_value_t = 1)]
    files: usize,
    /// Where to write it.
    #[arg(long)]
    out: std::path::PathBuf,
}

#[derive(Debug, clap::Args)]
struct DeriveDraftArgs {
    /// The target GGUF.
    #[arg(long)]
    model: PathBuf,
    /// Where to write the draft GGUF.
    #[arg(long)]
    out: PathBuf,
    /// Keep the first N blocks (an early exit).
    #[arg(long, conflicts_with_all = ["keep", "auto"])]
    layers: Option<usize>,
    /// Keep these blocks, e.g. `0-11,14,18-29` (layer skipping).
    #[arg(long, conflicts_with = "auto")]
    keep: Option<String>,
    /// Measure early exits and layer-skipping drafts on calibration
    /// prompts (acceptance against the target's greedy output, and step
    /// time) and write the one with the highest expected speedup.
    #[arg(long)]
    auto: bool,
    /// With `--auto`: what one verification round costs without drafting
    /// (network round trip plus the ring's compute), in milliseconds.
    #[arg(long, default_value_t = 200)]
    round_ms: u64,
    /// With `--auto`: pick only drafts whose step costs at most this
    /// many target steps (what the entry may spend on drafting).
    #[arg(long, default_value_t = 1.0)]
    max_cost: f64,
    /// Convert matrices to this GGML type (q4_0, q4_1, q8_0, f16, q4_k, …).
    #[arg(long = "type")]
    dtype: Option<String>,
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// Route file (TOML; see deploy/local/cluster.toml).
    #[arg(long)]
    config: PathBuf,
    /// Stage to serve (0 = the entry).
    #[arg(long)]
    stage: usize,
    /// Which of the stage's replica addresses to serve.
    #[arg(long, default_value_t = 0)]
    replica: usize,
    /// Attest with the SEV-SNP guest device instead of the route's simulated root.
    #[arg(long)]
    hardware: bool,
    /// With `--hardware`: also collect evidence from every GPU NVML sees (CC
    /// mode), bound to this shard's claims (build with `--features hw`).
    #[arg(long, requires = "hardware")]
    nvml_gpus: bool,
    /// With `--nvml-gpus`: an NVIDIA RIM (driver or VBIOS, as NVIDIA's RIM
    /// service serves it) to carry in every bundle, so clients can compare
    /// the GPUs' measurements with it (`require_rim`); repeatable.
    #[arg(long = "gpu-rim", value_name = "FILE", requires = "nvml_gpus")]
    gpu_rims: Vec<PathBuf>,
    /// With `--nvml-gpus`: an OCSP response (DER) for a GPU certificate to
    /// carry in every bundle; repeatable.
    #[arg(long = "gpu-ocsp", value_name = "FILE", requires = "nvml_gpus")]
    gpu_ocsp: Vec<PathBuf>,
    /// With `--nvml-gpus`: a directory of reference material to carry (a
    /// mounted ConfigMap, say): `*.xml`/`*.swidtag` are RIMs, `*.der`/`*.ocsp`
    /// OCSP responses; names starting with `.` are skipped, others refused.
    #[arg(long = "gpu-reference", value_name = "DIR", requires = "nvml_gpus")]
    gpu_reference: Option<PathBuf>,
    /// Read the `--gpu-rim`, `--gpu-ocsp` and `--gpu-reference` files again
    /// this often, in seconds (0: never), so renewed OCSP responses reach
    /// clients without a restart; bad material keeps the previous.
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    gpu_reference_refresh: u64,
    /// Exit when stdin closes (set by a supervisor, so no shard outlives it).
    #[arg(long)]
    supervised: bool,
    /// Refuse to start unless this shard's HOST_DATA (fixed by the VMM at launch, signed in
    /// every report) equals the digest of this route and its peer policy (`config-digest`):
    /// the configuration that decides trust is then the one clients pin, not one the host swapped.
    #[arg(long)]
    bind_config: bool,
    /// Listen here instead of on this replica's address in the route (when the network forwards
    /// that address here: a Kubernetes Service IP, a NAT). Stages after the entry only.
    #[arg(long, value_name = "ADDR")]
    listen: Option<std::net::SocketAddr>,
    /// Compute on this device instead of the route stage's: `cpu`, or `cuda:N` (a build with
    /// `--features cuda`; with `--hardware`, GPU N must be in CC mode and the ready state).
    #[arg(long, value_name = "DEVICE")]
    device: Option<crate::model::ComputeDevice>,
}

#[derive(Debug, clap::Args)]
struct DeviceBenchArgs {
    /// GGUF file (the whole model is loaded on the device).
    #[arg(long)]
    model: std::path::PathBuf,
    /// `cpu`, `candle-cpu` or `cuda:N`.
    #[arg(long, default_value = "cuda:0")]
    device: crate::model::ComputeDevice,
    /// Prompt length for the prefill row.
    #[arg(long, default_value_t = 512)]
    prefill: usize,
    /// Decode steps per decode row.
    #[arg(long, default_value_t = 32)]
    decode: usize,
    /// Sessions decoding together, one row each.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    batch: Vec<usize>,
}

#[derive(Debug, clap::Args)]
struct DeviceCheckArgs {
    /// The reference model (SmolLM2-135M-Instruct Q4_1: the fixtures are its).
    #[arg(long)]
    model: std::path::PathBuf,
    /// `cuda:N`, or `candle-cpu` to run the device path's checks where no GPU is.
    #[arg(long, default_value = "cuda:0")]
    device: crate::model::ComputeDevice,
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["prompt", "prompt_ids"])))]
struct GenerateArgs {
    /// GGUF file (single-process generation).
    #[arg(long, required_unless_present = "entry", conflicts_with = "entry")]
    model: Option<PathBuf>,
    /// A pipeline entry's internal generate endpoint (`HOST:PORT`, loopback).
    #[arg(long)]
    entry: Option<std::net::SocketAddr>,
    /// Prompt text.
    #[arg(long)]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids.
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Wrap the prompt in the model's chat template as a user message. With
    /// `--model`, a model that reasons apart (gpt-oss's analysis channel, a
    /// `<think>` block) prints its reasoning on standard error and its
    /// answer on standard output.
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
    /// With `--entry`: the drafter for speculative decoding (`none`, `ngram`,
    /// `model` or `ngram+model`); default: the route's setting.
    #[arg(long, requires = "entry")]
    drafter: Option<veil_wire::route::Drafter>,
    /// With `--entry`: draft exactly this many tokens per round instead of adaptive k.
    #[arg(long, requires = "entry")]
    draft_k: Option<usize>,
    /// With `--entry`: keep exactly this many verification rounds in flight
    /// (1 = one round per trip around the ring) instead of adaptive depth.
    #[arg(long, requires = "entry")]
    draft_depth: Option<usize>,
}

/// Why a `--layers` value is not a layer range (the caller is to blame).
#[derive(Debug, thiserror::Error)]
enum RangeArgError {
    /// No `..` between the bounds.
    #[error("expected START..END")]
    NoSeparator,
    /// The start is not a layer number.
    #[error("bad start")]
    BadStart,
    /// The end is not a layer number.
    #[error("bad end")]
    BadEnd,
    /// The range is empty (the attestation crate's message).
    #[error("{0}")]
    Empty(String),
}

fn parse_range(s: &str) -> Result<LayerRange, RangeArgError> {
    let (a, b) = s.split_once("..").ok_or(RangeArgError::NoSeparator)?;
    let start = a.parse().map_err(|_| RangeArgError::BadStart)?;
    let end = b.parse().map_err(|_| RangeArgError::BadEnd)?;
    LayerRange::new(start, end).map_err(|e| RangeArgError::Empty(e.to_string()))
}

/// Exit status of `serve` when the shard cannot start (route, policy, model,
/// attester, address in use): a configuration error that restarting will not
/// heal (sysexits' EX_CONFIG). A supervisor stops instead of retrying.
const EXIT_CONFIG: u8 = 78;
/// Exit status when the resident weights no longer hash as they did at load.
const EXIT_WEIGHTS_CHANGED: u8 = 70;

/// A `serve` that failed before serving: every error `serve` returns is one
/// (once up, it serves until the process ends).
#[derive(Debug, thiserror::Error)]
#[error("{0:#}")]
struct CannotStart(anyhow::Error);

/// Runs `veil-shard` with the process arguments; the exit status follows
/// the error (78 when a shard cannot start: bad configuration, port taken).
pub fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("veil-shard: {e:#}");
            if e.downcast_ref::<CannotStart>().is_some() {
                return std::process::ExitCode::from(EXIT_CONFIG);
            }
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    crate::contain::install_quiet_hook();
    match Cli::parse().command {
        Command::Perplexity(args) => perplexity::perplexity(args)?,
        Command::FormatWorker => crate::pipeline::entry::format_jobs::run_worker()?,
        Command::Evidence { simulated, hardware, vmpl, layers, nonce, out } => {
            evidence(simulated, hardware, vmpl, layers, nonce, out)?
        }
        Command::Manifest { model, write, out, json } => manifest(&model, write, out, json)?,
        Command::ConfigDigest { config, base64 } => config_digest(&config, base64)?,
        Command::DeviceBench(args) => device_bench::device_bench(args)?,
        Command::Plan(args) => plan::plan(args)?,
        Command::SynthModel(args) => synth_model(args)?,
        Command::DeviceCheck(args) => {
            if !device_check::device_check(args)? {
                std::process::exit(1);
            }
        }
        Command::Generate(args) => match args.entry {
            Some(addr) => generate_remote(addr, &args)?,
            None => generate(args)?,
        },
        Command::Serve(args) => serve(args).map_err(|e| anyhow::Error::new(CannotStart(e)))?,
        Command::Tokenize(args) => tokenize::tokenize(&args)?,
        Command::StageMemory(args) => {
            if !memory::stage_memory(&args)? {
                std::process::exit(1);
            }
        }
        Command::Canary { model, out } => canary(&model, &out)?,
        Command::DeriveDraft(args) => derive_draft(args)?,
        Command::Prepare { config, out, model } => prepare(&config, &out, model)?,
    }
    Ok(())
}

/// `veil-shard evidence`.
fn evidence(
    simulated: Option<PathBuf>,
    hardware: bool,
    vmpl: u32,
    layers: Option<LayerRange>,
    nonce: Option<String>,
    out: Option<PathBuf>,
) -> anyhow::Result<()> {
    let source = match (simulated, hardware) {
        (Some(dir), false) => Source::Simulated(dir),
        (None, true) => Source::Hardware { vmpl },
        _ => anyhow::bail!("choose --simulated DIR or --hardware"),
    };
    let nonce = nonce.map(|n| n.parse::<Nonce>()).transpose().map_err(anyhow::Error::msg).context("--nonce")?;
    let bundle = attest::evidence(&source, &attest::claims(layers, nonce))?;
    match out {
        Some(path) => std::fs::write(&path, bundle.to_json()).with_context(|| format!("writing {}", path.display()))?,
        None => println!("{}", bundle.to_json()),
    }
    Ok(())
}

/// `veil-shard manifest`.
fn manifest(model: &Path, write: bool, out: Option<PathBuf>, json: bool) -> anyhow::Result<()> {
    let mut gguf = crate::model::GgufFile::open(model)?;
    let manifest = gguf.model_manifest()?;
    let root = hex::encode(manifest.root());
    let target = out.or_else(|| write.then(|| crate::model::gguf::manifest_path(model)));
    if let Some(path) = &target {
        std::fs::write(path, manifest.to_json()).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if json {
        println!("{}", manifest.to_json());
    } else {
        println!(
            "{root}  {} tensors in {} file(s) + metadata {}",
            manifest.tensors.len(),
            gguf.files(),
            hex::encode(manifest.metadata)
        );
    }
    Ok(())
}

/// `veil-shard config-digest`.
fn config_digest(config: &Path, base64: bool) -> anyhow::Result<()> {
    let route = crate::pipeline::route::Route::load(config)?;
    if let Some(i) = route.stages.iter().position(|s| s.manifest_root.is_none()) {
        anyhow::bail!("stage {i} has no manifest_root: complete the route first (veil-shard prepare)");
    }
    let policy = crate::pipeline::shard::load_policy(&route.policy)?;
    // The policy shards would refuse to start with is not worth a digest to pin.
    policy.fit_for_serving_path().map_err(|e| anyhow::anyhow!("peer policy {}: {e}", route.policy.display()))?;
    let digest = route.config_digest(&policy);
    if base64 {
        use base64::Engine as _;
        println!("{}", base64::engine::general_purpose::STANDARD.encode(digest));
    } else {
        println!("{}", hex::encode(digest));
    }
    Ok(())
}

/// `veil-shard synth-model`.
fn synth_model(args: SynthModelArgs) -> anyhow::Result<()> {
    let SynthModelArgs {
        shape,
        dtype,
        rope_freqs,
        layers,
        vocab,
        chat_template,
        add_special,
        sharpen,
        seed,
        files,
        out,
    } = args;
    use crate::model::synth::{Options, Shape};
    let mut s = Shape::named(&shape).ok_or_else(|| {
        let names: Vec<&str> = Shape::NAMED.iter().map(|(n, _)| *n).collect();
        anyhow::anyhow!("unknown shape {shape:?}: one of {}", names.join(", "))
    })?;
    s.n_layer = layers.unwrap_or(s.n_layer).clamp(1, s.n_layer);
    let dt = synth_dtype(&dtype)?;
    let chat_template = chat_template.map(std::fs::read_to_string).transpose()?;
    let opts = Options {
        dtype: dt,
        seed,
        vocab_from: vocab,
        sharpen,
        rope_freqs,
        files,
        chat_template,
        specials: add_special,
    };
    crate::model::synth::write_with(&out, s, &opts)?;
    eprintln!("wrote {} ({shape}, {} layers, {dtype}, random weights)", out.display(), s.n_layer);
    Ok(())
}

/// `veil-shard canary`.
fn canary(model: &Path, out: &Path) -> anyhow::Result<()> {
    let (m, tok) = crate::generate::LocalModel::load(model, &[])?;
    let name = model.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let set = crate::canary::record(&m, &tok, &name)?;
    std::fs::write(out, serde_json::to_vec_pretty(&set)?)?;
    println!("{} canary answers of {name} written to {}", set.cases.len(), out.display());
    Ok(())
}

/// `veil-shard derive-draft`.
fn derive_draft(args: DeriveDraftArgs) -> anyhow::Result<()> {
    let DeriveDraftArgs { model, out, layers, keep, auto, round_ms, max_cost, dtype } = args;
    use crate::speculate::derive;
    let dtype = dtype.as_deref().map(derive::parse_dtype).transpose()?;
    let keep = match (layers, keep, auto) {
        (Some(n), _, _) => (0..n).collect(),
        (None, Some(spec), _) => derive::parse_layers(&spec)?,
        (None, None, true) => {
            let scratch = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            let round = std::time::Duration::from_millis(round_ms);
            let sel = crate::speculate::select::select(&model, scratch, round, max_cost)?;
            print!("{}", sel.table());
            match sel.best {
                Some((i, k)) => {
                    println!("picked {} with k = {k}", sel.measured[i].candidate.kind);
                    sel.measured[i].candidate.layers.clone()
                }
                None => anyhow::bail!(
                    "no derived draft costing at most {max_cost} target steps is expected to beat plain decoding at {round_ms} ms per round; none written"
                ),
            }
        }
        (None, None, false) => anyhow::bail!("say which blocks to keep: --layers N, --keep LIST or --auto"),
    };
    let d = derive::derive_draft(&model, &out, &keep, dtype)?;
    println!(
        "wrote {}: blocks {} ({} of {}), {} tensors ({} converted), {:.1} MiB",
        out.display(),
        derive::format_layers(&d.layers),
        d.layers.len(),
        d.target_layers,
        d.tensors,
        d.requantized,
        d.bytes as f64 / (1 << 20) as f64
    );
    Ok(())
}

/// `veil-shard prepare`.
fn prepare(config: &Path, out: &Path, model: Option<PathBuf>) -> anyhow::Result<()> {
    let mut route = crate::pipeline::route::Route::load(config)?;
    if let Some(m) = model {
        route.model = std::path::absolute(m)?;
    }
    let route = crate::pipeline::local::prepare(route)?;
    std::fs::write(out, route.to_toml()).with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}

/// A quantization by its `synth-model`/`plan` name.
fn synth_dtype(name: &str) -> anyhow::Result<crate::model::gguf::TensorType> {
    crate::model::synth::dtype_named(name).ok_or_else(|| {
        let names: Vec<&str> = crate::model::synth::DTYPES.iter().map(|(n, _)| *n).collect();
        anyhow::anyhow!("unknown dtype {name:?}: one of {}", names.join(", "))
    })
}
