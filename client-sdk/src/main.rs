//! `veil`: the client and reviewer command line.

use clap::Parser;
use veil_client::cli::{run, Cli};

/// Whether a panic is the standard library's "failed printing to stdout"
/// after the reader went away (`veil … | head`): not a failure of ours.
fn is_closed_pipe(payload: &(dyn std::any::Any + Send)) -> bool {
    let text = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or_default();
    text.starts_with("failed printing to std") && text.contains("Broken pipe")
}

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
    // `veil … | head` closes stdout early: end quietly, as other tools do.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !is_closed_pipe(info.payload()) {
            default_hook(info);
        }
    }));
    match std::panic::catch_unwind(|| run(cli)) {
        Ok(exit) => std::process::ExitCode::from(exit as u8),
        Err(payload) if is_closed_pipe(payload.as_ref()) => std::process::ExitCode::SUCCESS,
        Err(payload) => std::panic::resume_unwind(payload),
    }
}
