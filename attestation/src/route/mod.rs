//! The route a client relies on, verified as one: the entry's attestation
//! document and the checks that turn it into a [`VerifiedRoute`].
//!
//! ```text
//!  entry (nonce-fresh evidence)                 client (relying party)
//!  claims: hpke key hash ───────────────────▶  seals only to this key
//!          peer_policy  = H(policy it enforces) ─▶ peer_policy_binding, peer_policy
//!          route_shape  = H(stages, pins, n)   ─▶ route_shape_binding, coverage
//!          route_links  = H(shards it linked)  ─▶ route_links (then every shard's
//!          nonce                                   freshness is established)
//!  document: key_config, peer_policy, route, entry, shards[]
//! ```
//!
//! Nothing in the document is taken on the host's word: the entry's
//! nonce-bound claims commit to the peer policy text, the route's shape and
//! the exact list of shard evidence it has verified over live, exporter-bound
//! links, so a host that strips, replays or swaps shards changes a digest the
//! hardware signed. Every shard's own evidence must then pass the client's
//! policy and commit to the same peer policy and shape, and the peer policy
//! the shards enforce (on fail-over too) must be at least as strict as the
//! client's, or pinned by digest in the client's policy.
//!
//! [`verify_route`] is pure: the caller passes the document, the policy, the
//! nonce it sent and the time.

use crate::invalid::{InvalidValue, ValueKind};
use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::claims::{DrafterDigest, LayerRange, LinksCommitment, ManifestRoot, PolicyDigest, RouteDigest};
use crate::error::Error;
use crate::evidence::EvidenceBundle;
use crate::policy::{Policy, PolicyGap};
use crate::verify::{Outcome, VerifiedEvidence};

mod verify;
pub use verify::verify_route;

/// Version of the attestation document.
pub const DOC_VERSION: u32 = 2;
/// Largest attestation document a client reads.
pub const MAX_DOC_BYTES: usize = 8 << 20;
/// Most stages in a route.
pub const MAX_STAGES: usize = 255;
/// Most shards an attestation document lists.
pub const MAX_LINKED_SHARDS: usize = 1024;
/// Domain separator of the route-shape digest.
pub const SHAPE_DOMAIN: &[u8] = b"veil/route-shape/v1\0";
/// Domain separator of the route-links commitment.
pub const LINKS_DOMAIN: &[u8] = b"veil/route-links/v1\0";

/// One stage of a route: its layers and the manifest every replica loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StageShape {
    /// Layers served.
    pub layers: LayerRange,
    /// Manifest root every replica of the stage must attest.
    pub manifest_root: ManifestRoot,
}

/// The route's shape: contiguous stages from layer 0 to the model's layer
/// count, each pinned to one manifest, and the encoding of activations
/// between stages (`f32`, or `f16`/`bf16`, which change outputs slightly).
/// Every shard's claims commit to its digest, so a shard serves (and links
/// to) only this split of this model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "ShapeWire", into = "ShapeWire")]
pub struct RouteShape {
    model_layers: u32,
    activations: String,
    stages: Vec<StageShape>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ShapeWire {
    model_layers: u32,
    activations: String,
    stages: Vec<StageShape>,
}

impl TryFrom<ShapeWire> for RouteShape {
    type Error = InvalidValue;
    fn try_from(w: ShapeWire) -> Result<Self, InvalidValue> {
        Self::new(w.model_layers, &w.activations, w.stages)
    }
}

impl From<RouteShape> for ShapeWire {
    fn from(r: RouteShape) -> Self {
        Self { model_layers: r.model_layers, activations: r.activations, stages: r.stages }
    }
}

impl RouteShape {
    /// A shape; refused unless the stages cover `0..model_layers`
    /// contiguously and `activations` names an encoding (1..=8 lower-case
    /// letters and digits, e.g. `f32`).
    pub fn new(model_layers: u32, activations: &str, stages: Vec<StageShape>) -> Result<Self, InvalidValue> {
        if activations.is_empty()
            || activations.len() > 8
            || !activations.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            return Err(InvalidValue::new(
                ValueKind::RouteShape,
                format!("activation encoding {activations:?} is not a name like f32"),
            ));
        }
        if stages.is_empty() || stages.len() > MAX_STAGES {
            return Err(InvalidValue::new(
                ValueKind::RouteShape,
                format!("a route has 1..={MAX_STAGES} stages, not {}", stages.len()),
            ));
        }
        let mut next = 0;
        for (i, s) in stages.iter().enumerate() {
            if s.layers.start() != next {
                return Err(InvalidValue::new(
                    ValueKind::RouteShape,
                    format!("stage {i} starts at layer {}, expected {next}", s.layers.start()),
                ));
            }
            next = s.layers.end();
        }
        if next != model_layers {
            return Err(InvalidValue::new(
                ValueKind::RouteShape,
                format!("the stages end at layer {next}; the model has {model_layers}"),
            ));
        }
        Ok(Self { model_layers, activations: activations.to_owned(), stages })
    }

