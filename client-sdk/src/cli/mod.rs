//! The `veil` command line. One module per subcommand; `main.rs` only
//! parses arguments and maps the outcome to an exit code.
//!
//! Exit codes of `veil attest verify` (stable; scripts rely on them):
//! 0 accepted, 1 rejected, 2 unreadable input (file, bundle, policy or flags).
//! The same codes hold for GPU evidence (`--gpu-evidence`), alone or together
//! with SNP evidence: 0 only when the SNP table (if any) and every GPU table accept;
//! for a TDX quote (`--tdx QUOTE --collateral FILE`); and for Azure evidence
//! (`--azure HCL_REPORT [--vcek …] [--tpm-quote FILE [--ak-pub PEM] --nonce TEXT]`).

pub mod canary;
pub mod error;
pub mod inspect;
pub mod log;
pub mod measure;
pub mod policy_bundle;
pub mod policy_check;
pub mod policy_edit;
pub mod policy_init;
pub mod proxy;
pub mod receipt;
pub mod route;
pub mod sim_init;
pub mod verify;
pub mod verify_azure;
pub mod verify_tdx;
pub mod web;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Exit status of a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Evidence accepted (or the command succeeded).
    Accepted = 0,
    /// Evidence rejected by a check.
    Rejected = 1,
    /// Input could not be read or understood.
    Unreadable = 2,
    /// `veil chat` with stdin not a terminal: a turn was not answered.
    Unanswered = 3,
}

/// Veil: private inference on attested, sharded confidential VMs. Verify a
/// route, chat with it, serve a local OpenAI-compatible endpoint sealed to it,
/// compare its answers with a local reference, write, sign and check
/// policies, and inspect or verify attestation evidence.
#[derive(Debug, Parser)]
#[command(name = "veil", version, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Attestation evidence: inspect, verify, simulate.
    #[command(subcommand)]
    Attest(AttestCommand),
    /// Verify every shard on the route behind a Veil host: a check table each.
    Verify(RouteVerifyArgs),
    /// Chat with the model behind a verified route, sealed to its entry.
    Chat(ChatArgs),
    /// A local OpenAI-compatible endpoint that seals every call to a verified route.
    Proxy(ProxyArgs),
    /// The private chat page on loopback: it verifies the route and seals every prompt in the browser.
    Web(WebArgs),
    /// Policies.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Answers' receipts, signed by the attested entry.
    #[command(subcommand)]
    Receipt(ReceiptCommand),
    /// The transparency log of policy bundles: create, append, serve, prove, audit, witness.
    #[command(subcommand)]
    Log(LogCommand),
    /// Compare the route's greedy answers to canary prompts with a reference recorded locally (`veil-shard canary`).
    Canary(CanaryArgs),
    /// Reproduce the SEV-SNP launch measurement of a guest from its launch inputs (firmware, kernel, initrd, command line, vCPUs).
    Measure(MeasureArgs),
}

/// `veil measure --ovmf OVMF.fd [--kernel K --initrd I --append CMDLINE] --vcpus N --vcpu-type T`
#[derive(Debug, Args)]
pub struct MeasureArgs {
    /// The firmware image (OVMF with SEV-SNP metadata).
    #[arg(long)]
    pub ovmf: PathBuf,
    /// Measured direct boot: the kernel (needs firmware with an SNP kernel hashes section).
    #[arg(long)]
    pub kernel: Option<PathBuf>,
    /// Measured direct boot: the initrd.
    #[arg(long, requires = "kernel")]
    pub initrd: Option<PathBuf>,
    /// Measured direct boot: the kernel command line.
    #[arg(long, requires = "kernel")]
    pub append: Option<String>,
    /// vCPUs of the guest.
    #[arg(long)]
    pub vcpus: u32,
    /// vCPU type as QEMU names it (EPYC-v4, EPYC-Milan, EPYC-Genoa, EPYC-Turin, …).
    #[arg(long)]
    pub vcpu_type: String,
    /// The VMM that launches the guest.
    #[arg(long, default_value = "qemu")]
    pub vmm: veil_attestation::measure::Vmm,
    /// SEV_FEATURES of the guest's VMSAs, hex (bit 0, SNPActive, must be set).
    #[arg(long, default_value = "0x1")]
    pub guest_features: String,
    /// Also add the measurement to this policy file's `measurements`.
    #[arg(long, value_name = "POLICY")]
    pub add_to: Option<PathBuf>,
    /// With `--add-to`, in the same edit: pin this HOST_DATA (64 hex digits from
    /// `deploy/cvm/make-config-disk.sh` or `veil-shard config-digest`): the route and
    /// peer policy every guest of the deployment was launched with.
    #[arg(long, value_name = "HEX", requires = "add_to")]
    pub host_data: Option<String>,
    /// With `--add-to`, in the same edit: accept this peer policy (the shards' own,
    /// which cannot pin the HOST_DATA that digests it) by its digest.
    #[arg(long, value_name = "FILE", requires = "add_to")]
    pub peer_policy: Option<PathBuf>,
}

