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
    /// Generate text with the model in this process, or through a running
    /// pipeline's entry (`--entry`).
    Generate(GenerateArgs),
    /// Serve one stage of a route (the entry for stage 0).
    Serve(ServeArgs),
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
    /// Write a draft model derived from a target: its first layers (an
    /// early-exit model sharing the target's vocabulary), optionally
    /// requantized; for speculative decoding when no second model is at hand.
    DeriveDraft {
        /// The target GGUF.
        #[arg(long)]
        model: PathBuf,
        /// Where to write the draft GGUF.
        #[arg(long)]
        out: PathBuf,
        /// Transformer blocks to keep (from the first).
        #[arg(long)]
        layers: usize,
        /// Convert matrices to this GGML type (q4_0, q4_1, q8_0, f16, q4_k, …).
        #[arg(long = "type")]
        dtype: Option<String>,
    },
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
    /// Exit when stdin closes (set by a supervisor, so no shard outlives it).
    #[arg(long)]
    supervised: bool,
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
    /// With `--entry`: the drafter for speculative decoding (`none`, `ngram`
    /// or `model`); default: the route's setting.
    #[arg(long, requires = "entry")]
    drafter: Option<String>,
    /// With `--entry`: draft exactly this many tokens per round instead of adaptive k.
    #[arg(long, requires = "entry")]
    draft_k: Option<usize>,
}

fn parse_range(s: &str) -> Result<LayerRange, String> {
    let (a, b) = s.split_once("..").ok_or("expected START..END")?;
    LayerRange::new(a.parse().map_err(|_| "bad start")?, b.parse().map_err(|_| "bad end")?)
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

fn main() -> std::process::ExitCode {
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
                let doc = serde_json::json!({
                    "layers": [range.start, range.end],
                    "root": root,
                    "metadata": hex::encode(slice.manifest().metadata),
                    "tensors": slice.manifest().tensors,
                });
                println!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                println!(
                    "{root}  layers {}..{} ({} tensors + metadata {})",
                    range.start,
                    range.end,
                    slice.manifest().len(),
                    hex::encode(slice.manifest().metadata)
                );
            }
        }
        Command::Generate(args) => match args.entry {
            Some(addr) => generate_remote(addr, &args)?,
            None => generate(args)?,
        },
        Command::Serve(args) => serve(args).map_err(|e| anyhow::Error::new(CannotStart(e)))?,
        Command::Canary { model, out } => {
            let (m, tok) = veil_enclave::generate::LocalModel::load(&model, &[])?;
            let name = model.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let set = veil_enclave::canary::record(&m, &tok, &name)?;
            std::fs::write(&out, serde_json::to_vec_pretty(&set)?)?;
            println!("{} canary answers of {name} written to {}", set.cases.len(), out.display());
        }
        Command::DeriveDraft { model, out, layers, dtype } => {
            let dtype = dtype.as_deref().map(veil_enclave::speculate::derive::parse_dtype).transpose()?;
            let d = veil_enclave::speculate::derive::derive_draft(&model, &out, layers, dtype)?;
            println!(
                "wrote {}: {} of {} layers, {} tensors ({} converted), {:.1} MiB",
                out.display(),
                d.layers,
                d.target_layers,
                d.tensors,
                d.requantized,
                d.bytes as f64 / (1 << 20) as f64
            );
        }
        Command::Prepare { config, out, model } => {
            let mut route = veil_enclave::pipeline::route::Route::load(&config)?;
            if let Some(m) = model {
                route.model = std::path::absolute(m)?;
            }
            let route = veil_enclave::pipeline::local::prepare(route)?;
            std::fs::write(&out, route.to_toml()).with_context(|| format!("writing {}", out.display()))?;
        }
    }
    Ok(())
}

