//! The route as a whole, against a hostile host and a permissive operator:
//! every way of editing the attestation document (or the policy the shards
//! enforce) fails a named route check before any request could be sealed.
//! Built on the simulated attester (fixed seeds), so only the intended
//! check fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::OnceLock;
use std::time::SystemTime;

use veil_attestation::route::{
    links_commitment, verify_route, AttestationDoc, DrafterInfo, LinkedShard, RouteCheckId as R, RouteError,
    RouteShape, StageShape, DOC_VERSION,
};
use veil_attestation::simulated::{SimulatedAttester, SimulatedConfig};
use veil_attestation::snp::Product;
use veil_attestation::verify::{CheckId, Outcome};
use veil_attestation::{Claims, KeyHash, LayerRange, ManifestRoot, Nonce, Policy};

fn sim(seed: &[u8]) -> SimulatedAttester {
    SimulatedAttester::from_seed(seed, SimulatedConfig::new(Product::Genoa, b"veil route tests")).unwrap()
}

/// The operator's root (A) and another (B) anyone can make.
fn root_a() -> &'static SimulatedAttester {
    static A: OnceLock<SimulatedAttester> = OnceLock::new();
    A.get_or_init(|| sim(b"root A"))
}
fn root_b() -> &'static SimulatedAttester {
    static B: OnceLock<SimulatedAttester> = OnceLock::new();
    B.get_or_init(|| sim(b"root B"))
}

/// The client's policy: root A only.
fn client_policy() -> Policy {
    root_a().dev_policy().unwrap()
}

fn shape() -> RouteShape {
    let st = |a, b, m| StageShape { layers: LayerRange::new(a, b).unwrap(), manifest_root: ManifestRoot([m; 32]) };
    // One model: every stage attests its root.
    RouteShape::new(30, "f32", vec![st(0, 10, 1), st(10, 20, 1), st(20, 30, 1)]).unwrap()
}

const KEY_CONFIG: &[u8] = b"an OHTTP key configuration";

/// The claims of a shard of `stage` whose TLS key hash is `key` repeated.
fn shard_claims(stage: u32, key: u8, peer: &Policy, shape: &RouteShape) -> Claims {
    let s = shape.stages()[stage as usize];
    Claims {
        tls_key_hash: Some(KeyHash([key; 32])),
        layer_range: Some(s.layers),
        manifest_root: Some(s.manifest_root),
        peer_policy: Some(peer.digest()),
        route_shape: Some(shape.digest()),
        software_version: "veil-shard test".into(),
        ..Claims::default()
    }
}

/// A shard's static evidence (as in its RA-TLS certificate).
fn shard(att: &SimulatedAttester, stage: u32, replica: u32, peer: &Policy, shape: &RouteShape) -> LinkedShard {
    let claims = shard_claims(stage, stage as u8 * 16 + replica as u8, peer, shape);
    LinkedShard { stage, replica, evidence: att.evidence(&claims).unwrap() }
}

/// What an honest entry publishes for `nonce`: its fresh evidence commits
/// to `peer`, `shape` and exactly `shards`.
fn doc_with(nonce: &Nonce, peer: &Policy, shape: &RouteShape, shards: Vec<LinkedShard>) -> AttestationDoc {
    doc_keyed(KEY_CONFIG, nonce, peer, shape, shards)
}

fn doc_keyed(key: &[u8], nonce: &Nonce, peer: &Policy, shape: &RouteShape, shards: Vec<LinkedShard>) -> AttestationDoc {
    doc_drafting(key, nonce, peer, shape, shards, Some(ngram()))
}

/// The prompt-lookup drafter an honest test entry speculates with.
fn ngram() -> DrafterInfo {
    DrafterInfo { kind: "ngram".into(), draft_manifest: None, k_max: 6, k: None }
}

