//! The verifier: an ordered list of named checks over an evidence bundle.
//!
//! [`appraise`] runs every check it can and returns the full [`CheckReport`];
//! [`verify`] turns that into either a [`VerifiedEvidence`] (which only this
//! module can construct) or an [`Error::Rejected`] naming the first failed
//! check with the expected and actual values. Both are pure: the caller
//! passes the time, the policy and what it expects; nothing here reads a
//! clock, a file or a socket.

mod azure;
mod binding;
mod chain;
mod gpu;
mod report;
mod tdx;

use std::time::SystemTime;

pub use self::azure::{appraise_azure, verify_azure, AzureAppraisal, SnpEndorsement};
use self::binding::{check_binding, check_freshness};
pub use self::chain::check_signature;
use self::chain::{check_chain, check_chip_id, check_crl, check_product, check_reported_tcb};
pub use self::gpu::{appraise_gpus, verify_gpus, GpuExpectations, VerifiedGpus};
use self::report::{check_format, record_policy_checks};
pub use self::tdx::{verify_tdx, VerifiedTdx};
pub use crate::check::{CheckId, CheckReport, CheckResult, Outcome};
use crate::claims::{
    Claims, GpuEvidenceHash, KeyHash, LayerRange, LinksCommitment, ManifestRoot, Nonce, PolicyDigest, ReportData,
    RouteDigest,
};
use crate::error::{Error, Malformed, Rejection};
use crate::evidence::EvidenceBundle;
use crate::policy::Policy;
use crate::snp::{Endorsement, Product, SigningKey, SnpReport, Tcb};
use crate::x509::fmt_time;

/// What the relying party knows independently of the evidence.
///
/// Fields left `None` are not pinned. Pinned fields must equal the bundle's
/// claims, and the claims must hash to `REPORT_DATA`.
#[derive(Clone, Debug, Default)]
pub struct ExpectedClaims {
    /// Exact `REPORT_DATA` (for bare reports whose claims are not Veil's).
    pub report_data: Option<ReportData>,
    /// Hash of the TLS key the peer presented (RA-TLS).
    pub tls_key_hash: Option<KeyHash>,
    /// Hash of the HPKE key configuration the client will seal to.
    pub hpke_config_hash: Option<KeyHash>,
    /// Manifest root the relying party requires.
    pub manifest_root: Option<ManifestRoot>,
    /// Layer range the relying party requires.
    pub layer_range: Option<LayerRange>,
    /// Hash of GPU evidence the relying party holds.
    pub gpu_evidence_hash: Option<GpuEvidenceHash>,
    /// The nonce the relying party asked for (freshness).
    pub nonce: Option<Nonce>,
    /// Digest of the peer policy the relying party requires the shard to enforce.
    pub peer_policy: Option<PolicyDigest>,
    /// Digest of the route shape the shard must serve in.
    pub route_shape: Option<RouteDigest>,
    /// The entry's commitment to its linked shards (the document the client holds).
    pub route_links: Option<LinksCommitment>,
}

/// Where the endorsement chain ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum RootKind {
    /// A pinned AMD root key.
    Amd,
    /// Veil's simulated root (accepted only under `allow_simulated`), by the
    /// SHA-256 of its SubjectPublicKeyInfo (what `simulated_roots` pins).
    Simulated(KeyHash),
}

/// Evidence that passed every check of a policy. Only [`verify`] makes one.
#[derive(Clone, Debug)]
pub struct VerifiedEvidence {
    report: SnpReport,
    product: Product,
    signer: SigningKey,
    root: RootKind,
    claims: Option<Claims>,
    checks: CheckReport,
    gpus: Option<VerifiedGpus>,
    _private: (),
}

