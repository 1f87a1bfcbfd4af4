//! `veil`: the client and reviewer command line.

use clap::Parser;
use veil_client::cli::{run, Cli};

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // The verifier's per-evidence warnings about simulated evidence are in
        // every check table's banner already: one banner, not a log line per
        // shard, unless RUST_LOG asks for them.
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,veil_attestation=error".into()),
        )
        .init();
    let cli = Cli::parse();
    std::process::ExitCode::from(run(cli) as u8)
}
