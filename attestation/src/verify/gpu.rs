//! GPU verification: an ordered list of named checks per GPU, a table per
//! GPU, and a proof value only the verifier can make. Pure: the caller
//! passes the time, the policy, the reference values and the claims.

use std::collections::BTreeSet;
use std::time::SystemTime;

use crate::attester::gpu::simulated;
use crate::check::{CheckId, CheckReport, GpuCheckId, Outcome};
use crate::claims::Claims;
use crate::error::{Error, GpuFailure, Rejection};
use crate::gpu::chain::{self, leaf_fwid, verify_chain};
use crate::gpu::evidence::{gpu_evidence_digest, GpuEvidence};
use crate::gpu::rim::Rim;
use crate::gpu::spdm::{SpdmMeasurements, STATUS_OFF, STATUS_ON};
use crate::gpu::{GpuAppraisal, GpuCheckReport, GpuError, Version};
use crate::policy::Policy;
use crate::x509::{fmt_time, ParsedCert};

impl GpuCheckReport {
    fn record(&mut self, check: GpuCheckId, result: Row) {
        match result {
            Row::Pass(detail) => self.table.record(check, Outcome::Passed { detail }),
            Row::Fail(failed) => {
                let (error, expected, actual) = *failed;
                self.table.record_failure(check, error, expected, actual)
            }
            Row::Skip(reason) => self.table.record(check, Outcome::Skipped { reason }),
            Row::NotRun(reason) => self.table.record(check, Outcome::NotRun { reason }),
        }
    }
}

/// What the relying party supplies besides the evidence.
#[derive(Clone, Copy, Debug, Default)]
pub struct GpuExpectations<'a> {
    /// Golden measurements (driver and VBIOS RIMs), shared by all GPUs.
    pub rims: &'a [Rim],
    /// The shard's claims (from its SNP bundle): the nonce is derived from
    /// them and they must commit to the GPU evidence digest.
    pub claims: Option<&'a Claims>,
    /// An explicit expected SPDM nonce for every GPU (bare evidence, `--gpu-nonce`).
    pub nonce: Option<[u8; 32]>,
    /// OCSP responses (DER) covering the device chains, fetched by the relying party.
    pub ocsp: &'a [Vec<u8>],
}

/// GPU evidence that passed every check. Only [`verify_gpus`] makes one.
#[derive(Clone, Debug)]
pub struct VerifiedGpus {
    reports: Vec<SpdmMeasurements>,
    simulated: bool,
    appraisal: GpuAppraisal,
    _private: (),
}

impl VerifiedGpus {
    /// The verified transcripts, in GPU index order.
    pub fn reports(&self) -> &[SpdmMeasurements] {
        &self.reports
    }
    /// Whether any GPU was simulated.
    pub fn is_simulated(&self) -> bool {
        self.simulated
    }
    /// The tables.
    pub fn appraisal(&self) -> &GpuAppraisal {
        &self.appraisal
    }
}

enum Row {
    Pass(String),
    Fail(Box<(GpuError, String, String)>),
    Skip(String),
    NotRun(String),
}

fn fail(error: GpuError, expected: impl Into<String>, actual: impl Into<String>) -> Row {
    Row::Fail(Box::new((error, expected.into(), actual.into())))
}

