//! The route file as written: one TOML file read by every shard
//! (`veil-shard`, which checks it into a route) and by the development
//! supervisor (`veil-host cluster`, which starts its processes). Shapes only;
//! the enclave's `pipeline::route::Route::parse` is where it is checked.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// A route file.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouteFile {
    /// The GGUF (relative to the file, or `~/`).
    pub model: String,
    /// The attestation policy every link is verified against.
    pub policy: String,
    /// Development only: shards attest with this simulated root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simulated_root: Option<String>,
    /// Development only: simulated GPUs per shard.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub simulated_gpus: u32,
    /// KV memory per shard, all sessions together.
    #[serde(default = "default_kv_budget_mib")]
    pub kv_budget_mib: u64,
    /// Positions per forward frame during prefill.
    #[serde(default = "default_prefill_chunk")]
    pub prefill_chunk: u32,
    /// Control-link heartbeat.
    #[serde(default = "default_heartbeat_ms")]
    pub heartbeat_ms: u64,
    /// How long the entry waits for one round's verdict before it treats
    /// the round as lost.
    #[serde(default = "default_round_timeout_s")]
    pub round_timeout_s: u64,
    /// Re-hash resident weights this often (0: never).
    #[serde(default = "default_weight_recheck_s")]
    pub weight_recheck_s: u64,
    /// `f32` (exact), `f16` or `bf16` activations between shards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activation_precision: Option<String>,
    /// Speculative decoding; off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculation: Option<SpeculationFile>,
    /// The entry's endpoints.
    pub entry: EntryFile,
    /// Stages in order; stage 0 is the entry.
    pub stage: Vec<StageFile>,
}

/// Which drafter proposes tokens for speculative decoding: one type for
/// the route file (`speculation.drafter`), a request's `speculation.drafter`
/// and the CLIs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Drafter {
    /// No speculation.
    #[default]
    None,
    /// Prompt lookup: n-gram matches in the context (no weights).
    Ngram,
    /// The route's draft model.
    Model,
    /// Prompt lookup where the context repeats itself, the route's draft
    /// model elsewhere (and after a lookup that ends short of `k`).
    #[serde(rename = "ngram+model")]
    NgramModel,
    /// A given continuation (requests only: tests and benchmarks).
    Script,
}

impl Drafter {
    /// Its name as written in files and requests.
    pub fn name(self) -> &'static str {
        match self {
            Drafter::None => "none",
            Drafter::Ngram => "ngram",
            Drafter::Model => "model",
            Drafter::NgramModel => "ngram+model",
            Drafter::Script => "script",
        }
    }
}

impl std::str::FromStr for Drafter {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(Drafter::None),
            "ngram" => Ok(Drafter::Ngram),
            "model" => Ok(Drafter::Model),
            "ngram+model" => Ok(Drafter::NgramModel),
            "script" => Ok(Drafter::Script),
            other => Err(format!("unknown drafter {other:?} (none, ngram, model, ngram+model or script)")),
        }
    }
}

/// `[speculation]`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SpeculationFile {
    /// `none`, `ngram`, `model` or `ngram+model`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drafter: Option<Drafter>,
    /// For `model` and `ngram+model`: a GGUF with the target's vocabulary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_model: Option<String>,
    /// Most drafted tokens per round.
    #[serde(default = "default_k_max")]
    pub k_max: usize,
    /// A fixed k instead of adaptive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k: Option<usize>,
    /// Most verification rounds one session keeps in flight (pipelined
    /// speculation; 1 = one round per trip around the ring).
    #[serde(default = "default_depth_max")]
    pub depth_max: usize,
    /// A fixed number of rounds in flight instead of adaptive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<usize>,
}

/// The default most rounds in flight per session.
pub fn default_depth_max() -> usize {
    4
}

/// `[entry]`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EntryFile {
    /// The internal (plaintext, loopback-only) generate endpoint.
    pub generate_listen: SocketAddr,
    /// Sealed requests and evidence, for the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed_listen: Option<SocketAddr>,
    /// Have a spare replica of each stage shadow every session's KV, so a
    /// fail-over needs no re-prefill (costs the spare replica's compute).
    #[serde(default = "default_true", skip_serializing_if = "is_true")]
    pub shadows: bool,
}

fn default_true() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// `[[stage]]`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StageFile {
    /// Layers `[start, end)`.
    pub layers: [u32; 2],
    /// The manifest root every replica must have loaded (64 hex digits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_root: Option<String>,
    /// Shard addresses; any one serves the stage.
    pub replicas: Vec<SocketAddr>,
    /// Where the stage's shards compute: `cpu` (the default) or `cuda:N`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
}

impl RouteFile {
    /// Parses route TOML (shape only).
    pub fn from_toml(text: &str) -> Result<Self, toml::de::Error> {
        toml::from_str(text)
    }

    /// The file's TOML.
    pub fn to_toml(&self) -> String {
        // Every field is a string, number, address or table of them: always encodable.
        toml::to_string(self).unwrap_or_default()
    }
}

/// Default `kv_budget_mib`.
pub fn default_kv_budget_mib() -> u64 {
    512
}
/// Default `prefill_chunk`.
pub fn default_prefill_chunk() -> u32 {
    64
}
/// Default `heartbeat_ms`.
pub fn default_heartbeat_ms() -> u64 {
    250
}
/// Default `round_timeout_s`.
pub fn default_round_timeout_s() -> u64 {
    60
}
/// Default `weight_recheck_s`.
pub fn default_weight_recheck_s() -> u64 {
    60
}
/// Default `speculation.k_max`.
pub fn default_k_max() -> usize {
    8
}
fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_file_round_trips_and_refuses_unknown_keys() {
        let text = r#"
model = "m.gguf"
policy = "p.toml"
[entry]
generate_listen = "127.0.0.1:7700"
[[stage]]
layers = [0, 10]
replicas = ["127.0.0.1:7710"]
"#;
        let f = RouteFile::from_toml(text).unwrap();
        assert_eq!((f.kv_budget_mib, f.prefill_chunk, f.heartbeat_ms), (512, 64, 250));
        assert_eq!(RouteFile::from_toml(&f.to_toml()).unwrap(), f);
        assert!(RouteFile::from_toml(&text.replace("policy", "polcy")).is_err(), "a misspelt key is an error");
    }

    #[test]
    fn a_drafter_has_one_spelling_everywhere() {
        for d in [Drafter::None, Drafter::Ngram, Drafter::Model, Drafter::NgramModel, Drafter::Script] {
            assert_eq!(d.name().parse::<Drafter>(), Ok(d));
            let file = RouteFile::from_toml(&format!(
                "model = \"m\"\npolicy = \"p\"\n[speculation]\ndrafter = \"{}\"\n[entry]\n\
                 generate_listen = \"127.0.0.1:1\"\n[[stage]]\nlayers = [0, 1]\nreplicas = [\"127.0.0.1:2\"]\n",
                d.name()
            ))
            .unwrap();
            assert_eq!(file.speculation.and_then(|s| s.drafter), Some(d));
        }
        assert!("oracle".parse::<Drafter>().is_err());
    }
}