    /// The model's layer count.
    pub fn model_layers(&self) -> u32 {
        self.model_layers
    }

    /// The activation encoding between stages.
    pub fn activations(&self) -> &str {
        &self.activations
    }

    /// The stages in layer order (stage 0 is the entry).
    pub fn stages(&self) -> &[StageShape] {
        &self.stages
    }

    /// `SHA-256("veil/route-shape/v1\0" ‖ u32 model_layers ‖ u8 len ‖
    /// activations ‖ u32 stages ‖ per stage: u32 start ‖ u32 end ‖ manifest
    /// root)`, integers big-endian.
    pub fn digest(&self) -> RouteDigest {
        let mut h = Sha256::new();
        h.update(SHAPE_DOMAIN);
        h.update(self.model_layers.to_be_bytes());
        h.update([self.activations.len() as u8]);
        h.update(self.activations.as_bytes());
        h.update((self.stages.len() as u32).to_be_bytes());
        for s in &self.stages {
            h.update(s.layers.start().to_be_bytes());
            h.update(s.layers.end().to_be_bytes());
            h.update(s.manifest_root.0);
        }
        RouteDigest(h.finalize().into())
    }
}

/// A shard the entry has verified and holds a live link to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkedShard {
    /// Stage (1 = the first after the entry).
    pub stage: u32,
    /// Replica index within the stage.
    pub replica: u32,
    /// The evidence as the shard presented it (its RA-TLS certificate's).
    pub evidence: EvidenceBundle,
}

/// The entry's commitment to the shards it has linked:
/// `SHA-256("veil/route-links/v1\0" ‖ u32 count ‖ per shard: u32 stage ‖
/// u32 replica ‖ SHA-256(bundle JSON))`, in the document's order.
pub fn links_commitment(shards: &[LinkedShard]) -> LinksCommitment {
    let mut h = Sha256::new();
    h.update(LINKS_DOMAIN);
    h.update((shards.len() as u32).to_be_bytes());
    for s in shards {
        h.update(s.stage.to_be_bytes());
        h.update(s.replica.to_be_bytes());
        h.update(s.evidence.digest());
    }
    LinksCommitment(h.finalize().into())
}

/// `GET /v1/attestation?nonce=…`: what the entry publishes for clients.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttestationDoc {
    /// [`DOC_VERSION`].
    pub version: u32,
    /// The served model's name (informational; its identity is the manifests).
    pub model: String,
    /// The entry's OHTTP key configuration (base64 in JSON).
    #[serde(with = "b64")]
    pub key_config: Vec<u8>,
    /// The policy every shard on the route enforces on its links.
    pub peer_policy: Policy,
    /// The route's shape.
    pub route: RouteShape,
    /// The entry's evidence, bound to the client's nonce.
    pub entry: EvidenceBundle,
    /// Every shard the entry has verified and linked.
    pub shards: Vec<LinkedShard>,
    /// What the entry speculates with; its digest is in the entry's claims.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drafter: Option<DrafterInfo>,
    /// When the entry answered several verifiers with one evidence: this
    /// verifier's nonce's inclusion path to the root the evidence claims as
    /// its nonce ([`crate::nonce_batch`]). Absent: the claims carry the nonce.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce_path: Option<crate::nonce_batch::NoncePath>,
}

