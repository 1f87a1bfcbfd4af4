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
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::claims::{
    DrafterDigest, KeyHash, LayerRange, LinksCommitment, ManifestRoot, Nonce, PolicyDigest, RouteDigest,
};
use crate::error::Error;
use crate::evidence::EvidenceBundle;
use crate::policy::{Policy, PolicyGap};
use crate::verify::{verify, ExpectedClaims, Outcome, VerifiedEvidence};

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

fn pass(detail: impl Into<String>) -> Outcome {
    Outcome::Passed { detail: detail.into() }
}

fn failed(expected: impl Into<String>, actual: impl Into<String>) -> Outcome {
    Outcome::Failed { expected: expected.into(), actual: actual.into() }
}

fn show<T: fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "absent".to_owned(), |v| v.to_string())
}

/// Verifies the route behind `doc` for a client holding `policy` that asked
/// with `nonce`, at `now`. See the module documentation for the checks.
pub fn verify_route(
    doc: &AttestationDoc,
    policy: &Policy,
    nonce: &Nonce,
    now: SystemTime,
) -> Result<VerifiedRoute, RouteError> {
    policy.fit_for_serving_path().map_err(|e| RouteError::Evidence {
        who: "the route (policy)".into(),
        source: Error::ApiMisuse(e.to_string()),
    })?;
    let mut t = RouteReport::default();
    let reject = |t: RouteReport| {
        let (check, expected, actual) = match t.first_failure() {
            Some((c, e, a)) => (c, e.to_owned(), a.to_owned()),
            None => (RouteCheckId::RouteShape, String::new(), String::new()),
        };
        RouteError::Rejected(Box::new(RouteRejection { check, expected, actual, report: t }))
    };
    let shape = &doc.route;
    let stages = shape.stages();

    // Every route check runs; a failed one does not stop the table (the
    // verdict names the first). Evidence that fails the policy stops it
    // (its own table says why) unless a route check failed before.

    // 1. Shape (contiguity is enforced when parsing; the layer count may be pinned).
    t.record(
        RouteCheckId::RouteShape,
        match policy.model_layers {
            Some(n) if n != shape.model_layers() => failed(
                format!("a model of {n} layers (policy model_layers)"),
                format!("{} layers", shape.model_layers()),
            ),
            pinned => pass(format!(
                "layers 0..{} in {} stage(s), {} activations{}",
                shape.model_layers(),
                stages.len(),
                shape.activations(),
                if pinned.is_some() { " (layer count pinned)" } else { "" }
            )),
        },
    );

    // 2. Manifests the route pins, against the policy's allowlist.
    t.record(
        RouteCheckId::RouteManifests,
        match stages.iter().find(|s| s.manifest_root != stages[0].manifest_root) {
            // One model per route: stages of two models (even two allowed ones) compose nothing.
            Some(s) => failed(
                format!("every stage pinned to one model's manifest root ({})", stages[0].manifest_root),
                format!("layers {} pinned to manifest root {}", s.layers, s.manifest_root),
            ),
            None if policy.manifest_roots.is_empty() => {
                Outcome::Skipped { reason: "the policy pins no manifest roots".into() }
            }
            None if !policy.manifest_roots.contains(&stages[0].manifest_root) => failed(
                format!("a manifest root the policy allows ({} listed)", policy.manifest_roots.len()),
                format!("manifest root {}", stages[0].manifest_root),
            ),
            None => pass(format!("all {} stages load the allowed model {}", stages.len(), stages[0].manifest_root)),
        },
    );

    // 3. The entry, fresh and bound to the key this client will seal to:
    // its claims carry our nonce, or the root of a batch of nonces ours is
    // proven to be in.
    let entry_stage = stages[0];
    let claimed_nonce = match &doc.nonce_path {
        None => nonce.clone(),
        Some(p) => match p.claimed_nonce(nonce) {
            Ok(root) => root,
            Err(why) => {
                t.record(
                    RouteCheckId::EntryEvidence,
                    failed("a well-formed inclusion path for your nonce", why.to_string()),
                );
                return Err(reject(t));
            }
        },
    };
    let entry_expected = ExpectedClaims {
        nonce: Some(claimed_nonce),
        hpke_config_hash: Some(KeyHash::of(&doc.key_config)),
        layer_range: Some(entry_stage.layers),
        manifest_root: Some(entry_stage.manifest_root),
        ..ExpectedClaims::default()
    };
    let entry = match verify(&doc.entry, policy, &entry_expected, now) {
        Ok(e) => e,
        Err(source) if t.first_failure().is_some() => {
            t.record(
                RouteCheckId::EntryEvidence,
                failed("the entry's evidence passes your policy", source.to_string()),
            );
            return Err(reject(t));
        }
        Err(source) => return Err(RouteError::Evidence { who: "the entry".into(), source }),
    };
    t.record(
        RouteCheckId::EntryEvidence,
        pass(match &doc.nonce_path {
            None => "fresh (nonce), bound to the sealing key and to stage 0".to_owned(),
            Some(p) => format!(
                "fresh (your nonce, leaf {} of a batch of {} the evidence's claimed nonce is the root of), bound to \
                 the sealing key and to stage 0",
                p.index, p.size
            ),
        }),
    );
    if entry.is_simulated() {
        t.table.mark_row_simulated(RouteCheckId::EntryEvidence);
    }
    let claims = entry.claims().cloned().unwrap_or_default();

    // 4–6. What the entry's signed claims commit to.
    let policy_digest = doc.peer_policy.digest();
    t.record(
        RouteCheckId::PeerPolicyBinding,
        if claims.peer_policy == Some(policy_digest) {
            pass(format!("peer policy {policy_digest}"))
        } else {
            failed(format!("the published peer policy's digest {policy_digest}"), show(claims.peer_policy))
        },
    );
    let shape_digest = shape.digest();
    t.record(
        RouteCheckId::RouteShapeBinding,
        if claims.route_shape == Some(shape_digest) {
            pass(format!("route shape {shape_digest}"))
        } else {
            failed(format!("the published route shape's digest {shape_digest}"), show(claims.route_shape))
        },
    );
    let links = links_commitment(&doc.shards);
    t.record(
        RouteCheckId::RouteLinks,
        if claims.route_links == Some(links) {
            pass(format!("{} linked shard(s), committed in the entry's nonce-bound claims", doc.shards.len()))
        } else {
            failed(
                format!("the listed {} shard(s), commitment {links}", doc.shards.len()),
                format!("the entry committed to {}", show(claims.route_links)),
            )
        },
    );

    // 7. The peer policy: at least as strict as ours, or pinned.
    t.gaps = policy.gaps_in(&doc.peer_policy);
    let pinned = policy.peer_policies.contains(&policy_digest);
    t.record(
        RouteCheckId::PeerPolicy,
        match (t.gaps.len(), pinned) {
            (0, true) => pass(format!("digest {policy_digest} pinned in your policy")),
            (n, true) => Outcome::Warned {
                detail: format!("digest {policy_digest} pinned in your policy"),
                warning: format!("weaker than your policy on {n} setting(s), accepted only because you pinned it"),
            },
            (0, false) => pass("at least as strict as your policy on every check"),
            (n, false) => failed(
                "a peer policy at least as strict as yours, or its digest in peer_policies",
                format!(
                    "weaker on {n} setting(s): {}",
                    t.gaps.iter().map(|g| g.setting.as_str()).collect::<Vec<_>>().join(", ")
                ),
            ),
        },
    );

    // 8. Every listed shard, pinned to its stage, the shape and the peer policy.
    let mut shards: Vec<VerifiedShard> = Vec::with_capacity(doc.shards.len());
    for s in &doc.shards {
        let stage = usize::try_from(s.stage).unwrap_or(usize::MAX);
        let Some(want) = stages.get(stage).filter(|_| stage > 0) else {
            t.record(
                RouteCheckId::ShardEvidence,
                failed(format!("a stage in 1..{}", stages.len()), format!("stage {}", s.stage)),
            );
            return Err(reject(t));
        };
        if shards.iter().any(|v| (v.stage, v.replica) == (s.stage, s.replica)) {
            t.record(
                RouteCheckId::ShardEvidence,
                failed("one entry per stage and replica", format!("stage {} replica {} twice", s.stage, s.replica)),
            );
            return Err(reject(t));
        }
        let expected = ExpectedClaims {
            layer_range: Some(want.layers),
            manifest_root: Some(want.manifest_root),
            peer_policy: Some(policy_digest),
            route_shape: Some(shape_digest),
            ..ExpectedClaims::default()
        };
        let who = format!("the shard for layers {} (stage {} replica {})", want.layers, s.stage, s.replica);
        let mut evidence = match verify(&s.evidence, policy, &expected, now) {
            Ok(e) => e,
            // With a route check already failed, the table goes on to the
            // end and names that first failure; a shard's own table is the
            // answer only when everything before it passed.
            Err(source) if t.first_failure().is_some() => {
                t.record(
                    RouteCheckId::ShardEvidence,
                    failed("every listed shard passes your policy", format!("{who}: {source}")),
                );
                return Err(reject(t));
            }
            Err(source) => return Err(RouteError::Evidence { who, source }),
        };
        evidence.vouch_freshness(format!(
            "live link: the entry's nonce-bound route_links commit to this evidence (stage {} replica {})",
            s.stage, s.replica
        ));
        shards.push(VerifiedShard { stage: s.stage, replica: s.replica, layers: want.layers, evidence });
    }
    t.record(
        RouteCheckId::ShardEvidence,
        pass(format!("{} shard(s) pass your policy with the route's pins", shards.len())),
    );
    if shards.iter().any(|s| s.evidence.is_simulated()) {
        t.table.mark_row_simulated(RouteCheckId::ShardEvidence);
    }

    // 9. Coverage: every stage after the entry is served.
    let missing: Vec<String> = (1..stages.len())
        .filter(|&i| !shards.iter().any(|s| s.stage as usize == i))
        .map(|i| format!("stage {i} (layers {})", stages[i].layers))
        .collect();
    t.record(
        RouteCheckId::Coverage,
        if missing.is_empty() {
            pass(format!("layers 0..{} served by verified shards", shape.model_layers()))
        } else {
            failed("a linked, verified shard for every stage", format!("none for {}", missing.join(", ")))
        },
    );
    // 10. The drafter: published as committed, and allowed.
    let drafter = doc.drafter.clone();
    t.record(
        RouteCheckId::Drafter,
        match (&drafter, claims.drafter) {
            (Some(d), Some(c)) if d.digest() != c => {
                failed(format!("the published drafter's digest {}", d.digest()), format!("the entry committed to {c}"))
            }
            (Some(d), Some(c)) if !policy.drafters.is_empty() && !policy.drafters.contains(&c) => {
                failed("a drafter your policy's `drafters` allows", format!("{d} (digest {c})"))
            }
            (Some(d), Some(c)) => pass(format!(
                "{d} (digest {c}){}",
                if policy.drafters.is_empty() { "" } else { ", allowed by your policy" }
            )),
            (None, Some(c)) => {
                failed("the drafter the entry committed to, published", format!("digest {c}, not published"))
            }
            (Some(d), None) => {
                failed(format!("a commitment to the published drafter {d}"), "none in the entry's claims")
            }
            (None, None) if !policy.drafters.is_empty() => {
                failed("a drafter your policy's `drafters` allows", "the entry commits to no drafter")
            }
            (None, None) => Outcome::Skipped { reason: "the entry commits to no drafter".into() },
        },
    );
    if t.first_failure().is_some() {
        return Err(reject(t));
    }
    Ok(VerifiedRoute {
        model: doc.model.clone(),
        key_config: doc.key_config.clone(),
        shape: shape.clone(),
        peer_policy: doc.peer_policy.clone(),
        peer_policy_digest: policy_digest,
        peer_policy_pinned: pinned,
        entry: VerifiedShard { stage: 0, replica: 0, layers: entry_stage.layers, evidence: entry },
        shards,
        checks: t,
        drafter,
        _private: (),
    })
}
