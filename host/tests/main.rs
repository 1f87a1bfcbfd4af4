//! Veil host integration tests: one binary, one module per file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cluster;
mod log;
mod wan;