/// Domain separator of [`DrafterInfo::digest`].
pub const DRAFTER_DOMAIN: &[u8] = b"veil/drafter/v1\0";

/// The entry's drafter, as it commits to it (claims field 11): which kind,
/// the draft model's manifest root when it is a model, and the k settings.
/// Greedy output and the sampled distribution do not depend on it; a seeded
/// sampled request's text does, and so does speed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrafterInfo {
    /// `none`, `ngram` (prompt lookup), `model` or `ngram+model`.
    pub kind: String,
    /// The draft model's manifest root (kinds `model` and `ngram+model`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_manifest: Option<ManifestRoot>,
    /// Most tokens drafted per round.
    pub k_max: u32,
    /// A fixed k, when not adaptive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k: Option<u32>,
}

impl DrafterInfo {
    /// SHA-256 over a domain-separated, length-prefixed encoding.
    pub fn digest(&self) -> DrafterDigest {
        let mut h = Sha256::new();
        h.update(DRAFTER_DOMAIN);
        h.update((self.kind.len() as u32).to_be_bytes());
        h.update(self.kind.as_bytes());
        match &self.draft_manifest {
            Some(m) => {
                h.update([1]);
                h.update(m.0);
            }
            None => h.update([0]),
        }
        h.update(self.k_max.to_be_bytes());
        match self.k {
            Some(k) => {
                h.update([1]);
                h.update(k.to_be_bytes());
            }
            None => h.update([0]),
        }
        DrafterDigest(h.finalize().into())
    }
}

impl fmt::Display for DrafterInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.kind)?;
        if let Some(m) = &self.draft_manifest {
            write!(f, " (draft manifest {m})")?;
        }
        match self.k {
            Some(k) => write!(f, ", k = {k}"),
            None => write!(f, ", adaptive k ≤ {}", self.k_max),
        }
    }
}

mod b64 {
    use base64::Engine as _;
    pub(super) fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }
    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = <String as serde::Deserialize>::deserialize(d)?;
        if s.len() > 4096 {
            return Err(serde::de::Error::custom("key configuration too long"));
        }
        base64::engine::general_purpose::STANDARD.decode(s).map_err(serde::de::Error::custom)
    }
}

impl AttestationDoc {
    /// Parses a document, with its size limit.
    pub fn from_json(bytes: &[u8]) -> Result<Self, InvalidValue> {
        let invalid = |reason: String| InvalidValue::new(ValueKind::AttestationDocument, reason);
        if bytes.len() > MAX_DOC_BYTES {
            return Err(invalid(format!("{} bytes exceeds {MAX_DOC_BYTES}", bytes.len())));
        }
        let doc: Self = serde_json::from_slice(bytes).map_err(|e| invalid(e.to_string()))?;
        if doc.version != DOC_VERSION {
            return Err(invalid(format!("version {} (this client reads {DOC_VERSION})", doc.version)));
        }
        if doc.shards.len() > MAX_LINKED_SHARDS {
            return Err(invalid(format!("lists {} shards", doc.shards.len())));
        }
        Ok(doc)
    }
}

/// The route checks, in the order [`verify_route`] runs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RouteCheckId {
    /// The route covers layer 0 to the model's layer count (pinned by `model_layers`).
    RouteShape,
    /// Every stage's pinned manifest is one the policy allows for its range.
    RouteManifests,
    /// The entry's evidence passes the policy, bound to the nonce, the key and stage 0.
    EntryEvidence,
    /// The published peer policy is the one the entry's claims commit to.
    PeerPolicyBinding,
    /// The published shape is the one the entry's claims commit to.
    RouteShapeBinding,
    /// The listed shards are exactly those the entry's fresh claims commit to.
    RouteLinks,
    /// The peer policy is at least as strict as the client's, or pinned by digest.
    PeerPolicy,
    /// Every listed shard passes the policy with the route's pins.
    ShardEvidence,
    /// Every stage after the entry has a linked, verified shard.
    Coverage,
    /// The published drafter is the one the entry's claims commit to, and the
    /// policy allows it.
    Drafter,
}