impl VerifiedEvidence {
    /// The verified report.
    pub fn report(&self) -> &SnpReport {
        &self.report
    }
    /// The product the chain was pinned to.
    pub fn product(&self) -> Product {
        self.product
    }
    /// VCEK or VLEK.
    pub fn signer(&self) -> SigningKey {
        self.signer
    }
    /// Whether the evidence came from the simulated attester.
    pub fn is_simulated(&self) -> bool {
        matches!(self.root, RootKind::Simulated(_))
    }
    /// The simulated root's key fingerprint, for simulated evidence.
    pub fn simulated_root(&self) -> Option<KeyHash> {
        match self.root {
            RootKind::Simulated(k) => Some(k),
            RootKind::Amd => None,
        }
    }
    /// The claims `REPORT_DATA` commits to, when the bundle carried them.
    pub fn claims(&self) -> Option<&Claims> {
        self.claims.as_ref()
    }
    /// The full table of checks.
    pub fn checks(&self) -> &CheckReport {
        &self.checks
    }
    /// Records freshness established by other means than this evidence's
    /// own nonce (a shard whose static evidence a nonce-bound entry committed
    /// to over live links). Only the route verifier calls it.
    pub(crate) fn vouch_freshness(&mut self, detail: String) {
        self.checks.set(CheckId::Freshness, Outcome::Passed { detail });
    }
    /// The shard's verified GPUs (composite evidence), when it presented any
    /// or the policy requires them.
    pub fn gpus(&self) -> Option<&VerifiedGpus> {
        self.gpus.as_ref()
    }
    /// `REPORTED_TCB`, decoded for the product.
    pub fn reported_tcb(&self) -> Tcb {
        self.report.reported_tcb().decode(self.product)
    }
}

/// Verifies `bundle` against `policy`, the caller's expectations and `now`
/// (its GPUs too, when it carries any: see [`crate::gpu`]).
pub fn verify(
    bundle: &EvidenceBundle,
    policy: &Policy,
    expected: &ExpectedClaims,
    now: SystemTime,
) -> Result<VerifiedEvidence, Error> {
    verify_with_rims(bundle, policy, expected, &[], now)
}

/// [`verify`], comparing the GPUs' measurements with `rims`.
pub(crate) fn verify_with_rims(
    bundle: &EvidenceBundle,
    policy: &Policy,
    expected: &ExpectedClaims,
    rims: &[crate::gpu::Rim],
    now: SystemTime,
) -> Result<VerifiedEvidence, Error> {
    verify_inner(bundle, policy, expected, rims, now, true)
}

/// [`verify`] without the GPU evidence: for an RA-TLS handshake, where the
/// GPU evidence the claims commit to arrives after the handshake and the
/// whole is verified then. The result carries no GPUs and proves nothing
/// about them.
pub(crate) fn verify_deferring_gpus(
    bundle: &EvidenceBundle,
    policy: &Policy,
    expected: &ExpectedClaims,
    now: SystemTime,
) -> Result<VerifiedEvidence, Error> {
    verify_inner(bundle, policy, expected, &[], now, false)
}

/// Verifies a composite attester: the CPU bundle first, then its GPUs with
/// the nonce derived from, and the binding checked against, the *verified*
/// claims. `Ok` only when both pass.
pub fn verify_composite(
    bundle: &crate::EvidenceBundle,
    gpus: &[crate::gpu::GpuEvidence],
    rims: &[crate::gpu::Rim],
    policy: &Policy,
    expected: &ExpectedClaims,
    now: SystemTime,
) -> Result<(crate::VerifiedEvidence, VerifiedGpus), Error> {
    let composite = crate::EvidenceBundle { gpus: gpus.to_vec(), ..bundle.clone() };
    let cpu = verify_with_rims(&composite, policy, expected, rims, now)?;
    match cpu.gpus().cloned() {
        Some(verified) => Ok((cpu, verified)),
        // Invariant: a bundle with GPUs (or a policy requiring them) has them verified.
        None => Err(Error::ApiMisuse("no GPU evidence to verify".into())),
    }
}

