//! The route: which shard serves which layers where, and the cluster's
//! trust settings. One TOML file read by every shard and by the supervisor.
//!
//! ```toml
//! model = "~/.cache/veil/models/SmolLM2-135M-Instruct.Q4_1.gguf"
//! policy = "sim/policy.dev.toml"        # attestation policy every link is verified against
//! simulated_root = "sim"               # dev only: shards attest with this simulated root
//! simulated_gpus = 1                   # dev only: each shard also presents this many simulated GPUs
//! kv_budget_mib = 512                  # per shard, all sessions together
//! prefill_chunk = 64                   # positions per forward frame during prefill
//! heartbeat_ms = 250
//! round_timeout_s = 60                 # a round with no verdict this long is lost: resent, or re-routed
//! weight_recheck_s = 60      # re-hash resident weights this often; stop on a change (0: never)
//! activation_precision = "f32"         # or "f16"/"bf16": half the bytes per hop, not bit-exact
//!
//! [speculation]                        # optional; default: off
//! drafter = "ngram"                    # "none", "ngram" (prompt lookup), "model" or "ngram+model"
//! draft_model = "draft.gguf"           # for "model" and "ngram+model": a GGUF with the target's vocabulary
//! k_max = 8                            # most drafted tokens per round (adaptive k up to this)
//! k = 4                                # optional: a fixed k instead of adaptive
//!
//! [entry]
//! generate_listen = "127.0.0.1:7700"   # internal streaming generate endpoint (loopback only)
//! sealed_listen = "127.0.0.1:7701"     # sealed requests and evidence, for the host (ciphertext only)
//! shadows = true                       # a spare replica of each stage shadows every session's KV (default)
//!
//! [[stage]]                            # stage 0 is the entry: embedding and first layers
//! layers = [0, 10]
//! manifest_root = "…64 hex digits…"    # the model's, the same for every stage: `veil-shard manifest MODEL`
//! replicas = ["127.0.0.1:7710"]
//!
//! [[stage]]
//! layers = [10, 30]
//! manifest_root = "…"
//! replicas = ["127.0.0.1:7720", "127.0.0.1:7721"]
//! ```
//! Relative paths are relative to the file; `~/` is the home directory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use veil_attestation::{LayerRange, ManifestRoot};
use veil_wire::route::{default_depth_max, default_k_max, EntryFile, RouteFile, SpeculationFile, StageFile};

use crate::link::frame::Precision;

pub use crate::error::route::RouteError;

/// Which drafter the entry uses when a request does not choose (the route
/// never names `script`).
pub use veil_wire::route::Drafter as DrafterKind;

/// The route's speculative decoding settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Speculation {
    /// The default drafter.
    pub drafter: DrafterKind,
    /// The draft model file (loaded by the entry when set).
    pub draft_model: Option<PathBuf>,
    /// Most drafted tokens per round.
    pub k_max: usize,
    /// A fixed k instead of adaptive.
    pub k: Option<usize>,
    /// Most rounds one session keeps in flight (pipelined speculation).
    pub depth_max: usize,
    /// A fixed number of rounds in flight instead of adaptive.
    pub depth: Option<usize>,
}

impl Default for Speculation {
    fn default() -> Self {
        Self {
            drafter: DrafterKind::None,
            draft_model: None,
            k_max: default_k_max(),
            k: None,
            depth_max: default_depth_max(),
            depth: None,
        }
    }
}

/// One pipeline stage: a layer range and the shards that serve it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stage {
    /// Layers `[start, end)`.
    pub layers: LayerRange,
    /// The manifest root every replica must have loaded (hex in the file).
    pub manifest_root: Option<ManifestRoot>,
    /// Shard addresses; any one of them serves the stage.
    pub replicas: Vec<SocketAddr>,
    /// Where its shards compute (`veil-shard serve --device` overrides).
    pub device: crate::model::ComputeDevice,
}