fn generate(args: GenerateArgs) -> anyhow::Result<()> {
    use std::io::Write;
    use veil_enclave::entry::sampler::Sampler;
    use veil_enclave::generate::{generate, GenerateRequest, LocalModel};

    let path = args.model.clone().context("--model is required")?;
    let (model, tokenizer) = LocalModel::load(&path, &args.split)?;
    let prompt_ids = wire(&args).prompt_ids(&tokenizer)?;
    let mut sampler = Sampler::new(wire(&args).sampling())?;
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

fn generate_remote(addr: std::net::SocketAddr, args: &GenerateArgs) -> anyhow::Result<()> {
    use std::io::{BufRead, Write};
    use veil_enclave::pipeline::entry::GenerateEvent;

    if !addr.ip().is_loopback() {
        anyhow::bail!("--entry must be a loopback address: the internal endpoint carries plaintext");
    }
    let req = wire(args);
    let mut tcp = std::net::TcpStream::connect(addr).with_context(|| format!("connecting to the entry at {addr}"))?;
    tcp.write_all(format!("{}\n", serde_json::to_string(&req)?).as_bytes())?;
    let mut out = std::io::stdout();
    for line in std::io::BufReader::new(tcp).lines() {
        match serde_json::from_str::<GenerateEvent>(&line?).context("reading the entry's answer")? {
            GenerateEvent::Text(piece) => {
                if !args.json {
                    out.write_all(piece.as_bytes())?;
                    out.flush()?;
                }
            }
            GenerateEvent::Done(g) => {
                if args.json {
                    println!("{}", serde_json::to_string(&g)?);
                } else {
                    println!();
                    if let Some(s) = &g.speculation {
                        eprintln!(
                            "speculation ({}): {} rounds for {} tokens, {} of {} drafted tokens kept ({:.0}%)",
                            s.drafter,
                            s.rounds,
                            g.ids.len(),
                            s.accepted,
                            s.drafted,
                            100.0 * s.acceptance()
                        );
                    }
                }
                return Ok(());
            }
            GenerateEvent::Error(e) => anyhow::bail!("the pipeline failed: {e}"),
            GenerateEvent::Refused(e) => anyhow::bail!("the entry refused the request: {e}"),
        }
    }
    anyhow::bail!("the entry closed the connection before finishing")
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    use veil_enclave::pipeline::{entry, route::Route, shard};

    let route = Route::load(&args.config)?;
    let source = match (&route.simulated_root, args.hardware) {
        (_, true) => Source::Hardware { vmpl: 0 },
        (Some(dir), false) => Source::Simulated(dir.clone()),
        (None, false) => anyhow::bail!("the route sets no simulated_root; use --hardware on SEV-SNP"),
    };
    let mut attester = attest::attester(&source)?;
    if args.nvml_gpus {
        #[cfg(feature = "hw")]
        {
            tracing::info!("collecting GPU evidence through NVML with every report");
            attester = Box::new(veil_attestation::gpu::CompositeAttester::new(
                attester,
                veil_attestation::gpu::GpuSource::Nvml(veil_attestation::gpu::hw::NvmlGpuAttester),
            ));
        }
        #[cfg(not(feature = "hw"))]
        anyhow::bail!("--nvml-gpus needs a veil-shard built with `--features hw`");
    } else if route.simulated_gpus > 0 && !args.hardware {
        // Development: this CVM's GPUs are simulated too (fresh device keys
        // per start); one bundle carries CPU and GPU evidence, bound both ways.
        tracing::warn!(gpus = route.simulated_gpus, "using SIMULATED GPUs: GPU evidence proves nothing about hardware");
        let gpus = (0..route.simulated_gpus)
            .map(|_| {
                let seed = veil_attestation::Nonce::random();
                veil_attestation::gpu::simulated::SimulatedGpu::from_seed(seed.as_bytes(), Default::default())
            })
            .collect::<Result<Vec<_>, _>>()?;
        attester = Box::new(veil_attestation::gpu::CompositeAttester::new(
            attester,
            veil_attestation::gpu::GpuSource::Simulated(gpus),
        ));
    }
    let attester: std::sync::Arc<dyn veil_attestation::Attester> = attester.into();
    // The entry's sealing key is made before its evidence, which binds the key's hash.
    // A fresh key id per start, so clients holding the previous key get a
    // "wrong key" answer (and re-verify) rather than an undecryptable request.
    let key_id = veil_attestation::Nonce::random().as_bytes()[0];
    let seal_key = (args.stage == 0).then(|| veil_enclave::gateway::seal::SealKey::generate(key_id)).transpose()?;
    let evidence = if args.hardware { shard::Evidence::Hardware } else { shard::Evidence::Simulated };
    let loaded =
        shard::load(&route, args.stage, attester.as_ref(), seal_key.as_ref().map(|k| k.config_hash()), evidence)?;
    if let Some(every) = route.weight_recheck {
        shard::watch_weights(loaded.slice.clone(), every, |why| {
            tracing::error!(%why, "stopping: this shard's weights are no longer the ones it attested");
            std::process::exit(i32::from(EXIT_WEIGHTS_CHANGED));
        })?;
    }
    if args.supervised {
        // The supervisor holds our stdin; when it goes away, so do we.
        std::thread::spawn(|| {
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
            tracing::info!("supervisor gone (stdin closed): exiting");
            std::process::exit(0);
        });
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async move {
        if args.stage > 0 {
            return shard::serve(route, args.stage, args.replica, loaded).await;
        }
        let tokenizer = loaded.tokenizer.context("the entry's tokenizer was not loaded")?;
        let addr = route.stages[0].replicas[0];
        let gen_addr = route.generate_listen;
        let listener =
            tokio::net::TcpListener::bind(gen_addr).await.with_context(|| format!("listening on {gen_addr}"))?;
        let sealed_addr = route.sealed_listen;
        let model_name = route.model.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let draft_model = match &route.speculation.draft_model {
            None => None,
            Some(path) => {
                let m = veil_enclave::speculate::model::DraftModel::load(path, &tokenizer)
                    .with_context(|| format!("loading the draft model {}", path.display()))?;
                tracing::info!(draft = %m.name(), "draft model loaded for speculative decoding");
                Some(std::sync::Arc::new(m))
            }
        };
        let e = entry::Entry::start(route, loaded.slice, tokenizer, loaded.trust, draft_model);
        tracing::info!(%addr, generate = %gen_addr, "entry up; internal generate endpoint on loopback");
        if let (Some(sealed), Some(key)) = (sealed_addr, seal_key) {
            let listener =
                tokio::net::TcpListener::bind(sealed).await.with_context(|| format!("listening on {sealed}"))?;
            let gw = veil_enclave::gateway::server::Gateway::new(
                e.clone(),
                key,
                attester,
                loaded.claims,
                model_name,
                loaded.policy,
                loaded.shape,
            );
            tracing::info!(%sealed, "gateway: sealed requests and evidence (ciphertext only)");
            tokio::spawn(std::sync::Arc::new(gw).serve(listener));
        }
        let waiting = e.clone();
        tokio::spawn(async move {
            while !waiting.ready().await {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            tracing::info!("every stage has a verified shard: ready");
        });
        entry::serve_generate(e, listener).await;
        Ok(())
    })
}

/// The request the flags describe.
fn wire(args: &GenerateArgs) -> veil_enclave::pipeline::entry::GenerateWire {
    veil_enclave::pipeline::entry::GenerateWire {
        prompt: args.prompt.clone(),
        prompt_ids: args.prompt_ids.clone(),
        chat: args.chat,
        max_tokens: args.max_tokens,
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repeat_penalty: args.repeat_penalty,
        seed: args.seed,
        stop: args.stop.clone(),
        speculation: veil_enclave::pipeline::entry::SpeculationRequest {
            enabled: args.drafter.as_deref().map(|d| d != "none"),
            drafter: args.drafter.clone(),
            k: args.draft_k,
            script: None,
        },
    }
}
