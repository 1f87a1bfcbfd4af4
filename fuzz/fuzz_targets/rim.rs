//! Arbitrary bytes as an NVIDIA RIM (SWID tag XML): typed error or a RIM
//! whose golden values have the declared sizes; never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
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
});