fn verify_inner(
    bundle: &EvidenceBundle,
    policy: &Policy,
    expected: &ExpectedClaims,
    rims: &[crate::gpu::Rim],
    now: SystemTime,
    with_gpus: bool,
) -> Result<VerifiedEvidence, Error> {
    let appraisal = appraise(bundle, policy, expected, now);
    let report = appraisal.checks;
    if let Some((check, expected, actual)) = report.first_failure() {
        let rejection = Rejection {
            check,
            expected: expected.to_owned(),
            actual: actual.to_owned(),
            report: report.clone(),
            gpu: None,
            tdx: None,
            azure: None,
        };
        return Err(Error::Rejected(Box::new(rejection)));
    }
    match (appraisal.report, appraisal.product, appraisal.signer, appraisal.root) {
        (Some(snp), Some(product), Some(signer), Some(root)) => {
            // A composite attester's GPUs: verified against the claims the
            // report just proved (their nonce derives from them, and they
            // commit to the GPU evidence digest).
            let claims = bundle.claims.as_ref();
            let gpus = if with_gpus
                && (!bundle.gpus.is_empty()
                    || policy.gpu.required
                    || claims.is_some_and(|c| c.gpu_evidence_hash.is_some()))
            {
                // The verifier's own RIMs, then those the shard carries (their
                // signatures, not their carrier, make them count).
                let mut all_rims = rims.to_vec();
                for (index, raw) in bundle.gpu_rims.iter().enumerate() {
                    let rim = crate::gpu::Rim::parse(raw)
                        .map_err(|e| Malformed::CarriedRim { index, reason: e.to_string() })?;
                    if !all_rims.iter().any(|r| r.source() == rim.source()) {
                        all_rims.push(rim);
                    }
                }
                let expect = GpuExpectations { rims: &all_rims, claims, nonce: None, ocsp: &bundle.gpu_ocsp };
                Some(verify_gpus(&bundle.gpus, &expect, policy, now)?)
            } else {
                None
            };
            if matches!(root, RootKind::Simulated(_)) {
                tracing::warn!(
                    "accepting SIMULATED attestation evidence (policy allow_simulated = true): no hardware guarantee"
                );
            }
            Ok(VerifiedEvidence {
                report: snp,
                product,
                signer,
                root,
                claims: bundle.claims.clone(),
                checks: report,
                gpus,
                _private: (),
            })
        }
        // Invariant: with no failed check every stage produced its value;
        // refuse rather than assume.
        _ => Err(Error::ApiMisuse("verification incomplete without a failed check".into())),
    }
}

/// The result of running every check.
#[derive(Debug)]
pub struct Appraisal {
    /// The table.
    pub checks: CheckReport,
    report: Option<SnpReport>,
    product: Option<Product>,
    signer: Option<SigningKey>,
    root: Option<RootKind>,
}

type Fail = (String, String);

fn fail(expected: impl Into<String>, actual: impl Into<String>) -> Fail {
    (expected.into(), actual.into())
}

fn outcome(result: Result<String, Fail>) -> Outcome {
    match result {
        Ok(detail) => Outcome::Passed { detail },
        Err((expected, actual)) => Outcome::Failed { expected, actual },
    }
}

fn skipped(reason: impl Into<String>) -> Outcome {
    Outcome::Skipped { reason: reason.into() }
}

fn not_run(reason: impl Into<String>) -> Outcome {
    Outcome::NotRun { reason: reason.into() }
}

