//! Real SEV-SNP hardware vectors: each must reach exactly its expected
//! verdict, for the stated reason.

use veil_attestation::snp::{Product, SigningKey, SnpReport, SIGNED_LEN};
use veil_attestation::verify::RootKind;
use veil_attestation::x509::parse_time;
use veil_attestation::{appraise, verify, CheckId, ExpectedClaims, Outcome, Policy, ReportData};
use veil_tests::{test_now, Vector};

/// Every real SEV-SNP set in the vectors directory.
const SNP_SETS: [&str; 7] = [
    "snp-milan-virtee",
    "snp-turin-tinfoil",
    "snp-genoa-azure-trustee",
    "snp-milan-trustee",
    "snp-milan-dstack",
    "snp-milan-debug-gosev",
    "snp-milan-vlek-aws-trustee",
];

fn failures(v: &Vector, bundle: &veil_attestation::EvidenceBundle, policy: &Policy) -> Vec<CheckId> {
    let _ = v;
    appraise(bundle, policy, &ExpectedClaims::default(), test_now()).checks.failures()
}

#[test]
fn milan_virtee_accepts() {
    let Some(v) = Vector::load("snp-milan-virtee") else { return };
    for chain in [None, Some("ask_ark_milan.pem")] {
        let ok = verify(&v.bundle(chain), &v.pinned_policy(), &ExpectedClaims::default(), test_now()).unwrap();
        assert_eq!(ok.product(), Product::Milan);
        assert_eq!(ok.signer(), SigningKey::Vcek);
        assert!(!ok.is_simulated());
        // No claims and no expected REPORT_DATA: binding shows as not run.
        assert!(matches!(ok.checks().outcome(CheckId::ReportDataBinding), Some(Outcome::NotRun { .. })));
        let tcb = ok.reported_tcb();
        assert_eq!((tcb.bootloader, tcb.tee, tcb.snp, tcb.microcode), (3, 0, 8, 115));
    }
}

/// Issue 23: a genuine Turin v5 report (Tinfoil's production box, firmware
/// 1.58), signed by its VCEK, with PLATFORM_INFO 0x64: accepted by a policy
/// that pins only its measurement, with bit 6 named IOMMU_WRITE_SAFE and no
/// warning; the Turin TCB layout and 8-byte chip id decoded; its
/// REPORT_DATA pinned; one flipped bit in the measurement or a Genoa chain
/// refused by the named check.
#[test]
fn turin_tinfoil_accepts_with_a_default_policy() {
    let Some(v) = Vector::load("snp-turin-tinfoil") else { return };
    let policy = Policy { allow_smt: true, ..v.pinned_policy() };
    for chain in [None, Some("ask_ark_turin.pem")] {
        let ok = verify(&v.bundle(chain), &policy, &ExpectedClaims::default(), test_now())
            .unwrap_or_else(|e| panic!("the real Turin report was refused: {e}\n{}", table_of(&e)));
        assert_eq!(ok.product(), Product::Turin);
        assert_eq!(ok.signer(), SigningKey::Vcek);
        assert!(!ok.is_simulated());
        assert_eq!(ok.report().version(), 5);
        assert_eq!(ok.report().platform_info().0, 0x64);
        match ok.checks().outcome(CheckId::PlatformInfo) {
            Some(Outcome::Passed { detail }) => {
                assert!(detail.contains("IOMMU_WRITE_SAFE"), "{detail}");
            }
            other => panic!("platform_info on real Turin: {other:?}"),
        }
        assert!(ok.checks().warned().is_empty(), "{}", ok.checks());
        assert!(!ok.checks().any_simulated());
        let tcb = ok.reported_tcb();
        assert_eq!((tcb.fmc, tcb.bootloader, tcb.tee, tcb.snp, tcb.microcode), (Some(1), 1, 1, 4, 82));
    }
    // Also under a policy that refuses unknown PLATFORM_INFO bits: 0x64 has none.
    let mut strict = policy.clone();
    strict.platform.refuse_unknown_platform_bits = true;
    verify(&v.bundle(None), &strict, &ExpectedClaims::default(), test_now()).unwrap();
    let rd = ReportData::from_hex_padded(v.expected["report_data_hex"].as_str().unwrap()).unwrap();
    let exp = ExpectedClaims { report_data: Some(rd), ..Default::default() };
    verify(&v.bundle(None), &policy, &exp, test_now()).unwrap();
    let mut bad = v.bundle(None);
    bad.report[0x90] ^= 1;
    let err = verify(&bad, &policy, &ExpectedClaims::default(), test_now()).unwrap_err();
    assert_eq!(err.check(), Some(CheckId::ReportSignature), "{err}");
    let genoa = Vector::load("snp-genoa-azure-trustee").unwrap();
    let mut wrong_chain = v.bundle(None);
    wrong_chain.chain = genoa.chain_der("ask_ark_genoa.pem");
    let err = verify(&wrong_chain, &policy, &ExpectedClaims::default(), test_now()).unwrap_err();
    assert_eq!(err.check(), Some(CheckId::EndorsementChain), "{err}");
}

