//! The verified route as a reviewer reads it: the check tables `veil
//! verify` prints, the JSON document of `veil verify --json` (which the
//! Python and WebAssembly clients return too), and the warnings a reviewer
//! must see. No I/O: this module also builds for wasm32.

use veil_attestation::route::{VerifiedRoute, VerifiedShard};

fn show_shard(out: &mut String, name: &str, s: &VerifiedShard) {
    use std::fmt::Write as _;
    let _ = writeln!(out, "== {name}: stage {} replica {}, layers {}", s.stage(), s.replica(), s.layers());
    let _ = writeln!(out, "{}", s.evidence().checks());
    if let Some(gpus) = s.evidence().gpus() {
        let _ = writeln!(out, "{}", gpus.appraisal());
    }
}

fn shard_json(role: &str, s: &VerifiedShard) -> serde_json::Value {
    let e = s.evidence();
    serde_json::json!({
        "role": role,
        "stage": s.stage(),
        "replica": s.replica(),
        "layers": s.layers().to_string(),
        "simulated": e.is_simulated(),
        "verdict": e.checks().verdict(),
        "checks": e.checks(),
        "gpus": e.gpus().map(|g| g.appraisal().gpus.iter().map(|t| serde_json::json!({
            "gpu_index": t.gpu_index,
            "verdict": t.verdict(),
            "checks": t.results,
        })).collect::<Vec<_>>()),
    })
}

/// The verified route as `veil verify --json` prints it (and the Python
/// package returns it): the verdict, the model, the peer
/// policy and route shape digests, the drafter, the route checks and every
/// shard's checks with its simulated flag.
pub fn route_json(route: &VerifiedRoute) -> serde_json::Value {
    let mut shards = vec![shard_json("entry", route.entry())];
    shards.extend(route.shards().iter().map(|s| shard_json("shard", s)));
    serde_json::json!({
        "accepted": true,
        "simulated": route.simulated_count() > 0,
        "simulated_shards": route.simulated_count(),
        "verdict": format!("ACCEPTED{}", route.simulated_notice().map(|n| format!(" — {n}")).unwrap_or_default()),
        "model": route.model(),
        "peer_policy": route.peer_policy_digest().to_string(),
        "route_shape": route.shape().digest().to_string(),
        "drafter": route.drafter().map(|d| serde_json::json!({
            "kind": d.kind,
            "draft_manifest": d.draft_manifest.map(|m| m.to_string()),
            "k_max": d.k_max,
            "k": d.k,
            "digest": d.digest().to_string(),
        })),
        "route_checks": route.checks().table,
        "policy_gaps": route.checks().gaps.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "warnings": route_warnings(route),
        "shards": shards,
    })
}

/// Every warning a reviewer must see: the route checks' (a peer policy
/// weaker than the client's, accepted because pinned), each shard's
/// (simulated evidence accepted, fields this verifier does not know), each
/// GPU's, then the route's simulated notice; in route order, without repeats.
pub fn route_warnings(route: &VerifiedRoute) -> Vec<String> {
    use veil_attestation::check::{CheckName as _, Outcome};
    let mut out: Vec<String> = Vec::new();
    for r in &route.checks().table.results {
        if let Outcome::Warned { warning, .. } = &r.outcome {
            out.push(format!("{}: {warning}", r.check.check_name()));
        }
    }
    for s in std::iter::once(route.entry()).chain(route.shards()) {
        let e = s.evidence();
        let gpu = e.gpus().into_iter().flat_map(|g| g.appraisal().gpus.iter().flat_map(|t| t.warnings.iter()));
        for w in e.checks().warnings.iter().chain(gpu) {
            if !out.contains(w) {
                out.push(w.clone());
            }
        }
    }
    out.extend(route.simulated_notice());
    out
}

/// The check tables `veil verify` prints: each shard's (and its GPUs'),
/// then the route's.
pub fn route_text(route: &VerifiedRoute) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    show_shard(&mut out, "entry", route.entry());
    for s in route.shards() {
        show_shard(&mut out, "shard", s);
    }
    let _ = writeln!(out, "== route: peer policy {}, shape {}", route.peer_policy_digest(), route.shape().digest());
    let _ = writeln!(out, "{}", route.checks());
    out
}