/// Verifies a shard's GPU evidence; `Ok` only when every check passed.
pub fn verify_gpus(
    gpus: &[GpuEvidence],
    expect: &GpuExpectations<'_>,
    policy: &Policy,
    now: SystemTime,
) -> Result<VerifiedGpus, Error> {
    let appraisal = appraise_gpus(gpus, expect, policy, now);
    if let Some((expected, actual)) = &appraisal.topology {
        let error = appraisal.topology_error.clone().unwrap_or(GpuError::NotCcMode);
        return Err(Error::Rejected(Box::new(Rejection {
            check: CheckId::GpuSet,
            expected: expected.clone(),
            actual: actual.clone(),
            report: CheckReport::default(),
            gpu: Some(GpuFailure { index: None, error, appraisal: appraisal.clone() }),
            tdx: None,
            azure: None,
        })));
    }
    for g in &appraisal.gpus {
        if let Some(r) = g.first_failed() {
            let (expected, actual) = match &r.outcome {
                Outcome::Failed { expected, actual } => (expected.clone(), actual.clone()),
                _ => (String::new(), String::new()),
            };
            let error = r.error.clone().unwrap_or(GpuError::NotCcMode);
            return Err(Error::Rejected(Box::new(Rejection {
                check: CheckId::Gpu(r.check),
                expected,
                actual,
                report: CheckReport::default(),
                gpu: Some(GpuFailure { index: Some(g.gpu_index), error, appraisal: appraisal.clone() }),
                tdx: None,
                azure: None,
            })));
        }
    }
    let mut reports = Vec::with_capacity(gpus.len());
    for g in gpus {
        // Invariant: every report parsed (gpu_evidence_format passed); refuse rather than assume.
        reports.push(SpdmMeasurements::parse(&g.report).map_err(|e| Error::ApiMisuse(e.to_string()))?);
    }
    let simulated = appraisal.gpus.iter().any(|g| !g.warnings.is_empty());
    if simulated {
        tracing::warn!("accepting SIMULATED GPU evidence (policy allow_simulated = true): no hardware guarantee");
    }
    Ok(VerifiedGpus { reports, simulated, appraisal, _private: () })
}

/// Runs every check on every GPU and returns the tables (no early exit).
pub fn appraise_gpus(
    gpus: &[GpuEvidence],
    expect: &GpuExpectations<'_>,
    policy: &Policy,
    now: SystemTime,
) -> GpuAppraisal {
    let mut out = GpuAppraisal::default();
    if gpus.is_empty() && policy.gpu.required {
        out.topology = Some(("GPU evidence (policy: gpu.required = true)".into(), "none".into()));
        out.topology_error = Some(GpuError::NotCcMode);
        return out;
    }
    if gpus.is_empty() {
        if let Some(h) = expect.claims.and_then(|c| c.gpu_evidence_hash) {
            // The CPU report commits to GPU evidence that was not presented
            // (stripped on the way): refuse rather than pass as CPU-only.
            out.topology = Some((format!("the GPU evidence the claims commit to ({h})"), "none".into()));
            out.topology_error = Some(GpuError::GpuNotBoundToSession);
            return out;
        }
    }
    if let Some(n) = policy.gpu.count {
        if usize::try_from(n).ok() != Some(gpus.len()) {
            out.topology = Some((format!("{n} GPUs (policy: gpu.count)"), format!("{} GPUs", gpus.len())));
            out.topology_error =
                Some(GpuError::TopologyMismatch { expected: format!("{n} GPUs"), got: format!("{}", gpus.len()) });
        }
    }
    let digest = gpu_evidence_digest(gpus);
    let mut leaves = BTreeSet::new();
    for (i, g) in gpus.iter().enumerate() {
        let index = u32::try_from(i).unwrap_or(u32::MAX);
        if let Some(leaf) = g.cert_chain.first() {
            if !leaves.insert(leaf.clone()) && out.topology.is_none() {
                out.topology = Some(("each GPU once".into(), format!("GPU {index} repeats an earlier device")));
                out.topology_error = Some(GpuError::TopologyMismatch {
                    expected: "distinct GPUs".into(),
                    got: format!("GPU {index} presented twice"),
                });
            }
        }
        out.gpus.push(appraise_one(index, g, digest, expect, policy, now));
    }
    out
}

fn root_for(policy: &Policy) -> Result<ParsedCert, String> {
    match &policy.gpu.root_pem {
        Some(pem) => ParsedCert::from_pem(pem.as_bytes()).map_err(|e| format!("policy gpu.root_pem: {e}")),
        None => chain::nvidia_device_root().map_err(|e| format!("compiled-in NVIDIA root: {e}")),
    }
}