fn table_of(e: &veil_attestation::Error) -> String {
    match e {
        veil_attestation::Error::Rejected(r) => r.report.to_string(),
        other => other.to_string(),
    }
}

#[test]
fn milan_virtee_report_data_pin() {
    let Some(v) = Vector::load("snp-milan-virtee") else { return };
    let rd = ReportData::from_hex_padded(v.expected["report_data_hex"].as_str().unwrap()).unwrap();
    let exp = ExpectedClaims { report_data: Some(rd), ..Default::default() };
    let ok = verify(&v.bundle(None), &v.pinned_policy(), &exp, test_now()).unwrap();
    assert!(matches!(ok.checks().outcome(CheckId::ReportDataBinding), Some(Outcome::Passed { .. })));
    let mut wrong = rd;
    wrong.0[0] ^= 1;
    let exp = ExpectedClaims { report_data: Some(wrong), ..Default::default() };
    let err = verify(&v.bundle(None), &v.pinned_policy(), &exp, test_now()).unwrap_err();
    assert_eq!(err.check(), Some(CheckId::ReportDataBinding));
}

#[test]
fn our_parser_agrees_with_the_sev_crate() {
    use sev_parser_check::compare;
    for name in SNP_SETS {
        let Some(v) = Vector::load(name) else { return };
        compare(&v.read("report.bin"));
    }
}

mod sev_parser_check {
    use super::*;
    pub(super) fn compare(bytes: &[u8]) {
        use sev::parser::ByteParser;
        let theirs = sev::firmware::guest::AttestationReport::from_bytes(bytes).unwrap();
        let ours = SnpReport::from_bytes(bytes).unwrap();
        assert_eq!(theirs.version, ours.version());
        assert_eq!(theirs.vmpl, ours.vmpl());
        assert_eq!(theirs.measurement, ours.measurement());
        assert_eq!(theirs.report_data, ours.report_data());
        assert_eq!(theirs.chip_id, ours.chip_id());
        assert_eq!(theirs.host_data, ours.host_data());
        assert_eq!(theirs.id_key_digest, ours.id_key_digest());
        assert_eq!(theirs.policy.0, ours.policy().0);
        assert_eq!(theirs.cpuid_fam_id, ours.cpuid().map(|c| c.family));
        // sev decodes v2 reports with the Genoa/Turin layout; Milan shares Genoa's.
        let product = ours.product_hint().unwrap_or(Product::Milan);
        let tcb = ours.reported_tcb().decode(product);
        assert_eq!(
            (
                theirs.reported_tcb.bootloader,
                theirs.reported_tcb.tee,
                theirs.reported_tcb.snp,
                theirs.reported_tcb.microcode
            ),
            (tcb.bootloader, tcb.tee, tcb.snp, tcb.microcode)
        );
    }
}

