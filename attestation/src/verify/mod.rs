//! The verifier: an ordered list of named checks over an evidence bundle.
//!
//! [`appraise`] runs every check it can and returns the full [`CheckReport`];
//! [`verify`] turns that into either a [`VerifiedEvidence`] (which only this
//! module can construct) or an [`Error::Rejected`] naming the first failed
//! check with the expected and actual values. Both are pure: the caller
//! passes the time, the policy and what it expects; nothing here reads a
//! clock, a file or a socket.

use std::time::SystemTime;

pub use crate::check::{CheckId, CheckReport, CheckResult, Outcome};

use crate::claims::{
    Claims, GpuEvidenceHash, KeyHash, LayerRange, LinksCommitment, ManifestRoot, Nonce, PolicyDigest, ReportData,
    RouteDigest,
};
use crate::error::{Error, Rejection};
use crate::evidence::EvidenceBundle;
use crate::policy::{AbiVersion, GuestPolicyFlag, PlatformPolicy, Policy};
use crate::simulated;
use crate::snp::report::KNOWN_VERSIONS;
use crate::snp::{Endorsement, Product, SigningKey, SnpReport, Tcb};
use crate::x509::{fmt_time, ParsedCert, ParsedCrl};

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
    gpus: Option<crate::gpu::VerifiedGpus>,
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
    pub fn gpus(&self) -> Option<&crate::gpu::VerifiedGpus> {
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
) -> Result<(crate::VerifiedEvidence, crate::gpu::VerifiedGpus), Error> {
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
                let expect = crate::gpu::GpuExpectations { rims, claims, nonce: None, ocsp: &[] };
                Some(crate::gpu::verify_gpus(&bundle.gpus, &expect, policy, now)?)
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
            Some(r) => outcome(check_product(r, endorsement.as_ref(), policy)),
        },
    );

    // 3. Endorsement chain.
    let chain = match (&report, &endorsement) {
        (Some(r), Ok(e)) => check_chain(r, e, product, bundle, policy, now),
        (_, Err(e)) => Err(fail("a parsable VCEK/VLEK certificate", e.clone())),
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

fn check_format(report: Result<&SnpReport, String>, policy: &Policy) -> Result<String, Fail> {
    let r = report.map_err(|e| fail(format!("exactly {} bytes", crate::snp::REPORT_LEN), e))?;
    let v = r.version();
    if !KNOWN_VERSIONS.contains(&v) {
        return Err(fail(
            format!("a known report version ({}..={})", KNOWN_VERSIONS.start(), KNOWN_VERSIONS.end()),
            format!("version {v}"),
        ));
    }
    if v < policy.min_report_version || v > policy.max_report_version {
        return Err(fail(
            format!("report version {}..={} (policy)", policy.min_report_version, policy.max_report_version),
            format!("version {v}"),
        ));
    }
    if r.signature_algo() != crate::snp::report::SIG_ALGO_ECDSA_P384_SHA384 {
        return Err(fail(
            "signature algorithm 1 (ECDSA P-384 with SHA-384)",
            format!("algorithm {}", r.signature_algo()),
        ));
    }
    if !r.policy().reserved_bit_set() {
        return Err(fail("guest policy bit 17 set (reserved, must be one)", format!("policy {:#x}", r.policy().0)));
    }
    if r.policy().0 >> 26 != 0 {
        return Err(fail("guest policy bits 26..63 zero (reserved)", format!("policy {:#x}", r.policy().0)));
    }
    if r.key_info().0 >> 5 != 0 {
        return Err(fail("KEY_INFO bits 5..31 zero (reserved)", format!("KEY_INFO {:#x}", r.key_info().0)));
    }
    if let Some((start, end)) = r.nonzero_reserved() {
        return Err(fail("reserved bytes zero", format!("non-zero bytes in [{start:#x}, {end:#x})")));
    }
    Ok(format!("{} bytes, version {v}, ECDSA P-384/SHA-384", crate::snp::REPORT_LEN))
}

fn check_product(r: &SnpReport, endorsement: Result<&Endorsement, &String>, policy: &Policy) -> Result<String, Fail> {
    let e = endorsement.map_err(|e| fail("an endorsement naming the product", e.clone()))?;
    let from_cert =
        e.product().ok_or_else(|| fail("productName Milan*, Genoa* or Turin*", e.product_name().to_owned()))?;
    let detail = match r.cpuid() {
        Some(cpuid) => {
            let from_cpuid = Product::from_cpuid(cpuid).ok_or_else(|| {
                fail(
                    "a CPUID family/model of Milan, Genoa or Turin",
                    format!("family {:#x} model {:#x}", cpuid.family, cpuid.model),
                )
            })?;
            if from_cpuid != from_cert {
                return Err(fail(
                    format!("{from_cert} (endorsement productName {})", e.product_name()),
                    format!("{from_cpuid} (report CPUID)"),
                ));
            }
            format!("{from_cert} (CPUID and endorsement agree)")
        }
        None => format!("{from_cert} (from endorsement; report v{} has no CPUID fields)", r.version()),
    };
    if !policy.products.contains(&from_cert) {
        let allowed: Vec<_> = policy.products.iter().map(|p| p.name()).collect();
        return Err(fail(format!("one of [{}] (policy)", allowed.join(", ")), from_cert.to_string()));
    }
    Ok(detail)
}

struct Chain {
    root: RootKind,
    ark: ParsedCert,
    intermediate: ParsedCert,
    leaf_name: String,
    leaf_serial: Vec<u8>,
}

fn check_chain(
    r: &SnpReport,
    e: &Endorsement,
    product: Option<Product>,
    bundle: &EvidenceBundle,
    policy: &Policy,
    now: SystemTime,
) -> Result<Chain, Fail> {
    let in_report = r.key_info().signing_key();
    if in_report != e.kind() {
        return Err(fail(
            format!("KEY_INFO signing key {} (the certificate supplied)", e.kind()),
            format!("report says {in_report}"),
        ));
    }
    if e.kind() == SigningKey::Vlek && !policy.allow_vlek {
        return Err(fail(
            "a VCEK-signed report (policy: allow_vlek = false)",
            format!("VLEK-signed (cloud provider {})", e.csp_id().unwrap_or("unnamed")),
        ));
    }
    let product = product.ok_or_else(|| fail("an endorsement for a known product", e.product_name().to_owned()))?;
    let supplied = bundle
        .chain
        .iter()
        .map(|der| ParsedCert::from_der(der))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| fail("parsable chain certificates", err.to_string()))?;

    // The root: pinned AMD ARK for the product, or a simulated root when the
    // policy explicitly allows it. Anything else is an untrusted root.
    let amd_ark = product.amd_ark();
    let supplied_root = supplied.iter().find(|c| c.issued_by_name(c));
    let (ark, root) = match supplied_root {
        None => (amd_ark.clone(), RootKind::Amd),
        Some(c) if c.spki_der() == amd_ark.spki_der() => (amd_ark.clone(), RootKind::Amd),
        Some(c) if simulated::is_simulated_cert(c) => {
            let fingerprint = KeyHash(c.spki_sha256());
            if !policy.allow_simulated {
                return Err(fail(
                    format!("AMD ARK-{product} (simulated evidence refused: policy allow_simulated = false)"),
                    format!("Veil SIMULATED root {fingerprint}"),
                ));
            }
            if !policy.simulated_roots.is_empty() && !policy.simulated_roots.contains(&fingerprint) {
                return Err(fail(
                    "a simulated root pinned in policy simulated_roots",
                    format!("simulated root {fingerprint}"),
                ));
            }
            (c.clone(), RootKind::Simulated(fingerprint))
        }
        Some(c) => {
            return Err(fail(
                format!("AMD ARK-{product} (key {})", KeyHash(amd_ark.spki_sha256())),
                format!("untrusted root \"{}\" (key {})", c.subject_string(), KeyHash(c.spki_sha256())),
            ))
        }
    };
    // The pinned AMD ARK's self-signature and its ASK were verified once when
    // the builtin roots were loaded; only supplied certificates are checked here.
    if matches!(root, RootKind::Simulated(_)) {
        ark.verify_signed_by(&ark).map_err(|err| fail("a self-signed ARK", err.to_string()))?;
    }

    let intermediate_cn = match e.kind() {
        SigningKey::Vlek => format!("SEV-VLEK-{product}"),
        _ => format!("SEV-{product}"),
    };
    let mut candidates: Vec<&ParsedCert> = supplied.iter().filter(|c| !c.issued_by_name(c)).collect();
    if root == RootKind::Amd {
        candidates.push(product.amd_ask());
    }
    let intermediate = candidates
        .into_iter()
        .find(|c| e.cert().issued_by_name(c) && c.common_name().as_deref() == Some(intermediate_cn.as_str()))
        .ok_or_else(|| {
            fail(
                format!("an intermediate {intermediate_cn} that issued the {}", e.kind()),
                format!("issuer \"{}\" not supplied", e.cert().issuer_common_name().unwrap_or_default()),
            )
        })?
        .clone();
    if !intermediate.issued_by_name(&ark) {
        return Err(fail(format!("{intermediate_cn} issued by the ARK"), "issuer name differs"));
    }
    let pinned_ask = root == RootKind::Amd && intermediate.der() == product.amd_ask().der();
    if !pinned_ask {
        intermediate
            .verify_signed_by(&ark)
            .map_err(|err| fail(format!("{intermediate_cn} signed by ARK-{product}"), err.to_string()))?;
    }
    let leaf_name = format!("{}", e.kind());
    e.cert()
        .verify_signed_by(&intermediate)
        .map_err(|err| fail(format!("{leaf_name} signed by {intermediate_cn}"), err.to_string()))?;
    for (name, cert) in [(leaf_name.as_str(), e.cert()), (intermediate_cn.as_str(), &intermediate), ("ARK", &ark)] {
        cert.check_validity(now).map_err(|why| fail(format!("{name} certificate valid at {}", fmt_time(now)), why))?;
    }
    Ok(Chain { root, ark, intermediate, leaf_name, leaf_serial: e.cert().serial().to_vec() })
}

