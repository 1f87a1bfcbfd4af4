//! The model side of a shard: GGUF loading into layer slices, per-session
//! KV, and the manifest of what was loaded.

pub mod config;
pub mod device;
pub mod error;
pub mod gguf;
pub mod kernels;
pub mod kv_cache;
pub mod llama;
pub mod manifest;
pub mod reference;
pub mod synth;

pub use config::Config;
pub use device::{ComputeDevice, ParseDeviceError};
pub use error::{ModelError, Result};
pub use gguf::GgufFile;
pub use kv_cache::SessionKv;
pub use llama::{BatchItem, LayerSlice, Logits, Rows, SliceOutput};
pub use manifest::Manifest;
