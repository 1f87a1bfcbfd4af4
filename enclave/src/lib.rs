//! # veil-enclave
//!
//! What runs inside a shard's confidential VM: attestation evidence for the
//! shard's claims (simulated, or from the SEV-SNP guest device with the `hw`
//! feature), the model slice and its KV cache, the entry's tokenizer and
//! sampler, the link protocol between shards, and the pipeline servers.

#![warn(missing_docs, unreachable_pub)]

pub mod attest;
pub mod canary;
pub mod entry;
pub mod gateway;
pub mod generate;
pub mod link;
pub mod model;
pub mod pipeline;
pub mod speculate;
