//! Bad GPU input, one case per failure: each must fail the named check
//! with the specific typed error, never panic. Built on the simulated GPU
//! attester (fixed seeds), which re-signs every mutated transcript so that
//! only the intended check fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::OnceLock;
use std::time::SystemTime;

use veil_attestation::attester::gpu::simulated::{composite, SimulatedGpu, SimulatedGpuConfig};
use veil_attestation::gpu::chain::ChainError;
use veil_attestation::gpu::spdm::{field, OpaqueField, SpdmError, REQUEST_LEN, RESPONSE_HEADER_LEN};
use veil_attestation::gpu::{
    gpu_evidence_digest, CcSettings, GpuAppraisal, GpuCheckId as C, GpuCheckReport, GpuError, GpuEvidence, Rim,
    RimError,
};
use veil_attestation::simulated::{default_measurement, SimulatedAttester, SimulatedConfig};
use veil_attestation::snp::Product;
use veil_attestation::verify::{appraise_gpus, verify_gpus, GpuExpectations};
use veil_attestation::verify::{verify_composite, Outcome};
use veil_attestation::x509::parse_time;
use veil_attestation::{verify, Claims, Error, ExpectedClaims, KeyHash, Nonce, Policy};

fn gpu() -> &'static SimulatedGpu {
    static G: OnceLock<SimulatedGpu> = OnceLock::new();
    G.get_or_init(|| SimulatedGpu::from_seed(b"veil gpu tests", SimulatedGpuConfig::default()).unwrap())
}

fn other_gpu() -> &'static SimulatedGpu {
    static G: OnceLock<SimulatedGpu> = OnceLock::new();
    G.get_or_init(|| SimulatedGpu::from_seed(b"veil gpu tests 2", SimulatedGpuConfig::default()).unwrap())
}

fn now() -> SystemTime {
    parse_time("2026-11-29T00:00:00Z").unwrap()
}

fn claims() -> Claims {
    Claims {
        tls_key_hash: Some(KeyHash([1; 32])),
        nonce: Some(Nonce::new(vec![0x42; 32]).unwrap()),
        software_version: "veil test".into(),
        ..Default::default()
    }
}

fn sim_policy() -> Policy {
    Policy { allow_simulated: true, ..Policy::default() }
}

/// Good evidence for GPU 0 of `claims()`, with the claims bound to it.
fn good() -> (Claims, GpuEvidence) {
    let (bound, mut ev) = composite(&[gpu().clone()], &claims()).unwrap();
    (bound, ev.remove(0))
}

fn appraise_one(g: &GpuEvidence, claims: &Claims, policy: &Policy) -> GpuCheckReport {
    let a = appraise_gpus(
        std::slice::from_ref(g),
        &GpuExpectations { claims: Some(claims), ..Default::default() },
        policy,
        now(),
    );
    a.gpus.into_iter().next().unwrap()
}

/// Re-signed, edited evidence bound into claims (so only the edited property differs).
fn edited(edit: impl FnOnce(&mut veil_attestation::gpu::spdm::TranscriptBuilder)) -> (Claims, GpuEvidence) {
    let c = claims();
    let mut t = gpu().transcript(c.gpu_nonce(0).unwrap());
    edit(&mut t);
    let g = GpuEvidence { report: gpu().sign(&t), ..gpu().evidence_with_nonce([0; 32]) };
    let mut bound = c;
    bound.gpu_evidence_hash = Some(gpu_evidence_digest(std::slice::from_ref(&g)));
    (bound, g)
}

thread_local! {
    /// Checks a case on this thread has shown failing alone, with its error.
    static FAILED_ALONE: std::cell::RefCell<std::collections::BTreeSet<C>> = Default::default();
}

fn only_failure(t: &GpuCheckReport, check: C, error: &GpuError) {
    assert_eq!(t.failures(), vec![check], "{t}");
    assert_eq!(t.error(check), Some(error), "{t}");
    FAILED_ALONE.with(|f| f.borrow_mut().insert(check));
}