/// What the checks of one GPU read: its evidence, its parsed report and
/// chain, and what the relying party supplied.
struct GpuInput<'a> {
    index: u32,
    g: &'a GpuEvidence,
    digest: crate::claims::GpuEvidenceHash,
    expect: &'a GpuExpectations<'a>,
    policy: &'a Policy,
    now: SystemTime,
    parsed: Option<SpdmMeasurements>,
    certs: Result<Vec<ParsedCert>, chain::ChainError>,
}

impl GpuInput<'_> {
    fn leaf(&self) -> Option<&ParsedCert> {
        self.certs.as_ref().ok().and_then(|c| c.first())
    }
}

/// Runs every check on one GPU, in order (one function per check below).
fn appraise_one(
    index: u32,
    g: &GpuEvidence,
    digest: crate::claims::GpuEvidenceHash,
    expect: &GpuExpectations<'_>,
    policy: &Policy,
    now: SystemTime,
) -> GpuCheckReport {
    use GpuCheckId as C;
    let mut t = GpuCheckReport { gpu_index: index, ..Default::default() };
    let (format, parsed) = check_format(g);
    t.record(C::EvidenceFormat, format);
    let x = GpuInput { index, g, digest, expect, policy, now, parsed, certs: chain::parse_chain_der(&g.cert_chain) };
    let mut simulated_chain = false;
    let chain_ok = match check_device_chain(&x) {
        Ok((detail, simulated)) => {
            simulated_chain = simulated;
            if simulated {
                t.warnings.push(
                    "SIMULATED GPU evidence: signed by Veil's software device chain, not by an NVIDIA GPU. \
                     Accepted only because the policy sets allow_simulated = true. It proves nothing."
                        .into(),
                );
            }
            t.record(C::DeviceChain, Row::Pass(detail));
            true
        }
        Err(row) => {
            t.record(C::DeviceChain, row);
            false
        }
    };
    t.record(C::Revocation, check_revocation(&x, chain_ok));
    t.record(C::ReportSignature, check_signature(&x));
    t.record(C::Fwid, check_fwid(&x));
    t.record(C::Nonce, check_nonce(&x));
    t.record(C::EvidenceBinding, check_binding(&x));
    t.record(C::CcMode, check_cc_mode(&x));
    t.record(C::DevTools, check_devtools(&x));
    t.record(C::ProtectedPcie, check_protected_pcie(&x));
    let driver = x.parsed.as_ref().and_then(|m| m.opaque.driver_version());
    let vbios = x.parsed.as_ref().and_then(|m| m.opaque.vbios_version());
    t.record(C::DriverVersion, version_row(driver.as_deref(), policy.gpu.min_driver_version.as_deref(), true));
    t.record(C::VbiosVersion, version_row(vbios.as_deref(), policy.gpu.min_vbios_version.as_deref(), false));
    t.record(C::RimMeasurements, check_rim_measurements(&x, driver.as_deref(), vbios.as_deref()));
    t.record(C::RimSignature, rim_signature_row(expect.rims, policy, now));
    if simulated_chain {
        // Under a simulated device chain every value the rows judged was
        // chosen by that software root: flag them, as the SNP table does.
        // The format check and the RIMs' own signature judge other inputs.
        t.table.mark_simulated(&[C::EvidenceFormat, C::RimSignature]);
    }
    t
}

/// 1. Format (Hopper only: the layout, signature size and opaque fields are Hopper's).
fn check_format(g: &GpuEvidence) -> (Row, Option<SpdmMeasurements>) {
    let parsed = if g.arch.eq_ignore_ascii_case("HOPPER") {
        SpdmMeasurements::parse(&g.report).map_err(GpuError::Malformed)
    } else {
        Err(GpuError::UnsupportedArchitecture(g.arch.chars().take(32).collect()))
    };
    let row = match &parsed {
        Ok(m) => Row::Pass(format!(
            "SPDM 1.1 GET_MEASUREMENTS: {} blocks, {} opaque fields, {} bytes{}",
            m.blocks.len(),
            m.opaque.fields.len(),
            g.report.len(),
            match m.trailing_bytes {
                0 => String::new(),
                n => format!(" ({n} unsigned trailing byte(s) after the signature, ignored)"),
            }
        )),
        Err(e) => fail(e.clone(), "a Hopper SPDM 1.1 GET_MEASUREMENTS transcript", e.to_string()),
    };
    (row, parsed.ok())
}

