//! The `veil-host` command line. One module per subcommand; `main.rs` only
//! parses arguments, builds the runtime and dispatches.

pub mod cluster;
pub mod relay;
pub mod wan_shim;

use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};

/// `--tls-cert PEM --tls-key PEM`: HTTPS for the public API (`cluster`, `relay`).
#[derive(Debug, Args)]
pub struct TlsArgs {
    /// Serve the public API over HTTPS with this PEM certificate chain (leaf first).
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of `--tls-cert`.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl TlsArgs {
    /// The server configuration, when both are given; a bad certificate or key is an error.
    pub fn server_config(&self) -> anyhow::Result<Option<Arc<rustls::ServerConfig>>> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Ok(Some(crate::relay::tls_server_config(cert, key)?)),
            _ => Ok(None),
        }
    }
}

/// The untrusted Veil host.
#[derive(Debug, Parser)]
#[command(
    name = "veil-host",
    version,
    about = "The untrusted Veil host: the public relay API, local shard supervision and test tooling",
    long_about = "The untrusted Veil host. `cluster` starts and supervises the shard processes of a route on \
                  this machine and serves the public relay API (sealed requests and attestation documents, \
                  relayed to the entry as ciphertext; optional TLS; limits and metrics); `relay` serves that \
                  API alone in front of an entry elsewhere; `wan-shim` adds WAN \
                  delay to loopback links for tests and benchmarks. The host holds no key that opens a prompt.",
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
    /// Start and supervise the shard processes of a route on this machine (simulated TEEs for development).
    Cluster(cluster::ClusterArgs),
    /// Serve the public relay API alone, in front of an entry that runs elsewhere (its own CVM, a pod).
    Relay(relay::RelayArgs),
    /// Relay TCP to a target with added one-way delay, jitter and a bandwidth cap (WAN simulation on loopback).
    WanShim(wan_shim::WanShimArgs),
}