/// [`doc_keyed`] whose entry commits to (and publishes) `drafter`.
fn doc_drafting(
    key: &[u8],
    nonce: &Nonce,
    peer: &Policy,
    shape: &RouteShape,
    shards: Vec<LinkedShard>,
    drafter: Option<DrafterInfo>,
) -> AttestationDoc {
    let s0 = shape.stages()[0];
    let claims = Claims {
        hpke_config_hash: Some(KeyHash::of(key)),
        layer_range: Some(s0.layers),
        manifest_root: Some(s0.manifest_root),
        nonce: Some(nonce.clone()),
        peer_policy: Some(peer.digest()),
        route_shape: Some(shape.digest()),
        route_links: Some(links_commitment(&shards)),
        software_version: "veil-shard test".into(),
        drafter: drafter.as_ref().map(DrafterInfo::digest),
        ..Claims::default()
    };
    AttestationDoc {
        version: DOC_VERSION,
        model: "test".into(),
        key_config: key.to_vec(),
        peer_policy: peer.clone(),
        route: shape.clone(),
        entry: root_a().evidence(&claims).unwrap(),
        shards,
        drafter,
        nonce_path: None,
    }
}

fn honest_shards(peer: &Policy) -> Vec<LinkedShard> {
    let sh = shape();
    vec![shard(root_a(), 1, 0, peer, &sh), shard(root_a(), 1, 1, peer, &sh), shard(root_a(), 2, 0, peer, &sh)]
}

fn honest(nonce: &Nonce) -> AttestationDoc {
    let peer = client_policy();
    doc_with(nonce, &peer, &shape(), honest_shards(&peer))
}

fn nonce() -> Nonce {
    Nonce::new(vec![0x5a; 32]).unwrap()
}

fn rejected_by(doc: &AttestationDoc, policy: &Policy) -> R {
    match verify_route(doc, policy, &nonce(), SystemTime::now()) {
        Err(RouteError::Rejected(r)) => {
            // The table names the failure, and every check before it passed.
            let text = r.report.to_string();
            assert!(text.contains(&format!("{}", r.check)), "{text}");
            r.check
        }
        Err(e) => panic!("expected a route check to fail, got {e}"),
        Ok(_) => panic!("route accepted"),
    }
}

#[test]
fn an_honest_route_verifies_with_every_shard_fresh_through_the_entry() {
    let route = verify_route(&honest(&nonce()), &client_policy(), &nonce(), SystemTime::now()).unwrap();
    assert_eq!(route.shards().len(), 3);
    assert_eq!(route.key_config(), KEY_CONFIG);
    assert!(!route.peer_policy_pinned());
    for s in route.shards() {
        // Shard evidence carries no nonce; its freshness is the entry's
        // nonce-bound commitment to the live link.
        match s.evidence().checks().outcome(CheckId::Freshness) {
            Some(Outcome::Passed { detail }) => assert!(detail.contains("route_links"), "{detail}"),
            other => panic!("shard freshness {other:?}"),
        }
    }
    for check in R::ALL {
        assert!(route.checks().outcome(check).is_some(), "{check} missing from the table");
    }
    // JSON round trip of the document (what the host relays).
    let json = serde_json::to_vec(&honest(&nonce())).unwrap();
    let again = AttestationDoc::from_json(&json).unwrap();
    verify_route(&again, &client_policy(), &nonce(), SystemTime::now()).unwrap();
}

#[test]
fn a_host_that_strips_the_shard_list_is_refused_at_route_links() {
    let mut doc = honest(&nonce());
    doc.shards.clear();
    assert_eq!(rejected_by(&doc, &client_policy()), R::RouteLinks);
    let mut doc = honest(&nonce());
    doc.shards.truncate(1);
    assert_eq!(rejected_by(&doc, &client_policy()), R::RouteLinks);
}

#[test]
fn an_entry_that_linked_too_few_shards_is_refused_at_coverage() {
    // The entry itself committed to a partial list (a stage not linked yet).
    let peer = client_policy();
    let shards = honest_shards(&peer).into_iter().filter(|s| s.stage == 1).collect();
    let doc = doc_with(&nonce(), &peer, &shape(), shards);
    assert_eq!(rejected_by(&doc, &client_policy()), R::Coverage);
    let doc = doc_with(&nonce(), &peer, &shape(), Vec::new());
    assert_eq!(rejected_by(&doc, &client_policy()), R::Coverage);
}

