//! Arbitrary bytes as the certificate table a host attaches to an extended
//! report: a typed result, never a panic, and every entry within the blob.
#![no_main]

use libfuzzer_sys::fuzz_target;
use veil_attestation::snp::certs;

fuzz_target!(|data: &[u8]| {
    if let Ok(table) = certs::parse(data) {
        for (_, bytes) in table.entries() {
            assert!(bytes.len() <= data.len());
        }
    }
});
