//! Arbitrary bytes as an Azure HCL report and as a vTPM quote: the parsers
//! return typed errors, and the Azure appraisal never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use veil_attestation::azure::{AzureEvidence, AzureExpected, HclReport, TpmQuote};
use veil_attestation::{appraise_azure, Policy};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = HclReport::parse(data) {
        assert_eq!(h.snp_report.len(), 1184);
        let _ = h.claims.ak_pub();
    }
    if let Ok(q) = TpmQuote::parse(data) {
        let _ = q.computed_pcr_digest();
    }
    let ev = AzureEvidence { hcl: Some(data), quote: Some(data), ak_pub: Some(data) };
    let expected = AzureExpected { nonce: Some(b"n".to_vec()) };
    let _ = appraise_azure(&ev, None, &Policy::default(), &expected, std::time::SystemTime::now());
});