#[test]
fn a_replayed_older_shard_list_is_refused_at_route_links() {
    // An older genuine document (another nonce, other shard evidence: a
    // replica restarted since) spliced into today's.
    let peer = client_policy();
    let sh = shape();
    let old = doc_with(
        &Nonce::new(vec![1; 32]).unwrap(),
        &peer,
        &sh,
        vec![shard(root_a(), 1, 0, &peer, &sh), shard(root_a(), 2, 0, &peer, &sh)],
    );
    let mut doc = honest(&nonce());
    doc.shards = old.shards.clone();
    // Make the replayed evidence differ from today's (different TLS keys).
    doc.shards[0] = {
        let mut s = shard(root_a(), 1, 0, &peer, &sh);
        let mut c = s.evidence.claims.clone().unwrap();
        c.tls_key_hash = Some(KeyHash([0xee; 32]));
        s.evidence = root_a().evidence(&c).unwrap();
        s
    };
    assert_eq!(rejected_by(&doc, &client_policy()), R::RouteLinks);
    // And the old entry evidence is stale for this nonce.
    let mut doc = honest(&nonce());
    doc.entry = old.entry;
    match verify_route(&doc, &client_policy(), &nonce(), SystemTime::now()) {
        Err(RouteError::Evidence { source, .. }) => assert_eq!(source.check(), Some(CheckId::Freshness)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn shards_under_another_root_are_refused_even_when_the_entry_committed_to_them() {
    // The host runs the genuine entry with a permissive policy accepting its
    // own root B, and the entry links root-B shards: the client refuses the
    // policy before looking at the shards…
    let mut permissive = client_policy();
    permissive.simulated_roots.push(KeyHash(root_b_ark()));
    let sh = shape();
    let shards = vec![shard(root_b(), 1, 0, &permissive, &sh), shard(root_b(), 2, 0, &permissive, &sh)];
    let doc = doc_with(&nonce(), &permissive, &sh, shards.clone());
    assert_eq!(rejected_by(&doc, &client_policy()), R::PeerPolicy);
    // …and pinning that policy's digest does not make root-B evidence pass.
    let mut pinned = client_policy();
    pinned.peer_policies.push(permissive.digest());
    match verify_route(&doc, &pinned, &nonce(), SystemTime::now()) {
        Err(RouteError::Evidence { who, source }) => {
            assert!(who.contains("stage 1"), "{who}");
            assert_eq!(source.check(), Some(CheckId::EndorsementChain), "{source}");
        }
        other => panic!("{other:?}"),
    }
}

fn root_b_ark() -> [u8; 32] {
    let p = root_b().dev_policy().unwrap();
    p.simulated_roots[0].0
}

#[test]
fn a_published_policy_other_than_the_attested_one_is_refused_at_the_binding() {
    // The host swaps a strict-looking policy text into the document while
    // the shards enforce (and attest) a permissive one.
    let mut permissive = client_policy();
    permissive.any_measurement = true;
    permissive.measurements.clear();
    let sh = shape();
    let shards = vec![shard(root_a(), 1, 0, &permissive, &sh), shard(root_a(), 2, 0, &permissive, &sh)];
    let mut doc = doc_with(&nonce(), &permissive, &sh, shards);
    assert_eq!(rejected_by(&doc, &client_policy()), R::PeerPolicy);
    doc.peer_policy = client_policy();
    assert_eq!(rejected_by(&doc, &client_policy()), R::PeerPolicyBinding);
}

#[test]
fn a_published_shape_other_than_the_attested_one_is_refused() {
    let mut doc = honest(&nonce());
    let st = |a, b, m| StageShape { layers: LayerRange::new(a, b).unwrap(), manifest_root: ManifestRoot([m; 32]) };
    doc.route = RouteShape::new(30, "f32", vec![st(0, 10, 1), st(10, 30, 1)]).unwrap();
    assert_eq!(rejected_by(&doc, &client_policy()), R::RouteShapeBinding);
    // A shape that does not reach the model's last layer does not even parse.
    assert!(RouteShape::new(30, "f32", vec![st(0, 10, 1), st(10, 20, 2)]).is_err());
    assert!(RouteShape::new(30, "f32", vec![st(0, 10, 1), st(11, 30, 2)]).is_err());
    assert!(RouteShape::new(30, "f32", vec![]).is_err());
    let text = serde_json::to_string(&honest(&nonce())).unwrap().replace("\"model_layers\":30", "\"model_layers\":40");
    assert!(AttestationDoc::from_json(text.as_bytes()).is_err());
}

#[test]
fn a_shard_attesting_another_policy_or_shape_is_refused() {
    let peer = client_policy();
    let mut other = client_policy();
    other.allow_smt = false; // stricter, but not the entry's
    let sh = shape();
    let shards = vec![shard(root_a(), 1, 0, &peer, &sh), shard(root_a(), 2, 0, &other, &sh)];
    let doc = doc_with(&nonce(), &peer, &sh, shards);
    match verify_route(&doc, &client_policy(), &nonce(), SystemTime::now()) {
        Err(RouteError::Evidence { source, .. }) => assert_eq!(source.check(), Some(CheckId::ReportDataBinding)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn shards_listed_for_the_wrong_stage_are_refused() {
    let peer = client_policy();
    let sh = shape();
    // Evidence for layers 10..20 listed as stage 2.
    let mut s = shard(root_a(), 1, 0, &peer, &sh);
    s.stage = 2;
    let doc = doc_with(&nonce(), &peer, &sh, vec![shard(root_a(), 1, 0, &peer, &sh), s]);
    assert!(matches!(
        verify_route(&doc, &client_policy(), &nonce(), SystemTime::now()),
        Err(RouteError::Evidence { .. })
    ));
    // Stage 0 or past the end.
    for stage in [0, 3, u32::MAX] {
        let mut s = shard(root_a(), 1, 0, &peer, &sh);
        s.stage = stage;
        let doc = doc_with(&nonce(), &peer, &sh, vec![s]);
        assert_eq!(rejected_by(&doc, &client_policy()), R::ShardEvidence);
    }
    // The same replica twice.
    let doc =
        doc_with(&nonce(), &peer, &sh, vec![shard(root_a(), 1, 0, &peer, &sh), shard(root_a(), 1, 0, &peer, &sh)]);
    assert_eq!(rejected_by(&doc, &client_policy()), R::ShardEvidence);
}

#[test]
fn pinned_layer_count_and_manifests_are_enforced() {
    let mut policy = client_policy();
    policy.model_layers = Some(32);
    assert_eq!(rejected_by(&honest(&nonce()), &policy), R::RouteShape);
    policy.model_layers = Some(30);
    verify_route(&honest(&nonce()), &policy, &nonce(), SystemTime::now()).unwrap();
    // The model the route serves is allowed.
    policy.manifest_roots = vec![ManifestRoot([1; 32]), ManifestRoot([0x33; 32])];
    verify_route(&honest(&nonce()), &policy, &nonce(), SystemTime::now()).unwrap();
    // A model the client does not allow (an edited vocabulary or chat
    // template changes the root).
    policy.manifest_roots = vec![ManifestRoot([0x33; 32])];
    assert_eq!(rejected_by(&honest(&nonce()), &policy), R::RouteManifests);
    // A route whose last stage serves another model, even one the client
    // allows: stages of two models compose nothing.
    let st = |a, b, m| StageShape { layers: LayerRange::new(a, b).unwrap(), manifest_root: ManifestRoot([m; 32]) };
    let mixed = RouteShape::new(30, "f32", vec![st(0, 10, 1), st(10, 20, 1), st(20, 30, 0x33)]).unwrap();
    let peer = client_policy();
    let shards = (1..3).map(|i| shard(root_a(), i, 0, &peer, &mixed)).collect();
    let doc = doc_with(&nonce(), &peer, &mixed, shards);
    policy.manifest_roots = vec![ManifestRoot([1; 32]), ManifestRoot([0x33; 32])];
    assert_eq!(rejected_by(&doc, &policy), R::RouteManifests);
    policy.manifest_roots.clear();
    assert_eq!(rejected_by(&doc, &policy), R::RouteManifests);
}

#[test]
fn a_weaker_peer_policy_passes_only_when_pinned_by_digest() {
    let mut weaker = client_policy();
    weaker.allow_debug = true;
    let sh = shape();
    let shards = vec![shard(root_a(), 1, 0, &weaker, &sh), shard(root_a(), 2, 0, &weaker, &sh)];
    let doc = doc_with(&nonce(), &weaker, &sh, shards);
    match verify_route(&doc, &client_policy(), &nonce(), SystemTime::now()) {
        Err(RouteError::Rejected(r)) => {
            assert_eq!(r.check, R::PeerPolicy);
            assert_eq!(r.report.gaps.len(), 1);
            assert_eq!(r.report.gaps[0].setting, "allow_debug");
            assert!(r.report.to_string().contains("weaker: allow_debug"), "{}", r.report);
        }
        other => panic!("{other:?}"),
    }
    let mut pinned = client_policy();
    pinned.peer_policies.push(weaker.digest());
    let route = verify_route(&doc, &pinned, &nonce(), SystemTime::now()).unwrap();
    assert!(route.peer_policy_pinned());
}

#[test]
fn the_entry_must_be_bound_to_the_key_config_and_nonce() {
    let mut doc = honest(&nonce());
    doc.key_config = b"the host's own key".to_vec();
    match verify_route(&doc, &client_policy(), &nonce(), SystemTime::now()) {
        Err(RouteError::Evidence { who, source }) => {
            assert_eq!(who, "the entry");
            assert_eq!(source.check(), Some(CheckId::ReportDataBinding));
        }
        other => panic!("{other:?}"),
    }
    let other = Nonce::new(vec![7; 32]).unwrap();
    assert!(matches!(
        verify_route(&honest(&nonce()), &client_policy(), &other, SystemTime::now()),
        Err(RouteError::Evidence { .. })
    ));
}

/// Issue 55: `gpu.require_revocation` on the serving path. GPU shards
/// carry current OCSP responses for their device chains in their bundles
/// (NVIDIA-signed, so any carrier will do), and the route verifies. A host
/// that strips them, or replays responses that were current last week, is
/// refused at `gpu_revocation`, by name; so is one revoked certificate.
#[test]
fn gpu_revocation_is_met_on_the_serving_path_by_carried_ocsp_and_a_stripping_or_replaying_host_is_named() {
    use veil_attestation::attester::gpu::simulated::{SimulatedGpu, SimulatedGpuConfig};
    use veil_attestation::GpuCheckId;
    let sh = shape();
    let mut policy = client_policy();
    policy.gpu.require_revocation = true;
    let doc_for = |edit: &dyn Fn(&mut LinkedShard)| {
        let mut stage2 = gpu_shard(2, &policy, &sh);
        edit(&mut stage2);
        doc_with(&nonce(), &policy, &sh, vec![shard(root_a(), 1, 0, &policy, &sh), stage2])
    };
    let route = verify_route(&doc_for(&|_| {}), &policy, &nonce(), SystemTime::now()).unwrap();
    let gpus = route.shards().iter().find_map(|s| s.evidence().gpus()).expect("the GPU shard's GPUs verified");
    let table = gpus.appraisal().gpus[0].to_string();
    assert!(table.contains("OCSP status good and current"), "{table}");

    let refused = |doc: &AttestationDoc| match verify_route(doc, &policy, &nonce(), SystemTime::now()) {
        Err(RouteError::Evidence { source, .. }) => {
            assert_eq!(source.check(), Some(CheckId::Gpu(GpuCheckId::Revocation)), "{source}");
            source.to_string()
        }
        other => panic!("expected gpu_revocation to refuse the GPU shard, got {other:?}"),
    };
    let why = refused(&doc_for(&|s| s.evidence.gpu_ocsp.clear()));
    assert!(why.contains("none supplied"), "{why}");
    // The same GPU's responses, current a week ago.
    let gpu = SimulatedGpu::from_seed(b"route gpu", SimulatedGpuConfig::default()).unwrap();
    let day = std::time::Duration::from_secs(86_400);
    let week_ago = SystemTime::now() - 7 * day;
    let old = gpu.ocsp_responses(None, week_ago - day, Some(week_ago + day)).unwrap();
    let why = refused(&doc_for(&|s| s.evidence.gpu_ocsp = old.clone()));
    assert!(why.contains("stale"), "{why}");
    let revoked = gpu.ocsp_responses(Some(0), SystemTime::now() - day, Some(SystemTime::now() + day)).unwrap();
    let why = refused(&doc_for(&|s| s.evidence.gpu_ocsp = revoked.clone()));
    assert!(why.contains("revoked"), "{why}");
    // Without `require_revocation` a stripped list passes and says so.
    let mut lax = policy.clone();
    lax.gpu.require_revocation = false;
    let mut stage2 = gpu_shard(2, &lax, &sh);
    stage2.evidence.gpu_ocsp.clear();
    let doc = doc_with(&nonce(), &lax, &sh, vec![shard(root_a(), 1, 0, &lax, &sh), stage2]);
    let route = verify_route(&doc, &lax, &nonce(), SystemTime::now()).unwrap();
    let table = route.shards().iter().find_map(|s| s.evidence().gpus()).unwrap().appraisal().gpus[0].to_string();
    assert!(table.contains("no OCSP responses supplied"), "{table}");
}

/// SECURITY-CASES E11, a stated limit (THREAT_MODEL §5): a host that runs two
/// genuine entries can hand client 1 one key configuration and client 2
/// another; both routes verify, because both keys are attested. What the
/// client can do is see it: the verified key configuration is exposed for
/// comparison out of band (no transparency log publishes it yet).
#[test]
fn two_genuine_entries_with_different_keys_both_verify_a_stated_limit() {
    let peer = client_policy();
    let for_client_1 = doc_keyed(b"key configuration A", &nonce(), &peer, &shape(), honest_shards(&peer));
    let for_client_2 = doc_keyed(b"key configuration B", &nonce(), &peer, &shape(), honest_shards(&peer));
    let r1 = verify_route(&for_client_1, &client_policy(), &nonce(), SystemTime::now()).unwrap();
    let r2 = verify_route(&for_client_2, &client_policy(), &nonce(), SystemTime::now()).unwrap();
    assert_ne!(r1.key_config(), r2.key_config(), "each client learns the key it was given");
    assert_eq!(r1.key_config(), b"key configuration A");
}

/// Issue 23: the drafter is part of what the route attests. The entry's
/// nonce-fresh claims commit to the drafter it publishes; a host that edits
/// or strips the published drafter is refused at `drafter`; a policy can pin
/// the drafters it accepts (for instance only `none`, to require that no
/// speculation runs), and a route whose entry commits to another is refused.
#[test]
fn the_drafter_is_bound_into_the_route_and_pinnable() {
    let peer = client_policy();
    let route = verify_route(&honest(&nonce()), &peer, &nonce(), SystemTime::now()).unwrap();
    assert_eq!(route.drafter(), Some(&ngram()));
    assert!(matches!(route.checks().outcome(R::Drafter), Some(Outcome::Passed { .. })));
    // The host rewrites what the entry published.
    let mut edited = honest(&nonce());
    edited.drafter = Some(DrafterInfo { kind: "none".into(), ..ngram() });
    assert_eq!(rejected_by(&edited, &peer), R::Drafter);
    let mut stripped = honest(&nonce());
    stripped.drafter = None;
    assert_eq!(rejected_by(&stripped, &peer), R::Drafter);
    // A policy that accepts only "no drafter".
    let none = DrafterInfo { kind: "none".into(), draft_manifest: None, k_max: 6, k: None };
    let only_none = Policy { drafters: vec![none.digest()], ..peer.clone() };
    assert_eq!(rejected_by(&honest(&nonce()), &only_none), R::Drafter);
    let plain = doc_drafting(KEY_CONFIG, &nonce(), &peer, &shape(), honest_shards(&peer), Some(none.clone()));
    let route = verify_route(&plain, &only_none, &nonce(), SystemTime::now()).unwrap();
    assert_eq!(route.drafter().map(|d| d.kind.as_str()), Some("none"));
    // A pinned draft model: another manifest is another drafter.
    let model = DrafterInfo { kind: "model".into(), draft_manifest: Some(ManifestRoot([9; 32])), k_max: 6, k: None };
    let pinned = Policy { drafters: vec![model.digest()], ..peer.clone() };
    let other = DrafterInfo { draft_manifest: Some(ManifestRoot([8; 32])), ..model.clone() };
    let doc = doc_drafting(KEY_CONFIG, &nonce(), &peer, &shape(), honest_shards(&peer), Some(other));
    assert_eq!(rejected_by(&doc, &pinned), R::Drafter);
    let doc = doc_drafting(KEY_CONFIG, &nonce(), &peer, &shape(), honest_shards(&peer), Some(model));
    verify_route(&doc, &pinned, &nonce(), SystemTime::now()).unwrap();
    // An entry that commits to no drafter passes only a policy that pins none.
    let silent = doc_drafting(KEY_CONFIG, &nonce(), &peer, &shape(), honest_shards(&peer), None);
    let route = verify_route(&silent, &peer, &nonce(), SystemTime::now()).unwrap();
    assert!(matches!(route.checks().outcome(R::Drafter), Some(Outcome::Skipped { .. })));
    assert_eq!(rejected_by(&silent, &only_none), R::Drafter);
}

/// Issue 23: every route check is evaluated; the verdict names the first
/// failure and counts the others, and each failed row stays in the table.
#[test]
fn every_route_check_runs_and_the_verdict_names_the_first_failure() {
    let mut doc = honest(&nonce());
    doc.drafter = None; // fails `drafter`
    doc.shards.pop(); // fails `route_links` and `coverage`
    match verify_route(&doc, &client_policy(), &nonce(), SystemTime::now()) {
        Err(RouteError::Rejected(r)) => {
            assert_eq!(r.check, R::RouteLinks);
            let failures = r.report.table.failures();
            assert_eq!(failures, vec![R::RouteLinks, R::Coverage, R::Drafter], "{}", r.report);
            let text = r.report.to_string();
            assert!(text.contains("REJECTED (first failed check: route_links, 3 failed in all)"), "{text}");
        }
        other => panic!("expected a rejection, got {:?}", other.map(|_| ())),
    }
}

/// Issue 23, attestation at scale: one evidence answers a batch of
/// verifiers. Its claimed nonce is the Merkle root of their nonces; each gets
/// its inclusion path. A path for our nonce verifies; our nonce with another
/// verifier's path, or an evidence for a batch we were not in, fails
/// `freshness`; a malformed path is refused at `entry_evidence`.
#[test]
fn one_evidence_answers_a_batch_of_nonces_by_inclusion_path() {
    use veil_attestation::nonce_batch::{leaf, root, NoncePath};
    let peer = client_policy();
    let batch: Vec<Nonce> = (0..5u8).map(|i| Nonce::new(vec![i; 32]).unwrap()).collect();
    let mut all = batch.clone();
    all[3] = nonce();
    let leaves: Vec<[u8; 32]> = all.iter().map(leaf).collect();
    let batch_root = Nonce::new(root(&leaves).to_vec()).unwrap();
    let mut doc = doc_with(&batch_root, &peer, &shape(), honest_shards(&peer));
    doc.nonce_path = Some(NoncePath::of(3, &leaves));
    let route = verify_route(&doc, &peer, &nonce(), SystemTime::now()).unwrap();
    match route.checks().outcome(R::EntryEvidence) {
        Some(Outcome::Passed { detail }) => assert!(detail.contains("leaf 3 of a batch of 5"), "{detail}"),
        other => panic!("{other:?}"),
    }
    // Another verifier's path: not our nonce's.
    let mut theirs = doc.clone();
    theirs.nonce_path = Some(NoncePath::of(1, &leaves));
    match verify_route(&theirs, &peer, &nonce(), SystemTime::now()) {
        Err(RouteError::Evidence { source, .. }) => assert_eq!(source.check(), Some(CheckId::Freshness), "{source}"),
        other => panic!("another verifier's path was accepted: {:?}", other.map(|_| ())),
    }
    // A batch we were not in, with a path the host made up for us.
    let mut without = batch.clone();
    without[3] = Nonce::new(vec![0xEE; 32]).unwrap();
    let other_leaves: Vec<[u8; 32]> = without.iter().map(leaf).collect();
    let other_root = Nonce::new(root(&other_leaves).to_vec()).unwrap();
    let mut stale = doc_with(&other_root, &peer, &shape(), honest_shards(&peer));
    stale.nonce_path = Some(NoncePath::of(3, &leaves));
    match verify_route(&stale, &peer, &nonce(), SystemTime::now()) {
        Err(RouteError::Evidence { source, .. }) => assert_eq!(source.check(), Some(CheckId::Freshness), "{source}"),
        other => panic!("evidence for another batch was accepted: {:?}", other.map(|_| ())),
    }
    // Malformed: an index outside the batch.
    let mut bad = doc.clone();
    bad.nonce_path = Some(NoncePath { index: 9, ..NoncePath::of(3, &leaves) });
    assert_eq!(rejected_by(&bad, &peer), R::EntryEvidence);
    // Stripping the path: the claims carry the root, not our nonce.
    let mut stripped = doc;
    stripped.nonce_path = None;
    assert!(matches!(
        verify_route(&stripped, &peer, &nonce(), SystemTime::now()),
        Err(RouteError::Evidence { source, .. }) if source.check() == Some(CheckId::Freshness)
    ));
}

/// A stage shard on (simulated) GPUs, under root A: its bundle carries its
/// GPUs' RIMs, as a hardware shard carries NVIDIA's.
fn gpu_shard(stage: u32, peer: &Policy, shape: &RouteShape) -> LinkedShard {
    use veil_attestation::attester::gpu::simulated::{SimulatedGpu, SimulatedGpuConfig};
    use veil_attestation::attester::gpu::{CompositeAttester, GpuSource};
    use veil_attestation::Attester as _;
    let gpu = SimulatedGpu::from_seed(b"route gpu", SimulatedGpuConfig::default()).unwrap();
    let att = CompositeAttester::new(Box::new(sim(b"root A")), GpuSource::Simulated(vec![gpu])).unwrap();
    let claims = shard_claims(stage, 0xC0 + stage as u8, peer, shape);
    LinkedShard { stage, replica: 0, evidence: att.evidence(&claims).unwrap() }
}

/// Issue 55 item 11: with `require_rim = true`, a route whose GPU shards
/// carry their RIMs verifies (the RIMs reach the client with the evidence);
/// a host that strips them, or swaps in an unsigned RIM where the policy
/// requires signatures, is refused at that GPU check, by name.
#[test]
fn gpu_shards_carry_their_rims_to_the_client_and_a_host_that_strips_them_is_named() {
    use veil_attestation::GpuCheckId;
    let sh = shape();
    let mut policy = client_policy();
    policy.gpu.require_rim = true;
    let doc_for = |edit: &dyn Fn(&mut LinkedShard)| {
        let mut stage2 = gpu_shard(2, &policy, &sh);
        edit(&mut stage2);
        let shards = vec![shard(root_a(), 1, 0, &policy, &sh), stage2];
        doc_with(&nonce(), &policy, &sh, shards)
    };
    let route = verify_route(&doc_for(&|_| {}), &policy, &nonce(), SystemTime::now()).unwrap();
    let gpus = route.shards().iter().find_map(|s| s.evidence().gpus()).expect("the GPU shard's GPUs verified");
    let table = gpus.appraisal().gpus[0].to_string();
    assert!(table.contains("active golden measurements match (driver + VBIOS RIM)"), "{table}");

    // The host strips the RIMs: the route links still hold (they are not
    // committed to), and the GPU check names what is missing.
    let gpu_failure =
        |doc: &AttestationDoc, policy: &Policy| match verify_route(doc, policy, &nonce(), SystemTime::now()) {
            Err(RouteError::Evidence { source, .. }) => (source.check(), source.to_string()),
            other => panic!("expected the GPU shard's evidence to be refused, got {other:?}"),
        };
    let stripped = doc_for(&|s| s.evidence.gpu_rims.clear());
    let (check, why) = gpu_failure(&stripped, &policy);
    assert_eq!(check, Some(CheckId::Gpu(GpuCheckId::RimMeasurements)), "{why}");
    assert!(why.contains("none supplied"), "{why}");
    // Without `require_rim`, the same route passes and says no RIM was compared.
    let mut lax = policy.clone();
    lax.gpu.require_rim = false;
    let stripped_lax = {
        let mut stage2 = gpu_shard(2, &lax, &sh);
        stage2.evidence.gpu_rims.clear();
        doc_with(&nonce(), &lax, &sh, vec![shard(root_a(), 1, 0, &lax, &sh), stage2])
    };
    let route = verify_route(&stripped_lax, &lax, &nonce(), SystemTime::now()).unwrap();
    let table = route.shards().iter().find_map(|s| s.evidence().gpus()).unwrap().appraisal().gpus[0].to_string();
    assert!(table.contains("no RIM supplied"), "{table}");

    // Simulated RIMs are unsigned: under `require_rim_signature` (what a
    // hardware policy sets, so that a host cannot write its own golden
    // values) they are refused by name.
    let mut signed = policy.clone();
    signed.gpu.require_rim_signature = true;
    let doc = {
        let stage2 = gpu_shard(2, &signed, &sh);
        doc_with(&nonce(), &signed, &sh, vec![shard(root_a(), 1, 0, &signed, &sh), stage2])
    };
    let (check, why) = gpu_failure(&doc, &signed);
    assert_eq!(check, Some(CheckId::Gpu(GpuCheckId::RimSignature)), "{why}");
}