/// Runs every check and returns the table (no early exit, so a reviewer
/// sees every problem at once). Checks that need an earlier stage's output
/// show as not run when that stage failed.
pub fn appraise(bundle: &EvidenceBundle, policy: &Policy, expected: &ExpectedClaims, now: SystemTime) -> Appraisal {
    let mut t = CheckReport::default();

    // 1. Report format.
    let report = SnpReport::from_bytes(&bundle.report);
    t.record(CheckId::ReportFormat, outcome(check_format(report.as_ref().map_err(|e| e.to_string()), policy)));
    let report = report.ok();

    // 2. Product.
    let endorsement = Endorsement::parse(&bundle.endorsement);
    let product = endorsement.as_ref().ok().and_then(Endorsement::product);
    t.record(
        CheckId::Product,
        match &report {
            None => not_run("report unreadable"),
            Some(r) => outcome(check_product(r, endorsement.as_ref().map_err(|e| &e.reason), policy)),
        },
    );

    // 3. Endorsement chain.
    let chain = match (&report, &endorsement) {
        (Some(r), Ok(e)) => check_chain(r, e, product, bundle, policy, now),
        (_, Err(e)) => Err(fail("a parsable VCEK/VLEK certificate", e.reason.clone())),
        (None, Ok(_)) => Err(fail("a readable report (KEY_INFO)", "report unreadable")),
    };
    let mut simulated = false;
    match &chain {
        Ok(c) => {
            let root = match c.root {
                RootKind::Amd => "AMD root",
                RootKind::Simulated(_) => "SIMULATED root",
            };
            t.record(
                CheckId::EndorsementChain,
                Outcome::Passed {
                    detail: format!(
                        "{} → {} → {} ({root}), all valid at {}",
                        c.leaf_name,
                        c.intermediate.common_name().unwrap_or_default(),
                        c.ark.common_name().unwrap_or_default(),
                        fmt_time(now)
                    ),
                },
            );
            if matches!(c.root, RootKind::Simulated(_)) {
                simulated = true;
                t.warnings.push(
                    "SIMULATED evidence: signed by Veil's software root, not by AMD hardware. \
                     Accepted only because the policy sets allow_simulated = true. It proves nothing about confidentiality."
                        .into(),
                );
            }
        }
        Err((e, a)) => t.record(CheckId::EndorsementChain, Outcome::Failed { expected: e.clone(), actual: a.clone() }),
    }

    // Revocation.
    t.record(
        CheckId::Revocation,
        match &chain {
            Err(_) => not_run("endorsement chain not established"),
            Ok(c) => match &bundle.crl {
                None if policy.require_crl => Outcome::Failed {
                    expected: "a CRL signed by the ARK (policy: require_crl = true)".into(),
                    actual: "none supplied".into(),
                },
                None => skipped("no CRL supplied and policy does not require one"),
                Some(der) => outcome(check_crl(der, c, now)),
            },
        },
    );

    // 4. Signature over the raw signed bytes.
    t.record(
        CheckId::ReportSignature,
        match (&report, &endorsement) {
            (Some(r), Ok(e)) => outcome(check_signature(r, e)),
            _ => not_run("report or endorsement unreadable"),
        },
    );

    // 5. Chip id and reported TCB bound to the endorsement.
    let (chip, tcb_bind) = match (&report, &endorsement, product) {
        (Some(r), Ok(e), Some(p)) => (check_chip_id(r, e, p), outcome(check_reported_tcb(r, e, p))),
        _ => (not_run("report, endorsement or product unknown"), not_run("report, endorsement or product unknown")),
    };
    t.record(CheckId::ChipId, chip);
    t.record(CheckId::ReportedTcb, tcb_bind);

    // 6..8: what the report says, against the policy.
    match &report {
        None => {
            for id in [
                CheckId::Debug,
                CheckId::MigrationAgent,
                CheckId::Smt,
                CheckId::Vmpl,
                CheckId::TcbMinimum,
                CheckId::Measurement,
                CheckId::HostData,
                CheckId::IdKeyDigest,
            ] {
                t.record(id, not_run("report unreadable"));
            }
        }
        Some(r) => record_policy_checks(&mut t, r, product, policy),
    }

    // 9..10: binding and freshness.
    match &report {
        None => {
            t.record(CheckId::ReportDataBinding, not_run("report unreadable"));
            t.record(CheckId::Freshness, not_run("report unreadable"));
        }
        Some(r) => {
            t.record(CheckId::ReportDataBinding, check_binding(r, bundle.claims.as_ref(), expected, policy));
            t.record(CheckId::Freshness, check_freshness(bundle.claims.as_ref(), expected));
        }
    }

    // Under a simulated root, every value after the report's format was
    // chosen by software keys: each row says so.
    if simulated {
        t.mark_simulated(&[CheckId::ReportFormat]);
    }
    let signer = endorsement.as_ref().ok().map(Endorsement::kind);
    let root = chain.as_ref().ok().map(|c| c.root);
    Appraisal { checks: t, report, product, signer, root }
}
