//! [`verify_route`]: the ten route checks, in order, every one evaluated.
//!
//! Each check is a function from the document (and what earlier checks
//! established) to one [`Outcome`]; [`verify_route`] runs them in the order
//! of [`RouteCheckId`] and records each row. A failed check does not stop the
//! table (the verdict names the first failure). Evidence that fails the
//! policy stops it, and its own table says why, unless a route check failed
//! before it: then the route table goes on and names that first failure.

use std::fmt;
use std::time::SystemTime;

use super::{
    links_commitment, AttestationDoc, DrafterInfo, RouteCheckId, RouteError, RouteRejection, RouteReport, RouteShape,
    StageShape, VerifiedRoute, VerifiedShard,
};
use crate::claims::{Claims, DrafterDigest, KeyHash, Nonce, PolicyDigest, RouteDigest};
use crate::error::Error;
use crate::policy::Policy;
use crate::verify::{verify, ExpectedClaims, Outcome, VerifiedEvidence};

fn pass(detail: impl Into<String>) -> Outcome {
    Outcome::Passed { detail: detail.into() }
}

fn failed(expected: impl Into<String>, actual: impl Into<String>) -> Outcome {
    Outcome::Failed { expected: expected.into(), actual: actual.into() }
}

fn show<T: fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "absent".to_owned(), |v| v.to_string())
}

/// The rejection naming the table's first failed check.
fn reject(t: RouteReport) -> RouteError {
    let (check, expected, actual) = match t.first_failure() {
        Some((c, e, a)) => (c, e.to_owned(), a.to_owned()),
        None => (RouteCheckId::RouteShape, String::new(), String::new()),
    };
    RouteError::Rejected(Box::new(RouteRejection { check, expected, actual, report: t }))
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
    let shape = &doc.route;
    let stages = shape.stages();

    // 1–2. The shape, and the model its stages pin.
    t.record(RouteCheckId::RouteShape, shape_check(shape, policy));
    t.record(RouteCheckId::RouteManifests, manifests_check(stages, policy));
    // 3. The entry, fresh and bound to the key this client will seal to.
    let entry = verify_entry(doc, policy, nonce, now, &mut t)?;
    let claims = entry.claims().cloned().unwrap_or_default();
    // 4–6. What the entry's signed claims commit to.
    let policy_digest = doc.peer_policy.digest();
    let shape_digest = shape.digest();
    t.record(RouteCheckId::PeerPolicyBinding, peer_policy_binding_check(&claims, policy_digest));
    t.record(RouteCheckId::RouteShapeBinding, route_shape_binding_check(&claims, shape_digest));
    t.record(RouteCheckId::RouteLinks, route_links_check(doc, &claims));
    // 7. The peer policy: at least as strict as ours, or pinned.
    t.gaps = policy.gaps_in(&doc.peer_policy);
    let pinned = policy.peer_policies.contains(&policy_digest);
    t.record(RouteCheckId::PeerPolicy, peer_policy_check(&t, policy_digest, pinned));
    // 8. Every listed shard, pinned to its stage, the shape and the peer policy.
    let pins = ShardPins { policy_digest, shape_digest };
    let shards = verify_shards(doc, policy, now, pins, &mut t)?;
    // 9. Coverage: every stage after the entry is served.
    t.record(RouteCheckId::Coverage, coverage_check(shape, &shards));
    // 10. The drafter: published as committed, and allowed.
    t.record(RouteCheckId::Drafter, drafter_check(doc.drafter.as_ref(), claims.drafter, policy));
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
        entry: VerifiedShard { stage: 0, replica: 0, layers: stages[0].layers, evidence: entry },
        shards,
        checks: t,
        drafter: doc.drafter.clone(),
        _private: (),
    })
}

/// Check 1: the shape (contiguity is enforced when parsing; the layer count may be pinned).
fn shape_check(shape: &RouteShape, policy: &Policy) -> Outcome {
    match policy.model_layers {
        Some(n) if n != shape.model_layers() => {
            failed(format!("a model of {n} layers (policy model_layers)"), format!("{} layers", shape.model_layers()))
        }
        pinned => pass(format!(
            "layers 0..{} in {} stage(s), {} activations{}",
            shape.model_layers(),
            shape.stages().len(),
            shape.activations(),
            if pinned.is_some() { " (layer count pinned)" } else { "" }
        )),
    }
}

/// Check 2: the manifests the route pins, against the policy's allowlist.
fn manifests_check(stages: &[StageShape], policy: &Policy) -> Outcome {
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
    }
}