fn format_error(report: Vec<u8>) -> SpdmError {
    let (c, mut g) = good();
    g.report = report;
    let t = appraise_one(&g, &c, &sim_policy());
    // The edited transcript no longer has the digest the claims commit to,
    // so the binding fails with it; nothing else may.
    assert!([vec![C::EvidenceFormat], vec![C::EvidenceFormat, C::EvidenceBinding]].contains(&t.failures()), "{t}");
    match t.error(C::EvidenceFormat) {
        Some(GpuError::Malformed(e)) => {
            FAILED_ALONE.with(|f| f.borrow_mut().insert(C::EvidenceFormat));
            e.clone()
        }
        other => panic!("expected a format error, got {other:?}"),
    }
}

#[test]
fn accepts_simulated_when_allowed_with_a_warning() {
    let (c, g) = good();
    let t = appraise_one(&g, &c, &sim_policy());
    assert!(t.accepted(), "{t}");
    for check in [
        C::EvidenceFormat,
        C::DeviceChain,
        C::ReportSignature,
        C::Fwid,
        C::Nonce,
        C::EvidenceBinding,
        C::CcMode,
        C::DevTools,
    ] {
        assert!(matches!(t.outcome(check), Some(Outcome::Passed { .. })), "{check}: {t}");
    }
    assert!(t.warnings[0].contains("SIMULATED"), "{t}");
    assert!(t.to_string().contains("WARNING: SIMULATED"));
    let ok =
        verify_gpus(&[g], &GpuExpectations { claims: Some(&c), ..Default::default() }, &sim_policy(), now()).unwrap();
    assert!(ok.is_simulated());
}

#[test]
fn rejects_simulated_when_not_allowed() {
    let (c, g) = good();
    only_failure(&appraise_one(&g, &c, &Policy::default()), C::DeviceChain, &GpuError::SimulatedRefused);
}

#[test]
fn rejects_truncated_evidence() {
    let (_, g) = good();
    assert!(matches!(format_error(g.report[..30].to_vec()), SpdmError::Truncated { part: "request nonce", .. }));
    assert!(matches!(
        format_error(g.report[..g.report.len() - 1].to_vec()),
        SpdmError::Truncated { part: "Signature", .. }
    ));
    assert!(matches!(format_error(vec![]), SpdmError::Truncated { part: "request SPDMVersion", .. }));
}

#[test]
fn rejects_wrong_spdm_version() {
    let (_, mut g) = good();
    g.report[REQUEST_LEN] = 0x10;
    assert_eq!(format_error(g.report), SpdmError::UnsupportedVersion { message: "response", got: 0x10 });
}

#[test]
fn rejects_wrong_request_code() {
    let (_, mut g) = good();
    g.report[1] = 0x81; // GET_DIGESTS
    assert_eq!(format_error(g.report), SpdmError::UnexpectedCode { message: "request", expected: 0xE0, got: 0x81 });
}

#[test]
fn rejects_unsigned_request() {
    let (_, mut g) = good();
    g.report[2] = 0x00;
    assert_eq!(format_error(g.report), SpdmError::SignatureNotRequested { attributes: 0 });
}

#[test]
fn rejects_overrunning_measurement_block() {
    let (_, mut g) = good();
    let at = REQUEST_LEN + RESPONSE_HEADER_LEN + 2;
    g.report[at..at + 2].copy_from_slice(&0xF000u16.to_le_bytes());
    assert!(matches!(format_error(g.report), SpdmError::BlockOverrun { block: 0, index: 1, declared: 0xF000, .. }));
}

#[test]
fn rejects_record_length_that_overruns_the_evidence() {
    let (_, mut g) = good();
    let at = REQUEST_LEN + 5;
    g.report[at..at + 3].copy_from_slice(&[0xFF, 0xFF, 0x0F]);
    assert!(matches!(format_error(g.report), SpdmError::Truncated { part: "MeasurementRecord", .. }));
}

#[test]
fn rejects_opaque_field_that_overruns() {
    let (c, g) = edited(|t| t.opaque.fields.push(OpaqueField { field_type: 99, value: vec![1; 8] }));
    let mut report = g.report.clone();
    // Last opaque TLV (type 99, 8 bytes) sits right before the signature; claim 200 bytes.
    let at = report.len() - 96 - 8 - 2;
    report[at..at + 2].copy_from_slice(&200u16.to_le_bytes());
    let _ = c;
    assert!(matches!(format_error(report), SpdmError::OpaqueOverrun { field_type: 99, declared: 200, .. }));
}