#[test]
fn genoa_azure_accepts_and_refuses_milan_chain() {
    let Some(v) = Vector::load("snp-genoa-azure-trustee") else { return };
    for chain in [None, Some("ask_ark_genoa.pem")] {
        let ok = verify(&v.bundle(chain), &v.pinned_policy(), &ExpectedClaims::default(), test_now()).unwrap();
        assert_eq!(ok.product(), Product::Genoa);
    }
    // The Milan ASK/ARK must not endorse a Genoa VCEK.
    let milan = Vector::load("snp-milan-virtee").unwrap();
    let mut bundle = v.bundle(None);
    bundle.chain = milan.chain_der("ask_ark_milan.pem");
    let err = verify(&bundle, &v.pinned_policy(), &ExpectedClaims::default(), test_now()).unwrap_err();
    assert_eq!(err.check(), Some(CheckId::EndorsementChain));
}

#[test]
fn genoa_azure_report_data_binds_runtime_claims() {
    let Some(v) = Vector::load("snp-genoa-azure-trustee") else { return };
    // report_data[0..32] = SHA-256(runtime claims JSON inside the HCL report).
    use sha2::Digest;
    let hcl = v.read("azure_hcl_report.bin");
    let len = u32::from_le_bytes(hcl[0x4C0 + 16..0x4C0 + 20].try_into().unwrap()) as usize;
    let json = &hcl[0x4C0 + 20..0x4C0 + 20 + len];
    let digest = sha2::Sha256::digest(json);
    let report = SnpReport::from_bytes(&v.read("report.bin")).unwrap();
    assert_eq!(&report.report_data()[..32], &digest[..]);
    assert_eq!(&hcl[0x20..0x20 + 1184], v.read("report.bin").as_slice());
}

#[test]
fn milan_trustee_accepts_and_forged_vceks_fail() {
    let Some(v) = Vector::load("snp-milan-trustee") else { return };
    let mut policy = v.pinned_policy();
    policy.id_key_digest = Some(v.expected["id_key_digest_hex"].as_str().unwrap().parse().unwrap());
    let ok = verify(&v.bundle(Some("ask_ark_milan.pem")), &policy, &ExpectedClaims::default(), test_now()).unwrap();
    assert!(matches!(ok.checks().outcome(CheckId::IdKeyDigest), Some(Outcome::Passed { .. })));
    for forged in ["negative/vcek-forged-legacy.der", "negative/vcek-forged-new.der"] {
        let mut bundle = v.bundle(None);
        bundle.endorsement = v.read(forged);
        let fails = failures(&v, &bundle, &policy);
        assert!(fails.contains(&CheckId::EndorsementChain), "{forged}: {fails:?}");
        assert!(fails.contains(&CheckId::ReportSignature), "{forged}: {fails:?}");
    }
}

#[test]
fn milan_dstack_signature_valid_but_tcb_out_of_date() {
    let Some(v) = Vector::load("snp-milan-dstack") else { return };
    let mut policy = v.pinned_policy();
    policy.host_data =
        Some(veil_attestation::policy::HostData(v.expected["host_data_hex"].as_str().unwrap().parse().unwrap()));
    // Permissive on TCB: accepted (reported TCB is what the VCEK certifies).
    verify(&v.bundle(None), &policy, &ExpectedClaims::default(), test_now()).unwrap();
    // Strict minimum snp >= 24 (the platform's current TCB): rejected on TCB alone.
    policy.min_tcb.insert(Product::Milan, veil_attestation::policy::TcbMinimum { snp: Some(24), ..Default::default() });
    let fails = failures(&v, &v.bundle(None), &policy);
    assert_eq!(fails, vec![CheckId::TcbMinimum]);
}

#[test]
fn milan_debug_rejected_for_debug_only() {
    let Some(v) = Vector::load("snp-milan-debug-gosev") else { return };
    let policy = v.pinned_policy();
    assert_eq!(failures(&v, &v.bundle(None), &policy), vec![CheckId::Debug]);
    let permissive = Policy { allow_debug: true, ..policy };
    verify(&v.bundle(None), &permissive, &ExpectedClaims::default(), test_now()).unwrap();
}