fn check_crl(der: &[u8], chain: &Chain, now: SystemTime) -> Result<String, Fail> {
    let crl = ParsedCrl::from_der(der).map_err(|e| fail("a parsable CRL", e.to_string()))?;
    if !crl.issued_by_name(&chain.ark) {
        return Err(fail("a CRL issued by the ARK", "CRL issuer differs"));
    }
    crl.verify_signed_by(&chain.ark).map_err(|e| fail("a CRL signed by the ARK", e.to_string()))?;
    let (this_update, next_update) = crl.window();
    if now < this_update {
        return Err(fail(
            format!("a CRL issued before {}", fmt_time(now)),
            format!("thisUpdate {}", fmt_time(this_update)),
        ));
    }
    match next_update {
        None => return Err(fail("a CRL with nextUpdate", "no nextUpdate")),
        Some(next) if now > next => {
            return Err(fail(
                format!("a current CRL at {}", fmt_time(now)),
                format!("stale: nextUpdate {}", fmt_time(next)),
            ))
        }
        Some(_) => {}
    }
    let intermediate_name = chain.intermediate.common_name().unwrap_or_default();
    if crl.revokes(chain.intermediate.serial()) {
        return Err(fail(
            format!("{intermediate_name} not revoked"),
            format!("{intermediate_name} serial {} is revoked", hex::encode(chain.intermediate.serial())),
        ));
    }
    if crl.revokes(&chain.leaf_serial) {
        return Err(fail(
            format!("{} not revoked", chain.leaf_name),
            format!("serial {} is revoked", hex::encode(&chain.leaf_serial)),
        ));
    }
    Ok(format!(
        "CRL signed by the ARK, current until {}, chain not listed",
        next_update.map(fmt_time).unwrap_or_default()
    ))
}