#[test]
fn rejects_duplicate_driver_version_field() {
    let (_, g) =
        edited(|t| t.opaque.fields.push(OpaqueField { field_type: field::DRIVER_VERSION, value: b"999.0\0".to_vec() }));
    assert_eq!(format_error(g.report), SpdmError::DuplicateOpaqueField { field_type: field::DRIVER_VERSION });
}

#[test]
fn rejects_chain_out_of_order() {
    let (c, mut g) = good();
    g.cert_chain.swap(0, 1);
    let t = appraise_one(&g, &c, &sim_policy());
    assert!(
        matches!(t.error(C::DeviceChain), Some(GpuError::ChainInvalid(ChainError::NotIssuedByNext { index: 0, .. }))),
        "{t}"
    );
}

#[test]
fn rejects_chain_of_wrong_length() {
    let (c, mut g) = good();
    g.cert_chain.remove(2);
    let t = appraise_one(&g, &c, &sim_policy());
    assert!(
        matches!(
            t.error(C::DeviceChain),
            Some(GpuError::ChainInvalid(ChainError::WrongLength { got: 4, expected: 5 }))
        ),
        "{t}"
    );
}

#[test]
fn rejects_chain_with_a_foreign_root() {
    let (c, mut g) = good();
    // Another simulated GPU's root at the top: the intermediate is not issued by it.
    g.cert_chain[4] = other_gpu().chain_der()[4].clone();
    let t = appraise_one(&g, &c, &sim_policy());
    assert!(
        matches!(t.error(C::DeviceChain), Some(GpuError::ChainInvalid(ChainError::NotIssuedByNext { index: 3, .. }))),
        "{t}"
    );
    // A real-looking chain that ends at a root other than the pinned one (policy pins another root).
    let mut p = Policy::default();
    p.gpu.root_pem = Some(veil_attestation::gpu::chain::NVIDIA_DEVICE_IDENTITY_CA_PEM.to_owned());
    let (c, g) = good();
    let t = appraise_one(&g, &c, &p);
    assert_eq!(t.error(C::DeviceChain), Some(&GpuError::SimulatedRefused), "{t}");
}

#[test]
fn rejects_signature_by_another_gpu() {
    let (c, mut g) = good();
    g.report = other_gpu().sign(&gpu().transcript(c.gpu_nonce(0).unwrap()));
    let mut bound = c;
    bound.gpu_evidence_hash = Some(gpu_evidence_digest(std::slice::from_ref(&g)));
    only_failure(&appraise_one(&g, &bound, &sim_policy()), C::ReportSignature, &GpuError::GpuReportSignatureInvalid);
}

#[test]
fn rejects_fwid_that_differs_from_the_leaf() {
    let (c, g) = edited(|t| {
        let f = t.opaque.fields.iter_mut().find(|f| f.field_type == field::FWID).unwrap();
        f.value[0] ^= 1;
    });
    only_failure(&appraise_one(&g, &c, &sim_policy()), C::Fwid, &GpuError::FwidMismatch);
}

#[test]
fn rejects_nonce_mismatch() {
    let (c, g) = edited(|t| t.request_nonce[0] ^= 1);
    only_failure(&appraise_one(&g, &c, &sim_policy()), C::Nonce, &GpuError::NonceMismatch);
}

#[test]
fn rejects_gpu_evidence_of_another_gpu_index() {
    // GPU 0's evidence presented as the second GPU: the nonce is derived per index.
    let c = claims();
    let a = gpu().evidence_for(&c, 0).unwrap();
    let b = other_gpu().evidence_for(&c, 0).unwrap();
    let mut bound = c;
    bound.gpu_evidence_hash = Some(gpu_evidence_digest(&[a.clone(), b.clone()]));
    let appraisal =
        appraise_gpus(&[a, b], &GpuExpectations { claims: Some(&bound), ..Default::default() }, &sim_policy(), now());
    assert!(appraisal.gpus[0].accepted());
    assert_eq!(appraisal.gpus[1].failures(), vec![C::Nonce], "{}", appraisal.gpus[1]);
}

