//! Every integration test of `veil-enclave` in one binary, so the support
//! code (clusters of `veil-shard` processes, the abusive client, a model
//! with a large vocabulary) is compiled and linked once. One module per
//! area; `cargo test -p veil-enclave --test all pipeline::` runs one.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

#[path = "../support/abuse.rs"]
mod abuse_support;
#[path = "../support/big_vocab.rs"]
mod big_vocab;
#[path = "../support/cluster.rs"]
mod cluster;
#[path = "../support/relay.rs"]
mod relay;

mod abuse;
mod cli;
mod device;
mod families;
mod format_budget;
mod gemma3;
mod model;
mod openai;
mod perplexity;
mod pipeline;
mod quant_suite;
mod route_binding;
mod self_draft;
mod speculation;
mod structured;
mod templates;
mod tools;
mod vocab;