/// `veil canary URL --reference FILE`
#[derive(Debug, Args)]
pub struct CanaryArgs {
    /// The host's public URL (`http://HOST:PORT` or `https://HOST:PORT`).
    pub url: String,
    /// The policy every shard must satisfy.
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// The reference answers (`veil-shard canary --model M --out FILE` on your own copy of the model).
    #[arg(long)]
    pub reference: PathBuf,
    /// Also trust these PEM certificate authorities for the host's https:// URL.
    #[arg(long)]
    pub ca: Option<PathBuf>,
}

/// `veil policy …`
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Write a policy pinning what a route presents now (trust on first use), for review.
    Init(PolicyInitArgs),
    /// Explain a policy line by line and warn about each weak setting (exit 1 when any); with
    /// `--log`, refuse a signed bundle older than the newest version its publisher logged.
    ///
    /// With --policy-key, POLICY may be a signed bundle (its signature is verified; the rollback
    /// floor is neither checked nor raised). With --log too, the log is asked for the newest version
    /// of the bundle's publisher: the checkpoint is verified as for --policy (log key, witnesses
    /// required, extending the last checkpoint this client accepted; nothing is written to the state
    /// directory), the bundle's inclusion proof is checked, and every entry is read and the root
    /// recomputed. Exit 1, before the explanation, when the bundle is older than the newest logged
    /// version, is not in the log, or the log is refused (a rollback, a fork, two bundles of one
    /// version); 2 when the log cannot be read.
    Check(PolicyCheckArgs),
    /// Make a publisher's signing key for policy bundles (private PEM, and the public PEM to hand out).
    Keygen(PolicyKeygenArgs),
    /// Sign a policy as a versioned bundle that clients verify with the publisher's public key.
    Sign(PolicySignArgs),
    /// Write a strict starting policy that accepts no measurement yet (build it up from reproduced values).
    New(PolicyNewArgs),
    /// Add reproduced values to a policy file.
    #[command(flatten)]
    Edit(PolicyEdit),
}

/// `veil policy new --out FILE`
#[derive(Debug, Args)]
pub struct PolicyNewArgs {
    /// Where to write the policy.
    #[arg(long)]
    pub out: PathBuf,
    /// Accept SIMULATED evidence (development clusters only).
    #[arg(long)]
    pub allow_simulated: bool,
    /// Replace an existing file.
    #[arg(long)]
    pub force: bool,
}

/// Edits of a policy file with values reproduced from source.
#[derive(Debug, Subcommand)]
pub enum PolicyEdit {
    /// Allow a launch measurement (from `veil measure`).
    AddMeasurement {
        /// The policy file.
        policy: PathBuf,
        /// The measurement (96 hex digits).
        measurement: String,
    },
    /// Allow a model by its manifest root (from `veil-shard manifest --model MODEL`).
    AddManifest {
        /// The policy file.
        policy: PathBuf,
        /// The manifest root (64 hex digits).
        #[arg(long)]
        root: String,
    },
    /// Accept a peer policy (the route's own policy file) by its digest.
    AddPeerPolicy {
        /// The policy file.
        policy: PathBuf,
        /// The peer policy file the shards enforce on their links.
        #[arg(long)]
        peer: PathBuf,
    },
    /// Set the TCB minimums for a product (compared with REPORTED_TCB).
    SetTcb {
        /// The policy file.
        policy: PathBuf,
        /// Milan, Genoa or Turin.
        #[arg(long)]
        product: String,
        /// FMC (Turin only).
        #[arg(long)]
        fmc: Option<u8>,
        /// PSP boot loader.
        #[arg(long)]
        bootloader: Option<u8>,
        /// PSP OS (TEE).
        #[arg(long)]
        tee: Option<u8>,
        /// SNP firmware.
        #[arg(long)]
        snp: Option<u8>,
        /// Microcode.
        #[arg(long)]
        microcode: Option<u8>,
    },
    /// Pin HOST_DATA (from `veil-shard config-digest`: the route and peer policy the shards are bound to).
    SetHostData {
        /// The policy file.
        policy: PathBuf,
        /// 64 hex digits.
        host_data: String,
    },
    /// Pin the model's layer count the route must cover.
    SetLayers {
        /// The policy file.
        policy: PathBuf,
        /// Layers.
        layers: u32,
    },
}