#[test]
fn rejects_gpu_evidence_spliced_from_another_session() {
    // Run A and run B differ in the client nonce; B's bundle carries A's GPU evidence.
    let mut claims_b = claims();
    claims_b.nonce = Some(Nonce::new(vec![0x43; 32]).unwrap());
    let (_, gpu_a) = good();
    let (bound_b, _) = composite(&[gpu().clone()], &claims_b).unwrap();
    let t = appraise_one(&gpu_a, &bound_b, &sim_policy());
    assert_eq!(t.error(C::Nonce), Some(&GpuError::NonceMismatch), "{t}");
    assert_eq!(t.error(C::EvidenceBinding), Some(&GpuError::GpuNotBoundToSession), "{t}");
}

#[test]
fn rejects_claims_without_gpu_evidence_hash() {
    let (mut c, g) = good();
    c.gpu_evidence_hash = None;
    only_failure(&appraise_one(&g, &c, &sim_policy()), C::EvidenceBinding, &GpuError::GpuNotBoundToSession);
}

#[test]
fn rejects_devtools_mode() {
    let (_, mut g) = good();
    g.settings = Some(CcSettings { cc_mode: true, devtools_mode: true });
    let mut c = claims();
    c.gpu_evidence_hash = Some(gpu_evidence_digest(std::slice::from_ref(&g)));
    only_failure(&appraise_one(&g, &c, &sim_policy()), C::DevTools, &GpuError::DevToolsMode);
}

#[test]
fn rejects_cc_mode_off() {
    let (_, mut g) = good();
    g.settings = Some(CcSettings { cc_mode: false, devtools_mode: false });
    let mut c = claims();
    c.gpu_evidence_hash = Some(gpu_evidence_digest(std::slice::from_ref(&g)));
    only_failure(&appraise_one(&g, &c, &sim_policy()), C::CcMode, &GpuError::NotCcMode);
    let (c, g) = edited(|t| {
        let f = t.opaque.fields.iter_mut().find(|f| f.field_type == field::FEATURE_FLAG).unwrap();
        f.value = 7u16.to_le_bytes().to_vec();
    });
    only_failure(&appraise_one(&g, &c, &sim_policy()), C::CcMode, &GpuError::NotCcMode);
}

#[test]
fn rejects_missing_gpu_evidence_when_required() {
    let mut p = sim_policy();
    p.gpu.required = true;
    let a = appraise_gpus(&[], &GpuExpectations::default(), &p, now());
    assert_eq!(a.topology_error, Some(GpuError::NotCcMode));
    let e = verify_gpus(&[], &GpuExpectations::default(), &p, now()).unwrap_err();
    assert!(matches!(&e, Error::Rejected(r) if r.gpu.as_ref().map(|g| &g.error) == Some(&GpuError::NotCcMode)), "{e}");
    // One rejection shape: the GPU set is a named check too.
    assert_eq!(e.check(), Some(veil_attestation::CheckId::GpuSet));
}

#[test]
fn rejects_wrong_gpu_count_and_duplicate_gpu() {
    let (c, g) = good();
    let mut p = sim_policy();
    p.gpu.count = Some(2);
    let a: GpuAppraisal =
        appraise_gpus(std::slice::from_ref(&g), &GpuExpectations { claims: Some(&c), ..Default::default() }, &p, now());
    assert!(matches!(a.topology_error, Some(GpuError::TopologyMismatch { .. })));
    let a = appraise_gpus(&[g.clone(), g], &GpuExpectations::default(), &sim_policy(), now());
    assert!(matches!(a.topology_error, Some(GpuError::TopologyMismatch { ref got, .. }) if got.contains("twice")));
    assert!(!a.accepted());
}

#[test]
fn rejects_driver_below_minimum() {
    let (c, g) = good();
    let mut p = sim_policy();
    p.gpu.min_driver_version = Some("575.0".into());
    only_failure(
        &appraise_one(&g, &c, &p),
        C::DriverVersion,
        &GpuError::DriverTooOld { got: "570.86.10".into(), min: "575.0".into() },
    );
}

