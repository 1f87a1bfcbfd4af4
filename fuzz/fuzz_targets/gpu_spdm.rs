//! Arbitrary bytes as GPU evidence: the SPDM GET_MEASUREMENTS parser must
//! return a typed error or a transcript whose parts are consistent, and the
//! whole GPU appraisal must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use veil_attestation::gpu::spdm::{SpdmMeasurements, SIGNATURE_LEN};
use veil_attestation::gpu::GpuEvidence;
use veil_attestation::verify::{appraise_gpus, GpuExpectations};
use veil_attestation::Policy;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = SpdmMeasurements::parse(data) {
        // The signed part, the signature and the trailing bytes tile the input exactly.
        assert_eq!(m.signed_bytes().len() + SIGNATURE_LEN + m.trailing_bytes, data.len());
        assert_eq!(&data[..m.signed_bytes().len()], m.signed_bytes());
        let _ = m.opaque.vbios_version();
        let _ = m.opaque.driver_version();
    }
    let g = GpuEvidence { arch: "HOPPER".into(), report: data.to_vec(), cert_chain: vec![], settings: None };
    let policy = Policy { allow_simulated: true, ..Policy::default() };
    let _ = appraise_gpus(&[g], &GpuExpectations::default(), &policy, std::time::SystemTime::now());
});
