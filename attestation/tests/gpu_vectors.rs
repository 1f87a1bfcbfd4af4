//! Real NVIDIA Hopper evidence (`nvidia-*` vector sets): each reaches its
//! expected verdict for the stated reason, and flipping bits makes each
//! check fail. Vectors come from `$VEIL_VECTORS` or `../shared/vectors`;
//! absent vectors print SKIP, or fail under `VEIL_REQUIRE_VECTORS=1`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use veil_attestation::gpu::spdm::{SpdmMeasurements, SIGNATURE_LEN};
use veil_attestation::gpu::{evidence, GpuCheckId as C, GpuCheckReport, GpuError, GpuEvidence, Rim};
use veil_attestation::verify::Outcome;
use veil_attestation::verify::{appraise_gpus, verify_gpus, GpuExpectations};
use veil_attestation::x509::{parse_time, ParsedCert};
use veil_attestation::Policy;

fn vectors_dir() -> Option<PathBuf> {
    let candidates = std::env::var_os("VEIL_VECTORS")
        .map(PathBuf::from)
        .into_iter()
        .chain([Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/vectors")]);
    for c in candidates {
        if c.join("README.md").exists() {
            return Some(c);
        }
    }
    assert!(
        std::env::var("VEIL_REQUIRE_VECTORS").as_deref() != Ok("1"),
        "VEIL_REQUIRE_VECTORS=1 but no vectors at $VEIL_VECTORS or ../shared/vectors"
    );
    eprintln!("SKIP: real hardware vectors not found (set VEIL_VECTORS)");
    // Also on record for `.ci/run`'s summary (see `veil_tests::skip`).
    if let Some(f) = std::env::current_exe().ok().and_then(|e| Some(e.parent()?.parent()?.join("veil-skipped.txt"))) {
        use std::io::Write as _;
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(f) {
            let _ = writeln!(f, "gpu_vectors: real hardware vectors not found (set VEIL_VECTORS)");
        }
    }
    None
}

fn set(name: &str) -> Option<PathBuf> {
    let d = vectors_dir()?.join(name);
    assert!(d.is_dir(), "vector set {name} missing from the vectors directory");
    Some(d)
}

fn expected(dir: &Path, file: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join(file)).unwrap()).unwrap()
}

fn hex_pem(dir: &Path, report: &str, chain: &str) -> GpuEvidence {
    GpuEvidence::from_hex_and_pem(&std::fs::read(dir.join(report)).unwrap(), &std::fs::read(dir.join(chain)).unwrap())
        .unwrap()
}

fn nonce(hex_str: &str) -> [u8; 32] {
    hex::decode(hex_str).unwrap().try_into().unwrap()
}

/// Verification time inside every certificate's validity and before the sample RIMs' signer expiry.
fn at() -> SystemTime {
    parse_time("2025-01-01T00:00:00Z").unwrap()
}

fn table(g: &GpuEvidence, expect: &GpuExpectations<'_>, policy: &Policy, now: SystemTime) -> GpuCheckReport {
    let a = appraise_gpus(std::slice::from_ref(g), expect, policy, now);
    assert!(a.topology.is_none());
    a.gpus.into_iter().next().unwrap()
}

fn passed(t: &GpuCheckReport, c: C) -> bool {
    matches!(t.outcome(c), Some(Outcome::Passed { .. }))
}

fn not_run(t: &GpuCheckReport, c: C) -> bool {
    matches!(t.outcome(c), Some(Outcome::NotRun { .. }))
}

const CORE: [C; 6] = [C::EvidenceFormat, C::DeviceChain, C::ReportSignature, C::Fwid, C::Nonce, C::CcMode];

