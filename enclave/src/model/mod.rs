//! The model side of a shard: GGUF loading into layer slices, per-session
//! KV, and the manifest of what was loaded.
//!
//! A slice ([`LayerSlice`], `slice.rs`) runs blocks (`block.rs`) whose parts
//! each architecture chooses (`arch/`); attention, norms and RoPE
//! (`layers.rs`), weights and their loader (`weight.rs`) and the mixture of
//! experts (`moe.rs`) are shared by all of them.

mod arch;
mod block;
pub mod config;
pub mod device;
pub mod error;
pub mod gguf;
pub mod kernels;
pub mod kv_cache;
mod layers;
pub mod manifest;
mod moe;
pub use moe::{routing_counts, NEAR_TIE};
pub mod plan;
pub mod quant;
pub mod reference;
mod rows;
mod slice;
pub mod synth;
mod weight;

pub use config::Config;
pub use device::{ComputeDevice, ParseDeviceError};
pub use error::{ModelError, Result};
pub use gguf::GgufFile;
pub use kv_cache::SessionKv;
pub use manifest::Manifest;
pub use rows::{BatchItem, Logits, Rows, SliceOutput};
pub use slice::LayerSlice;