/// A parsed, checked route.
#[derive(Clone, Debug)]
pub struct Route {
    /// Model file every shard loads its slice from.
    pub model: PathBuf,
    /// Attestation policy file.
    pub policy: PathBuf,
    /// Simulated attestation root (development), when set.
    pub simulated_root: Option<PathBuf>,
    /// Simulated GPUs each shard presents with its evidence (development).
    pub simulated_gpus: u32,
    /// KV memory per shard, bytes.
    pub kv_budget_bytes: usize,
    /// Positions per forward frame in prefill.
    pub prefill_chunk: usize,
    /// Heartbeat interval on control links.
    pub heartbeat: std::time::Duration,
    /// How long the entry waits for a round's verdict.
    pub round_timeout: std::time::Duration,
    /// How often a shard re-hashes its resident weights (`None`: never).
    pub weight_recheck: Option<std::time::Duration>,
    /// Encoding of hidden states between shards (f32 unless the file opts in to f16/bf16).
    pub precision: Precision,
    /// Speculative decoding on the entry.
    pub speculation: Speculation,
    /// The entry's internal generate endpoint.
    pub generate_listen: SocketAddr,
    /// Where the entry serves sealed requests and evidence to the host
    /// (ciphertext only), when set.
    pub sealed_listen: Option<SocketAddr>,
    /// Spare replicas shadow sessions' KV (warm fail-over).
    pub shadows: bool,
    /// Stages in layer order; stage 0 is the entry.
    pub stages: Vec<Stage>,
}

impl Route {
    /// Reads and checks a route file.
    pub fn load(path: &Path) -> Result<Self, RouteError> {
        let text = std::fs::read_to_string(path).map_err(|source| RouteError::Io { path: path.to_owned(), source })?;
        // Absolute, so that a route written back out (`to_toml`) resolves the same from anywhere.
        // A bare file name has an empty parent: the current directory.
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let base = std::path::absolute(parent).map_err(|source| RouteError::Io { path: path.to_owned(), source })?;
        Self::parse(&text, &base).map_err(|e| match e {
            RouteError::Parse { message, .. } => RouteError::Parse { path: path.to_owned(), message },
            other => other,
        })
    }