/// Check 3: the entry's evidence: its claims carry our nonce (or the root of a
/// batch of nonces ours is proven to be in), the sealing key and stage 0.
/// Records [`RouteCheckId::EntryEvidence`]; evidence that fails the policy
/// ends the verification.
fn verify_entry(
    doc: &AttestationDoc,
    policy: &Policy,
    nonce: &Nonce,
    now: SystemTime,
    t: &mut RouteReport,
) -> Result<VerifiedEvidence, RouteError> {
    let stage = doc.route.stages()[0];
    let claimed_nonce = match &doc.nonce_path {
        None => nonce.clone(),
        Some(p) => match p.claimed_nonce(nonce) {
            Ok(root) => root,
            Err(why) => {
                t.record(
                    RouteCheckId::EntryEvidence,
                    failed("a well-formed inclusion path for your nonce", why.to_string()),
                );
                return Err(reject(std::mem::take(t)));
            }
        },
    };
    let expected = ExpectedClaims {
        nonce: Some(claimed_nonce),
        hpke_config_hash: Some(KeyHash::of(&doc.key_config)),
        layer_range: Some(stage.layers),
        manifest_root: Some(stage.manifest_root),
        ..ExpectedClaims::default()
    };
    let entry = match verify(&doc.entry, policy, &expected, now) {
        Ok(e) => e,
        Err(source) if t.first_failure().is_some() => {
            t.record(
                RouteCheckId::EntryEvidence,
                failed("the entry's evidence passes your policy", source.to_string()),
            );
            return Err(reject(std::mem::take(t)));
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
    Ok(entry)
}

/// Check 4: the entry's claims commit to the published peer policy.
fn peer_policy_binding_check(claims: &Claims, digest: PolicyDigest) -> Outcome {
    if claims.peer_policy == Some(digest) {
        pass(format!("peer policy {digest}"))
    } else {
        failed(format!("the published peer policy's digest {digest}"), show(claims.peer_policy))
    }
}

/// Check 5: the entry's claims commit to the published route shape.
fn route_shape_binding_check(claims: &Claims, digest: RouteDigest) -> Outcome {
    if claims.route_shape == Some(digest) {
        pass(format!("route shape {digest}"))
    } else {
        failed(format!("the published route shape's digest {digest}"), show(claims.route_shape))
    }
}

/// Check 6: the entry's claims commit to exactly the listed shards.
fn route_links_check(doc: &AttestationDoc, claims: &Claims) -> Outcome {
    let links = links_commitment(&doc.shards);
    if claims.route_links == Some(links) {
        pass(format!("{} linked shard(s), committed in the entry's nonce-bound claims", doc.shards.len()))
    } else {
        failed(
            format!("the listed {} shard(s), commitment {links}", doc.shards.len()),
            format!("the entry committed to {}", show(claims.route_links)),
        )
    }
}

/// Check 7: the peer policy: no gap against the client's (`t.gaps`), or pinned by digest.
fn peer_policy_check(t: &RouteReport, digest: PolicyDigest, pinned: bool) -> Outcome {
    match (t.gaps.len(), pinned) {
        (0, true) => pass(format!("digest {digest} pinned in your policy")),
        (n, true) => Outcome::Warned {
            detail: format!("digest {digest} pinned in your policy"),
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
    }
}

/// What every shard's claims must commit to besides its own stage.
#[derive(Clone, Copy)]
struct ShardPins {
    policy_digest: PolicyDigest,
    shape_digest: RouteDigest,
}

/// Check 8: every listed shard: a stage after the entry, once per stage and
/// replica, its evidence passing the policy with its stage's layers and
/// manifest, the peer policy and the shape pinned. Records
/// [`RouteCheckId::ShardEvidence`]; a malformed list or evidence that fails
/// the policy ends the verification.
fn verify_shards(
    doc: &AttestationDoc,
    policy: &Policy,
    now: SystemTime,
    pins: ShardPins,
    t: &mut RouteReport,
) -> Result<Vec<VerifiedShard>, RouteError> {
    let stages = doc.route.stages();
    let mut shards: Vec<VerifiedShard> = Vec::with_capacity(doc.shards.len());
    for s in &doc.shards {
        let stage = usize::try_from(s.stage).unwrap_or(usize::MAX);
        let Some(want) = stages.get(stage).filter(|_| stage > 0) else {
            t.record(
                RouteCheckId::ShardEvidence,
                failed(format!("a stage in 1..{}", stages.len()), format!("stage {}", s.stage)),
            );
            return Err(reject(std::mem::take(t)));
        };
        if shards.iter().any(|v| (v.stage, v.replica) == (s.stage, s.replica)) {
            t.record(
                RouteCheckId::ShardEvidence,
                failed("one entry per stage and replica", format!("stage {} replica {} twice", s.stage, s.replica)),
            );
            return Err(reject(std::mem::take(t)));
        }
        let expected = ExpectedClaims {
            layer_range: Some(want.layers),
            manifest_root: Some(want.manifest_root),
            peer_policy: Some(pins.policy_digest),
            route_shape: Some(pins.shape_digest),
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
                return Err(reject(std::mem::take(t)));
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
    Ok(shards)
}

/// Check 9: every stage after the entry is served by a verified shard.
fn coverage_check(shape: &RouteShape, shards: &[VerifiedShard]) -> Outcome {
    let stages = shape.stages();
    let missing: Vec<String> = (1..stages.len())
        .filter(|&i| !shards.iter().any(|s| s.stage as usize == i))
        .map(|i| format!("stage {i} (layers {})", stages[i].layers))
        .collect();
    if missing.is_empty() {
        pass(format!("layers 0..{} served by verified shards", shape.model_layers()))
    } else {
        failed("a linked, verified shard for every stage", format!("none for {}", missing.join(", ")))
    }
}

/// Check 10: the drafter the entry committed to is the one published, and one the
/// policy's `drafters` allows when it lists any.
fn drafter_check(published: Option<&DrafterInfo>, committed: Option<DrafterDigest>, policy: &Policy) -> Outcome {
    match (published, committed) {
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
        (Some(d), None) => failed(format!("a commitment to the published drafter {d}"), "none in the entry's claims"),
        (None, None) if !policy.drafters.is_empty() => {
            failed("a drafter your policy's `drafters` allows", "the entry commits to no drafter")
        }
        (None, None) => Outcome::Skipped { reason: "the entry commits to no drafter".into() },
    }
}
