//! # veil-enclave
//!
//! What runs inside a shard's confidential VM. Today: producing attestation
//! evidence for this shard's claims (simulated, or from the SEV-SNP guest
//! device with the `hw` feature). Model loading, the layer slice, the shard
//! link protocol and the entry's gateway are built on this by later work.

#![warn(missing_docs, unreachable_pub)]

pub mod attest;
pub mod entry;
pub mod generate;
pub mod model;