#[test]
fn aws_vlek_rejected_now_accepted_when_valid_and_allowed() {
    let Some(v) = Vector::load("snp-milan-vlek-aws-trustee") else { return };
    let bundle = v.bundle(Some("asvk_ark_milan.pem"));
    // Default: VLEK not allowed.
    let err = verify(&bundle, &v.pinned_policy(), &ExpectedClaims::default(), test_now()).unwrap_err();
    assert_eq!(err.check(), Some(CheckId::EndorsementChain));
    assert!(err.to_string().contains("VLEK"), "{err}");
    // VLEK allowed, VMPL 1 allowed, but the certificate expired on 2025-12-10.
    let policy = Policy { allow_vlek: true, vmpl: 1, ..v.pinned_policy() };
    let err = verify(&bundle, &policy, &ExpectedClaims::default(), test_now()).unwrap_err();
    assert_eq!(err.check(), Some(CheckId::EndorsementChain));
    assert!(err.to_string().contains("expired"), "{err}");
    // While it was valid, it is accepted.
    let then = parse_time("2025-06-01T00:00:00Z").unwrap();
    let ok = verify(&bundle, &policy, &ExpectedClaims::default(), then).unwrap();
    assert_eq!(ok.signer(), SigningKey::Vlek);
    assert!(matches!(ok.checks().outcome(CheckId::ChipId), Some(Outcome::Skipped { .. })));
    // VMPL 0 required: rejected on VMPL.
    let strict_vmpl = Policy { vmpl: 0, ..policy };
    let a = appraise(&bundle, &strict_vmpl, &ExpectedClaims::default(), then);
    assert_eq!(a.checks.failures(), vec![CheckId::Vmpl]);
}

#[test]
fn every_signed_bit_flip_fails_the_signature() {
    let Some(v) = Vector::load("snp-milan-virtee") else { return };
    let bundle = v.bundle(None);
    let vcek = veil_attestation::snp::Endorsement::parse(&bundle.endorsement).unwrap();
    let original = SnpReport::from_bytes(&bundle.report).unwrap();
    assert!(veil_attestation::verify::check_signature(&original, &vcek).is_ok());
    // Flips across the signed region and the signature itself.
    for byte in (0..SIGNED_LEN).chain(0x2A0..0x2A0 + 48).chain(0x2E8..0x2E8 + 48) {
        for bit in 0..8 {
            let mut raw = bundle.report.clone();
            raw[byte] ^= 1 << bit;
            let flipped = SnpReport::from_bytes(&raw).unwrap();
            assert!(
                veil_attestation::verify::check_signature(&flipped, &vcek).is_err(),
                "flip of byte {byte:#x} bit {bit} was not caught by the signature check"
            );
        }
    }
    // And through the full verifier, a sample of flips names the signature check.
    let policy = v.pinned_policy();
    for byte in [0x50, 0x90, 0x1A0, 0x29F] {
        let mut b = bundle.clone();
        b.report[byte] ^= 0x80;
        let a = appraise(&b, &policy, &ExpectedClaims::default(), test_now());
        assert!(matches!(a.checks.outcome(CheckId::ReportSignature), Some(Outcome::Failed { .. })));
    }
}

#[test]
fn vectors_agree_with_expected_json() {
    for name in SNP_SETS {
        let Some(v) = Vector::load(name) else { return };
        let r = SnpReport::from_bytes(&v.read("report.bin")).unwrap();
        let e = &v.expected;
        assert_eq!(u64::from(r.version()), e["report_version"].as_u64().unwrap(), "{name}");
        assert_eq!(u64::from(r.vmpl()), e["vmpl"].as_u64().unwrap(), "{name}");
        assert_eq!(hex::encode(r.measurement()), e["measurement_hex"].as_str().unwrap(), "{name}");
        assert_eq!(hex::encode(r.chip_id()), e["chip_id_hex"].as_str().unwrap(), "{name}");
        assert_eq!(r.policy().debug_allowed(), e["policy_debug"].as_bool().unwrap(), "{name}");
        let product = Product::from_product_name(e["product"].as_str().unwrap()).unwrap();
        let tcb = r.reported_tcb().decode(product);
        assert_eq!(u64::from(tcb.snp), e["reported_tcb"]["snp"].as_u64().unwrap(), "{name}");
        assert_eq!(u64::from(tcb.microcode), e["reported_tcb"]["microcode"].as_u64().unwrap(), "{name}");
        assert_eq!(r.current_version().to_string(), e["firmware_version"].as_str().unwrap(), "{name}");
        let signer = if e["signing_key"] == "VLEK" { SigningKey::Vlek } else { SigningKey::Vcek };
        assert_eq!(r.key_info().signing_key(), signer, "{name}");
    }
}