    /// Parses route TOML, resolving relative paths against `base`.
    pub fn parse(text: &str, base: &Path) -> Result<Self, RouteError> {
        let f = RouteFile::from_toml(text)
            .map_err(|e| RouteError::Parse { path: PathBuf::new(), message: e.to_string() })?;
        let bad = |m: String| Err(RouteError::Invalid(m));
        if f.stage.is_empty() {
            return bad("no stages".into());
        }
        if f.stage.len() > 255 {
            return bad("more than 255 stages".into());
        }
        if !f.entry.generate_listen.ip().is_loopback() {
            return bad(format!(
                "entry.generate_listen {} is not a loopback address: the internal endpoint carries plaintext and must not leave the enclave",
                f.entry.generate_listen
            ));
        }
        if f.simulated_gpus > 0 && f.simulated_root.is_none() {
            return bad("simulated_gpus needs simulated_root (development clusters only)".into());
        }
        if f.simulated_gpus > 8 {
            return bad("simulated_gpus is at most 8".into());
        }
        if f.prefill_chunk == 0 || f.heartbeat_ms == 0 || f.kv_budget_mib == 0 || f.round_timeout_s == 0 {
            return bad("prefill_chunk, heartbeat_ms, round_timeout_s and kv_budget_mib must be positive".into());
        }
        let precision = match f.activation_precision.as_deref() {
            None | Some("f32") => Precision::F32,
            Some("f16") => Precision::F16,
            Some("bf16") => Precision::Bf16,
            Some(other) => return bad(format!("activation_precision {other:?} (f32, f16 or bf16)")),
        };
        let speculation = match &f.speculation {
            None => Speculation::default(),
            Some(sp) => {
                let drafter = sp.drafter.unwrap_or_default();
                if drafter == DrafterKind::Script {
                    return bad(
                        "speculation.drafter \"script\" is for requests only (none, ngram, model or ngram+model)"
                            .into(),
                    );
                }
                if matches!(drafter, DrafterKind::Model | DrafterKind::NgramModel) && sp.draft_model.is_none() {
                    return bad(format!("speculation.drafter = {:?} needs speculation.draft_model", drafter.name()));
                }
                if sp.k_max == 0 || sp.k_max > crate::speculate::MAX_K {
                    return bad(format!("speculation.k_max must be 1..={}", crate::speculate::MAX_K));
                }
                if sp.k.is_some_and(|k| k > sp.k_max) {
                    return bad("speculation.k is larger than k_max".into());
                }
                let depths = 1..=crate::speculate::pipeline::MAX_DEPTH;
                if !depths.contains(&sp.depth_max) || sp.depth.is_some_and(|d| !depths.contains(&d)) {
                    return bad(format!(
                        "speculation.depth_max and depth must be 1..={}",
                        crate::speculate::pipeline::MAX_DEPTH
                    ));
                }
                Speculation {
                    drafter,
                    draft_model: None,
                    k_max: sp.k_max,
                    k: sp.k,
                    depth_max: sp.depth_max,
                    depth: sp.depth,
                }
            }
        };
        let mut stages = Vec::with_capacity(f.stage.len());
        let mut next = 0;
        for (i, s) in f.stage.iter().enumerate() {
            let [a, b] = s.layers;
            if a != next || b <= a {
                return bad(format!("stage {i} serves layers {a}..{b}; stages must be contiguous from 0"));
            }
            next = b;
            if s.replicas.is_empty() || s.replicas.len() > 255 {
                return bad(format!("stage {i} needs 1 to 255 replicas"));
            }
            if i == 0 && s.replicas.len() != 1 {
                return bad("stage 0 is the entry and has exactly one address".into());
            }
            let manifest_root = s
                .manifest_root
                .as_deref()
                .map(str::parse::<ManifestRoot>)
                .transpose()
                .map_err(|e| RouteError::Invalid(format!("stage {i} manifest_root: {e}")))?;
            let layers = LayerRange::new(a, b).map_err(|e| RouteError::Invalid(e.to_string()))?;
            let device = s
                .device
                .as_deref()
                .map(str::parse)
                .transpose()
                .map_err(|e| RouteError::Invalid(format!("stage {i} device: {e}")))?
                .unwrap_or_default();
            stages.push(Stage { layers, manifest_root, replicas: s.replicas.clone(), device });
        }
        let all: Vec<_> = stages
            .iter()
            .flat_map(|s| s.replicas.iter())
            .chain([&f.entry.generate_listen])
            .chain(f.entry.sealed_listen.as_ref())
            .collect();
        for (i, a) in all.iter().enumerate() {
            if all[i + 1..].contains(a) {
                return bad(format!("address {a} is used twice"));
            }
        }
        let resolve = |p: &str| -> PathBuf {
            if let Some(rest) = p.strip_prefix("~/") {
                return PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(rest);
            }
            let p = Path::new(p);
            if p.is_absolute() {
                p.to_owned()
            } else {
                base.join(p)
            }
        };
        let speculation = Speculation {
            draft_model: f.speculation.as_ref().and_then(|sp| sp.draft_model.as_deref()).map(resolve),
            ..speculation
        };
        Ok(Self {
            speculation,
            model: resolve(&f.model),
            policy: resolve(&f.policy),
            simulated_root: f.simulated_root.as_deref().map(resolve),
            simulated_gpus: f.simulated_gpus,
            kv_budget_bytes: usize::try_from(f.kv_budget_mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX),
            prefill_chunk: f.prefill_chunk as usize,
            heartbeat: std::time::Duration::from_millis(f.heartbeat_ms),
            round_timeout: std::time::Duration::from_secs(f.round_timeout_s),
            weight_recheck: (f.weight_recheck_s > 0).then(|| std::time::Duration::from_secs(f.weight_recheck_s)),
            precision,
            generate_listen: f.entry.generate_listen,
            sealed_listen: f.entry.sealed_listen,
            shadows: f.entry.shadows,
            stages,
        })
    }

    /// Whether every stage pins its manifest root (shards require it).
    pub fn fully_pinned(&self) -> Result<(), RouteError> {
        match self.stages.iter().position(|s| s.manifest_root.is_none()) {
            Some(i) => Err(RouteError::Invalid(format!(
                "stage {i} has no manifest_root (veil-host cluster fills them in; or run veil-shard manifest)"
            ))),
            None => Ok(()),
        }
    }