impl RouteCheckId {
    /// Every route check, in order.
    pub const ALL: [RouteCheckId; 10] = [
        Self::RouteShape,
        Self::RouteManifests,
        Self::EntryEvidence,
        Self::PeerPolicyBinding,
        Self::RouteShapeBinding,
        Self::RouteLinks,
        Self::PeerPolicy,
        Self::ShardEvidence,
        Self::Coverage,
        Self::Drafter,
    ];

    /// Stable snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            Self::RouteShape => "route_shape",
            Self::RouteManifests => "route_manifests",
            Self::EntryEvidence => "entry_evidence",
            Self::PeerPolicyBinding => "peer_policy_binding",
            Self::RouteShapeBinding => "route_shape_binding",
            Self::RouteLinks => "route_links",
            Self::PeerPolicy => "peer_policy",
            Self::ShardEvidence => "shard_evidence",
            Self::Coverage => "coverage",
            Self::Drafter => "drafter",
        }
    }
}

impl fmt::Display for RouteCheckId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl crate::check::CheckName for RouteCheckId {
    fn check_name(self) -> &'static str {
        self.name()
    }
    const COLUMN: usize = 20;
    const NOT_RUN_NOTE: &'static str = "";
}

/// The route checks with their outcomes (the crate's one check table type),
/// and the peer policy's gaps.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RouteReport {
    /// Every route check's outcome, in order.
    pub table: crate::check::CheckTable<RouteCheckId>,
    /// Where the peer policy is weaker than the client's, line by line.
    pub gaps: Vec<PolicyGap>,
}

impl RouteReport {
    fn record(&mut self, check: RouteCheckId, outcome: Outcome) {
        self.table.record(check, outcome);
    }

    /// The first failed check.
    pub fn first_failure(&self) -> Option<(RouteCheckId, &str, &str)> {
        self.table.first_failure()
    }

    /// Outcome of `check`.
    pub fn outcome(&self, check: RouteCheckId) -> Option<&Outcome> {
        self.table.outcome(check)
    }
}

impl fmt::Display for RouteReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{:<3} {:<20} {:<9} detail", "#", "route check", "result")?;
        for (i, row) in self.table.results.iter().enumerate() {
            let detail = match &row.outcome {
                Outcome::Passed { detail } => detail.clone(),
                Outcome::Failed { expected, actual } => format!("expected {expected}; got {actual}"),
                Outcome::Warned { detail, warning } => format!("{detail}; WARNING: {warning}"),
                Outcome::Skipped { reason } | Outcome::NotRun { reason } => reason.clone(),
            };
            writeln!(f, "{:<3} {:<20} {:<9} {}", i + 1, row.check.name(), row.label(), detail)?;
            if row.check == RouteCheckId::PeerPolicy && !self.gaps.is_empty() {
                let how = if matches!(row.outcome, Outcome::Warned { .. }) {
                    "weaker (accepted by your pin)"
                } else {
                    "weaker"
                };
                for g in &self.gaps {
                    writeln!(f, "{:<33}  {how}: {g}", "")?;
                }
            }
        }
        write!(f, "route verdict: {}", self.table.verdict())
    }
}

/// A route check failed (the table says which, and every other outcome).
#[derive(Clone, Debug)]
pub struct RouteRejection {
    /// The first failed check.
    pub check: RouteCheckId,
    /// What was required.
    pub expected: String,
    /// What the document or evidence showed.
    pub actual: String,
    /// Every route check's outcome.
    pub report: RouteReport,
}

impl fmt::Display for RouteRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "route rejected by check `{}`: expected {}, got {}", self.check, self.expected, self.actual)
    }
}

