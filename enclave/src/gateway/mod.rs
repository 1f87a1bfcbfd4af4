//! The entry's sealed-request gateway: Oblivious HTTP (RFC 9458) with
//! chunked responses, Binary HTTP (RFC 9292) inside. Requests open only
//! inside the entry; the host relays ciphertext.

pub mod openai;
pub mod seal;
pub mod server;
