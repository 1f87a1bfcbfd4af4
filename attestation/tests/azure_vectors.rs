//! Real Azure confidential-VM evidence: HCL reports from Microsoft's
//! paravisor (`snp-genoa-azure-trustee`, `azure-cvm-snp`) and a vTPM quote
//! with its attestation key (`azure-cvm-snp`). Each reaches its expected
//! verdict, and each binding (runtime claims to REPORT_DATA, quote to the
//! claims' key, nonce, PCRs) fails when its input is edited. Vectors come
//! from `$VEIL_VECTORS` or `../shared/vectors`; absent vectors print SKIP,
//! or fail under `VEIL_REQUIRE_VECTORS=1`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use veil_attestation::azure::policy::PcrValue;
use veil_attestation::azure::{
    AzureCheckId as C, AzureCheckReport, AzureError, AzureEvidence, AzureExpected, TpmQuote,
};
use veil_attestation::check::Outcome;
use veil_attestation::x509::ParsedCert;
use veil_attestation::{appraise_azure, verify_azure, Policy, SnpEndorsement};

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
    None
}

fn read(set: &str, name: &str) -> Option<Vec<u8>> {
    Some(std::fs::read(vectors_dir()?.join(set).join(name)).unwrap())
}

fn pem_chain(bytes: &[u8]) -> Vec<Vec<u8>> {
    ParsedCert::chain_from_pem(bytes).unwrap().iter().map(|c| c.der().to_vec()).collect()
}

fn any_measurement() -> Policy {
    Policy { any_measurement: true, ..Policy::default() }
}

fn failed(t: &AzureCheckReport, c: C) -> bool {
    matches!(t.outcome(c), Some(Outcome::Failed { .. }))
}

fn passed(t: &AzureCheckReport, c: C) -> bool {
    matches!(t.outcome(c), Some(Outcome::Passed { .. } | Outcome::Warned { .. }))
}

/// A real Genoa HCL report with its VCEK: the SNP report passes every SNP
/// check, the runtime claims hash to REPORT_DATA, the claims carry an RSA
/// attestation key; the quote rows do not run (no quote).
#[test]
fn a_real_genoa_hcl_report_is_accepted_and_binds_its_claims() {
    let set = "snp-genoa-azure-trustee";
    let Some(hcl) = read(set, "azure_hcl_report.bin") else { return };
    let e = SnpEndorsement {
        endorsement: read(set, "vcek.pem").unwrap(),
        chain: pem_chain(&read(set, "ask_ark_genoa.pem").unwrap()),
        crl: None,
    };
    let ev = AzureEvidence { hcl: Some(&hcl), ..Default::default() };
    let a = verify_azure(&ev, Some(&e), &any_measurement(), &AzureExpected::default(), SystemTime::now()).unwrap();
    println!("{}\n{}", a.snp.as_ref().unwrap(), a.azure);
    for c in [C::HclFormat, C::SnpReport, C::RuntimeClaims, C::AttestationKey, C::VmConfiguration] {
        assert!(passed(&a.azure, c), "{c}");
    }
    assert!(a.azure.not_run().contains(&C::TpmSignature));
    // One byte of the claims changed (inside a string, so the JSON still parses): the binding fails.
    let at = find(&hcl, b"vmUniqueId").unwrap() + 14;
    let mut edited = hcl.clone();
    edited[at] ^= 0x01;
    let ev = AzureEvidence { hcl: Some(&edited), ..Default::default() };
    let t = appraise_azure(&ev, Some(&e), &any_measurement(), &AzureExpected::default(), SystemTime::now()).azure;
    assert!(matches!(t.error(C::RuntimeClaims), Some(AzureError::ClaimsNotBound)), "{t}");
    // Under Milan's chain the VCEK does not verify: the SNP row fails.
    let Some(milan) = read("azure-cvm-snp", "certs.pem") else { return };
    let wrong = SnpEndorsement { chain: pem_chain(&milan)[1..].to_vec(), ..e };
    let ev = AzureEvidence { hcl: Some(&hcl), ..Default::default() };
    let t = appraise_azure(&ev, Some(&wrong), &any_measurement(), &AzureExpected::default(), SystemTime::now()).azure;
    assert!(matches!(t.error(C::SnpReport), Some(AzureError::SnpRejected(_))), "{t}");
}