/// Verifies the report signature with the endorsement's key over the raw
/// bytes `[0, 0x2A0)`. R and S are 72-byte little-endian fields whose upper
/// 24 bytes must be zero (ABI Table 119).
pub fn check_signature(r: &SnpReport, e: &Endorsement) -> Result<String, Fail> {
    let (r_le, s_le) = (r.signature_r(), r.signature_s());
    if r_le[48..].iter().chain(&s_le[48..]).any(|b| *b != 0) {
        return Err(fail("signature R and S with zero upper 24 bytes", "non-zero padding"));
    }
    // Little-endian R and S become the big-endian R ‖ S the verifier takes.
    let mut fixed = [0u8; 96];
    for i in 0..48 {
        fixed[i] = r_le[47 - i];
        fixed[48 + i] = s_le[47 - i];
    }
    e.cert().verify_p384_fixed(r.signed_bytes(), &fixed).map_err(|err| match err {
        crate::x509::CertError::BadSignature => {
            fail(format!("a valid {} signature over bytes [0, 0x2A0)", e.kind()), "signature does not verify")
        }
        other => fail("an ECDSA P-384 endorsement key", other.to_string()),
    })?;
    Ok(format!("ECDSA P-384 signature by the {} verifies over bytes [0, 0x2A0)", e.kind()))
}