#[test]
fn rejects_vbios_below_minimum() {
    let (c, g) = good();
    let mut p = sim_policy();
    p.gpu.min_vbios_version = Some("96.00.B0.00.00".into());
    only_failure(
        &appraise_one(&g, &c, &p),
        C::VbiosVersion,
        &GpuError::VbiosTooOld { got: "96.00.AF.00.01".into(), min: "96.00.B0.00.00".into() },
    );
}

#[test]
fn rejects_protected_pcie_off_when_required() {
    let (c, g) = good();
    let mut p = sim_policy();
    p.gpu.require_protected_pcie = true;
    only_failure(&appraise_one(&g, &c, &p), C::ProtectedPcie, &GpuError::ProtectedPcieOff);
}

fn rims(g: &SimulatedGpu) -> Vec<Rim> {
    vec![Rim::parse(g.rim_xml(true).as_bytes()).unwrap(), Rim::parse(g.rim_xml(false).as_bytes()).unwrap()]
}

#[test]
fn accepts_matching_rims_and_rejects_one_changed_measurement() {
    let (c, g) = good();
    let mut p = sim_policy();
    p.gpu.require_rim = true;
    let rims = rims(gpu());
    let expect = GpuExpectations { claims: Some(&c), rims: &rims, ..Default::default() };
    let t = appraise_gpus(std::slice::from_ref(&g), &expect, &p, now()).gpus.remove(0);
    assert!(
        matches!(t.outcome(C::RimMeasurements), Some(Outcome::Passed { detail }) if detail.contains("63 active") && detail.contains("index 35 not compared")),
        "{t}"
    );
    let (c, g) = edited(|t| t.blocks[20].value[0] ^= 1);
    let expect = GpuExpectations { claims: Some(&c), rims: &rims, ..Default::default() };
    let t = appraise_gpus(std::slice::from_ref(&g), &expect, &p, now()).gpus.remove(0);
    only_failure(&t, C::RimMeasurements, &GpuError::RimMismatch { index: 20 });
}

#[test]
fn rejects_rims_that_both_claim_an_index() {
    let (c, g) = good();
    let mut rims = rims(gpu());
    let golden = rims[1].measurements[&0].clone();
    rims[0].measurements.insert(0, golden);
    let expect = GpuExpectations { claims: Some(&c), rims: &rims, ..Default::default() };
    let t = appraise_gpus(std::slice::from_ref(&g), &expect, &sim_policy(), now()).gpus.remove(0);
    only_failure(&t, C::RimMeasurements, &GpuError::RimConflict { index: 0 });
}

#[test]
fn rejects_missing_rim_when_required_and_rim_signature_fails_closed() {
    let (c, g) = good();
    let mut p = sim_policy();
    p.gpu.require_rim = true;
    only_failure(&appraise_one(&g, &c, &p), C::RimMeasurements, &GpuError::RimUnavailable);
    let mut p = sim_policy();
    p.gpu.require_rim_signature = true;
    only_failure(&appraise_one(&g, &c, &p), C::RimSignature, &GpuError::RimSignatureNotVerified);
    let t = appraise_one(&g, &c, &sim_policy());
    assert!(matches!(t.outcome(C::RimSignature), Some(Outcome::NotRun { .. })), "{t}");
    // Unsigned (simulated) RIMs: accepted as supplied unless the policy requires signatures.
    let rims = rims(gpu());
    let expect = GpuExpectations { claims: Some(&c), rims: &rims, ..Default::default() };
    let t = appraise_gpus(std::slice::from_ref(&g), &expect, &sim_policy(), now()).gpus.remove(0);
    assert!(matches!(t.outcome(C::RimSignature), Some(Outcome::Skipped { .. })), "{t}");
    let mut p = sim_policy();
    p.gpu.require_rim_signature = true;
    let t = appraise_gpus(std::slice::from_ref(&g), &expect, &p, now()).gpus.remove(0);
    only_failure(&t, C::RimSignature, &GpuError::RimSignatureNotVerified);
}

