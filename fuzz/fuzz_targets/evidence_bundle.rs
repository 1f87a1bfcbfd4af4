//! Arbitrary bytes as bundle JSON: parse, then appraise what parses.
#![no_main]

use libfuzzer_sys::fuzz_target;
use veil_attestation::{appraise, EvidenceBundle, ExpectedClaims, Policy};

fuzz_target!(|data: &[u8]| {
    if let Ok(bundle) = EvidenceBundle::from_json(data) {
        let policy = Policy { allow_simulated: true, any_measurement: true, ..Policy::default() };
        let _ = appraise(&bundle, &policy, &ExpectedClaims::default(), std::time::SystemTime::now());
        let again = EvidenceBundle::from_json(bundle.to_json().as_bytes()).expect("round trip");
        assert_eq!(again, bundle);
    }
});
