//! `REPORT_DATA` binding (the claims hash into the report, pinned claims
//! match, manifests allowed per layer range) and freshness (the nonce).

use super::{not_run, ExpectedClaims};
use crate::check::Outcome;
use crate::claims::Claims;
use crate::policy::Policy;
use crate::snp::SnpReport;

pub(super) fn check_binding(
    r: &SnpReport,
    claims: Option<&Claims>,
    expected: &ExpectedClaims,
    policy: &Policy,
) -> Outcome {
    let actual = r.report_data();
    if let Some(pin) = &expected.report_data {
        if pin.0 != actual {
            return Outcome::Failed {
                expected: format!("REPORT_DATA {}", hex::encode(pin.0)),
                actual: hex::encode(actual),
            };
        }
    }
    let Some(claims) = claims else {
        if expected.report_data.is_some() {
            return Outcome::Passed { detail: "REPORT_DATA equals the pinned value".into() };
        }
        let pinned = expected.tls_key_hash.is_some()
            || expected.hpke_config_hash.is_some()
            || expected.manifest_root.is_some()
            || expected.layer_range.is_some()
            || expected.gpu_evidence_hash.is_some()
            || expected.peer_policy.is_some()
            || expected.route_shape.is_some()
            || expected.route_links.is_some();
        return if pinned {
            Outcome::Failed {
                expected: "claims bound into REPORT_DATA".into(),
                actual: "the evidence carries no claims".into(),
            }
        } else {
            not_run("no claims and no expected REPORT_DATA supplied")
        };
    };
    let bound = match claims.report_data() {
        Ok(rd) => rd,
        Err(e) => return Outcome::Failed { expected: "encodable claims".into(), actual: e.to_string() },
    };
    if bound.0 != actual {
        return Outcome::Failed {
            expected: format!("REPORT_DATA = SHA-512(claims) = {}", hex::encode(bound.0)),
            actual: hex::encode(actual),
        };
    }
    macro_rules! pinned {
        ($field:ident, $label:literal) => {
            if let Some(want) = &expected.$field {
                if claims.$field.as_ref() != Some(want) {
                    let got = claims.$field.as_ref().map(|v| v.to_string()).unwrap_or_else(|| "absent".into());
                    return Outcome::Failed {
                        expected: format!("{} {}", $label, want),
                        actual: format!("{} {}", $label, got),
                    };
                }
            }
        };
    }
    pinned!(tls_key_hash, "TLS key hash");
    pinned!(hpke_config_hash, "HPKE key-config hash");
    pinned!(manifest_root, "manifest root");
    pinned!(layer_range, "layer range");
    pinned!(gpu_evidence_hash, "GPU evidence hash");
    pinned!(peer_policy, "peer-policy digest");
    pinned!(route_shape, "route-shape digest");
    pinned!(route_links, "route-links commitment");
    if !policy.manifest_roots.is_empty() && !claims.manifest_root.is_some_and(|r| policy.manifest_roots.contains(&r)) {
        return Outcome::Failed {
            expected: format!("a manifest root the policy allows ({} listed)", policy.manifest_roots.len()),
            actual: format!(
                "manifest root {}",
                claims.manifest_root.map(|r| r.to_string()).unwrap_or_else(|| "absent".into())
            ),
        };
    }
    Outcome::Passed { detail: "REPORT_DATA = SHA-512(canonical claims); pinned claims match".into() }
}

pub(super) fn check_freshness(claims: Option<&Claims>, expected: &ExpectedClaims) -> Outcome {
    let Some(want) = &expected.nonce else {
        return not_run("no nonce was requested");
    };
    match claims.and_then(|c| c.nonce.as_ref()) {
        Some(got) if got == want => Outcome::Passed { detail: format!("nonce {want} is in the signed claims") },
        Some(got) => {
            Outcome::Failed { expected: format!("nonce {want}"), actual: format!("nonce {got} (stale or replayed)") }
        }
        None => Outcome::Failed { expected: format!("nonce {want}"), actual: "no nonce in the signed claims".into() },
    }
}