#[test]
fn rejects_malformed_rim_xml() {
    let x = gpu().rim_xml(false);
    for (bad, want) in [
        (x.replace("</Payload>", ""), "Xml"),
        (
            x.replace("SoftwareIdentity xmlns", "Software xmlns").replace("</SoftwareIdentity>", "</Software>"),
            "NotSwid",
        ),
        (x.replacen("alternatives=\"1\"", "alternatives=\"0\"", 1), "Invalid"),
        (x.replacen("index=\"1\"", "index=\"0\"", 1), "DuplicateIndex"),
        (x.replacen("size=\"48\"", "size=\"47\"", 1), "Invalid"),
        (format!("<!DOCTYPE d [<!ENTITY e SYSTEM \"file:///etc/passwd\">]>{x}"), "Xml"),
    ] {
        let e = Rim::parse(bad.as_bytes()).unwrap_err();
        let name = match e {
            RimError::Xml(_) => "Xml",
            RimError::NotSwid(_) => "NotSwid",
            RimError::Invalid { .. } => "Invalid",
            RimError::DuplicateIndex(_) => "DuplicateIndex",
            _ => "other",
        };
        assert_eq!(name, want, "{e}");
    }
}

#[test]
fn rejects_revocation_when_required() {
    let (c, g) = good();
    let mut p = sim_policy();
    p.gpu.require_revocation = true;
    only_failure(&appraise_one(&g, &c, &p), C::Revocation, &GpuError::RevocationUnavailable);
}

#[test]
fn every_gpu_check_has_a_failing_case() {
    // Runs every negative case here, on this thread, and collects the checks
    // they showed failing alone (with the expected error): every GpuCheckId
    // must be among them.
    let cases: &[fn()] = &[
        rejects_simulated_when_not_allowed,
        rejects_truncated_evidence,
        rejects_wrong_spdm_version,
        rejects_wrong_request_code,
        rejects_unsigned_request,
        rejects_overrunning_measurement_block,
        rejects_record_length_that_overruns_the_evidence,
        rejects_opaque_field_that_overruns,
        rejects_duplicate_driver_version_field,
        rejects_chain_out_of_order,
        rejects_chain_of_wrong_length,
        rejects_chain_with_a_foreign_root,
        rejects_signature_by_another_gpu,
        rejects_fwid_that_differs_from_the_leaf,
        rejects_nonce_mismatch,
        rejects_gpu_evidence_of_another_gpu_index,
        rejects_gpu_evidence_spliced_from_another_session,
        rejects_claims_without_gpu_evidence_hash,
        rejects_devtools_mode,
        rejects_cc_mode_off,
        rejects_missing_gpu_evidence_when_required,
        rejects_wrong_gpu_count_and_duplicate_gpu,
        rejects_driver_below_minimum,
        rejects_vbios_below_minimum,
        rejects_protected_pcie_off_when_required,
        accepts_matching_rims_and_rejects_one_changed_measurement,
        rejects_rims_that_both_claim_an_index,
        rejects_missing_rim_when_required_and_rim_signature_fails_closed,
        rejects_malformed_rim_xml,
        rejects_revocation_when_required,
        rejects_revoked_chain_certificate,
        rejects_stale_or_future_ocsp,
        rejects_incomplete_forged_or_foreign_ocsp,
        rejects_unknown_architecture,
    ];
    for case in cases {
        case();
    }
    let covered: Vec<C> = FAILED_ALONE.with(|f| f.borrow().iter().copied().collect());
    assert_eq!(covered, C::ALL.to_vec(), "GPU checks without an isolated failing case");
}

