//! Arbitrary text as a policy file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use veil_attestation::Policy;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(p) = Policy::from_toml(text) {
            assert_eq!(Policy::from_toml(&p.to_toml()).unwrap(), p);
        }
    }
});