/// 2. Device chain: to the pinned root, or (only under allow_simulated) a simulated one; `Ok((detail, simulated))`.
fn check_device_chain(x: &GpuInput<'_>) -> Result<(String, bool), Row> {
    let now = x.now;
    let policy = x.policy;
    match (&x.certs, root_for(x.policy)) {
        (Err(e), _) => Err(fail(GpuError::ChainInvalid(e.clone()), "a parsable device chain", e.to_string())),
        (_, Err(e)) => Err(fail(
            GpuError::ChainInvalid(chain::ChainError::Malformed { index: 0, reason: e.clone() }),
            "a usable pinned root",
            e,
        )),
        (Ok(certs), Ok(root)) => {
            let top = certs.last();
            // A simulated chain is refused without allow_simulated, and flagged, even when a policy pins its root.
            let simulated_top = top.filter(|c| simulated::is_simulated_gpu_cert(c));
            match simulated_top {
                Some(sim_root) if !policy.allow_simulated => Err(fail(
                    GpuError::SimulatedRefused,
                    "a chain to the NVIDIA Device Identity CA",
                    format!("SIMULATED root {:?} (policy allow_simulated = false)", sim_root.subject_string()),
                )),
                Some(sim_root) => match verify_chain(certs, sim_root, now) {
                    Ok(names) => Ok((format!("{names} (SIMULATED root), valid at {}", fmt_time(now)), true)),
                    Err(e) => {
                        Err(fail(GpuError::ChainInvalid(e.clone()), "a valid simulated device chain", e.to_string()))
                    }
                },
                None => match verify_chain(certs, &root, now) {
                    Ok(names) => Ok((format!("{names} (pinned root), valid at {}", fmt_time(now)), false)),
                    Err(e) => Err(fail(
                        GpuError::ChainInvalid(e.clone()),
                        format!(
                            "{} certificates to the pinned {:?}",
                            chain::CHAIN_LEN,
                            root.common_name().unwrap_or_default()
                        ),
                        e.to_string(),
                    )),
                },
            }
        }
    }
}

/// 3. Revocation (OCSP responses supplied by the relying party).
fn check_revocation(x: &GpuInput<'_>, chain_ok: bool) -> Row {
    let (certs, expect, policy, now) = (&x.certs, x.expect, x.policy, x.now);
    match (&certs, chain_ok) {
        (Ok(certs), true) if !expect.ocsp.is_empty() => match crate::gpu::ocsp::check_chain(certs, expect.ocsp, now) {
            Ok(detail) => Row::Pass(detail),
            Err(failed) => Row::Fail(failed),
        },
        (_, true) if policy.gpu.require_revocation => fail(
            GpuError::RevocationUnavailable,
            "OCSP responses for the device chain (policy: gpu.require_revocation = true)",
            "none supplied",
        ),
        (_, true) => {
            Row::Skip("no OCSP responses supplied and the policy does not require them (offline verification)".into())
        }
        _ => Row::NotRun("device chain not established".into()),
    }
}

/// 4. The report's signature by the leaf key.
fn check_signature(x: &GpuInput<'_>) -> Row {
    let (parsed, leaf) = (&x.parsed, x.leaf());
    match (&parsed, leaf) {
        (Some(m), Some(leaf)) => match leaf.verify_p384_fixed(m.signed_bytes(), &m.signature) {
            Ok(()) => Row::Pass(format!(
                "ECDSA P-384 by the leaf key over SHA-384 of {} bytes (request ‖ response without signature)",
                m.signed_bytes().len()
            )),
            Err(crate::x509::CertError::BadSignature) => fail(
                GpuError::GpuReportSignatureInvalid,
                "a valid leaf signature over request ‖ response",
                "signature does not verify",
            ),
            Err(e) => fail(GpuError::GpuReportSignatureInvalid, "an ECDSA P-384 leaf key", e.to_string()),
        },
        _ => Row::NotRun("report or leaf certificate unreadable".into()),
    }
}