/// `veil policy keygen`
#[derive(Debug, Args)]
pub struct PolicyKeygenArgs {
    /// Where to write the private key (PKCS#8 PEM, mode 0600); the public key goes to FILE.pub.
    #[arg(long)]
    pub out: PathBuf,
}

/// `veil policy sign POLICY`
#[derive(Debug, Args)]
pub struct PolicySignArgs {
    /// The policy (TOML) to sign.
    pub policy: PathBuf,
    /// The publisher's private key (from `veil policy keygen`).
    #[arg(long)]
    pub key: PathBuf,
    /// The bundle's version: raise it with every change (clients refuse older versions once they saw a newer one).
    #[arg(long)]
    pub version: u64,
    /// Where to write the bundle.
    #[arg(long)]
    pub out: PathBuf,
    /// Also append the bundle to this log directory (`veil log init`), in the same step.
    #[arg(long, value_name = "DIR")]
    pub log: Option<PathBuf>,
}

/// `veil policy check POLICY [--policy-key PEM [--log URL|DIR --log-key FILE]]`
#[derive(Debug, Args)]
pub struct PolicyCheckArgs {
    /// The policy file: TOML, or a signed bundle with --policy-key.
    pub policy: PathBuf,
    /// The publisher's public key (PEM) when the policy is a signed bundle (`veil policy sign`).
    #[arg(long, value_name = "PEM")]
    pub policy_key: Option<PathBuf>,
    /// With a signed bundle: the log whose newest version of it the bundle must be (`--unlogged` is
    /// refused: leave out --log instead).
    #[command(flatten)]
    pub log: LogTrustArgs,
}

/// `veil policy init URL`
#[derive(Debug, Args)]
pub struct PolicyInitArgs {
    /// The host's public URL (`http://HOST:PORT` or `https://HOST:PORT`).
    pub url: String,
    /// Where to write the policy.
    #[arg(long)]
    pub out: PathBuf,
    /// Accept and pin SIMULATED evidence (development clusters); sets `allow_simulated = true`.
    #[arg(long)]
    pub allow_simulated: bool,
    /// Replace an existing file.
    #[arg(long)]
    pub force: bool,
    /// Also trust these PEM certificate authorities for the host's https:// URL.
    #[arg(long)]
    pub ca: Option<PathBuf>,
}

/// `--policy FILE [--policy-key PEM]`, shared by every command that verifies a route.
#[derive(Debug, Args)]
pub struct PolicyArgs {
    /// Policy every shard must satisfy: a TOML file, or a signed bundle with --policy-key.
    #[arg(long = "policy", value_name = "FILE")]
    pub path: PathBuf,
    /// The publisher's public key (PEM) when the policy is a signed bundle (`veil policy sign`).
    #[arg(long, value_name = "PEM")]
    pub policy_key: Option<PathBuf>,
    /// Where a signed bundle must be logged.
    #[command(flatten)]
    pub log: LogTrustArgs,
}

impl PolicyArgs {
    /// Reads the policy (see [`policy_bundle::load_policy`]).
    pub fn load(&self) -> Result<veil_attestation::Policy, error::CliError> {
        policy_bundle::load_policy(&self.path, self.policy_key.as_deref(), &self.log)
    }
}