fn find(h: &[u8], needle: &[u8]) -> Option<usize> {
    h.windows(needle.len()).position(|w| w == needle)
}

/// The vTPM quote verifies under its own AK with the nonce `challenge`; with
/// another nonce, an edited message, or the HCL report's AK (another VM's),
/// it is refused by the check that guards each.
#[test]
fn the_vtpm_quote_verifies_under_its_ak_and_nonce_and_nothing_else() {
    let set = "azure-cvm-snp";
    let (Some(quote), Some(ak), Some(hcl)) =
        (read(set, "quote.bin"), read(set, "akpub.pem"), read(set, "hcl-report-snp.bin"))
    else {
        return;
    };
    let nonce = AzureExpected { nonce: Some(b"challenge".to_vec()) };
    let p = any_measurement();
    let now = SystemTime::now();
    // The quote with the key it was made with: signature, nonce and PCR digest pass.
    let ev = AzureEvidence { quote: Some(&quote), ak_pub: Some(&ak), hcl: None };
    let a = verify_azure(&ev, None, &p, &nonce, now).unwrap();
    println!("{}", a.azure);
    for c in [C::TpmQuoteFormat, C::TpmSignature, C::TpmNonce, C::TpmPcrDigest] {
        assert!(passed(&a.azure, c), "{c}");
    }
    // Without an HCL report the key is bound to nothing: the binding row does not run, and says so.
    assert!(a.azure.not_run().contains(&C::TpmAkBinding));
    // Another nonce.
    let other = AzureExpected { nonce: Some(b"challengf".to_vec()) };
    let t = appraise_azure(&ev, None, &p, &other, now).azure;
    assert!(matches!(t.error(C::TpmNonce), Some(AzureError::NonceMismatch)), "{t}");
    // An edited message (a byte of the PCR digest).
    let mut edited = quote.clone();
    let last = edited.len() - 24 * 32 - 8 - 1;
    edited[last] ^= 1;
    let ev2 = AzureEvidence { quote: Some(&edited), ..ev };
    let t = appraise_azure(&ev2, None, &p, &nonce, now).azure;
    assert!(matches!(t.error(C::TpmSignature), Some(AzureError::SignatureInvalid)), "{t}");
    assert!(failed(&t, C::TpmPcrDigest));
    // The mixed pair: this HCL report's AK is another VM's. With --ak-pub the
    // binding fails; without it the quote is checked under the HCL's AK and its signature fails.
    let ev3 = AzureEvidence { hcl: Some(&hcl), quote: Some(&quote), ak_pub: Some(&ak) };
    let t = appraise_azure(&ev3, None, &p, &nonce, now).azure;
    assert!(matches!(t.error(C::TpmAkBinding), Some(AzureError::AkMismatch)), "{t}");
    // No VCEK was given for the HCL report's SNP report: that fails too, first.
    assert!(matches!(t.error(C::SnpReport), Some(AzureError::NoEndorsement)), "{t}");
    let e = verify_azure(&ev3, None, &p, &nonce, now).unwrap_err();
    assert_eq!(e.check(), Some(veil_attestation::CheckId::Azure(C::SnpReport)), "{e}");
    let ev4 = AzureEvidence { ak_pub: None, ..ev3 };
    let t = appraise_azure(&ev4, None, &p, &nonce, now).azure;
    assert!(passed(&t, C::TpmAkBinding) && passed(&t, C::RuntimeClaims), "{t}");
    assert!(matches!(t.error(C::TpmSignature), Some(AzureError::SignatureInvalid)), "{t}");
}

