//! # veil-host
//!
//! The untrusted side of a Veil node. The host holds no key that opens a
//! request: it relays ciphertext and evidence and supervises shard processes.
//!
//! - [`relay`]: the public API (`/v1/attestation`, `/v1/sealed`, `/healthz`,
//!   `/metrics`) in front of the entry's gateway, with body, concurrency and
//!   timeout limits.
//! - [`admission`]: the relay's slots and its bounded, fair queue.
//! - [`cli`]: the `veil-host` command line (`cluster`, `wan-shim`), one module
//!   per subcommand.
//! - [`wan`]: a userspace WAN link shim, a TCP relay that adds one-way delay,
//!   jitter and a bandwidth cap between shard processes on loopback (the
//!   machines here have no `netem`).
//!
//! ```text
//!  client ──HTTP──▶ relay (host) ──HTTP──▶ entry gateway (CVM) ══RA-TLS══▶ shards
//!         ciphertext + evidence only
//! ```

#![warn(missing_docs, unreachable_pub)]

pub mod admission;
pub mod cli;
pub mod relay;
pub mod wan;