fn assert_fields(g: &GpuEvidence, e: &serde_json::Value) {
    let m = SpdmMeasurements::parse(&g.report).unwrap();
    assert_eq!(g.report.len() as u64, e["evidence_len"].as_u64().unwrap());
    assert_eq!(m.blocks.len() as u64, e["num_measurement_blocks"].as_u64().unwrap());
    assert_eq!(hex::encode(m.request_nonce), e["request_nonce_hex"].as_str().unwrap());
    assert_eq!(hex::encode(m.responder_nonce), e["responder_nonce_hex"].as_str().unwrap());
    assert_eq!(m.trailing_bytes as u64, e["trailing_bytes_after_signature"].as_u64().unwrap());
    assert_eq!(m.opaque.driver_version().unwrap(), e["driver_version"].as_str().unwrap());
    assert_eq!(m.opaque.vbios_version().unwrap(), e["vbios_version"].as_str().unwrap());
    assert_eq!(hex::encode(m.opaque.fwid().unwrap()), e["fwid_hex"].as_str().unwrap());
    let (project, sku, chip) = m.opaque.board();
    assert_eq!(project.unwrap(), e["project"].as_str().unwrap());
    assert_eq!(sku.unwrap(), e["project_sku"].as_str().unwrap());
    assert_eq!(chip.unwrap(), e["chip_sku"].as_str().unwrap());
    assert_eq!(
        format!("{:02x}", m.opaque.protected_pcie_status().unwrap()),
        e["protected_pcie_status"].as_str().unwrap()
    );
    let subjects: Vec<String> =
        g.cert_chain.iter().map(|d| ParsedCert::from_der(d).unwrap().common_name().unwrap()).collect();
    for (got, want) in subjects.iter().zip(e["cert_chain"].as_array().unwrap()) {
        assert!(want.as_str().unwrap().contains(&format!("CN={got}")), "{got} vs {want}");
    }
}

#[test]
fn nvtrust_accepts_with_its_nonce_and_decodes_every_field() {
    let Some(d) = set("nvidia-h100-nvtrust") else { return };
    let e = expected(&d, "expected.json");
    let g = hex_pem(&d, "attestation_report.hex", "cert_chain.pem");
    assert_fields(&g, &e);
    let expect = GpuExpectations { nonce: Some(nonce(e["request_nonce_hex"].as_str().unwrap())), ..Default::default() };
    for now in [at(), SystemTime::now()] {
        let t = table(&g, &expect, &Policy::default(), now);
        for c in CORE {
            assert!(passed(&t, c), "{c}: {t}");
        }
        // No RIM, no claims, no collector report: shown as not run, never as passed.
        for c in [C::EvidenceBinding, C::DevTools, C::RimMeasurements, C::RimSignature] {
            assert!(not_run(&t, c), "{c}: {t}");
        }
        assert!(t.accepted(), "{t}");
    }
    verify_gpus(std::slice::from_ref(&g), &expect, &Policy::default(), at()).unwrap();
}

#[test]
fn nvtrust_sample_rim_is_for_another_vbios() {
    let Some(d) = set("nvidia-h100-nvtrust") else { return };
    let g = hex_pem(&d, "attestation_report.hex", "cert_chain.pem");
    let rim = Rim::parse(
        &std::fs::read(d.join("rim-samples-nonmatching/NV_GPU_VBIOS_1010_0200_882_96005E0001_PROD.swidtag")).unwrap(),
    )
    .unwrap();
    assert_eq!(rim.version, "96.00.5E.00.01");
    assert!(rim.has_signature);
    let t = table(
        &g,
        &GpuExpectations { rims: std::slice::from_ref(&rim), ..Default::default() },
        &Policy::default(),
        at(),
    );
    assert!(
        matches!(t.error(C::RimMeasurements), Some(GpuError::RimNotForThisGpu { rim_version, vbios, .. })
            if rim_version == "96.00.5E.00.01" && vbios == "96.00.9F.00.01"),
        "{t}"
    );
    // A genuine NVIDIA RIM (its signature verifies), just not for this GPU.
    assert!(passed(&t, C::RimSignature), "{t}");
}

#[test]
fn coco_accepts_despite_one_trailing_byte() {
    let Some(d) = set("nvidia-h100-coco-trustee") else { return };
    let e = expected(&d, "expected.json");
    let g = hex_pem(&d, "attestation_report.hex", "cert_chain.pem");
    assert_fields(&g, &e);
    let m = SpdmMeasurements::parse(&g.report).unwrap();
    assert_eq!(m.trailing_bytes, 1);
    assert_eq!(m.opaque.opaque_data_version(), Some(1));
    assert_eq!(m.opaque.feature_flag(), Some(0));
    // The naive reading (signature = last 96 bytes) does not verify; parsing by lengths does.
    let leaf = ParsedCert::from_der(&g.cert_chain[0]).unwrap();
    let n = g.report.len();
    let naive: [u8; SIGNATURE_LEN] = g.report[n - SIGNATURE_LEN..].try_into().unwrap();
    assert!(leaf.verify_p384_fixed(&g.report[..n - SIGNATURE_LEN], &naive).is_err());
    let expect = GpuExpectations { nonce: Some(nonce(e["request_nonce_hex"].as_str().unwrap())), ..Default::default() };
    let t = table(&g, &expect, &Policy::default(), at());
    for c in CORE {
        assert!(passed(&t, c), "{c}: {t}");
    }
    assert!(t.accepted(), "{t}");
}

