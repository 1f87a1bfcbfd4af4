//! # veil-host
//!
//! The untrusted side of a Veil node. The host holds no key that opens a
//! request. Its public API (attestation relay, sealed-request relay, health,
//! metrics) and the supervision of shard processes are built by the
//! sealed-request and pipeline work; they are **not built yet**.
//!
//! Today the crate holds test and benchmark tooling:
//!
//! - [`wan`]: a userspace WAN link shim, a TCP relay that adds one-way delay,
//!   jitter and a bandwidth cap between shard processes on loopback (the
//!   machines here have no `netem`). Bin: `veil-host wan-shim`.
//!
//! ```text
//!  shard A ──TCP──▶ WanShim (listen) ──[delay ± jitter, rate cap]──▶ shard B (target)
//!          ◀──TCP── ─────────────────────[same shape, own schedule]◀──
//! ```
//!
//! - [`cli`]: the `veil-host` command line, one module per subcommand.

#![warn(missing_docs, unreachable_pub)]

pub mod cli;
pub mod wan;
