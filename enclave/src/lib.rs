//! # veil-enclave
//!
//! What runs inside a shard's confidential VM: evidence for the shard's
//! claims ([`attest`]: simulated, or SEV-SNP with the `hw` feature), the
//! model slice and its KV cache ([`model`]), text in and out of the model
//! on the entry shard — tokenizer, chat template, sampler ([`text`]) — the
//! link protocol between shards ([`link`]), the pipeline ([`pipeline`]),
//! speculative decoding ([`speculate`]), the sealed OpenAI gateway
//! ([`gateway`]) and canary prompts ([`canary`]).
//!
//! ```text
//!  sealed request ──▶ gateway (open, parse, tokenize)
//!                       └─▶ Entry::run_session (drives SessionCore, sans-IO)
//!                             └─▶ StageWorker (layers of stage 0)
//!                                                     │ forward frame, RA-TLS data link
//!                                                     ▼
//!                                             stage 1 … last stage (StageWorker each)
//!                                                     │ verdict, RA-TLS control link
//!  sealed answer ◀── gateway (SSE, padded) ◀── SessionCore: sampler / verify_round ◀─┘
//! ```
//!
//! `docs/ARCHITECTURE.md` walks one request through these by function.

#![warn(missing_docs, unreachable_pub)]

pub mod attest;
pub mod canary;
pub mod cli;
pub mod contain;
pub mod error;
pub mod gateway;
pub mod generate;
pub mod gpu_reference;
pub mod link;
pub mod local_model;
pub mod model;
pub mod node;
pub mod pipeline;
pub mod speculate;
pub mod text;