/// The transparency log a signed policy bundle must be in (`--log`,
/// `--log-key`, witnesses), or `--unlogged` to accept one that is not.
#[derive(Debug, Clone, Default, Args)]
pub struct LogTrustArgs {
    /// The transparency log holding signed bundles: its URL (`veil log serve`, or a Veil host's
    /// `https://HOST/v1/log`) or its directory.
    #[arg(long = "log", value_name = "URL|DIR")]
    pub source: Option<String>,
    /// The log's verifier key (the `NAME+ID+KEY` line `veil log init` wrote to log.vkey).
    #[arg(long, value_name = "FILE", requires = "source")]
    pub log_key: Option<PathBuf>,
    /// A witness's verifier key (`veil log keygen --witness`); repeatable.
    #[arg(long = "witness", value_name = "FILE", requires = "log_key")]
    pub witnesses: Vec<PathBuf>,
    /// How many distinct listed witness keys must have cosigned the log's checkpoint (one public key
    /// listed under two names counts once).
    #[arg(long, default_value_t = 0, requires = "log_key")]
    pub witnesses_required: usize,
    /// Accept a signed bundle that is in no transparency log: its publisher could show you
    /// a different bundle than everyone else and nobody would see it.
    #[arg(long, conflicts_with_all = ["source", "log_key"])]
    pub unlogged: bool,
}

/// `veil log …`
#[derive(Debug, Subcommand)]
pub enum LogCommand {
    /// Create an empty log in DIR with a fresh key; prints its verifier key (also in DIR/log.vkey).
    Init(LogInitArgs),
    /// Make a witness's key pair (FILE, mode 0600, and FILE.vkey).
    Keygen(LogKeygenArgs),
    /// Append entries (signed policy bundles, reference values) and sign the new checkpoint.
    Append(LogAppendArgs),
    /// Serve a log directory's read API over HTTP (checkpoint, entries, proofs).
    Serve(LogServeArgs),
    /// Prove that FILE is in the log: verify the checkpoint and the inclusion proof, print both as JSON.
    Prove(LogProveArgs),
    /// Audit a whole log: recompute its root from every entry, and refuse two different bundles
    /// one publisher signed with the same version.
    Verify(LogVerifyArgs),
    /// As a witness: check the log's checkpoint extends the last one this witness cosigned, then cosign it.
    Cosign(LogCosignArgs),
}

/// `veil log init DIR --origin NAME`
#[derive(Debug, Args)]
pub struct LogInitArgs {
    /// The log's directory (created).
    pub dir: PathBuf,
    /// The log's name, the first line of every checkpoint (e.g. `policy.example.org/log`).
    #[arg(long)]
    pub origin: String,
}

/// `veil log keygen --name NAME --out FILE`
#[derive(Debug, Args)]
pub struct LogKeygenArgs {
    /// The witness's name (e.g. `witness.example.org`).
    #[arg(long)]
    pub name: String,
    /// Where to write the private key (mode 0600); the verifier key goes to FILE.vkey.
    #[arg(long)]
    pub out: PathBuf,
}

/// `veil log append DIR FILE…`
#[derive(Debug, Args)]
pub struct LogAppendArgs {
    /// The log's directory.
    pub dir: PathBuf,
    /// The entries (one file each).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// The publisher's public key (PEM): a policy bundle must verify with it, and is refused when the log
    /// already holds a different bundle of the same version from this publisher.
    #[arg(long, value_name = "PEM")]
    pub policy_key: Option<PathBuf>,
}

/// `veil log serve DIR --listen ADDR`
#[derive(Debug, Args)]
pub struct LogServeArgs {
    /// The log's directory.
    pub dir: PathBuf,
    /// Where to serve.
    #[arg(long, default_value = "127.0.0.1:8002")]
    pub listen: std::net::SocketAddr,
}

/// `veil log prove FILE --log URL|DIR --log-key FILE`
#[derive(Debug, Args)]
pub struct LogProveArgs {
    /// The entry (e.g. a signed policy bundle).
    pub file: PathBuf,
    /// The log and the checkpoint's signers.
    #[command(flatten)]
    pub log: LogTrustArgs,
    /// Also prove the checkpoint extends the tree of this size (a consistency proof).
    #[arg(long, value_name = "SIZE")]
    pub since: Option<u64>,
}

/// `veil log verify --log URL|DIR --log-key FILE`
#[derive(Debug, Args)]
pub struct LogVerifyArgs {
    /// The log and the checkpoint's signers.
    #[command(flatten)]
    pub log: LogTrustArgs,
    /// Publishers' public keys (PEM) whose bundles are checked for two versions alike; repeatable.
    #[arg(long = "policy-key", value_name = "PEM")]
    pub policy_keys: Vec<PathBuf>,
}