/// 5. The report's FWID against the leaf's DICE TcbInfo.
fn check_fwid(x: &GpuInput<'_>) -> Row {
    let (parsed, leaf) = (&x.parsed, x.leaf());
    match (&parsed, leaf) {
        (Some(m), Some(leaf)) => match (m.opaque.fwid(), leaf_fwid(leaf)) {
            (_, Err(e)) => fail(GpuError::FwidMismatch, "a leaf certificate with a DICE FWID", e.reason),
            (None, Ok(_)) => fail(GpuError::FwidMismatch, "an FWID opaque field (20)", "absent"),
            (Some(report), Ok(cert)) if report == cert.as_slice() => {
                Row::Pass(format!("FWID {} in the report and the leaf's TcbInfo", hex::encode(report)))
            }
            (Some(report), Ok(cert)) => fail(
                GpuError::FwidMismatch,
                format!("FWID {} (leaf TcbInfo)", hex::encode(cert)),
                format!("FWID {} (report)", hex::encode(report)),
            ),
        },
        _ => Row::NotRun("report or leaf certificate unreadable".into()),
    }
}

/// 6. The request nonce: the expected one, or the one derived from the claims.
fn check_nonce(x: &GpuInput<'_>) -> Row {
    let (parsed, expect, index) = (&x.parsed, x.expect, x.index);
    let wanted = match (expect.nonce, expect.claims) {
        (Some(n), _) => Some(Ok((n, "the expected nonce"))),
        (None, Some(c)) => Some(c.gpu_nonce(index).map(|n| (n, "the nonce derived from the shard's claims"))),
        (None, None) => None,
    };
    match (&parsed, wanted) {
        (None, _) => Row::NotRun("report unreadable".into()),
        (Some(_), None) => Row::NotRun("no expected nonce and no claims to derive it from".into()),
        (Some(_), Some(Err(e))) => fail(GpuError::NonceMismatch, "encodable claims", e.to_string()),
        (Some(m), Some(Ok((n, source)))) if m.request_nonce == n => {
            Row::Pass(format!("request nonce {} is {source}", hex::encode(n)))
        }
        (Some(m), Some(Ok((n, source)))) => fail(
            GpuError::NonceMismatch,
            format!("nonce {} ({source})", hex::encode(n)),
            format!("nonce {} (stale, replayed or from another session)", hex::encode(m.request_nonce)),
        ),
    }
}

/// 7. The shard's signed claims commit to the digest of its GPU evidence.
fn check_binding(x: &GpuInput<'_>) -> Row {
    let (expect, digest) = (x.expect, x.digest);
    match expect.claims {
        None => Row::NotRun("no shard claims (bare GPU evidence): binding to a CPU report not checked".into()),
        Some(c) => match c.gpu_evidence_hash {
            Some(h) if h == digest => Row::Pass(format!("claims commit to the GPU evidence digest {h}")),
            Some(h) => fail(
                GpuError::GpuNotBoundToSession,
                format!("gpu_evidence_hash {digest} (digest of the GPU evidence)"),
                format!("gpu_evidence_hash {h} in the claims"),
            ),
            None => fail(
                GpuError::GpuNotBoundToSession,
                format!("gpu_evidence_hash {digest} in the claims"),
                "the claims carry no GPU evidence hash",
            ),
        },
    }
}