    /// The route's shape for a model of `model_layers` layers: what every
    /// shard's claims commit to. Refused unless every stage pins its manifest
    /// and the stages end at the model's last layer.
    pub fn shape(&self, model_layers: u32) -> Result<veil_attestation::route::RouteShape, RouteError> {
        self.fully_pinned()?;
        let stages = self
            .stages
            .iter()
            .map(|s| {
                Ok(veil_attestation::route::StageShape {
                    layers: s.layers,
                    manifest_root: s.manifest_root.unwrap_or(ManifestRoot([0; 32])),
                })
            })
            .collect::<Result<Vec<_>, RouteError>>()?;
        let activations = match self.precision {
            Precision::F32 => "f32",
            Precision::F16 => "f16",
            Precision::Bf16 => "bf16",
        };
        veil_attestation::route::RouteShape::new(model_layers, activations, stages)
            .map_err(|e| RouteError::Invalid(e.to_string()))
    }

    /// The route as TOML (paths absolute), e.g. after roots were filled in.
    pub fn to_toml(&self) -> String {
        RouteFile::from(self).to_toml()
    }
}

impl Route {
    /// The digest a shard's SEV-SNP `HOST_DATA` must equal when the route and
    /// its peer policy are bound through it (`veil-shard serve --bind-config`,
    /// `veil-shard config-digest`): SHA-256 over a domain separator, the route
    /// in canonical TOML with every file path left out (the weights are pinned
    /// by manifest roots, the policy by its content), and the peer policy's
    /// canonical encoding. The same route and policy give the same digest on
    /// every machine, whatever directory they sit in.
    pub fn config_digest(&self, policy: &veil_attestation::Policy) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        let mut file = RouteFile::from(self);
        file.model.clear();
        file.policy.clear();
        file.simulated_root = None;
        if let Some(sp) = file.speculation.as_mut() {
            sp.draft_model = None;
        }
        let route = file.to_toml();
        let policy = policy.canonical_bytes();
        Sha256::new()
            .chain_update(CONFIG_DIGEST_DOMAIN)
            .chain_update((route.len() as u64).to_le_bytes())
            .chain_update(route.as_bytes())
            .chain_update((policy.len() as u64).to_le_bytes())
            .chain_update(&policy)
            .finalize()
            .into()
    }
}

/// Domain separator of [`Route::config_digest`].
pub const CONFIG_DIGEST_DOMAIN: &[u8] = b"veil/route-config/v1\0";