#[test]
fn coco_rim_mismatches_at_index_9() {
    let Some(d) = set("nvidia-h100-coco-trustee") else { return };
    let g = hex_pem(&d, "attestation_report.hex", "cert_chain.pem");
    let rim =
        Rim::parse(&std::fs::read(d.join("rim/NV_GPU_VBIOS_1010_0200_882_960074001A_PROD.swidtag")).unwrap()).unwrap();
    assert_eq!(rim.version, "96.00.74.00.1A");
    assert_eq!(rim.active_indices().count(), 12);
    let rims = [rim];
    let t = table(&g, &GpuExpectations { rims: &rims, ..Default::default() }, &Policy::default(), at());
    assert_eq!(t.error(C::RimMeasurements), Some(&GpuError::RimMismatch { index: 9 }), "{t}");
    // The RIM itself is authentic at that time: its XML signature verifies to the NVIDIA RIM root.
    assert!(passed(&t, C::RimSignature), "{t}");
    // Today its L4 signer has expired (2025-09-05).
    let late = table(
        &g,
        &GpuExpectations { rims: &rims, ..Default::default() },
        &Policy::default(),
        parse_time("2026-01-01").unwrap(),
    );
    assert!(
        matches!(late.error(C::RimSignature), Some(GpuError::RimSignatureInvalid(m)) if m.contains("expired")),
        "{late}"
    );
    let Some(Outcome::Failed { expected, actual }) = t.outcome(C::RimMeasurements) else { panic!("{t}") };
    assert!(expected.contains("7f3e9382") && expected.contains("SPDM block 10"), "{expected}");
    assert!(actual.starts_with("059b32e7") && actual.contains("1 of 12"), "{actual}");
    // With the mismatching index's golden value replaced by the report's, the other 11 match.
    let mut fixed = rims[0].clone();
    let m = SpdmMeasurements::parse(&g.report).unwrap();
    fixed.measurements.get_mut(&9).unwrap().alternatives = vec![m.block(10).unwrap().value.clone()];
    let t = table(
        &g,
        &GpuExpectations { rims: std::slice::from_ref(&fixed), ..Default::default() },
        &Policy::default(),
        at(),
    );
    assert!(passed(&t, C::RimMeasurements), "{t}");
    // …but an edited golden value is no longer what NVIDIA signed.
    assert!(matches!(t.error(C::RimSignature), Some(GpuError::RimSignatureInvalid(_))), "{t}");
    // The policy may require both RIMs: the driver RIM is not available offline.
    let mut p = Policy::default();
    p.gpu.require_rim = true;
    let t = table(&g, &GpuExpectations { rims: std::slice::from_ref(&fixed), ..Default::default() }, &p, at());
    assert_eq!(t.error(C::RimMeasurements), Some(&GpuError::RimUnavailable), "{t}");
}

#[test]
fn nvsdk_invalid_signature_is_rejected_at_the_signature_check() {
    let Some(d) = set("nvidia-hopper-negative-nvsdk") else { return };
    let e = expected(&d, "expected_invalid_signature.json");
    let g = hex_pem(&d, "invalid_signature_report.hex", "invalid_signature_cert_chain.pem");
    assert_fields(&g, &e);
    let expect = GpuExpectations { nonce: Some(nonce(e["request_nonce_hex"].as_str().unwrap())), ..Default::default() };
    let t = table(&g, &expect, &Policy::default(), at());
    assert!(passed(&t, C::DeviceChain), "{t}");
    assert_eq!(t.first_failed().unwrap().check, C::ReportSignature, "{t}");
    assert_eq!(t.error(C::ReportSignature), Some(&GpuError::GpuReportSignatureInvalid));
    assert_eq!(t.error(C::Fwid), Some(&GpuError::FwidMismatch));
    let err = verify_gpus(std::slice::from_ref(&g), &expect, &Policy::default(), at()).unwrap_err();
    assert!(err.to_string().contains("gpu_report_signature"), "{err}");
}