fn check_chip_id(r: &SnpReport, e: &Endorsement, product: Product) -> Outcome {
    if e.kind() == SigningKey::Vlek {
        return skipped("VLEK: the key is bound to the cloud provider, not to a chip (no hwID)");
    }
    let Some(hw_id) = e.hw_id() else {
        return Outcome::Failed { expected: "a VCEK with hwID".into(), actual: "no hwID extension".into() };
    };
    let chip = r.chip_id();
    if r.chip_id_masked() {
        return Outcome::Failed {
            expected: format!("CHIP_ID {}", hex::encode(hw_id)),
            actual: "CHIP_ID masked (all zero)".into(),
        };
    }
    let significant = if product == Product::Turin { 8 } else { 64 };
    let matches =
        hw_id.len() == significant && chip[..significant] == *hw_id && chip[significant..].iter().all(|b| *b == 0);
    if matches {
        Outcome::Passed { detail: format!("CHIP_ID equals the VCEK hwID ({significant} bytes)") }
    } else {
        Outcome::Failed {
            expected: format!("CHIP_ID {} (VCEK hwID)", hex::encode(hw_id)),
            actual: hex::encode(&chip[..]),
        }
    }
}

fn check_reported_tcb(r: &SnpReport, e: &Endorsement, product: Product) -> Result<String, Fail> {
    let reported = r.reported_tcb().decode(product);
    let certified = e.tcb();
    let same = reported.bootloader == certified.bootloader
        && reported.tee == certified.tee
        && reported.snp == certified.snp
        && reported.microcode == certified.microcode
        && (product != Product::Turin || reported.fmc == certified.fmc);
    if same {
        Ok(format!("REPORTED_TCB {reported} equals the {} TCB", e.kind()))
    } else {
        Err(fail(format!("{certified} ({} extensions)", e.kind()), format!("{reported} (REPORTED_TCB)")))
    }
}

/// The guest policy against `[platform]` (its reserved bits are a
/// `report_format` matter): every required hardening bit set, CXL refused unless allowed, the ABI minimum the guest
/// required at least the policy's and no higher than the running firmware.
fn check_guest_policy(r: &SnpReport, p: &PlatformPolicy) -> Result<String, Fail> {
    let gp = r.policy();
    let missing: Vec<&str> =
        p.require_guest_policy.iter().filter(|f| gp.0 & f.mask() == 0).map(|f| f.abi_name()).collect();
    if !missing.is_empty() {
        return Err(fail(format!("guest policy with {} set", missing.join(", ")), format!("{:#x}", gp.0)));
    }
    if gp.cxl_allowed() && !p.allow_cxl {
        return Err(fail("CXL_ALLOW = 0 (policy: platform.allow_cxl = false)", "CXL_ALLOW = 1"));
    }
    let abi = AbiVersion { major: gp.abi_major(), minor: gp.abi_minor() };
    if let Some(min) = p.min_guest_abi {
        if abi < min {
            return Err(fail(format!("guest ABI minimum >= {min}"), format!("ABI minimum {abi}")));
        }
    }
    if r.version() >= 3 {
        let fw = r.current_version();
        if (fw.major, fw.minor) < (abi.major, abi.minor) {
            return Err(fail(
                format!("running firmware at least the guest's ABI minimum {abi}"),
                format!("firmware {fw}: the report contradicts its own launch policy"),
            ));
        }
    }
    let set: Vec<&str> = GuestPolicyFlag::ALL.iter().filter(|f| gp.0 & f.mask() != 0).map(|f| f.abi_name()).collect();
    Ok(format!(
        "guest policy {:#x}: ABI minimum {abi}, hardening {}",
        gp.0,
        if set.is_empty() { "none".to_owned() } else { set.join(", ") }
    ))
}

