//! Arbitrary bytes as TDX collateral: the JSON form, the TCB info and QE
//! identity bodies and the hex fields return typed errors, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use veil_attestation::tdx::Collateral;

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = Collateral::from_json(data) {
        let _ = c.tcb_info();
        let _ = c.qe_identity();
        let _ = c.tcb_info_signature();
        let _ = c.qe_identity_signature();
        let _ = c.root_ca_crl_der();
        let _ = c.pck_crl_der();
    }
});