#[test]
fn nvsdk_cert_hold_sdk_json_accepts_offline_only() {
    let Some(d) = set("nvidia-hopper-negative-nvsdk") else { return };
    let e = expected(&d, "expected_cert_hold.json");
    let gpus = evidence::load_any(&std::fs::read(d.join("cert_hold_evidence.json")).unwrap(), None).unwrap();
    assert_eq!(gpus.len(), 1);
    assert_fields(&gpus[0], &e);
    let expect = GpuExpectations { nonce: Some(nonce(e["request_nonce_hex"].as_str().unwrap())), ..Default::default() };
    verify_gpus(&gpus, &expect, &Policy::default(), at()).unwrap();
    // The driver RIM's signing chain is revoked (certificateHold): only OCSP shows it. A policy that
    // requires revocation data fails closed, since this verifier has none.
    let mut p = Policy::default();
    p.gpu.require_revocation = true;
    let t = table(&gpus[0], &expect, &p, at());
    assert_eq!(t.error(C::Revocation), Some(&GpuError::RevocationUnavailable), "{t}");
}

// ---- bit flips on real evidence: each check can fail ----

fn nvtrust() -> Option<(GpuEvidence, [u8; 32])> {
    let d = set("nvidia-h100-nvtrust")?;
    let e = expected(&d, "expected.json");
    Some((hex_pem(&d, "attestation_report.hex", "cert_chain.pem"), nonce(e["request_nonce_hex"].as_str().unwrap())))
}

#[test]
fn flipping_any_signed_region_breaks_the_signature() {
    let Some((g, n)) = nvtrust() else { return };
    let expect = GpuExpectations { nonce: Some(n), ..Default::default() };
    let m = SpdmMeasurements::parse(&g.report).unwrap();
    let signed = m.signed_bytes().len();
    // A measurement value byte, a responder-nonce byte, the last opaque byte (protected-PCIe status), a signature byte.
    for at_byte in [37 + 8 + 7 + 10, signed - 424 - 10, signed - 1, signed + 10] {
        let mut bad = g.clone();
        bad.report[at_byte] ^= 0x01;
        let t = table(&bad, &expect, &Policy::default(), at());
        assert_eq!(t.error(C::ReportSignature), Some(&GpuError::GpuReportSignatureInvalid), "byte {at_byte}: {t}");
    }
    // The request nonce is signed too, and it is what the nonce check reads.
    let mut bad = g.clone();
    bad.report[4] ^= 0x80;
    let t = table(&bad, &expect, &Policy::default(), at());
    assert_eq!(t.error(C::ReportSignature), Some(&GpuError::GpuReportSignatureInvalid));
    assert_eq!(t.error(C::Nonce), Some(&GpuError::NonceMismatch));
}

#[test]
fn wrong_expected_nonce_fails_the_nonce_check_only() {
    let Some((g, mut n)) = nvtrust() else { return };
    n[31] ^= 1;
    let t = table(&g, &GpuExpectations { nonce: Some(n), ..Default::default() }, &Policy::default(), at());
    assert_eq!(t.failures(), vec![C::Nonce], "{t}");
}

#[test]
fn reordered_truncated_or_foreign_chains_fail_the_chain_check() {
    let Some((g, n)) = nvtrust() else { return };
    let expect = GpuExpectations { nonce: Some(n), ..Default::default() };
    let mut swapped = g.clone();
    swapped.cert_chain.swap(1, 2);
    let mut short = g.clone();
    short.cert_chain.pop();
    let mut p = Policy::default();
    // A foreign root: the coco-trustee RIM root (a real NVIDIA root, but not the device root).
    if let Some(d) = set("nvidia-h100-nvtrust") {
        p.gpu.root_pem = Some(std::fs::read_to_string(d.join("nvidia_rim_root.pem")).unwrap());
    }
    for (bad, policy) in [(&swapped, &Policy::default()), (&short, &Policy::default()), (&g, &p)] {
        let t = table(bad, &expect, policy, at());
        assert!(matches!(t.error(C::DeviceChain), Some(GpuError::ChainInvalid(_))), "{t}");
    }
    // Before the leaf's notBefore the chain is not valid.
    let t = table(&g, &expect, &Policy::default(), parse_time("2020-01-01").unwrap());
    assert!(
        matches!(t.error(C::DeviceChain), Some(GpuError::ChainInvalid(e)) if e.to_string().contains("not valid before")),
        "{t}"
    );
}