#[test]
fn amd_roots_match_vector_fingerprints() {
    let Some(v) = Vector::load("snp-milan-virtee") else { return };
    let ark = Product::Milan.amd_ark();
    use sha2::Digest;
    assert_eq!(hex::encode(sha2::Sha256::digest(ark.der())), v.expected["ark_cert_der_sha256"].as_str().unwrap());
    let g = Vector::load("snp-genoa-azure-trustee").unwrap();
    assert_eq!(hex::encode(Product::Genoa.amd_ark().spki_sha256()), g.expected["ark_spki_sha256"].as_str().unwrap());
    let _ = RootKind::Amd;
}

/// The `sev` crate ships a Milan report and a Turin VCEK in its own tests;
/// reach them in the local cargo registry when it is there.
fn sev_crate_testdata() -> Option<std::path::PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cargo")))?;
    let src = std::fs::read_dir(home.join("registry/src")).ok()?;
    for index in src.flatten() {
        let Ok(crates) = std::fs::read_dir(index.path()) else { continue };
        for c in crates.flatten() {
            let name = c.file_name().to_string_lossy().into_owned();
            let dir = c.path().join("tests/certs_data");
            if name.starts_with("sev-8.") && dir.join("report_milan.hex").exists() {
                return Some(dir);
            }
        }
    }
    // The sev crate is a dependency, so its sources (tests included) are in
    // the registry of any machine that built this; CI requires them.
    assert!(
        std::env::var("VEIL_REQUIRE_VECTORS").as_deref() != Ok("1"),
        "VEIL_REQUIRE_VECTORS=1 but the sev crate's test data is not in the cargo registry"
    );
    veil_tests::skip("sev crate test data not found in the cargo registry");
    None
}

#[test]
fn sev_crate_milan_report_accepts() {
    let Some(dir) = sev_crate_testdata() else { return };
    let hex_text = std::fs::read_to_string(dir.join("report_milan.hex")).unwrap();
    let bundle = veil_attestation::EvidenceBundle {
        report: hex::decode(hex_text.trim()).unwrap(),
        endorsement: std::fs::read(dir.join("vcek_milan.der")).unwrap(),
        chain: vec![],
        crl: None,
        claims: None,
        gpus: Vec::new(),
        gpu_rims: Vec::new(),
        gpu_ocsp: Vec::new(),
    };
    let report = SnpReport::from_bytes(&bundle.report).unwrap();
    let policy =
        Policy { measurements: vec![veil_attestation::Measurement(report.measurement())], ..Policy::default() };
    let ok = verify(&bundle, &policy, &ExpectedClaims::default(), test_now()).unwrap();
    assert_eq!(ok.product(), Product::Milan);
}

#[test]
fn sev_crate_turin_vcek_chains_with_eight_byte_hwid() {
    use veil_attestation::snp::Endorsement;
    use veil_attestation::x509::ParsedCert;
    let Some(dir) = sev_crate_testdata() else { return };
    let vcek = Endorsement::parse(&std::fs::read(dir.join("vcek_turin.der")).unwrap()).unwrap();
    assert_eq!(vcek.product(), Some(Product::Turin));
    assert_eq!(vcek.hw_id().map(<[u8]>::len), Some(8));
    assert!(vcek.tcb().fmc.is_some(), "Turin VCEKs certify an FMC level");
    vcek.cert().verify_signed_by(Product::Turin.amd_ask()).unwrap();
    assert!(vcek.cert().verify_signed_by(Product::Genoa.amd_ask()).is_err());
    // The crate's Turin chain file holds the same ASK and ARK we pin.
    let chain = ParsedCert::chain_from_pem(&std::fs::read(dir.join("cert_chain_turin")).unwrap()).unwrap();
    assert!(chain.iter().any(|c| c.der() == Product::Turin.amd_ask().der()));
    assert!(chain.iter().any(|c| c.der() == Product::Turin.amd_ark().der()));
}