/// 8. Confidential-computing mode.
fn check_cc_mode(x: &GpuInput<'_>) -> Row {
    let (parsed, g) = (&x.parsed, x.g);
    match &parsed {
        None => Row::NotRun("report unreadable".into()),
        Some(m) => {
            let flag = m.opaque.feature_flag();
            let mode = match flag {
                Some(0) => Ok("multi-GPU passthrough CC (feature flag 0)"),
                Some(1) => Ok("single-GPU passthrough CC (feature flag 1)"),
                Some(2) => Ok("protected PCIe (feature flag 2)"),
                Some(other) => Err(format!("feature flag {other}")),
                None => Ok("signed measurement report with opaque data (the GPU answers only in CC or PPCIe mode; no feature flag in this opaque-data version)"),
            };
            match (mode, g.settings) {
                (Err(actual), _) => fail(GpuError::NotCcMode, "a CC feature flag (0, 1 or 2)", actual),
                (Ok(_), Some(s)) if !s.cc_mode => {
                    fail(GpuError::NotCcMode, "CC mode on", "the collector reports CC mode off")
                }
                (Ok(how), Some(_)) => Row::Pass(format!("{how}; collector reports CC on")),
                (Ok(how), None) => Row::Pass(how.to_owned()),
            }
        }
    }
}

/// 9. DevTools. The collector's report is trusted only when the signed CPU claims commit to it.
fn check_devtools(x: &GpuInput<'_>) -> Row {
    let (g, policy) = (x.g, x.policy);
    let bound = x.expect.claims.and_then(|c| c.gpu_evidence_hash) == Some(x.digest);
    match g.settings {
        Some(s) if s.devtools_mode => fail(GpuError::DevToolsMode, "CC production mode", "CC DevTools mode"),
        Some(_) if bound => Row::Pass("collector reports DevTools off (bound through the CPU report)".into()),
        None if policy.gpu.require_cc_settings => fail(
            GpuError::DevToolsMode,
            "the collector's CC settings (policy: gpu.require_cc_settings = true)",
            "none: DevTools mode cannot be excluded",
        ),
        Some(_) if policy.gpu.require_cc_settings => fail(
            GpuError::DevToolsMode,
            "the collector's CC settings bound to a CPU report (policy: gpu.require_cc_settings = true)",
            "a report not bound to signed claims: DevTools mode cannot be excluded",
        ),
        Some(_) => Row::NotRun("the collector reports DevTools off, but no signed claims commit to that report".into()),
        None => {
            Row::NotRun("DevTools mode is not in the signed SPDM evidence and no collector report was supplied".into())
        }
    }
}

/// 10. Protected PCIe, when the policy asks.
fn check_protected_pcie(x: &GpuInput<'_>) -> Row {
    let (parsed, policy) = (&x.parsed, x.policy);
    match &parsed {
        None => Row::NotRun("report unreadable".into()),
        Some(m) => {
            let status = m.opaque.protected_pcie_status();
            let shown = match status {
                Some(STATUS_ON) => "on (0xAA)".to_owned(),
                Some(STATUS_OFF) => "off (0x55)".to_owned(),
                Some(b) => format!("unknown status {b:#04x}"),
                None => "absent".to_owned(),
            };
            if !policy.gpu.require_protected_pcie {
                Row::Skip(format!("policy does not require protected PCIe (status {shown})"))
            } else if status == Some(STATUS_ON) {
                Row::Pass("protected PCIe on (0xAA)".into())
            } else {
                fail(GpuError::ProtectedPcieOff, "protected PCIe on (0xAA)", shown)
            }
        }
    }
}

/// 13. Every active RIM index against the golden values.
fn check_rim_measurements(x: &GpuInput<'_>, driver: Option<&str>, vbios: Option<&str>) -> Row {
    let (parsed, expect, policy) = (&x.parsed, x.expect, x.policy);
    match &parsed {
        None => Row::NotRun("report unreadable".into()),
        Some(_) if expect.rims.is_empty() && policy.gpu.require_rim => {
            fail(GpuError::RimUnavailable, "driver and VBIOS RIMs (policy: gpu.require_rim = true)", "none supplied")
        }
        Some(_) if expect.rims.is_empty() => Row::NotRun("no RIM supplied".into()),
        Some(m) => rim_row(m, expect.rims, driver, vbios, policy.gpu.require_rim),
    }
}