/// PCRs the policy pins must be selected by the quote and equal.
#[test]
fn pinned_pcrs_must_match() {
    let set = "azure-cvm-snp";
    let (Some(quote), Some(ak)) = (read(set, "quote.bin"), read(set, "akpub.pem")) else { return };
    let q = TpmQuote::parse(&quote).unwrap();
    let ev = AzureEvidence { quote: Some(&quote), ak_pub: Some(&ak), hcl: None };
    let mut p = any_measurement();
    p.azure.pcrs.insert("4".into(), vec![PcrValue(q.pcr_values[4])]);
    let t = appraise_azure(&ev, None, &p, &AzureExpected::default(), SystemTime::now()).azure;
    assert!(passed(&t, C::TpmPcrs), "{t}");
    p.azure.pcrs.insert("4".into(), vec![PcrValue([0; 32])]);
    let t = appraise_azure(&ev, None, &p, &AzureExpected::default(), SystemTime::now()).azure;
    assert!(matches!(t.error(C::TpmPcrs), Some(AzureError::Pcr(4))), "{t}");
    // A policy built in code that skipped validation: a pin that names no
    // PCR fails the row (it is not skipped as "not run", which would accept).
    p.azure.pcrs.clear();
    p.azure.pcrs.insert("24".into(), vec![PcrValue([0; 32])]);
    assert!(p.validate().is_err());
    let t = appraise_azure(&ev, None, &p, &AzureExpected::default(), SystemTime::now()).azure;
    assert!(matches!(t.error(C::TpmPcrs), Some(AzureError::InvalidPolicy(_))), "{t}");
    assert!(!t.accepted(), "{t}");
}

/// `azure-cvm-snp`'s HCL report: its claims bind to REPORT_DATA, but the
/// VCEK in `certs.pem` is another chip's (CHIP_ID differs from its hwID and
/// the signature does not verify), so the SNP row fails with that VCEK.
#[test]
fn the_azure_cvm_snp_hcl_report_binds_its_claims_but_not_to_that_vcek() {
    let set = "azure-cvm-snp";
    let (Some(hcl), Some(certs)) = (read(set, "hcl-report-snp.bin"), read(set, "certs.pem")) else { return };
    let chain = pem_chain(&certs);
    let e = SnpEndorsement { endorsement: chain[0].clone(), chain: chain[1..].to_vec(), crl: None };
    let ev = AzureEvidence { hcl: Some(&hcl), ..Default::default() };
    let a = appraise_azure(&ev, Some(&e), &any_measurement(), &AzureExpected::default(), SystemTime::now());
    println!("{}\n{}", a.snp.as_ref().unwrap(), a.azure);
    assert!(passed(&a.azure, C::RuntimeClaims) && passed(&a.azure, C::AttestationKey), "{}", a.azure);
    let snp = a.snp.unwrap();
    assert_eq!(snp.failures(), vec![veil_attestation::CheckId::ReportSignature, veil_attestation::CheckId::ChipId]);
    assert!(matches!(a.azure.error(C::SnpReport), Some(AzureError::SnpRejected(c)) if c == "report_signature"));
}

/// The fuzz seeds are in the real layouts: the HCL report parses and its
/// claims hash to its REPORT_DATA; the quote parses.
#[test]
fn azure_fuzz_seeds_parse() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/azure_hcl");
    let h = veil_attestation::azure::HclReport::parse(&std::fs::read(root.join("synthetic_hcl.bin")).unwrap()).unwrap();
    let report = veil_attestation::snp::SnpReport::from_bytes(&h.snp_report).unwrap();
    assert_eq!(report.report_data(), h.hash.report_data(&h.claims_bytes));
    let q = TpmQuote::parse(&std::fs::read(root.join("synthetic_quote.bin")).unwrap()).unwrap();
    assert_eq!(q.extra_data, b"nonce");
    assert_eq!(q.selected_sha256(), vec![0, 2]);
}
