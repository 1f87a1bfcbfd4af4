//! Veil attestation integration tests: one binary, one module per file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod azure_vectors;
mod gpu_negative;
mod gpu_vectors;
mod invalid_values;
mod route;
mod tdx_simulated;
mod tdx_vectors;