/// `veil log cosign --log URL|DIR --log-key FILE --key WITNESS_KEY --state DIR`
#[derive(Debug, Args)]
pub struct LogCosignArgs {
    /// The log and its key.
    #[command(flatten)]
    pub log: LogTrustArgs,
    /// The witness's private key (`veil log keygen`).
    #[arg(long)]
    pub key: PathBuf,
    /// The witness's own state directory (the last checkpoint it cosigned per log).
    #[arg(long, value_name = "DIR")]
    pub state: PathBuf,
    /// Write the cosigned checkpoint here; by default, when the log is a directory, it is added there.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// `veil receipt …`
#[derive(Debug, Subcommand)]
pub enum ReceiptCommand {
    /// Check receipts offline against the saved route documents they were answered on; exit 0 when every one verifies.
    ///
    /// Each saved route is verified again against the policy: its evidence for the `nonce` the file
    /// holds, with the time-dependent checks (certificate validity, CRL dates) as of the `verified_at`
    /// the file holds. A receipt
    /// is then accepted when it names that route's id and model, carries the receipt key the route's
    /// entry attested, is signed by that key, and has a time (the entry's clock) no earlier than
    /// `verified_at` less 300 s.
    ///
    /// What an accepted receipt proves: code holding the attested entry's receipt key (the entry, unless
    /// its TEE is broken) signed it, on a route whose evidence passes the policy, reporting the request
    /// and response digests, token counts, drafter, shards and time it carries.
    ///
    /// What it does not prove: the route file is not authenticated. Its nonce and `verified_at` are
    /// whatever the file says, and anyone who can ask the entry for evidence (the host included) can
    /// build one with a nonce of its own and a `verified_at` of its choosing. So an accepted receipt
    /// does not show that you (or any client) verified that route, nor when, nor that its evidence was
    /// fresh then; the time check is only as good as that `verified_at` and the entry's clock, which the
    /// host sets. Keep route files you saved yourself (`veil verify --save-route`, `veil proxy
    /// --receipts`) where the host cannot write. Offline there is no transcript: the request and response
    /// digests are compared with nothing (the SDK checks both when the answer arrives), so a receipt
    /// alone does not show which prompt or answer it covers. Its `shards` are not compared with the
    /// route's listed shards.
    Verify(ReceiptVerifyArgs),
}

/// `veil receipt verify RECEIPTS --route ROUTES --policy P`
#[derive(Debug, Args)]
pub struct ReceiptVerifyArgs {
    /// A receipt (JSON), or JSON lines of them (`veil proxy --receipts`'s file).
    pub receipts: PathBuf,
    /// The saved route document (`veil verify --save-route`), or JSON lines of them (the proxy's file again).
    #[arg(long, value_name = "FILE")]
    pub route: PathBuf,
    /// The policy the route was verified against.
    #[command(flatten)]
    pub policy: PolicyArgs,
}

/// `veil proxy URL`
#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// The host's public URL (`http://HOST:PORT` or `https://HOST:PORT`).
    pub url: String,
    /// The policy every shard must satisfy.
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Where to serve the plain API (loopback only).
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: std::net::SocketAddr,
    /// Also trust these PEM certificate authorities for the host's https:// URL.
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// Append every verified route document and every answer's checked receipt to FILE, as JSON lines
    /// (`veil receipt verify FILE --route FILE`).
    #[arg(long, value_name = "FILE")]
    pub receipts: Option<PathBuf>,
}

/// `veil web URL`
#[derive(Debug, Args)]
pub struct WebArgs {
    /// The host's public URL (`http://HOST:PORT` or `https://HOST:PORT`).
    pub url: String,
    /// The policy every shard must satisfy (handed to the page, which verifies against it).
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Where to serve the page (loopback only).
    #[arg(long, default_value = "127.0.0.1:8001")]
    pub listen: std::net::SocketAddr,
    /// Also trust these PEM certificate authorities for the host's https:// URL.
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// The WebAssembly client's package (scripts/build-wasm.sh). Default:
    /// $VEIL_WEB_PKG, else npm/veil-client beside this executable's directory.
    #[arg(long, value_name = "DIR")]
    pub pkg: Option<PathBuf>,
}