#[test]
fn composite_cpu_and_gpu_evidence_bind_both_ways() {
    let snp = SimulatedAttester::from_seed(b"veil gpu composite", SimulatedConfig::new(Product::Genoa, b"g")).unwrap();
    let (bound, gpus) = composite(&[gpu().clone(), other_gpu().clone()], &claims()).unwrap();
    let cpu_part = veil_attestation::Attester::evidence(&snp, &bound).unwrap();
    let policy = Policy { allow_simulated: true, measurements: vec![default_measurement()], ..Policy::default() };
    let expected = ExpectedClaims { nonce: claims().nonce, ..Default::default() };
    // The CPU report commits to GPU evidence: without it the bundle is refused.
    let e = verify(&cpu_part, &policy, &expected, now()).unwrap_err();
    assert!(
        matches!(&e, Error::Rejected(r) if r.gpu.as_ref().map(|g| &g.error) == Some(&GpuError::GpuNotBoundToSession)),
        "{e}"
    );
    // One bundle: CPU evidence and its GPUs, verified together by `verify`.
    let bundle = veil_attestation::EvidenceBundle { gpus: gpus.clone(), ..cpu_part };
    let bundle = veil_attestation::EvidenceBundle::from_json(bundle.to_json().as_bytes()).unwrap();
    let cpu = verify(&bundle, &policy, &expected, now()).unwrap();
    assert_eq!(cpu.gpus().map(|g| g.reports().len()), Some(2));
    let expect = GpuExpectations { claims: cpu.claims(), ..Default::default() };
    let ok = verify_gpus(&gpus, &expect, &policy, now()).unwrap();
    assert_eq!(ok.reports().len(), 2);
    let (_, both) = verify_composite(&bundle, &gpus, &[], &policy, &expected, now()).unwrap();
    assert!(both.is_simulated());
    // A GPU dropped from the set: the digest in the signed claims no longer matches.
    let e = verify_composite(&bundle, &gpus[..1], &[], &policy, &expected, now()).unwrap_err();
    assert!(
        matches!(&e, Error::Rejected(r) if r.gpu.as_ref().map(|g| &g.error) == Some(&GpuError::GpuNotBoundToSession)),
        "{e}"
    );
    // `Error::check` names GPU checks as it names SNP checks.
    assert_eq!(e.check(), Some(veil_attestation::CheckId::Gpu(C::EvidenceBinding)), "{e}");
    // Swapping the GPUs' order breaks both the per-index nonce and the digest.
    let swapped = [gpus[1].clone(), gpus[0].clone()];
    let a = appraise_gpus(&swapped, &expect, &policy, now());
    for g in &a.gpus {
        assert_eq!(g.failures(), vec![C::Nonce, C::EvidenceBinding], "{g}");
    }
}

#[test]
fn fuzz_seed_corpus_parses() {
    // The committed seeds (`sim-*`); a local fuzzing run adds hash-named inputs that need not parse.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    let seeds = |dir: &str| {
        let mut v: Vec<_> = std::fs::read_dir(root.join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("sim-"))
            .collect();
        v.sort();
        v
    };
    let spdm = seeds("gpu_spdm");
    assert_eq!(spdm.len(), 2);
    for path in spdm {
        let m = veil_attestation::gpu::SpdmMeasurements::parse(&std::fs::read(path).unwrap()).unwrap();
        assert_eq!(m.blocks.len(), 64);
    }
    let rims = seeds("rim");
    assert_eq!(rims.len(), 1);
    for path in rims {
        let rim = Rim::parse(&std::fs::read(path).unwrap()).unwrap();
        assert_eq!(rim.measurements.len(), 4);
    }
}

#[test]
fn pinning_a_simulated_root_in_the_policy_does_not_bypass_allow_simulated() {
    let (c, g) = good();
    let root = veil_attestation::x509::ParsedCert::from_der(&gpu().chain_der()[4]).unwrap();
    let pem = format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        base64::Engine::encode(&base64::engine::general_purpose::STANDARD, root.der())
    );
    let mut p = Policy::default();
    p.gpu.root_pem = Some(pem);
    only_failure(&appraise_one(&g, &c, &p), C::DeviceChain, &GpuError::SimulatedRefused);
    p.allow_simulated = true;
    let t = appraise_one(&g, &c, &p);
    assert!(t.accepted() && !t.warnings.is_empty(), "{t}");
}

fn with_ocsp(responses: &[Vec<u8>]) -> GpuCheckReport {
    let (c, g) = good();
    let expect = GpuExpectations { claims: Some(&c), ocsp: responses, ..Default::default() };
    let mut p = sim_policy();
    p.gpu.require_revocation = true;
    appraise_gpus(std::slice::from_ref(&g), &expect, &p, now()).gpus.remove(0)
}

fn day(d: &str) -> SystemTime {
    parse_time(d).unwrap()
}

