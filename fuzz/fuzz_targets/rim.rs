//! Arbitrary bytes as an NVIDIA RIM (SWID tag XML): typed error or a RIM
//! whose golden values have the declared sizes; the XML-DSig verifier
//! (canonicalization, structure checks) never panics either.
#![no_main]

use libfuzzer_sys::fuzz_target;
use veil_attestation::gpu::xmldsig::{nvidia_rim_root, verify_rim_signature};
use veil_attestation::gpu::Rim;

fuzz_target!(|data: &[u8]| {
    if let Ok(rim) = Rim::parse(data) {
        for golden in rim.measurements.values() {
            assert!(!golden.alternatives.is_empty());
            let size = golden.alternatives[0].len();
            assert!(golden.alternatives.iter().all(|a| a.len() == size));
        }
        let _ = rim.active_indices().count();
    }
    if let Ok(root) = nvidia_rim_root() {
        // Nothing random verifies; what matters is a typed error, not a panic.
        assert!(verify_rim_signature(data, &root, std::time::SystemTime::now()).is_err());
    }
});