/// `veil verify URL`
#[derive(Debug, Args)]
pub struct RouteVerifyArgs {
    /// The host's public URL (`http://HOST:PORT` or `https://HOST:PORT`).
    pub url: String,
    /// The policy every shard must satisfy.
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Also trust these PEM certificate authorities for the host's https:// URL.
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// Print the whole verdict as JSON (every table, simulated flags) for scripts.
    #[arg(long)]
    pub json: bool,
    /// Write the route document as verified (with its nonce and time) to FILE, to check receipts against later.
    #[arg(long, value_name = "FILE")]
    pub save_route: Option<PathBuf>,
}

/// `veil chat URL`
#[derive(Debug, Args)]
pub struct ChatArgs {
    /// The host's public URL (`http://HOST:PORT` or `https://HOST:PORT`).
    pub url: String,
    /// The policy every shard must satisfy.
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Most tokens per answer (at least 1; the entry also refuses more than
    /// the model's context leaves after the conversation so far).
    #[arg(long, default_value_t = 256, value_parser = parse_max_tokens)]
    pub max_tokens: usize,
    /// Sampling temperature, 0 to 2 (0 = greedy).
    #[arg(long, default_value_t = 0.7, allow_negative_numbers = true, value_parser = parse_temperature)]
    pub temperature: f32,
    /// Repetition penalty over the last 64 tokens, above 0 and at most 2
    /// (1 = off; llama.cpp's chat default is 1.1). Turns speculation off.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true, value_parser = parse_repeat_penalty)]
    pub repeat_penalty: f32,
    /// Also trust these PEM certificate authorities for the host's https:// URL.
    #[arg(long)]
    pub ca: Option<PathBuf>,
}

/// `--repeat-penalty`: the gateway's range, checked before anything is verified or sent.
fn parse_repeat_penalty(s: &str) -> Result<f32, String> {
    let p: f32 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if p > 0.0 && p <= 2.0 {
        Ok(p)
    } else {
        Err("must be above 0 and at most 2 (1 = off)".into())
    }
}

/// `--temperature`: the gateway's range, checked before anything is verified or sent.
fn parse_temperature(s: &str) -> Result<f32, String> {
    let t: f32 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if (0.0..=2.0).contains(&t) {
        Ok(t)
    } else {
        Err("must be between 0 and 2 (0 = greedy)".into())
    }
}

/// `--max-tokens`: at least one.
fn parse_max_tokens(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a whole number")),
    }
}

/// `veil attest …`
#[derive(Debug, Subcommand)]
pub enum AttestCommand {
    /// Decode every field of an SEV-SNP report or evidence bundle, an Intel TDX quote, or NVIDIA GPU evidence.
    Inspect(InspectArgs),
    /// Verify evidence against a policy and print the check table.
    Verify(Box<VerifyArgs>),
    /// Create a SIMULATED attestation root and chip (development only).
    SimInit(SimInitArgs),
}