#[test]
fn policy_minimums_and_requirements_fail_on_real_evidence() {
    let Some((g, n)) = nvtrust() else { return };
    let expect = GpuExpectations { nonce: Some(n), ..Default::default() };
    let mut p = Policy::default();
    p.gpu.min_driver_version = Some("550.127.05".into());
    p.gpu.min_vbios_version = Some("96.00.A0.00.01".into());
    p.gpu.require_protected_pcie = true;
    p.gpu.require_rim_signature = true;
    p.gpu.require_cc_settings = true;
    let t = table(&g, &expect, &p, at());
    assert_eq!(
        t.error(C::DriverVersion),
        Some(&GpuError::DriverTooOld { got: "550.90.07".into(), min: "550.127.05".into() })
    );
    assert_eq!(
        t.error(C::VbiosVersion),
        Some(&GpuError::VbiosTooOld { got: "96.00.9F.00.01".into(), min: "96.00.A0.00.01".into() })
    );
    assert_eq!(t.error(C::ProtectedPcie), Some(&GpuError::ProtectedPcieOff));
    assert_eq!(t.error(C::RimSignature), Some(&GpuError::RimSignatureNotVerified));
    assert_eq!(t.error(C::DevTools), Some(&GpuError::DevToolsMode));
    // The same minimums met.
    let mut p = Policy::default();
    p.gpu.min_driver_version = Some("550.54.14".into());
    p.gpu.min_vbios_version = Some("96.00.5E.00.01".into());
    let t = table(&g, &expect, &p, at());
    assert!(passed(&t, C::DriverVersion) && passed(&t, C::VbiosVersion), "{t}");
}

#[test]
fn every_truncation_of_real_evidence_is_a_typed_format_failure() {
    let Some((g, _)) = nvtrust() else { return };
    for len in (0..g.report.len() - SIGNATURE_LEN + 1).step_by(7) {
        let mut bad = g.clone();
        bad.report.truncate(len);
        let t = table(&bad, &GpuExpectations::default(), &Policy::default(), at());
        assert!(matches!(t.error(C::EvidenceFormat), Some(GpuError::Malformed(_))), "{len}: {t}");
        assert!(not_run(&t, C::ReportSignature));
    }
}

#[test]
fn rim_xml_signatures_verify_before_signer_expiry_and_fail_after_or_when_edited() {
    use veil_attestation::gpu::xmldsig::{nvidia_rim_root, verify_rim_signature, XmlDsigError};
    let root = nvidia_rim_root().unwrap();
    let mut seen = 0;
    for (name, file) in [
        ("nvidia-h100-coco-trustee", "rim/NV_GPU_VBIOS_1010_0200_882_960074001A_PROD.swidtag"),
        ("nvidia-h100-nvtrust", "rim-samples-nonmatching/NV_GPU_VBIOS_1010_0200_882_96005E0001_PROD.swidtag"),
    ] {
        let Some(d) = set(name) else { return };
        let xml = std::fs::read(d.join(file)).unwrap();
        let signer = verify_rim_signature(&xml, &root, at()).unwrap();
        assert!(signer.contains("RIM"), "{signer}");
        // After the L4 signer's notAfter the chain is no longer valid.
        let late = verify_rim_signature(&xml, &root, parse_time("2026-01-01").unwrap()).unwrap_err();
        assert!(matches!(&late, XmlDsigError::Chain(m) if m.contains("expired")), "{late}");
        // One golden value edited: the digest no longer matches.
        let text = String::from_utf8(xml.clone()).unwrap();
        let i = text.find("Hash0=\"").unwrap() + 7;
        let mut edited = text.into_bytes();
        edited[i] = if edited[i] == b'0' { b'1' } else { b'0' };
        assert_eq!(verify_rim_signature(&edited, &root, at()), Err(XmlDsigError::DigestMismatch));
        // The SignatureValue altered: the signature fails.
        let text = String::from_utf8(xml).unwrap();
        let i = text.find("<ds:SignatureValue>").unwrap() + 20;
        let mut edited = text.into_bytes();
        edited[i] = if edited[i] == b'A' { b'B' } else { b'A' };
        assert_eq!(verify_rim_signature(&edited, &root, at()), Err(XmlDsigError::BadSignature));
        seen += 1;
    }
    assert_eq!(seen, 2);
}

