//! `veil-host`: the untrusted side of a Veil node.
//!
//! The host holds no key that opens a request. Its public API (attestation
//! relay, sealed-request relay, health, metrics) and the supervision of
//! shard processes are built by the sealed-request and pipeline work; until
//! then this binary only reports its version, and says so.

use clap::Parser;

/// The untrusted Veil host (relay and supervision).
#[derive(Debug, Parser)]
#[command(
    name = "veil-host",
    version,
    about,
    long_about = "The untrusted Veil host. Its relay API and shard supervision are not built yet; this build only reports its version."
)]
struct Cli {}

fn main() {
    let _ = Cli::parse();
    eprintln!(
        "veil-host {}: the relay API and shard supervision are not built yet (see README, roadmap)",
        env!("CARGO_PKG_VERSION")
    );
    std::process::exit(2);
}