/// Why a route was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RouteError {
    /// A shard's evidence failed the policy (its own check table inside).
    #[error("attestation of {who} failed: {source}")]
    Evidence {
        /// Which shard.
        who: String,
        /// The verifier's verdict.
        source: Error,
    },
    /// A route check failed.
    #[error("{0}")]
    Rejected(Box<RouteRejection>),
}

impl RouteError {
    /// The failed route check, when a route check (not a shard's evidence) failed.
    pub fn check(&self) -> Option<RouteCheckId> {
        match self {
            Self::Rejected(r) => Some(r.check),
            Self::Evidence { .. } => None,
        }
    }
}

/// A shard of a verified route.
#[derive(Clone, Debug)]
pub struct VerifiedShard {
    stage: u32,
    replica: u32,
    layers: LayerRange,
    evidence: VerifiedEvidence,
}

impl VerifiedShard {
    /// Stage (0 = the entry).
    pub fn stage(&self) -> u32 {
        self.stage
    }
    /// Replica index within the stage.
    pub fn replica(&self) -> u32 {
        self.replica
    }
    /// Layers served.
    pub fn layers(&self) -> LayerRange {
        self.layers
    }
    /// What passed the client's policy.
    pub fn evidence(&self) -> &VerifiedEvidence {
        &self.evidence
    }
}

/// A route every shard of which passed the client's policy, whose entry
/// committed (fresh, to the client's nonce) to exactly these shards, this
/// shape and a peer policy the client accepts. Only [`verify_route`] makes
/// one; sealing a request takes it.
#[derive(Clone, Debug)]
pub struct VerifiedRoute {
    model: String,
    key_config: Vec<u8>,
    shape: RouteShape,
    peer_policy: Policy,
    peer_policy_digest: PolicyDigest,
    peer_policy_pinned: bool,
    entry: VerifiedShard,
    shards: Vec<VerifiedShard>,
    checks: RouteReport,
    drafter: Option<DrafterInfo>,
    _private: (),
}

impl VerifiedRoute {
    /// The drafter the entry committed to (`None`: it committed to none).
    pub fn drafter(&self) -> Option<&DrafterInfo> {
        self.drafter.as_ref()
    }
    /// The model's name as the entry gives it.
    pub fn model(&self) -> &str {
        &self.model
    }
    /// The entry's key configuration (its hash is in the entry's verified claims).
    pub fn key_config(&self) -> &[u8] {
        &self.key_config
    }
    /// The attested shape.
    pub fn shape(&self) -> &RouteShape {
        &self.shape
    }
    /// The peer policy every shard enforces (its digest is attested).
    pub fn peer_policy(&self) -> &Policy {
        &self.peer_policy
    }
    /// Its digest.
    pub fn peer_policy_digest(&self) -> PolicyDigest {
        self.peer_policy_digest
    }
    /// Whether it was accepted by the digest pinned in the client's policy
    /// (rather than by being at least as strict).
    pub fn peer_policy_pinned(&self) -> bool {
        self.peer_policy_pinned
    }
    /// The entry (stage 0).
    pub fn entry(&self) -> &VerifiedShard {
        &self.entry
    }
    /// The other shards the entry has linked, in the document's order.
    pub fn shards(&self) -> &[VerifiedShard] {
        &self.shards
    }
    /// The route checks.
    pub fn checks(&self) -> &RouteReport {
        &self.checks
    }
    /// How many of the route's shard processes (the entry included) were
    /// accepted on SIMULATED evidence: software keys, no hardware guarantee.
    pub fn simulated_count(&self) -> usize {
        std::iter::once(&self.entry).chain(&self.shards).filter(|s| s.evidence.is_simulated()).count()
    }
    /// One line a banner or a verdict carries when any shard is simulated
    /// (`None` when every shard's evidence chains to AMD hardware).
    pub fn simulated_notice(&self) -> Option<String> {
        let n = self.simulated_count();
        (n > 0).then(|| {
            format!(
                "SIMULATED: {n} of {} shard process(es) attested by a software root; no hardware guarantee",
                1 + self.shards.len()
            )
        })
    }
}