fn rim_signature_row(rims: &[Rim], policy: &Policy, now: SystemTime) -> Row {
    let required = policy.gpu.require_rim_signature;
    if rims.is_empty() {
        return if required {
            fail(
                GpuError::RimSignatureNotVerified,
                "signed RIMs (policy: gpu.require_rim_signature = true)",
                "no RIM supplied",
            )
        } else {
            Row::NotRun("no RIM supplied".into())
        };
    }
    let root = match &policy.gpu.rim_root_pem {
        Some(pem) => ParsedCert::from_pem(pem.as_bytes()).map_err(|e| format!("policy gpu.rim_root_pem: {e}")),
        None => crate::gpu::xmldsig::nvidia_rim_root().map_err(|e| e.to_string()),
    };
    let root = match root {
        Ok(r) => r,
        Err(e) => return fail(GpuError::RimSignatureInvalid(e.clone()), "a usable RIM root", e),
    };
    let mut signers = Vec::new();
    let mut unsigned = Vec::new();
    for rim in rims {
        if !rim.has_signature {
            unsigned.push(rim.tag_id.clone());
            continue;
        }
        // The comparison uses the parsed values: they must be the signed document's.
        let same = Rim::parse(rim.source())
            .is_ok_and(|signed| signed.measurements == rim.measurements && signed.version == rim.version);
        if !same {
            let why = format!("RIM {}: golden values differ from the signed document", rim.tag_id);
            return fail(GpuError::RimSignatureInvalid(why.clone()), "RIM contents as signed", why);
        }
        match crate::gpu::xmldsig::verify_rim_signature(rim.source(), &root, now) {
            Ok(signer) => signers.push(format!("{} (signed by {signer})", rim.version)),
            Err(e) => {
                return fail(
                    GpuError::RimSignatureInvalid(e.to_string()),
                    format!(
                        "RIM {} signed, chain to {:?} valid at {}",
                        rim.version,
                        root.common_name().unwrap_or_default(),
                        fmt_time(now)
                    ),
                    e.to_string(),
                )
            }
        }
    }
    match (unsigned.is_empty(), required) {
        (false, true) => fail(
            GpuError::RimSignatureNotVerified,
            "every RIM signed (policy: gpu.require_rim_signature = true)",
            format!("unsigned: {}", unsigned.join(", ")),
        ),
        (false, false) => Row::Skip(format!(
            "unsigned RIM(s) {} accepted as supplied (policy does not require signatures){}",
            unsigned.join(", "),
            if signers.is_empty() { String::new() } else { format!("; verified: {}", signers.join(", ")) }
        )),
        (true, _) => Row::Pass(format!(
            "XML-DSig (C14N 1.1, ECDSA P-384) verified to {:?} at {}: {}",
            root.common_name().unwrap_or_default(),
            fmt_time(now),
            signers.join(", ")
        )),
    }
}

fn version_row(got: Option<&str>, min: Option<&str>, driver: bool) -> Row {
    let what = if driver { "driver" } else { "VBIOS" };
    let parse = |s: &str| if driver { Version::driver(s) } else { Version::vbios(s) };
    let Some(min) = min else {
        return Row::Skip(format!("policy sets no minimum {what} version ({what} {})", got.unwrap_or("absent")));
    };
    let too_old = |got: String| {
        if driver {
            GpuError::DriverTooOld { got, min: min.to_owned() }
        } else {
            GpuError::VbiosTooOld { got, min: min.to_owned() }
        }
    };
    let Some(got) = got else {
        return fail(too_old("absent".into()), format!("{what} >= {min}"), format!("no {what} version field"));
    };
    match (parse(got), parse(min)) {
        (_, Err(e)) => fail(too_old(got.to_owned()), format!("a valid minimum {what} version"), e.to_string()),
        (Err(e), _) => fail(too_old(got.to_owned()), format!("{what} >= {min}"), e.to_string()),
        (Ok(g), Ok(m)) if g >= m => Row::Pass(format!("{what} {g} >= {m}")),
        (Ok(g), Ok(m)) => fail(too_old(got.to_owned()), format!("{what} >= {m}"), format!("{what} {g}")),
    }
}