/// Issue 55 item 11: NVIDIA's signed RIM travels in a shard's bundle (the
/// host fetched it; the report does not commit to it), survives the bundle's
/// JSON byte for byte, and is what the verifier compares: its XML signature
/// verifies to NVIDIA's RIM root while the signer is valid and fails by name
/// after, and its golden values are compared with the GPU's (a simulated
/// GPU with this RIM's VBIOS version: they differ, at the first VBIOS index).
#[test]
fn an_nvidia_rim_carried_in_a_shard_bundle_is_verified_and_compared() {
    use veil_attestation::attester::gpu::simulated::{SimulatedGpu, SimulatedGpuConfig};
    use veil_attestation::attester::gpu::{CompositeAttester, GpuReference, GpuSource};
    use veil_attestation::simulated::{SimulatedAttester, SimulatedConfig};
    use veil_attestation::{Attester as _, Claims, Error, EvidenceBundle, ExpectedClaims};
    let Some(d) = set("nvidia-h100-coco-trustee") else { return };
    let rim = std::fs::read(d.join("rim/NV_GPU_VBIOS_1010_0200_882_960074001A_PROD.swidtag")).unwrap();
    let root = || {
        let config = SimulatedConfig::new(veil_attestation::snp::Product::Genoa, b"carried RIM test");
        SimulatedAttester::from_seed(b"carried RIM root", config).unwrap()
    };
    // VBIOS 96.00.74.00.1A, as the RIM's colloquialVersion reads.
    let config = SimulatedGpuConfig { vbios: [0x00, 0x74, 0x00, 0x96, 0x1A, 0, 0, 0], ..Default::default() };
    let gpu = SimulatedGpu::from_seed(b"carried RIM gpu", config).unwrap();
    let shard = CompositeAttester::new(Box::new(root()), GpuSource::Simulated(vec![gpu]))
        .unwrap()
        .carrying(GpuReference { rims: vec![rim.clone()], ocsp: Vec::new() })
        .unwrap();
    let bundle = shard.evidence(&Claims { software_version: "test".into(), ..Claims::default() }).unwrap();
    let bundle = EvidenceBundle::from_json(bundle.to_json().as_bytes()).unwrap();
    assert_eq!(bundle.gpu_rims, vec![rim]);
    let mut policy = root().dev_policy().unwrap();
    policy.gpu.require_rim_signature = true;
    let gpu_table = |now: SystemTime| match veil_attestation::verify(&bundle, &policy, &ExpectedClaims::default(), now)
    {
        Err(Error::Rejected(r)) => r.gpu.unwrap().appraisal.gpus.into_iter().next().unwrap(),
        other => panic!("{other:?}"),
    };
    let t = gpu_table(at());
    assert!(passed(&t, C::RimSignature), "{t}");
    assert!(matches!(t.error(C::RimMeasurements), Some(GpuError::RimMismatch { .. })), "{t}");
    let Some(Outcome::Failed { expected, .. }) = t.outcome(C::RimMeasurements) else { panic!("{t}") };
    assert!(expected.starts_with("VBIOS RIM index"), "{expected}");
    let late = gpu_table(parse_time("2026-01-01").unwrap());
    assert!(
        matches!(late.error(C::RimSignature), Some(GpuError::RimSignatureInvalid(m)) if m.contains("expired")),
        "{late}"
    );
    // A carrier that flips one byte of the signed document breaks its signature.
    let mut edited = bundle.clone();
    let at_byte = edited.gpu_rims[0].len() / 2;
    edited.gpu_rims[0][at_byte] ^= 0x01;
    match veil_attestation::verify(&edited, &policy, &ExpectedClaims::default(), at()) {
        Err(Error::Rejected(r)) => {
            let t = r.gpu.unwrap().appraisal.gpus.into_iter().next().unwrap();
            assert!(!passed(&t, C::RimSignature), "{t}");
        }
        // Or it is no longer a RIM at all.
        Err(Error::Malformed(m)) => assert!(m.to_string().starts_with("gpu_rims[0]"), "{m}"),
        other => panic!("{other:?}"),
    }
}
