//! Arbitrary bytes as an RA-TLS certificate and as its evidence extension.
#![no_main]

use libfuzzer_sys::fuzz_target;
use veil_attestation::ratls::{decode_certificate, decode_extension};

fuzz_target!(|data: &[u8]| {
    let _ = decode_certificate(data);
    let _ = decode_extension(data);
});