fn same_version(a: &str, b: &str) -> bool {
    a.trim().eq_ignore_ascii_case(b.trim())
}

fn rim_row(m: &SpdmMeasurements, rims: &[Rim], driver: Option<&str>, vbios: Option<&str>, require_both: bool) -> Row {
    let mut driver_rim = None;
    let mut vbios_rim = None;
    for r in rims {
        if driver.is_some_and(|d| same_version(d, &r.version)) && driver_rim.is_none() {
            driver_rim = Some(r);
        } else if vbios.is_some_and(|v| same_version(v, &r.version)) && vbios_rim.is_none() {
            vbios_rim = Some(r);
        } else {
            return fail(
                GpuError::RimNotForThisGpu {
                    rim_version: r.version.clone(),
                    driver: driver.unwrap_or("absent").to_owned(),
                    vbios: vbios.unwrap_or("absent").to_owned(),
                },
                format!("RIMs for driver {} and VBIOS {}", driver.unwrap_or("absent"), vbios.unwrap_or("absent")),
                format!("RIM {} for version {}", r.tag_id, r.version),
            );
        }
    }
    if require_both && (driver_rim.is_none() || vbios_rim.is_none()) {
        let missing = if driver_rim.is_none() { "driver" } else { "VBIOS" };
        return fail(
            GpuError::RimUnavailable,
            "both a driver and a VBIOS RIM (policy: gpu.require_rim = true)",
            format!("no {missing} RIM supplied"),
        );
    }
    if let (Some(d), Some(v)) = (driver_rim, vbios_rim) {
        if let Some(index) = d.active_indices().find(|i| v.measurements.get(i).is_some_and(|g| g.active)) {
            return fail(
                GpuError::RimConflict { index },
                "driver and VBIOS RIMs with disjoint indices",
                format!("both claim index {index}"),
            );
        }
    }
    // NVDEC0 disabled (0x55): index 35 reflects no loaded NVDEC firmware and is not compared (NVIDIA's verifier does the same).
    let skip_35 = m.opaque.nvdec0_status() == Some(STATUS_OFF);
    let mut compared = 0usize;
    let mut mismatches = Vec::new();
    for (kind, rim) in [("driver", driver_rim), ("VBIOS", vbios_rim)] {
        let Some(rim) = rim else { continue };
        for (index, golden) in rim.measurements.iter().filter(|(_, g)| g.active) {
            if *index == 35 && skip_35 {
                continue;
            }
            compared += 1;
            let block = u8::try_from(index + 1).ok().and_then(|b| m.block(b));
            let ok = block.is_some_and(|b| golden.alternatives.contains(&b.value));
            if !ok {
                mismatches.push((*index, kind, golden, block.map(|b| hex::encode(&b.value))));
            }
        }
    }
    let which = [driver_rim.map(|_| "driver"), vbios_rim.map(|_| "VBIOS")]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(" + ");
    match mismatches.first() {
        None => Row::Pass(format!(
            "{compared} active golden measurements match ({which} RIM){}",
            if skip_35 { "; index 35 not compared (NVDEC0 disabled)" } else { "" }
        )),
        Some((index, kind, golden, got)) => fail(
            GpuError::RimMismatch { index: *index },
            format!(
                "{kind} RIM index {index} (SPDM block {}) = {}",
                index + 1,
                golden.alternatives.iter().map(hex::encode).collect::<Vec<_>>().join(" or ")
            ),
            format!(
                "{} ({} of {compared} active indices mismatch: {:?})",
                got.clone().unwrap_or_else(|| "no such block".into()),
                mismatches.len(),
                mismatches.iter().map(|m| m.0).collect::<Vec<_>>()
            ),
        ),
    }
}
