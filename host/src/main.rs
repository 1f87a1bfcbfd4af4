//! `veil-host`: the untrusted side of a Veil node.
//!
//! Local shard supervision with the public relay API (`cluster`), the relay
//! alone (`relay`) and test tooling (`wan-shim`). This file only
//! sets up logging, parses arguments, builds the runtime and dispatches to
//! the subcommand's module in `veil_host::cli`.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use veil_host::cli::{self, Cli, Command};

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Scripts read the listening address from the log; keep colour codes out of pipes.
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("veil-host: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome: anyhow::Result<()> = match cli.command {
        Command::WanShim(args) => runtime.block_on(cli::wan_shim::run(args)).map_err(Into::into),
        Command::Cluster(args) => runtime.block_on(cli::cluster::run(args)),
        Command::Relay(args) => runtime.block_on(cli::relay::run(args)),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("veil-host: {e:#}");
            ExitCode::FAILURE
        }
    }
}
