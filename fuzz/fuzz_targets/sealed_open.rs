//! Arbitrary bytes as a sealed request to the entry: opening never panics,
//! and nothing that fails to authenticate is remembered by the replay window.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use veil_enclave::gateway::seal::SealKey;

fn key() -> &'static SealKey {
    static KEY: OnceLock<SealKey> = OnceLock::new();
    KEY.get_or_init(|| SealKey::generate(7).expect("key"))
}

fuzz_target!(|data: &[u8]| {
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let before = key().remembered();
    let mut sealed = data.to_vec();
    // Most inputs should reach the decryption: give them the right key id.
    if let Some(first) = sealed.first_mut() {
        *first = 7;
    }
    let opened = rt.block_on(key().open(sealed));
    if opened.is_err() {
        assert_eq!(key().remembered(), before, "a request that did not open was remembered");
    }
});
