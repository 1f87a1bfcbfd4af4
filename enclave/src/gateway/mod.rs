//! The entry's sealed-request gateway: Oblivious HTTP (RFC 9458) with
//! chunked responses, Binary HTTP (RFC 9292) inside. Requests open only
//! inside the entry; the host relays ciphertext.

// The session cores: no unwrap or expect outside tests (a panic here would drop sessions).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod answer;
pub mod openai;
pub mod seal;
pub mod server;