impl From<&Route> for RouteFile {
    fn from(r: &Route) -> Self {
        let path = |p: &Path| p.display().to_string();
        let sp = &r.speculation;
        RouteFile {
            model: path(&r.model),
            policy: path(&r.policy),
            simulated_root: r.simulated_root.as_deref().map(path),
            simulated_gpus: r.simulated_gpus,
            kv_budget_mib: (r.kv_budget_bytes >> 20) as u64,
            prefill_chunk: r.prefill_chunk as u32,
            heartbeat_ms: r.heartbeat.as_millis() as u64,
            round_timeout_s: r.round_timeout.as_secs(),
            weight_recheck_s: r.weight_recheck.map_or(0, |d| d.as_secs()),
            activation_precision: Some(
                match r.precision {
                    Precision::F32 => "f32",
                    Precision::F16 => "f16",
                    Precision::Bf16 => "bf16",
                }
                .to_owned(),
            ),
            speculation: (*sp != Speculation::default()).then(|| SpeculationFile {
                drafter: Some(sp.drafter),
                draft_model: sp.draft_model.as_deref().map(path),
                k_max: sp.k_max,
                k: sp.k,
                depth_max: sp.depth_max,
                depth: sp.depth,
            }),
            entry: EntryFile { generate_listen: r.generate_listen, sealed_listen: r.sealed_listen, shadows: r.shadows },
            stage: r
                .stages
                .iter()
                .map(|s| StageFile {
                    layers: [s.layers.start(), s.layers.end()],
                    manifest_root: s.manifest_root.map(|r| r.to_string()),
                    replicas: s.replicas.clone(),
                    device: (s.device != crate::model::ComputeDevice::Cpu).then(|| s.device.to_string()),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = r#"
model = "m.gguf"
policy = "/etc/veil/policy.toml"
[entry]
generate_listen = "127.0.0.1:7700"
[[stage]]
layers = [0, 10]
replicas = ["127.0.0.1:7710"]
[[stage]]
layers = [10, 30]
manifest_root = "0101010101010101010101010101010101010101010101010101010101010101"
replicas = ["127.0.0.1:7720", "127.0.0.1:7721"]
"#;

    #[test]
    fn the_config_digest_covers_what_decides_trust_and_no_path() {
        let base = Path::new("/srv/a");
        let r = Route::parse(OK, base).unwrap();
        let p = veil_attestation::Policy::default();
        let d = r.config_digest(&p);
        // Other directories and file names: the same digest.
        let moved = OK.replace("m.gguf", "/elsewhere/model.gguf").replace("/etc/veil/policy.toml", "p.toml");
        assert_eq!(Route::parse(&moved, Path::new("/other")).unwrap().config_digest(&p), d);
        // A replica, a manifest pin, a setting, a stage's device, or the policy: another digest.
        for changed in [
            OK.replace("127.0.0.1:7721", "127.0.0.1:7722"),
            OK.replace("\"127.0.0.1:7721\"]", "\"127.0.0.1:7721\"]\ndevice = \"cuda:0\""),
            OK.replace("0101010101", "0202020202"),
            format!("prefill_chunk = 32\n{OK}"),
        ] {
            assert_ne!(Route::parse(&changed, base).unwrap().config_digest(&p), d, "{changed}");
        }
        let weaker = veil_attestation::Policy { allow_debug: true, ..veil_attestation::Policy::default() };
        assert_ne!(r.config_digest(&weaker), d);
    }

    #[test]
    fn parses_resolves_and_round_trips() {
        let r = Route::parse(OK, Path::new("/srv/veil")).unwrap();
        assert_eq!(r.model, Path::new("/srv/veil/m.gguf"));
        assert_eq!(r.policy, Path::new("/etc/veil/policy.toml"));
        assert_eq!(r.stages.len(), 2);
        assert_eq!(r.stages[1].manifest_root, Some(ManifestRoot([1; 32])));
        assert!(r.fully_pinned().is_err());
        let again = Route::parse(&r.to_toml(), Path::new("/")).unwrap();
        assert_eq!(again.stages, r.stages);
        assert_eq!(again.model, r.model);
        assert_eq!(r.speculation, Speculation::default());
        let spec =
            OK.replace("[entry]", "[speculation]\ndrafter = \"model\"\ndraft_model = \"d.gguf\"\nk = 3\n[entry]");
        let r = Route::parse(&spec, Path::new("/srv/veil")).unwrap();
        assert_eq!(r.speculation.drafter, DrafterKind::Model);
        assert_eq!(r.speculation.draft_model.as_deref(), Some(Path::new("/srv/veil/d.gguf")));
        assert_eq!(r.speculation.k, Some(3));
        assert_eq!(Route::parse(&r.to_toml(), Path::new("/")).unwrap().speculation, r.speculation);
    }

    #[test]
    fn refuses_inconsistent_routes() {
        let cases = [
            OK.replace("layers = [10, 30]", "layers = [11, 30]"),
            OK.replace("127.0.0.1:7700", "0.0.0.0:7700"),
            OK.replace("\"127.0.0.1:7720\", ", "\"127.0.0.1:7710\", "),
            OK.replace("replicas = [\"127.0.0.1:7710\"]", "replicas = [\"127.0.0.1:7710\", \"127.0.0.1:7711\"]"),
            OK.replace("0101010101", "01"),
            OK.replace("policy =", "unknown = 1\npolicy ="),
            OK.replace("policy =", "activation_precision = \"f8\"\npolicy ="),
            OK.replace("[entry]", "[speculation]\ndrafter = \"model\"\n[entry]"),
            OK.replace("[entry]", "[speculation]\ndrafter = \"ngram+model\"\n[entry]"),
            OK.replace("[entry]", "[speculation]\ndrafter = \"oracle\"\n[entry]"),
            OK.replace("[entry]", "[speculation]\ndrafter = \"ngram\"\nk_max = 99\n[entry]"),
            OK.replace("[entry]", "[speculation]\ndrafter = \"ngram\"\nk_max = 4\nk = 5\n[entry]"),
            OK.replace("[entry]", "[speculation]\ndrafter = \"ngram\"\ndepth_max = 0\n[entry]"),
            OK.replace("[entry]", "[speculation]\ndrafter = \"ngram\"\ndepth = 9\n[entry]"),
        ];
        for c in cases {
            assert!(Route::parse(&c, Path::new("/")).is_err(), "{c}");
        }
    }
}
