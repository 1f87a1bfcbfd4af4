//! Bad input: each test breaks one property and asserts that the named
//! check — and, where the breakage is isolated, only that check — fails.
//! Mutations are applied to the simulated attester's report *before* it is
//! re-signed, so the signature stays valid and the targeted check is the one
//! that catches it (the manipulate-then-resign pattern).

use std::time::Duration;

use veil_attestation::evidence::EvidenceBundle;
use veil_attestation::policy::{GuestPolicyFlag, HostData, PlatformFlag, PlatformPolicy, TcbMinimum};
use veil_attestation::simulated::{SimulatedAttester, SimulatedConfig};
use veil_attestation::snp::report::field;
use veil_attestation::snp::{GuestPolicy, PlatformInfo, Product, Tcb, REPORT_LEN};
use veil_attestation::x509::ParsedCert;
use veil_attestation::{
    appraise, verify, CheckId, Claims, Error, ExpectedClaims, KeyHash, Malformed, Nonce, Outcome, Policy,
};
use veil_tests::{sim, sim_policy, sim_with, test_now, Vector};

fn claims() -> Claims {
    Claims {
        tls_key_hash: Some(KeyHash([0x11; 32])),
        manifest_root: Some(veil_attestation::ManifestRoot([0x22; 32])),
        nonce: Some(Nonce::new(vec![0x33; 32]).unwrap()),
        software_version: "veil-test".into(),
        ..Default::default()
    }
}

/// Evidence from `s` whose report was edited by `edit` and then re-signed.
fn edited(s: &SimulatedAttester, edit: impl FnOnce(&mut [u8; REPORT_LEN])) -> EvidenceBundle {
    let c = claims();
    let mut raw = s.unsigned_report(&c.report_data().unwrap());
    edit(&mut raw);
    s.sign_report(&mut raw);
    s.bundle_for(raw.to_vec(), Some(c))
}

fn genoa() -> SimulatedAttester {
    sim(Product::Genoa)
}

fn good() -> EvidenceBundle {
    genoa().evidence(&claims()).unwrap()
}

fn failures(bundle: &EvidenceBundle, policy: &Policy, expected: &ExpectedClaims) -> Vec<CheckId> {
    appraise(bundle, policy, expected, test_now()).checks.failures()
}

/// Asserts `check` is the first failure reported by `verify` and that no
/// other check failed.
#[track_caller]
fn assert_only(bundle: &EvidenceBundle, policy: &Policy, expected: &ExpectedClaims, check: CheckId) {
    let err = verify(bundle, policy, expected, test_now()).expect_err("evidence must be rejected");
    assert_eq!(err.check(), Some(check), "{err}");
    assert_eq!(failures(bundle, policy, expected), vec![check]);
}

#[track_caller]
fn assert_fails(bundle: &EvidenceBundle, policy: &Policy, check: CheckId) {
    assert_only(bundle, policy, &ExpectedClaims::default(), check)
}