/// `veil attest inspect`
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["file", "gpu_evidence"])))]
pub struct InspectArgs {
    /// Raw 1184-byte report, the same as hex text, an evidence bundle (JSON), or a TDX quote (raw).
    pub file: Option<PathBuf>,
    /// NVIDIA GPU evidence: Veil GPU JSON, the NVIDIA SDK's JSON list, or a hex report (with --gpu-certs).
    #[arg(long, value_name = "FILE")]
    pub gpu_evidence: Option<PathBuf>,
    /// PEM device certificate chain (leaf first) for a hex --gpu-evidence.
    #[arg(long, value_name = "PEM", requires = "gpu_evidence")]
    pub gpu_certs: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `veil attest verify`
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("input").required(true).multiple(true).args(["evidence", "report", "gpu_evidence", "tdx", "azure", "tpm_quote"])))]
pub struct VerifyArgs {
    /// Policy file (TOML). Without it a strict default applies: every product,
    /// debug and migration agent off, VMPL 0, no TCB minimums, simulated
    /// evidence refused, measurement pinned with --measurement or waived with
    /// --any-measurement.
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// The publisher's public key (PEM) when the policy is a signed bundle (`veil policy sign`).
    #[arg(long, value_name = "PEM")]
    pub policy_key: Option<PathBuf>,
    /// Where a signed bundle must be logged.
    #[command(flatten)]
    pub log: LogTrustArgs,
    /// Evidence bundle (JSON).
    #[arg(long, conflicts_with_all = ["report", "vcek"])]
    pub evidence: Option<PathBuf>,
    /// Bare SEV-SNP report (raw or hex).
    #[arg(long, requires = "vcek")]
    pub report: Option<PathBuf>,
    /// VCEK or VLEK certificate (DER or PEM) for --report, or for the SNP report inside --azure.
    #[arg(long)]
    pub vcek: Option<PathBuf>,
    /// Intermediate and root certificates (PEM), e.g. the ASVK chain for a VLEK.
    #[arg(long, requires = "vcek")]
    pub chain: Option<PathBuf>,
    /// CRL signed by the ARK (DER or PEM).
    #[arg(long, requires = "vcek")]
    pub crl: Option<PathBuf>,
    /// Intel TDX quote (the raw binary, v4 or v5), verified offline with --collateral against the pinned
    /// Intel SGX Root CA and the policy's `[tdx]` section.
    #[arg(long, value_name = "QUOTE", requires = "collateral", conflicts_with_all = ["evidence", "report", "gpu_evidence"])]
    pub tdx: Option<PathBuf>,
    /// TDX collateral for --tdx: the PCCS JSON form (CRLs, issuer chains, signed TCB info and QE identity).
    #[arg(long, value_name = "FILE", requires = "tdx")]
    pub collateral: Option<PathBuf>,
    /// Azure HCL report (vTPM NV index 0x01400001: the SNP report and the runtime claims holding the
    /// vTPM's attestation key); its SNP report is checked with --vcek, and the policy's `[azure]` section.
    #[arg(long, value_name = "HCL_REPORT", conflicts_with_all = ["evidence", "report", "gpu_evidence", "tdx"])]
    pub azure: Option<PathBuf>,
    /// A vTPM quote (the az-cvm-vtpm serialisation: signature, TPMS_ATTEST, PCR values), checked under the
    /// HCL report's attestation key, or --ak-pub; with --nonce its qualifying data (text).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["evidence", "report", "gpu_evidence", "tdx"])]
    pub tpm_quote: Option<PathBuf>,
    /// The attestation key (SPKI, PEM or DER) to check --tpm-quote with; with --azure it must be the HCL
    /// report's own.
    #[arg(long, value_name = "PEM", requires = "tpm_quote")]
    pub ak_pub: Option<PathBuf>,
    /// Allowed TDX MRTD (96 hex digits); repeatable; added to the policy's `[tdx] mrtd`.
    #[arg(long = "mrtd", value_name = "HEX", requires = "tdx")]
    pub mrtds: Vec<String>,
    /// Allowed launch measurement (96 hex digits); repeatable; added to the policy's allowlist.
    #[arg(long = "measurement", value_name = "HEX")]
    pub measurements: Vec<String>,
    /// Accept any launch measurement, or with --tdx any MRTD (says so in the table).
    #[arg(long)]
    pub any_measurement: bool,
    /// Expected REPORT_DATA (hex, up to 64 bytes, zero-padded).
    #[arg(long, value_name = "HEX")]
    pub report_data: Option<String>,
    /// Expected nonce in the bundle's claims (hex); with --tpm-quote, the quote's qualifying data (text).
    #[arg(long, value_name = "HEX|TEXT")]
    pub nonce: Option<String>,
    /// Verify as of this time (YYYY-MM-DD or YYYY-MM-DDTHH:MM:SSZ) instead of now.
    #[arg(long, value_name = "TIME")]
    pub at: Option<String>,
    /// NVIDIA GPU evidence: Veil GPU JSON, the NVIDIA SDK's JSON list, or a hex report (with --gpu-certs).
    /// Together with --evidence, the GPU nonce is derived from the bundle's claims and the claims must
    /// commit to the GPU evidence digest.
    #[arg(long, value_name = "FILE")]
    pub gpu_evidence: Option<PathBuf>,
    /// PEM device certificate chain (leaf first) for a hex --gpu-evidence.
    #[arg(long, value_name = "PEM", requires = "gpu_evidence")]
    pub gpu_certs: Option<PathBuf>,
    /// Expected SPDM request nonce of every GPU (64 hex digits).
    #[arg(long, value_name = "HEX", requires = "gpu_evidence")]
    pub gpu_nonce: Option<String>,
    /// A driver or VBIOS RIM (SWID XML); repeatable. Without any, RIM comparison shows as not run.
    #[arg(long = "rim", value_name = "FILE", requires = "gpu_evidence")]
    pub rims: Vec<PathBuf>,
    /// OCSP response (DER) for a certificate of the GPU device chain; repeatable.
    #[arg(long = "gpu-ocsp", value_name = "FILE", requires = "gpu_evidence")]
    pub gpu_ocsp: Vec<PathBuf>,
    /// Fail unless both RIMs are given and match (sets the policy's gpu.require_rim).
    #[arg(long, requires = "gpu_evidence")]
    pub require_rim: bool,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// `veil attest sim-init`
#[derive(Debug, Args)]
pub struct SimInitArgs {
    /// Directory to create (keys, certificates, config, dev policy).
    pub dir: PathBuf,
    /// Product the simulated hierarchy imitates.
    #[arg(long, default_value = "Genoa", value_parser = parse_product)]
    pub product: veil_attestation::snp::Product,
    /// Derive keys from this seed (hex) instead of fresh randomness; for reproducible tests only.
    #[arg(long, value_name = "HEX")]
    pub seed: Option<String>,
    /// The launch measurement the simulated guests report (96 hex digits; e.g. `veil measure` of the
    /// launch inputs the simulated guest stands for). Default: a fixed value that no real guest has.
    #[arg(long, value_name = "HEX")]
    pub measurement: Option<String>,
    /// The HOST_DATA the simulated guests report (64 hex digits; e.g. `veil-shard config-digest`
    /// of the route, as a VMM would set it at launch). Default: zero.
    #[arg(long, value_name = "HEX")]
    pub host_data: Option<String>,
    /// Overwrite an existing simulated root in DIR.
    #[arg(long)]
    pub force: bool,
}

fn parse_product(s: &str) -> Result<veil_attestation::snp::Product, error::UnknownProduct> {
    veil_attestation::snp::Product::from_product_name(s).ok_or_else(|| error::UnknownProduct { name: s.to_owned() })
}

/// Runs a parsed command, writing to stdout/stderr.
pub fn run(cli: Cli) -> Exit {
    match cli.command {
        Command::Attest(AttestCommand::Inspect(args)) => inspect::run(&args),
        Command::Attest(AttestCommand::Verify(args)) if args.tdx.is_some() => verify_tdx::run(&args),
        Command::Attest(AttestCommand::Verify(args)) if args.azure.is_some() || args.tpm_quote.is_some() => {
            verify_azure::run(&args)
        }
        Command::Attest(AttestCommand::Verify(args)) => verify::run(&args),
        Command::Attest(AttestCommand::SimInit(args)) => sim_init::run(&args),
        Command::Verify(args) => route::verify(&args),
        Command::Chat(args) => route::chat(&args),
        Command::Proxy(args) => proxy::run(&args),
        Command::Web(args) => web::run(&args),
        Command::Policy(PolicyCommand::Init(args)) => policy_init::run(&args),
        Command::Policy(PolicyCommand::Check(args)) => policy_check::run(&args),
        Command::Policy(PolicyCommand::Keygen(args)) => policy_bundle::keygen(&args),
        Command::Canary(args) => canary::run(&args),
        Command::Policy(PolicyCommand::Sign(args)) => policy_bundle::sign(&args),
        Command::Policy(PolicyCommand::New(args)) => policy_edit::new(&args),
        Command::Policy(PolicyCommand::Edit(edit)) => policy_edit::run(&edit),
        Command::Measure(args) => measure::run(&args),
        Command::Receipt(ReceiptCommand::Verify(args)) => receipt::verify(&args),
        Command::Log(command) => log::run(&command),
    }
}

/// Connection options from a `--ca` flag.
fn connect_options(ca: Option<&std::path::Path>) -> Result<crate::sdk::ConnectOptions, crate::sdk::ClientError> {
    let options = crate::sdk::ConnectOptions::default();
    match ca {
        Some(path) => options.with_ca_file(path),
        None => Ok(options),
    }
}