#[test]
fn accepts_good_current_ocsp_for_every_chain_certificate() {
    let r = gpu().ocsp_responses(None, day("2026-11-28"), Some(day("2026-12-05"))).unwrap();
    let t = with_ocsp(&r);
    assert!(
        matches!(t.outcome(C::Revocation), Some(Outcome::Passed { detail }) if detail.contains("SIM GH100 GSP BROM")),
        "{t}"
    );
    assert!(t.accepted(), "{t}");
}

#[test]
fn rejects_revoked_chain_certificate() {
    let r = gpu().ocsp_responses(Some(1), day("2026-11-28"), Some(day("2026-12-05"))).unwrap();
    only_failure(
        &with_ocsp(&r),
        C::Revocation,
        &GpuError::OcspRevoked { cert: "SIM GH100 GSP BROM".into(), reason: "CertificateHold".into() },
    );
}

#[test]
fn rejects_stale_or_future_ocsp() {
    let stale = gpu().ocsp_responses(None, day("2026-10-01"), Some(day("2026-10-08"))).unwrap();
    only_failure(&with_ocsp(&stale), C::Revocation, &GpuError::OcspStale { cert: "SIM GH100 GSP FMC LF".into() });
    let future = gpu().ocsp_responses(None, day("2026-12-01"), Some(day("2026-12-08"))).unwrap();
    only_failure(&with_ocsp(&future), C::Revocation, &GpuError::OcspStale { cert: "SIM GH100 GSP FMC LF".into() });
    let open_ended = gpu().ocsp_responses(None, day("2026-11-28"), None).unwrap();
    only_failure(&with_ocsp(&open_ended), C::Revocation, &GpuError::OcspStale { cert: "SIM GH100 GSP FMC LF".into() });
}

#[test]
fn rejects_incomplete_forged_or_foreign_ocsp() {
    let mut r = gpu().ocsp_responses(None, day("2026-11-28"), Some(day("2026-12-05"))).unwrap();
    r.remove(2);
    only_failure(&with_ocsp(&r), C::Revocation, &GpuError::RevocationUnavailable);
    // Another GPU's responses name other certificates: nothing covers this chain.
    let foreign = other_gpu().ocsp_responses(None, day("2026-11-28"), Some(day("2026-12-05"))).unwrap();
    only_failure(&with_ocsp(&foreign), C::Revocation, &GpuError::RevocationUnavailable);
    // A flipped signature byte.
    let mut forged = gpu().ocsp_responses(None, day("2026-11-28"), Some(day("2026-12-05"))).unwrap();
    let last = forged[0].len() - 3;
    forged[0][last] ^= 1;
    let t = with_ocsp(&forged);
    only_failure(&t, C::Revocation, &GpuError::RevocationUnavailable);
    assert!(t.to_string().contains("does not verify"), "{t}");
    only_failure(&with_ocsp(&[vec![0x30, 0x03, 0x0a, 0x01, 0x00]]), C::Revocation, &GpuError::RevocationUnavailable);
}

#[test]
fn rejects_unknown_architecture() {
    let (c, mut g) = good();
    g.arch = "BLACKWELL".into();
    let t = appraise_one(&g, &c, &sim_policy());
    assert_eq!(t.error(C::EvidenceFormat), Some(&GpuError::UnsupportedArchitecture("BLACKWELL".into())), "{t}");
}

#[test]
fn devtools_report_counts_only_when_bound_to_signed_claims() {
    let (_, g) = good();
    // Bare evidence with a collector report that says "off": unauthenticated, so not a pass.
    let bare =
        appraise_gpus(std::slice::from_ref(&g), &GpuExpectations::default(), &sim_policy(), now()).gpus.remove(0);
    assert!(matches!(bare.outcome(C::DevTools), Some(Outcome::NotRun { .. })), "{bare}");
    let mut p = sim_policy();
    p.gpu.require_cc_settings = true;
    let strict = appraise_gpus(std::slice::from_ref(&g), &GpuExpectations::default(), &p, now()).gpus.remove(0);
    assert_eq!(strict.error(C::DevTools), Some(&GpuError::DevToolsMode), "{strict}");
}