/// `PLATFORM_INFO` against `[platform]`: every required bit set; every bit
/// shown by its ABI name. A bit the ABI this verifier knows does not define
/// is a platform state it cannot judge: a warning by default (firmware adds
/// bits, as Turin's did with `IOMMU_WRITE_SAFE`, and real hardware must not
/// fail for it), a failure when the policy sets
/// `refuse_unknown_platform_bits`.
fn check_platform_info(r: &SnpReport, p: &PlatformPolicy) -> Outcome {
    let pi = r.platform_info();
    let info = pi.0;
    let missing: Vec<&str> = p.require_platform.iter().filter(|f| info & f.mask() == 0).map(|f| f.abi_name()).collect();
    if !missing.is_empty() {
        return Outcome::Failed {
            expected: format!("PLATFORM_INFO with {} set", missing.join(", ")),
            actual: format!("{info:#x} ({})", named_platform_bits(pi)),
        };
    }
    let unknown = pi.unknown_bits();
    if unknown != 0 && p.refuse_unknown_platform_bits {
        return Outcome::Failed {
            expected: format!(
                "no PLATFORM_INFO bits outside {:#x} (policy: refuse_unknown_platform_bits)",
                crate::snp::PlatformInfo::KNOWN
            ),
            actual: format!("{info:#x}: unknown bits {unknown:#x}"),
        };
    }
    let detail = format!("PLATFORM_INFO {info:#x} ({})", named_platform_bits(pi));
    if unknown != 0 {
        return Outcome::Warned {
            detail,
            warning: format!(
                "unknown bits {unknown:#x}: firmware newer than this verifier; set \
                 platform.refuse_unknown_platform_bits to refuse them"
            ),
        };
    }
    Outcome::Passed { detail }
}

