//! Veil client and `veil` CLI integration tests: one binary, one module per file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cli;
mod cli_platforms;
mod measure;
mod transparency;