fn put_u32(raw: &mut [u8; REPORT_LEN], at: usize, v: u32) {
    raw[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(raw: &mut [u8; REPORT_LEN], at: usize, v: u64) {
    raw[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

#[test]
fn baseline_simulated_evidence_is_accepted() {
    let ok =
        verify(&good(), &sim_policy(), &ExpectedClaims { nonce: claims().nonce, ..Default::default() }, test_now())
            .unwrap();
    assert!(ok.is_simulated());
    assert!(ok.checks().warnings.iter().any(|w| w.contains("SIMULATED")));
    assert!(ok.checks().to_string().contains("WARNING: SIMULATED"));
}

// ── 1. report format ────────────────────────────────────────────────────

#[test]
fn rejects_truncated_report() {
    let mut b = good();
    b.report.truncate(REPORT_LEN - 1);
    assert_eq!(failures(&b, &sim_policy(), &ExpectedClaims::default())[0], CheckId::ReportFormat);
    assert_eq!(
        verify(&b, &sim_policy(), &ExpectedClaims::default(), test_now()).unwrap_err().check(),
        Some(CheckId::ReportFormat)
    );
}

#[test]
fn rejects_oversized_report_with_trailing_bytes() {
    let mut b = good();
    b.report.push(0);
    let err = verify(&b, &sim_policy(), &ExpectedClaims::default(), test_now()).unwrap_err();
    assert_eq!(err.check(), Some(CheckId::ReportFormat));
    assert!(err.to_string().contains("trailing"), "{err}");
}

#[test]
fn rejects_empty_report() {
    let mut b = good();
    b.report.clear();
    assert_eq!(
        verify(&b, &sim_policy(), &ExpectedClaims::default(), test_now()).unwrap_err().check(),
        Some(CheckId::ReportFormat)
    );
}

#[test]
fn rejects_unknown_report_version_1() {
    assert_fails(&edited(&genoa(), |r| put_u32(r, field::VERSION, 1)), &sim_policy(), CheckId::ReportFormat);
}

#[test]
fn rejects_unknown_report_version_6() {
    // Version 6 has no CPUID interpretation we trust, but the CPUID bytes
    // remain, so only the format check fails.
    assert_fails(&edited(&genoa(), |r| put_u32(r, field::VERSION, 6)), &sim_policy(), CheckId::ReportFormat);
}

#[test]
fn rejects_version_below_policy_minimum() {
    let mut config = SimulatedConfig::new(Product::Genoa, b"v2");
    config.report_version = 2;
    let b = sim_with(config).evidence(&claims()).unwrap();
    verify(&b, &sim_policy(), &ExpectedClaims::default(), test_now()).unwrap();
    let policy = Policy { min_report_version: 3, ..sim_policy() };
    assert_fails(&b, &policy, CheckId::ReportFormat);
}

#[test]
fn rejects_signature_algorithm_other_than_p384() {
    assert_fails(&edited(&genoa(), |r| put_u32(r, field::SIGNATURE_ALGO, 2)), &sim_policy(), CheckId::ReportFormat);
}

#[test]
fn rejects_guest_policy_with_reserved_bit_clear() {
    let edit = |r: &mut [u8; REPORT_LEN]| put_u64(r, field::POLICY, GuestPolicy::SMT);
    assert_fails(&edited(&genoa(), edit), &sim_policy(), CheckId::ReportFormat);
}

#[test]
fn rejects_reserved_guest_policy_bits() {
    let edit = |r: &mut [u8; REPORT_LEN]| put_u64(r, field::POLICY, GuestPolicy::RESERVED_MUST_BE_ONE | 1 << 40);
    assert_fails(&edited(&genoa(), edit), &sim_policy(), CheckId::ReportFormat);
}

#[test]
fn rejects_reserved_key_info_bits_and_signing_keys() {
    let s = genoa();
    let base = |r: &[u8; REPORT_LEN]| u32::from_le_bytes(r[field::KEY_INFO..field::KEY_INFO + 4].try_into().unwrap());
    assert_fails(&edited(&s, |r| put_u32(r, field::KEY_INFO, base(r) | 1 << 5)), &sim_policy(), CheckId::ReportFormat);
    // SIGNING_KEY values 2..=6 are reserved: no certificate kind matches them.
    for key in 2..=6u32 {
        let b = edited(&s, |r| put_u32(r, field::KEY_INFO, (base(r) & !0b11100) | key << 2));
        let err = verify(&b, &sim_policy(), &ExpectedClaims::default(), test_now()).unwrap_err();
        assert_eq!(err.check(), Some(CheckId::EndorsementChain), "{err}");
        assert!(err.to_string().contains(&format!("reserved({key})")), "{err}");
    }
}

#[test]
fn rejects_nonzero_reserved_bytes_signed_and_unsigned() {
    for at in [0x04C, 0x18C, 0x19F, 0x1EB, 0x1EF, 0x1F8, 0x29F] {
        assert_fails(&edited(&genoa(), |r| r[at] = 1), &sim_policy(), CheckId::ReportFormat);
    }
    // After the signature: not signed, still must be zero.
    let mut b = good();
    b.report[0x400] = 1;
    assert_fails(&b, &sim_policy(), CheckId::ReportFormat);
}

// ── 2. product ──────────────────────────────────────────────────────────

#[test]
fn rejects_product_not_allowed_by_policy() {
    let policy = Policy { products: vec![Product::Milan, Product::Turin], ..sim_policy() };
    assert_fails(&good(), &policy, CheckId::Product);
}

#[test]
fn rejects_cpuid_that_disagrees_with_the_vcek() {
    let milan = Product::Milan.canonical_cpuid();
    let edit = |r: &mut [u8; REPORT_LEN]| {
        r[field::CPUID_FAM_ID..field::CPUID_FAM_ID + 3].copy_from_slice(&[milan.family, milan.model, 1])
    };
    assert_fails(&edited(&genoa(), edit), &sim_policy(), CheckId::Product);
}

#[test]
fn rejects_unknown_cpuid() {
    let edit =
        |r: &mut [u8; REPORT_LEN]| r[field::CPUID_FAM_ID..field::CPUID_FAM_ID + 2].copy_from_slice(&[0x17, 0x31]);
    assert_fails(&edited(&genoa(), edit), &sim_policy(), CheckId::Product);
}

// ── 3. endorsement chain ────────────────────────────────────────────────

#[test]
fn rejects_simulated_evidence_under_strict_policy() {
    let strict = Policy { allow_simulated: false, ..sim_policy() };
    let err = verify(&good(), &strict, &ExpectedClaims::default(), test_now()).unwrap_err();
    assert_eq!(err.check(), Some(CheckId::EndorsementChain));
    assert!(err.to_string().contains("SIMULATED"), "{err}");
}

#[test]
fn rejects_simulated_root_not_pinned() {
    let policy = Policy { simulated_roots: vec![KeyHash([0; 32])], ..sim_policy() };
    assert_fails(&good(), &policy, CheckId::EndorsementChain);
    let s = genoa();
    let pinned = KeyHash(ParsedCert::from_der(s.ark_der()).unwrap().spki_sha256());
    let policy = Policy { simulated_roots: vec![pinned], ..sim_policy() };
    verify(&good(), &policy, &ExpectedClaims::default(), test_now()).unwrap();
}

#[test]
fn rejects_chain_to_a_non_amd_root() {
    // A real Genoa report and VCEK, but the supplied chain ends at a root
    // that merely calls itself ARK-Genoa.
    let Some(v) = Vector::load("snp-genoa-azure-trustee") else { return };
    let mut b = v.bundle(None);
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(rcgen::DnType::CommonName, "ARK-Genoa");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let fake_root = params.self_signed(&kp).unwrap();
    b.chain = vec![Product::Genoa.amd_ask().der().to_vec(), fake_root.der().to_vec()];
    for policy in [v.pinned_policy(), Policy { allow_simulated: true, ..v.pinned_policy() }] {
        let err = verify(&b, &policy, &ExpectedClaims::default(), test_now()).unwrap_err();
        assert_eq!(err.check(), Some(CheckId::EndorsementChain));
        assert!(err.to_string().contains("untrusted root"), "{err}");
    }
}

#[test]
fn rejects_expired_vcek() {
    let s = genoa();
    let mut spec = s.default_vcek_spec();
    spec.validity = (test_now() - Duration::from_secs(86_400 * 400), test_now() - Duration::from_secs(86_400));
    let mut b = good();
    b.endorsement = s.issue_vcek(&spec, None).unwrap();
    let err = verify(&b, &sim_policy(), &ExpectedClaims::default(), test_now()).unwrap_err();
    assert_eq!(err.check(), Some(CheckId::EndorsementChain));
    assert!(err.to_string().contains("expired"), "{err}");
    assert_eq!(failures(&b, &sim_policy(), &ExpectedClaims::default()), vec![CheckId::EndorsementChain]);
}

#[test]
fn rejects_vcek_not_yet_valid() {
    let s = genoa();
    let mut spec = s.default_vcek_spec();
    spec.validity = (test_now() + Duration::from_secs(86_400), test_now() + Duration::from_secs(86_400 * 400));
    let mut b = good();
    b.endorsement = s.issue_vcek(&spec, None).unwrap();
    assert_fails(&b, &sim_policy(), CheckId::EndorsementChain);
}

#[test]
fn rejects_key_info_that_names_vlek_for_a_vcek() {
    let edit = |r: &mut [u8; REPORT_LEN]| put_u32(r, field::KEY_INFO, 1 << 2);
    assert_fails(&edited(&genoa(), edit), &sim_policy(), CheckId::EndorsementChain);
}

#[test]
fn rejects_unsigned_report_key_info() {
    let edit = |r: &mut [u8; REPORT_LEN]| put_u32(r, field::KEY_INFO, 7 << 2);
    assert_fails(&edited(&genoa(), edit), &sim_policy(), CheckId::EndorsementChain);
}

#[test]
fn rejects_vlek_when_policy_does_not_allow_it() {
    let Some(v) = Vector::load("snp-milan-vlek-aws-trustee") else { return };
    let then = veil_attestation::x509::parse_time("2025-06-01").unwrap();
    let policy = Policy { vmpl: 1, ..v.pinned_policy() };
    let a = appraise(&v.bundle(Some("asvk_ark_milan.pem")), &policy, &ExpectedClaims::default(), then);
    assert_eq!(a.checks.failures(), vec![CheckId::EndorsementChain]);
    assert!(
        matches!(a.checks.outcome(CheckId::EndorsementChain), Some(Outcome::Failed { expected, .. }) if expected.contains("allow_vlek"))
    );
}

#[test]
fn rejects_missing_intermediate() {
    let s = genoa();
    let mut b = good();
    b.chain = vec![s.ark_der().to_vec()];
    assert_fails(&b, &sim_policy(), CheckId::EndorsementChain);
}

#[test]
fn rejects_endorsement_that_is_not_a_certificate() {
    let mut b = good();
    b.endorsement = b"not a certificate".to_vec();
    let f = failures(&b, &sim_policy(), &ExpectedClaims::default());
    assert!(f.contains(&CheckId::EndorsementChain) && f.contains(&CheckId::Product), "{f:?}");
}

#[test]
fn rejects_intermediate_signed_by_another_root() {
    // The ASK of another simulated hierarchy under this hierarchy's ARK.
    let other = SimulatedAttester::from_seed(b"other root", SimulatedConfig::new(Product::Genoa, b"x")).unwrap();
    let s = genoa();
    let mut b = good();
    b.chain = vec![other.ask_der().to_vec(), s.ark_der().to_vec()];
    assert_fails(&b, &sim_policy(), CheckId::EndorsementChain);
}

// ── revocation ──────────────────────────────────────────────────────────

fn crl_window() -> (std::time::SystemTime, std::time::SystemTime) {
    (test_now() - Duration::from_secs(86_400), test_now() + Duration::from_secs(86_400 * 30))
}

#[test]
fn accepts_a_current_crl_that_lists_nothing_of_ours() {
    let s = genoa();
    let (a, b) = crl_window();
    let mut bundle = good();
    bundle.crl = Some(s.issue_crl(&[&[0x77]], a, b).unwrap());
    let ok =
        verify(&bundle, &Policy { require_crl: true, ..sim_policy() }, &ExpectedClaims::default(), test_now()).unwrap();
    assert!(matches!(ok.checks().outcome(CheckId::Revocation), Some(Outcome::Passed { .. })));
}

#[test]
fn rejects_revoked_ask() {
    let s = genoa();
    let (a, b) = crl_window();
    let mut bundle = good();
    let ask_serial = ParsedCert::from_der(s.ask_der()).unwrap().serial().to_vec();
    bundle.crl = Some(s.issue_crl(&[&ask_serial], a, b).unwrap());
    assert_fails(&bundle, &sim_policy(), CheckId::Revocation);
}

#[test]
fn rejects_crl_signed_by_another_key() {
    let other = SimulatedAttester::from_seed(b"other root", SimulatedConfig::new(Product::Genoa, b"x")).unwrap();
    let (a, b) = crl_window();
    let mut bundle = good();
    bundle.crl = Some(other.issue_crl(&[], a, b).unwrap());
    assert_fails(&bundle, &sim_policy(), CheckId::Revocation);
}

#[test]
fn rejects_stale_crl() {
    let s = genoa();
    let mut bundle = good();
    bundle.crl = Some(
        s.issue_crl(&[], test_now() - Duration::from_secs(86_400 * 60), test_now() - Duration::from_secs(86_400 * 30))
            .unwrap(),
    );
    let err = verify(&bundle, &sim_policy(), &ExpectedClaims::default(), test_now()).unwrap_err();
    assert_eq!(err.check(), Some(CheckId::Revocation));
    assert!(err.to_string().contains("stale"), "{err}");
}

#[test]
fn rejects_missing_crl_when_required() {
    assert_fails(&good(), &Policy { require_crl: true, ..sim_policy() }, CheckId::Revocation);
}

// ── 4. signature ────────────────────────────────────────────────────────

#[test]
fn rejects_bad_signature() {
    let mut b = good();
    b.report[field::MEASUREMENT] ^= 1;
    // The measurement no longer matches the allowlist either: both fail,
    // the signature first.
    let f = failures(&b, &sim_policy(), &ExpectedClaims::default());
    assert_eq!(f[0], CheckId::ReportSignature, "{f:?}");
    let mut b = good();
    b.report[field::REPORT_ID] ^= 1;
    assert_fails(&b, &sim_policy(), CheckId::ReportSignature);
}

#[test]
fn rejects_signature_with_nonzero_padding() {
    let mut b = good();
    b.report[field::SIGNATURE_R + 60] = 1;
    assert_fails(&b, &sim_policy(), CheckId::ReportSignature);
}

/// The order n of P-384, big-endian.
const P384_N: &str = "ffffffffffffffffffffffffffffffffffffffffffffffffc7634d81f4372ddf581a0db248b0a77aecec196accc52973";

/// Writes a 48-byte big-endian integer into a little-endian 72-byte
/// signature component at `at` (the SNP layout), zeroing its padding.
fn put_component(report: &mut [u8], at: usize, big_endian: &[u8]) {
    let mut le = big_endian.to_vec();
    le.reverse();
    report[at..at + 72].fill(0);
    report[at..at + le.len()].copy_from_slice(&le);
}

/// A2: every out-of-range or malformed component the catalogue names — R or
/// S equal to n, above n, all ones; nonzero padding in R or S — fails the
/// signature check by name, each with the other component left valid.
#[test]
fn rejects_signature_components_out_of_range_or_padded() {
    let n = hex::decode(P384_N).unwrap();
    let mut n_plus_1 = n.clone();
    *n_plus_1.last_mut().unwrap() += 1;
    let ones = vec![0xffu8; 48];
    for (name, at) in [("R", field::SIGNATURE_R), ("S", field::SIGNATURE_R + 72)] {
        for (what, value) in [("n", &n), ("n + 1", &n_plus_1), ("2^384 - 1", &ones)] {
            let mut b = good();
            put_component(&mut b.report, at, value);
            let err = verify(&b, &sim_policy(), &ExpectedClaims::default(), test_now()).unwrap_err();
            assert_eq!(err.check(), Some(CheckId::ReportSignature), "{name} = {what}: {err}");
        }
        for pad in [48, 60, 71] {
            let mut b = good();
            b.report[at + pad] = 1;
            let err = verify(&b, &sim_policy(), &ExpectedClaims::default(), test_now()).unwrap_err();
            assert_eq!(err.check(), Some(CheckId::ReportSignature), "padding byte {pad} of {name}: {err}");
        }
    }
}

/// A7: signature algorithms 0 (invalid), 2 and 0xFFFF are refused at the
/// format check before any signature is looked at.
#[test]
fn rejects_every_signature_algorithm_but_ecdsa_p384() {
    for algo in [0u32, 2, 0xFFFF, u32::MAX] {
        let b = edited(&genoa(), |r| put_u32(r, field::SIGNATURE_ALGO, algo));
        let err = verify(&b, &sim_policy(), &ExpectedClaims::default(), test_now()).unwrap_err();
        assert_eq!(err.check(), Some(CheckId::ReportFormat), "algorithm {algo}: {err}");
    }
}

#[test]
fn rejects_signature_of_zero() {
    let mut b = good();
    b.report[field::SIGNATURE_R..field::SIGNATURE_R + 144].fill(0);
    assert_fails(&b, &sim_policy(), CheckId::ReportSignature);
}

// ── 5. chip id and reported TCB ─────────────────────────────────────────

#[test]
fn rejects_vcek_of_another_chip() {
    // Another chip: another key and another hwID, issued by the same ASK.
    let s = genoa();
    let mut spec = s.default_vcek_spec();
    spec.chip_id = vec![0xAB; 64];
    let mut b = good();
    b.endorsement = s.issue_vcek(&spec, Some(b"another chip")).unwrap();
    let f = failures(&b, &sim_policy(), &ExpectedClaims::default());
    assert_eq!(f, vec![CheckId::ReportSignature, CheckId::ChipId]);
}

#[test]
fn rejects_vcek_whose_hwid_differs_from_chip_id() {
    let s = genoa();
    let mut spec = s.default_vcek_spec();
    spec.chip_id = vec![0xAB; 64];
    let mut b = good();
    b.endorsement = s.issue_vcek(&spec, None).unwrap();
    assert_fails(&b, &sim_policy(), CheckId::ChipId);
}

#[test]
fn rejects_masked_chip_id_with_a_vcek() {
    let edit = |r: &mut [u8; REPORT_LEN]| r[field::CHIP_ID..field::CHIP_ID + 64].fill(0);
    assert_fails(&edited(&genoa(), edit), &sim_policy(), CheckId::ChipId);
}

#[test]
fn rejects_reported_tcb_other_than_the_vcek_tcb() {
    let s = genoa();
    let mut spec = s.default_vcek_spec();
    spec.tcb.microcode += 1;
    let mut b = good();
    b.endorsement = s.issue_vcek(&spec, None).unwrap();
    assert_fails(&b, &sim_policy(), CheckId::ReportedTcb);
}

#[test]
fn turin_chip_id_uses_eight_bytes_and_fmc() {
    let s = sim(Product::Turin);
    let b = s.evidence(&claims()).unwrap();
    let ok = verify(&b, &sim_policy(), &ExpectedClaims::default(), test_now()).unwrap();
    assert_eq!(ok.product(), Product::Turin);
    assert_eq!(ok.reported_tcb().fmc, Some(1));
    // A Turin VCEK that certifies another FMC level.
    let mut spec = s.default_vcek_spec();
    spec.tcb.fmc = Some(5);
    let mut b2 = b.clone();
    b2.endorsement = s.issue_vcek(&spec, None).unwrap();
    assert_fails(&b2, &sim_policy(), CheckId::ReportedTcb);
}

// ── 6. guest policy and VMPL ────────────────────────────────────────────

#[test]
fn rejects_debug_policy() {
    let edit = |r: &mut [u8; REPORT_LEN]| {
        put_u64(r, field::POLICY, GuestPolicy::SMT | GuestPolicy::RESERVED_MUST_BE_ONE | GuestPolicy::DEBUG)
    };
    let b = edited(&genoa(), edit);
    assert_fails(&b, &sim_policy(), CheckId::Debug);
    verify(&b, &Policy { allow_debug: true, ..sim_policy() }, &ExpectedClaims::default(), test_now()).unwrap();
}

#[test]
fn rejects_migration_agent() {
    let edit = |r: &mut [u8; REPORT_LEN]| {
        put_u64(r, field::POLICY, GuestPolicy::RESERVED_MUST_BE_ONE | GuestPolicy::MIGRATE_MA)
    };
    assert_fails(&edited(&genoa(), edit), &sim_policy(), CheckId::MigrationAgent);
}

#[test]
fn rejects_smt_when_policy_forbids_it() {
    let policy = Policy { allow_smt: false, ..sim_policy() };
    assert_fails(&good(), &policy, CheckId::Smt);
    let edit = |r: &mut [u8; REPORT_LEN]| put_u64(r, field::PLATFORM_INFO, PlatformInfo::TSME_EN);
    verify(&edited(&genoa(), edit), &policy, &ExpectedClaims::default(), test_now()).unwrap();
}

#[test]
fn rejects_vmpl_other_than_policy() {
    let edit = |r: &mut [u8; REPORT_LEN]| put_u32(r, field::VMPL, 1);
    let b = edited(&genoa(), edit);
    assert_fails(&b, &sim_policy(), CheckId::Vmpl);
    verify(&b, &Policy { vmpl: 1, ..sim_policy() }, &ExpectedClaims::default(), test_now()).unwrap();
}

// ── 7. TCB minimums ─────────────────────────────────────────────────────

fn min_tcb(product: Product, min: TcbMinimum) -> Policy {
    let mut p = sim_policy();
    p.min_tcb.insert(product, min);
    p
}

#[test]
fn rejects_bootloader_below_minimum() {
    assert_fails(
        &good(),
        &min_tcb(Product::Genoa, TcbMinimum { bootloader: Some(10), ..Default::default() }),
        CheckId::TcbMinimum,
    );
}

#[test]
fn rejects_tee_below_minimum() {
    assert_fails(
        &good(),
        &min_tcb(Product::Genoa, TcbMinimum { tee: Some(1), ..Default::default() }),
        CheckId::TcbMinimum,
    );
}

#[test]
fn rejects_snp_below_minimum() {
    assert_fails(
        &good(),
        &min_tcb(Product::Genoa, TcbMinimum { snp: Some(24), ..Default::default() }),
        CheckId::TcbMinimum,
    );
}

#[test]
fn rejects_microcode_below_minimum() {
    assert_fails(
        &good(),
        &min_tcb(Product::Genoa, TcbMinimum { microcode: Some(73), ..Default::default() }),
        CheckId::TcbMinimum,
    );
}

#[test]
fn rejects_fmc_below_minimum_on_turin() {
    let b = sim(Product::Turin).evidence(&claims()).unwrap();
    assert_fails(&b, &min_tcb(Product::Turin, TcbMinimum { fmc: Some(2), ..Default::default() }), CheckId::TcbMinimum);
}

#[test]
fn accepts_tcb_at_exact_minimum_and_ignores_other_products() {
    let exact = TcbMinimum { bootloader: Some(9), tee: Some(0), snp: Some(23), microcode: Some(72), fmc: None };
    verify(&good(), &min_tcb(Product::Genoa, exact), &ExpectedClaims::default(), test_now()).unwrap();
    let other = min_tcb(Product::Milan, TcbMinimum { snp: Some(200), ..Default::default() });
    verify(&good(), &other, &ExpectedClaims::default(), test_now()).unwrap();
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
    #[test]
    fn tcb_rollback_of_any_component_is_caught(component in 0usize..4, level in 0u8..=254) {
        let reported = Tcb { fmc: None, bootloader: 9, tee: 0, snp: 23, microcode: 72 };
        let mut config = SimulatedConfig::new(Product::Genoa, b"prop");
        config.tcb = reported;
        let s = sim_with(config);
        let b = s.evidence(&claims()).unwrap();
        let mut min = TcbMinimum::default();
        let actual = match component { 0 => { min.bootloader = Some(level); 9 } 1 => { min.tee = Some(level); 0 } 2 => { min.snp = Some(level); 23 } _ => { min.microcode = Some(level); 72 } };
        let accepted = verify(&b, &min_tcb(Product::Genoa, min), &ExpectedClaims::default(), test_now()).is_ok();
        proptest::prop_assert_eq!(accepted, actual >= level);
    }
}

// ── 8. measurement, host data, ID key ───────────────────────────────────

#[test]
fn rejects_measurement_not_allowlisted() {
    let policy = Policy { measurements: vec!["ab".repeat(48).parse().unwrap()], ..sim_policy() };
    assert_fails(&good(), &policy, CheckId::Measurement);
}

#[test]
fn rejects_everything_with_an_empty_allowlist() {
    let policy = Policy { measurements: vec![], ..sim_policy() };
    let err = verify(&good(), &policy, &ExpectedClaims::default(), test_now()).unwrap_err();
    assert_eq!(err.check(), Some(CheckId::Measurement));
    assert!(err.to_string().contains("allowlist is empty"), "{err}");
}

#[test]
fn any_measurement_waiver_is_explicit_and_shown() {
    let policy = Policy { measurements: vec![], any_measurement: true, ..sim_policy() };
    let ok = verify(&good(), &policy, &ExpectedClaims::default(), test_now()).unwrap();
    assert!(
        matches!(ok.checks().outcome(CheckId::Measurement), Some(Outcome::Skipped { reason }) if reason.contains("ANY"))
    );
}

#[test]
fn rejects_host_data_mismatch() {
    let policy = Policy { host_data: Some(HostData(KeyHash([9; 32]))), ..sim_policy() };
    assert_fails(&good(), &policy, CheckId::HostData);
}

#[test]
fn rejects_id_key_digest_mismatch() {
    let policy = Policy { id_key_digest: Some("01".repeat(48).parse().unwrap()), ..sim_policy() };
    assert_fails(&good(), &policy, CheckId::IdKeyDigest);
}

// ── 9. REPORT_DATA binding ──────────────────────────────────────────────

#[test]
fn rejects_claims_edited_after_signing() {
    let mut b = good();
    b.claims.as_mut().unwrap().layer_range = Some(veil_attestation::LayerRange::new(0, 30).unwrap());
    assert_fails(&b, &sim_policy(), CheckId::ReportDataBinding);
}

#[test]
fn rejects_raw_report_data_mismatch() {
    let mut b = good();
    b.claims = None;
    let expected = ExpectedClaims { report_data: Some(veil_attestation::ReportData([7; 64])), ..Default::default() };
    assert_only(&b, &sim_policy(), &expected, CheckId::ReportDataBinding);
}

#[test]
fn rejects_pinned_tls_key_mismatch() {
    let expected = ExpectedClaims { tls_key_hash: Some(KeyHash([0x99; 32])), ..Default::default() };
    assert_only(&good(), &sim_policy(), &expected, CheckId::ReportDataBinding);
}

#[test]
fn rejects_pinned_manifest_root_mismatch() {
    let expected =
        ExpectedClaims { manifest_root: Some(veil_attestation::ManifestRoot([0x98; 32])), ..Default::default() };
    assert_only(&good(), &sim_policy(), &expected, CheckId::ReportDataBinding);
}

#[test]
fn policy_manifest_pins_one_root_per_model_whatever_the_layers() {
    let s = genoa();
    let with = |range: Option<(u32, u32)>, root: Option<u8>| {
        let c = Claims {
            layer_range: range.map(|(a, b)| veil_attestation::LayerRange::new(a, b).unwrap()),
            manifest_root: root.map(|r| veil_attestation::ManifestRoot([r; 32])),
            ..claims()
        };
        s.evidence(&c).unwrap()
    };
    let mut policy = sim_policy();
    policy.manifest_roots = vec![veil_attestation::ManifestRoot([0x22; 32])];
    let pinned = |b: &EvidenceBundle| verify(b, &policy, &ExpectedClaims::default(), test_now());
    // Any stage of the allowed model: the same root whatever its layers.
    for range in [Some((0, 30)), Some((0, 10)), Some((10, 30)), None] {
        assert!(pinned(&with(range, Some(0x22))).is_ok(), "{range:?}");
    }
    for bad in [with(Some((0, 30)), Some(0x23)), with(Some((0, 10)), None)] {
        assert_only(&bad, &policy, &ExpectedClaims::default(), CheckId::ReportDataBinding);
    }
    assert_eq!(Policy::from_toml(&policy.to_toml()).unwrap().manifest_roots, policy.manifest_roots);
    // A policy of the earlier per-range form is refused when read, not
    // silently read as pinning nothing.
    let old = format!("{}\n[manifest_roots]\n\"0..30\" = [\"{}\"]\n", sim_policy().to_toml(), "22".repeat(32));
    assert!(Policy::from_toml(&old).is_err());
}

#[test]
fn rejects_missing_claims_when_a_claim_is_pinned() {
    let mut b = good();
    b.claims = None;
    let expected = ExpectedClaims { tls_key_hash: Some(KeyHash([0x11; 32])), ..Default::default() };
    assert_only(&b, &sim_policy(), &expected, CheckId::ReportDataBinding);
}

// ── 10. freshness ───────────────────────────────────────────────────────

#[test]
fn rejects_stale_nonce() {
    let expected = ExpectedClaims { nonce: Some(Nonce::new(vec![0x44; 32]).unwrap()), ..Default::default() };
    let err = verify(&good(), &sim_policy(), &expected, test_now()).unwrap_err();
    assert_eq!(err.check(), Some(CheckId::Freshness));
    assert!(err.to_string().contains("stale"), "{err}");
}

#[test]
fn rejects_evidence_without_the_requested_nonce() {
    let c = Claims { nonce: None, ..claims() };
    let b = genoa().evidence(&c).unwrap();
    let expected = ExpectedClaims { nonce: Some(Nonce::new(vec![0x33; 32]).unwrap()), ..Default::default() };
    assert_only(&b, &sim_policy(), &expected, CheckId::Freshness);
}

// ── bundle parsing ──────────────────────────────────────────────────────

#[test]
fn rejects_malformed_bundle_json() {
    for bad in [
        &b"{"[..],
        b"[]",
        b"{\"version\":1}",
        b"null",
        b"{\"version\":1,\"kind\":\"tdx\",\"report\":\"\",\"endorsement\":\"\"}",
    ] {
        assert!(
            matches!(EvidenceBundle::from_json(bad), Err(Malformed::Json(_))),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn rejects_unknown_fields_in_bundle() {
    let j = good().to_json().replacen('{', "{\"extra\": 1,", 1);
    assert!(matches!(EvidenceBundle::from_json(j.as_bytes()), Err(Malformed::Json(_))));
}

#[test]
fn rejects_oversized_bundle() {
    let mut j = good().to_json();
    j.push_str(&" ".repeat(veil_attestation::evidence::MAX_BUNDLE_BYTES));
    assert!(matches!(EvidenceBundle::from_json(j.as_bytes()), Err(Malformed::TooLarge { .. })));
}

#[test]
fn rejects_oversized_certificate_field() {
    let mut b = good();
    b.endorsement = vec![0; 64 * 1024];
    assert!(matches!(
        EvidenceBundle::from_json(b.to_json().as_bytes()),
        Err(Malformed::FieldTooLarge { field: "endorsement", .. })
    ));
}

#[test]
fn rejects_too_many_chain_certificates() {
    let mut b = good();
    b.chain = vec![vec![1]; 5];
    assert!(matches!(
        EvidenceBundle::from_json(b.to_json().as_bytes()),
        Err(Malformed::FieldTooLarge { field: "chain", .. })
    ));
}

#[test]
fn bundle_round_trips_through_json_and_still_verifies() {
    let b = EvidenceBundle::from_json(good().to_json().as_bytes()).unwrap();
    verify(&b, &sim_policy(), &ExpectedClaims::default(), test_now()).unwrap();
}

#[test]
fn errors_never_echo_claims_key_material() {
    // Rejections name checks and public values, not private keys.
    let policy = Policy { allow_simulated: false, ..sim_policy() };
    let err: Error = verify(&good(), &policy, &ExpectedClaims::default(), test_now()).unwrap_err();
    assert!(!format!("{err:?}").contains("PRIVATE KEY"));
}

type Case = (CheckId, EvidenceBundle, Policy, ExpectedClaims);

/// One isolated mutation per check: the manipulate-one-field table.
fn one_mutation_per_check() -> Vec<Case> {
    let s = genoa();
    let none = ExpectedClaims::default;
    let p = sim_policy;
    let mut other_tcb = s.default_vcek_spec();
    other_tcb.tcb.snp += 1;
    let mut other_chip = s.default_vcek_spec();
    other_chip.chip_id = vec![0xCD; 64];
    let with_endorsement = |der: Vec<u8>| EvidenceBundle { endorsement: der, ..good() };
    let mut flipped = good();
    flipped.report[field::REPORT_ID] ^= 0x10;
    let mut tampered_claims = good();
    tampered_claims.claims.as_mut().unwrap().software_version = "other".into();
    vec![
        (CheckId::ReportFormat, edited(&s, |r| put_u32(r, field::VERSION, 9)), p(), none()),
        (CheckId::Product, good(), Policy { products: vec![Product::Turin], ..p() }, none()),
        (CheckId::EndorsementChain, good(), Policy { allow_simulated: false, ..p() }, none()),
        (CheckId::Revocation, good(), Policy { require_crl: true, ..p() }, none()),
        (CheckId::ReportSignature, flipped, p(), none()),
        (CheckId::ChipId, with_endorsement(s.issue_vcek(&other_chip, None).unwrap()), p(), none()),
        (CheckId::ReportedTcb, with_endorsement(s.issue_vcek(&other_tcb, None).unwrap()), p(), none()),
        (
            CheckId::Debug,
            edited(&s, |r| put_u64(r, field::POLICY, GuestPolicy::RESERVED_MUST_BE_ONE | GuestPolicy::DEBUG)),
            p(),
            none(),
        ),
        (
            CheckId::MigrationAgent,
            edited(&s, |r| put_u64(r, field::POLICY, GuestPolicy::RESERVED_MUST_BE_ONE | GuestPolicy::MIGRATE_MA)),
            p(),
            none(),
        ),
        (
            CheckId::GuestPolicy,
            edited(&s, |r| put_u64(r, field::POLICY, GuestPolicy::RESERVED_MUST_BE_ONE | GuestPolicy::CXL_ALLOW)),
            p(),
            none(),
        ),
        (CheckId::Smt, good(), Policy { allow_smt: false, ..p() }, none()),
        (
            CheckId::PlatformInfo,
            edited(&s, |r| put_u64(r, field::PLATFORM_INFO, 1 << 40)),
            platform_of(p(), |pl| pl.refuse_unknown_platform_bits = true),
            none(),
        ),
        (CheckId::Vmpl, edited(&s, |r| put_u32(r, field::VMPL, 3)), p(), none()),
        (
            CheckId::TcbMinimum,
            good(),
            min_tcb(Product::Genoa, TcbMinimum { snp: Some(99), ..Default::default() }),
            none(),
        ),
        (CheckId::MitigationVector, v5(&s, 0b01, 0b11), mitigations(&[1]), none()),
        (CheckId::Measurement, edited(&s, |r| r[field::MEASUREMENT] ^= 1), p(), none()),
        (
            CheckId::HostData,
            edited(&s, |r| r[field::HOST_DATA] = 1),
            Policy { host_data: Some(HostData(KeyHash([0; 32]))), ..p() },
            none(),
        ),
        (CheckId::IdKeyDigest, good(), Policy { id_key_digest: Some("02".repeat(48).parse().unwrap()), ..p() }, none()),
        (CheckId::ReportDataBinding, tampered_claims, p(), none()),
        (CheckId::Freshness, good(), p(), ExpectedClaims { nonce: Some(Nonce::new(vec![1]).unwrap()), ..none() }),
    ]
}

#[test]
fn every_check_has_an_isolated_negative_case() {
    let cases = one_mutation_per_check();
    let checks: Vec<CheckId> = cases.iter().map(|c| c.0).collect();
    assert_eq!(checks, CheckId::ALL.to_vec(), "one case per check, in order");
    for (check, bundle, policy, expected) in &cases {
        assert_only(bundle, policy, expected, *check);
    }
}

// --- Platform hardening (SECURITY-CASES C4, C10, C11) ---

fn platform(edit: impl FnOnce(&mut PlatformPolicy)) -> Policy {
    let mut p = sim_policy();
    edit(&mut p.platform);
    p
}

fn mitigations(bits: &[u8]) -> Policy {
    platform(|p| p.required_mitigations = bits.to_vec())
}

/// A version-5 report with the given launch and current mitigation vectors.
fn v5(s: &SimulatedAttester, launch: u64, current: u64) -> EvidenceBundle {
    edited(s, |r| {
        put_u32(r, field::VERSION, 5);
        put_u64(r, field::LAUNCH_MIT_VECTOR, launch);
        put_u64(r, field::CURRENT_MIT_VECTOR, current);
    })
}

fn with_guest_policy(bits: u64) -> EvidenceBundle {
    edited(&genoa(), |r| put_u64(r, field::POLICY, GuestPolicy::RESERVED_MUST_BE_ONE | bits))
}

/// C4: each guest-policy hardening bit is its own policy decision: required
/// and absent fails `guest_policy` naming the bit; required and present passes.
#[test]
fn each_required_guest_policy_bit_is_enforced_by_name() {
    for flag in GuestPolicyFlag::ALL {
        let policy = platform(|p| p.require_guest_policy = vec![flag]);
        let err = verify(&good(), &policy, &ExpectedClaims::default(), test_now()).unwrap_err();
        assert_eq!(err.check(), Some(CheckId::GuestPolicy), "{flag:?}: {err}");
        assert!(err.to_string().contains(flag.abi_name()), "{flag:?} named: {err}");
        assert_eq!(failures(&good(), &policy, &ExpectedClaims::default()), vec![CheckId::GuestPolicy]);
        verify(&with_guest_policy(flag.mask()), &policy, &ExpectedClaims::default(), test_now())
            .unwrap_or_else(|e| panic!("{flag:?} set must pass: {e}"));
        // Another bit set does not stand in for the required one.
        let other = GuestPolicyFlag::ALL.iter().find(|f| **f != flag).unwrap();
        assert_fails(&with_guest_policy(other.mask()), &policy, CheckId::GuestPolicy);
    }
}

#[test]
fn cxl_memory_is_refused_unless_allowed() {
    let cxl = with_guest_policy(GuestPolicy::CXL_ALLOW);
    assert_fails(&cxl, &sim_policy(), CheckId::GuestPolicy);
    verify(&cxl, &platform(|p| p.allow_cxl = true), &ExpectedClaims::default(), test_now()).unwrap();
}

#[test]
fn guest_abi_minimum_is_compared_with_policy_and_firmware() {
    // The simulated firmware runs 1.55; a guest that required 1.51 passes a 1.51 minimum.
    let abi_1_51 = with_guest_policy((1 << 8) | 51);
    let min = |v: &str| platform(|p| p.min_guest_abi = Some(v.parse().unwrap()));
    verify(&abi_1_51, &min("1.51"), &ExpectedClaims::default(), test_now()).unwrap();
    assert_fails(&abi_1_51, &min("1.52"), CheckId::GuestPolicy);
    assert_fails(&good(), &min("1.0"), CheckId::GuestPolicy); // ABI minimum 0.0
                                                              // A guest that required ABI 2.0 cannot have launched on firmware 1.55: the report contradicts itself.
    assert_fails(&with_guest_policy(2 << 8), &sim_policy(), CheckId::GuestPolicy);
}

/// C10: every PLATFORM_INFO bit the policy can require, absent and present.
#[test]
fn each_required_platform_info_bit_is_enforced_by_name() {
    for flag in PlatformFlag::ALL {
        let policy = platform(|p| p.require_platform = vec![flag]);
        let without = edited(&genoa(), |r| {
            put_u64(
                r,
                field::PLATFORM_INFO,
                PlatformFlag::ALL.iter().filter(|f| **f != flag).fold(0, |m, f| m | f.mask()),
            )
        });
        let err = verify(&without, &policy, &ExpectedClaims::default(), test_now()).unwrap_err();
        assert_eq!(err.check(), Some(CheckId::PlatformInfo), "{flag:?}: {err}");
        assert!(err.to_string().contains(flag.abi_name()), "{flag:?} named: {err}");
        let with = edited(&genoa(), |r| put_u64(r, field::PLATFORM_INFO, flag.mask()));
        verify(&with, &policy, &ExpectedClaims::default(), test_now())
            .unwrap_or_else(|e| panic!("{flag:?} set must pass: {e}"));
    }
}

/// Issue 23: a real Turin report has PLATFORM_INFO 0x64 (ECC_EN,
/// ALIAS_CHECK_COMPLETE, IOMMU_WRITE_SAFE). Every bit the ABI names passes
/// the default policy by name; a bit it does not name is a WARN row by
/// default and a failure only where the policy refuses unknown bits.
#[test]
fn platform_info_bits_are_named_and_unknown_ones_warn_unless_refused() {
    let lenient = Policy { allow_smt: true, ..sim_policy() };
    for known in [0x64u64, 0x27, 0xFF] {
        let b = edited(&genoa(), |r| put_u64(r, field::PLATFORM_INFO, known));
        let ok = verify(&b, &lenient, &ExpectedClaims::default(), test_now()).unwrap();
        match ok.checks().outcome(CheckId::PlatformInfo) {
            Some(Outcome::Passed { detail }) => {
                if known == 0x64 {
                    assert!(detail.contains("ECC_EN, ALIAS_CHECK_COMPLETE, IOMMU_WRITE_SAFE"), "{detail}");
                }
            }
            other => panic!("{known:#x}: {other:?}"),
        }
    }
    let unknown = edited(&genoa(), |r| put_u64(r, field::PLATFORM_INFO, 0x64 | 1 << 40));
    let ok = verify(&unknown, &lenient, &ExpectedClaims::default(), test_now()).unwrap();
    match ok.checks().outcome(CheckId::PlatformInfo) {
        Some(Outcome::Warned { warning, .. }) => assert!(warning.contains("0x10000000000"), "{warning}"),
        other => panic!("an unknown bit must warn: {other:?}"),
    }
    assert!(ok.checks().verdict().contains("WARN: platform_info"), "{}", ok.checks().verdict());
    let strict = platform_of(lenient.clone(), |pl| pl.refuse_unknown_platform_bits = true);
    assert_fails(&unknown, &strict, CheckId::PlatformInfo);
    // Known bits stay fine under the strict policy.
    let b = edited(&genoa(), |r| put_u64(r, field::PLATFORM_INFO, 0x64));
    verify(&b, &strict, &ExpectedClaims::default(), test_now()).unwrap();
}

fn platform_of(mut p: Policy, f: impl FnOnce(&mut veil_attestation::policy::PlatformPolicy)) -> Policy {
    f(&mut p.platform);
    p
}

#[test]
fn mitigation_vectors_need_report_version_5() {
    assert_fails(&good(), &mitigations(&[0]), CheckId::MitigationVector);
    verify(&v5(&genoa(), 1, 1), &mitigations(&[0]), &ExpectedClaims::default(), test_now()).unwrap();
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
    /// C11: required ⊆ launch and required ⊆ current, as bit sets. A numeric
    /// comparison (current >= required) would pass many of these wrongly.
    #[test]
    fn mitigations_are_compared_as_bit_sets(launch in proptest::prelude::any::<u64>(), current in proptest::prelude::any::<u64>(), need in proptest::prelude::any::<u64>()) {
        let bits: Vec<u8> = (0..64u8).filter(|b| need >> b & 1 == 1).collect();
        let policy = mitigations(&bits);
        let result = verify(&v5(&genoa(), launch, current), &policy, &ExpectedClaims::default(), test_now());
        let subset = need & launch == need && need & current == need;
        if subset {
            proptest::prop_assert!(result.is_ok(), "{:?}", result.err().map(|e| e.to_string()));
        } else {
            let err = result.unwrap_err();
            proptest::prop_assert_eq!(err.check(), Some(CheckId::MitigationVector));
        }
    }
}

#[test]
fn platform_settings_are_part_of_peer_policy_strictness() {
    let mine = platform(|p| {
        p.require_guest_policy = vec![GuestPolicyFlag::RaplDisabled];
        p.require_platform = vec![PlatformFlag::AliasCheckComplete];
        p.min_guest_abi = Some("1.55".parse().unwrap());
        p.required_mitigations = vec![3];
    });
    let gaps: Vec<String> = mine.gaps_in(&sim_policy()).into_iter().map(|g| g.setting).collect();
    for s in [
        "platform.require_guest_policy",
        "platform.require_platform",
        "platform.min_guest_abi",
        "platform.required_mitigations",
    ] {
        assert!(gaps.iter().any(|g| g == s), "{s} missing from {gaps:?}");
    }
    assert!(mine.gaps_in(&mine).is_empty());
    let cxl = platform(|p| p.allow_cxl = true);
    assert!(sim_policy().gaps_in(&cxl).iter().any(|g| g.setting == "platform.allow_cxl"));
    // Order and duplicates do not change the digest; a new requirement does.
    let reordered = platform(|p| {
        p.require_platform = vec![PlatformFlag::AliasCheckComplete, PlatformFlag::Tsme, PlatformFlag::Tsme];
    });
    let ordered = platform(|p| p.require_platform = vec![PlatformFlag::Tsme, PlatformFlag::AliasCheckComplete]);
    assert_eq!(reordered.digest(), ordered.digest());
    assert_ne!(ordered.digest(), sim_policy().digest());
    // A policy that says nothing about [platform] keeps the digest it had before the section existed.
    assert!(!String::from_utf8_lossy(&sim_policy().canonical_bytes()).contains("platform"));
}

#[test]
fn platform_section_parses_and_rejects_typos() {
    let p = Policy::from_toml(
        "[platform]\nrequire_guest_policy = [\"single_socket\", \"page_swap_disabled\"]\nmin_guest_abi = \"1.55\"\n\
         require_platform = [\"alias_check_complete\"]\nrequired_mitigations = [0, 2]\n",
    )
    .unwrap();
    assert_eq!(p.platform.require_guest_policy, vec![GuestPolicyFlag::SingleSocket, GuestPolicyFlag::PageSwapDisabled]);
    assert_eq!(p.platform.mitigation_mask(), 0b101);
    assert!(Policy::from_toml("[platform]\nrequire_platform = [\"smt\"]\n").is_err());
    assert!(Policy::from_toml("[platform]\nrequired_mitigations = [64]\n").is_err());
    assert!(Policy::from_toml("[platform]\nmin_guest_abi = \"1\"\n").is_err());
    assert!(Policy::from_toml("[platform]\nallow_cxl_memory = true\n").is_err());
}