/// The set bits by name, then any unknown ones.
fn named_platform_bits(pi: crate::snp::PlatformInfo) -> String {
    let mut names: Vec<String> = pi.set_names().into_iter().map(str::to_owned).collect();
    if pi.unknown_bits() != 0 {
        names.push(format!("unknown {:#x}", pi.unknown_bits()));
    }
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// The required mitigation bits must be a subset of both the launch and the
/// current mitigation vector: bit sets, never compared as numbers.
fn check_mitigations(r: &SnpReport, p: &PlatformPolicy) -> Outcome {
    let need = p.mitigation_mask();
    if need == 0 {
        return skipped("policy requires no mitigation-vector bits");
    }
    let (Some(launch), Some(current)) = (r.launch_mit_vector(), r.current_mit_vector()) else {
        return Outcome::Failed {
            expected: format!("mitigation vectors with bits {need:#x} (report version 5 or later)"),
            actual: format!("report version {} has no mitigation vectors", r.version()),
        };
    };
    for (name, v) in [("LAUNCH_MIT_VECTOR", launch), ("CURRENT_MIT_VECTOR", current)] {
        if v & need != need {
            return Outcome::Failed {
                expected: format!("{name} ⊇ {need:#x}"),
                actual: format!("{v:#x} (missing {:#x})", need & !v),
            };
        }
    }
    Outcome::Passed { detail: format!("bits {need:#x} set at launch ({launch:#x}) and now ({current:#x})") }
}

fn record_policy_checks(t: &mut CheckReport, r: &SnpReport, product: Option<Product>, policy: &Policy) {
    let gp = r.policy();
    t.record(
        CheckId::Debug,
        if policy.allow_debug {
            skipped(format!("policy allows debug (DEBUG bit is {})", u8::from(gp.debug_allowed())))
        } else if gp.debug_allowed() {
            Outcome::Failed {
                expected: "DEBUG = 0".into(),
                actual: "DEBUG = 1: the host can read and write guest memory".into(),
            }
        } else {
            Outcome::Passed { detail: "DEBUG = 0".into() }
        },
    );
    t.record(
        CheckId::MigrationAgent,
        if policy.allow_migration_agent {
            skipped(format!("policy allows a migration agent (MIGRATE_MA is {})", u8::from(gp.migrate_ma_allowed())))
        } else if gp.migrate_ma_allowed() {
            Outcome::Failed { expected: "MIGRATE_MA = 0".into(), actual: "MIGRATE_MA = 1".into() }
        } else {
            Outcome::Passed { detail: "MIGRATE_MA = 0".into() }
        },
    );
    t.record(CheckId::GuestPolicy, outcome(check_guest_policy(r, &policy.platform)));
    let smt_on = r.platform_info().smt_enabled();
    t.record(
        CheckId::Smt,
        if policy.allow_smt {
            skipped(format!("policy allows SMT (platform SMT {})", if smt_on { "enabled" } else { "disabled" }))
        } else if smt_on {
            Outcome::Failed {
                expected: "SMT disabled on the platform (policy: allow_smt = false)".into(),
                actual: "SMT enabled".into(),
            }
        } else {
            Outcome::Passed { detail: "SMT disabled on the platform".into() }
        },
    );
    t.record(CheckId::PlatformInfo, check_platform_info(r, &policy.platform));
    t.record(
        CheckId::Vmpl,
        if r.vmpl() == policy.vmpl {
            Outcome::Passed { detail: format!("VMPL {}", r.vmpl()) }
        } else {
            Outcome::Failed { expected: format!("VMPL {} (policy)", policy.vmpl), actual: format!("VMPL {}", r.vmpl()) }
        },
    );
    t.record(
        CheckId::TcbMinimum,
        match product {
            None => not_run("product unknown"),
            Some(p) => match policy.min_tcb.get(&p) {
                None => skipped(format!("policy sets no TCB minimum for {p}")),
                Some(min) => outcome(check_tcb_minimum(r.reported_tcb().decode(p), min)),
            },
        },
    );
    t.record(CheckId::MitigationVector, check_mitigations(r, &policy.platform));
    let m = crate::claims::Measurement(r.measurement());
    t.record(
        CheckId::Measurement,
        if policy.any_measurement {
            skipped(format!("policy allows ANY launch measurement (this one is {m})"))
        } else if policy.measurements.is_empty() {
            Outcome::Failed {
                expected: "a launch measurement on the policy allowlist".into(),
                actual: format!("{m}, and the allowlist is empty (pin a measurement or waive with any_measurement)"),
            }
        } else if policy.measurements.contains(&m) {
            Outcome::Passed { detail: format!("{m} is allowlisted") }
        } else {
            Outcome::Failed {
                expected: format!("one of {} allowlisted measurements", policy.measurements.len()),
                actual: m.to_string(),
            }
        },
    );
    t.record(
        CheckId::HostData,
        match &policy.host_data {
            None => skipped("HOST_DATA not pinned by policy"),
            Some(pin) if pin.0 .0 == r.host_data() => {
                Outcome::Passed { detail: format!("HOST_DATA {}", hex::encode(r.host_data())) }
            }
            Some(pin) => Outcome::Failed { expected: pin.0.to_string(), actual: hex::encode(r.host_data()) },
        },
    );
    t.record(
        CheckId::IdKeyDigest,
        match &policy.id_key_digest {
            None => skipped("ID key digest not pinned by policy"),
            Some(pin) if pin.0 == r.id_key_digest() => Outcome::Passed { detail: format!("ID_KEY_DIGEST {pin}") },
            Some(pin) => Outcome::Failed { expected: pin.to_string(), actual: hex::encode(r.id_key_digest()) },
        },
    );
}

fn check_tcb_minimum(reported: Tcb, min: &crate::policy::TcbMinimum) -> Result<String, Fail> {
    let mut low = Vec::new();
    let mut want = Vec::new();
    let mut cmp = |name: &str, actual: Option<u8>, minimum: Option<u8>| {
        if let Some(m) = minimum {
            let a = actual.unwrap_or(0);
            if a < m {
                want.push(format!("{name} >= {m}"));
                low.push(format!("{name} = {a}"));
            }
        }
    };
    cmp("fmc", reported.fmc, min.fmc);
    cmp("bootloader", Some(reported.bootloader), min.bootloader);
    cmp("tee", Some(reported.tee), min.tee);
    cmp("snp", Some(reported.snp), min.snp);
    cmp("microcode", Some(reported.microcode), min.microcode);
    if low.is_empty() {
        Ok(format!("REPORTED_TCB {reported} meets the policy minimums"))
    } else {
        Err(fail(want.join(", "), low.join(", ")))
    }
}

fn check_binding(r: &SnpReport, claims: Option<&Claims>, expected: &ExpectedClaims, policy: &Policy) -> Outcome {
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
        Err(e) => return Outcome::Failed { expected: "encodable claims".into(), actual: e },
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
    if !policy.manifest_roots.is_empty() {
        let Some(range) = claims.layer_range else {
            return Outcome::Failed {
                expected: "a layer range (the policy pins manifests per range)".into(),
                actual: "no layer range claimed".into(),
            };
        };
        let allowed = policy.manifest_roots.get(&range.to_string());
        let root = claims.manifest_root;
        if !allowed.is_some_and(|roots| root.is_some_and(|r| roots.contains(&r))) {
            return Outcome::Failed {
                expected: match allowed {
                    Some(roots) => {
                        format!("a manifest root the policy allows for layers {range} ({} listed)", roots.len())
                    }
                    None => format!("layers {range} listed in the policy's manifest_roots"),
                },
                actual: format!("manifest root {}", root.map(|r| r.to_string()).unwrap_or_else(|| "absent".into())),
            };
        }
    }
    Outcome::Passed { detail: "REPORT_DATA = SHA-512(canonical claims); pinned claims match".into() }
}

fn check_freshness(claims: Option<&Claims>, expected: &ExpectedClaims) -> Outcome {
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
