//! Arbitrary JSON as claims: what parses must encode, and the encoding must
//! be a function of the claims alone.
#![no_main]

use libfuzzer_sys::fuzz_target;
use veil_attestation::Claims;

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = serde_json::from_slice::<Claims>(data) {
        if let Ok(enc) = c.encode() {
            let back: Claims = serde_json::from_str(&serde_json::to_string(&c).unwrap()).unwrap();
            assert_eq!(back.encode().unwrap(), enc);
        }
    }
});
