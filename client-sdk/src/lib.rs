//! # veil-client
//!
//! The client side of Veil: today, the reviewer's tools over
//! `veil-attestation` (`veil attest inspect`, `veil attest verify`,
//! `veil attest sim-init`). The SDK flow (connect → verify every shard →
//! seal → stream) is built on the same verifier by the sealed-request work.
//!
//! ```text
//!  file (report.bin | report.hex | bundle.json) ──▶ input::load ──▶ EvidenceBundle
//!  policy.toml + flags ──▶ Policy, ExpectedClaims ──┐                    │
//!                                                   ▼                    ▼
//!                                 veil_attestation::appraise ──▶ CheckReport ──▶ table / JSON, exit code
//! ```

#![warn(missing_docs, unreachable_pub)]

pub mod cli;
pub mod input;
pub mod sdk;
pub mod seal;
