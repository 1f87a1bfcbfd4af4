//! Arbitrary bytes as a TDX quote: the parser returns a typed error or a
//! quote whose parts tile the input, and the whole TDX appraisal (with the
//! bytes as the quote and as the collateral) never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use veil_attestation::tdx::{appraise_tdx, Quote, TdxExpected, TdxPolicy};

fuzz_target!(|data: &[u8]| {
    if let Ok(q) = Quote::parse(data) {
        // The signed part, the signature data (with its length) and the padding tile the input.
        assert!(q.signed_len <= data.len());
        assert_eq!(&data[data.len() - q.trailing.len()..], q.trailing.as_slice());
        assert_eq!(q.report.mr_service_td.is_some(), q.is_td15());
    }
    let policy = TdxPolicy { any_measurement: true, ..TdxPolicy::default() };
    let _ = appraise_tdx(data, data, &policy, &TdxExpected::default(), std::time::SystemTime::now());
});
