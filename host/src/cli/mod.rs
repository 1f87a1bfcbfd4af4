//! The `veil-host` command line. One module per subcommand; `main.rs` only
//! parses arguments, builds the runtime and dispatches.

pub mod wan_shim;

use clap::{Parser, Subcommand};

/// The untrusted Veil host.
#[derive(Debug, Parser)]
#[command(
    name = "veil-host",
    version,
    about = "The untrusted Veil host (relay API and shard supervision: not built yet; today: test tooling)",
    long_about = "The untrusted Veil host. Its relay API and shard supervision are not built yet; \
                  today it offers test and benchmark tooling (`wan-shim`).",
    arg_required_else_help = true
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Relay TCP to a target with added one-way delay, jitter and a bandwidth cap (WAN simulation on loopback).
    WanShim(wan_shim::WanShimArgs),
}
