//! `veil-host relay`: the public API alone, in front of an entry that runs
//! elsewhere (its own confidential VM, a Kubernetes pod). Sealed requests and
//! attestation documents are passed through as ciphertext; the relay holds no
//! key that opens a prompt.

use std::net::SocketAddr;

use anyhow::Context;
use clap::Args;

use crate::relay::{Relay, RelayConfig};

/// `veil-host relay --entry ADDR --listen ADDR`
#[derive(Debug, Args)]
pub struct RelayArgs {
    /// The entry's gateway (`entry.sealed_listen` in the route).
    #[arg(long)]
    pub entry: SocketAddr,
    /// The public API.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// HTTPS for the public API.
    #[command(flatten)]
    pub tls: super::TlsArgs,
    /// Slots of sealed requests in flight at once (a request holds its
    /// `veil-cost`); more wait in the queue.
    #[arg(long, default_value_t = 64)]
    pub max_concurrent: usize,
    /// Sealed requests that may wait for a slot, all clients together
    /// (served by client address in turn); more get 503 with Retry-After.
    /// 0: no queue.
    #[arg(long, default_value_t = 256)]
    pub max_queued: usize,
    /// Seconds a sealed request waits for a slot before a 503 with Retry-After.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub queue_timeout: u64,
    /// Sealed requests in flight or queued at once from one client address; more get 429.
    #[arg(long, default_value_t = 16)]
    pub max_per_client: usize,
    /// Attestation fetches in flight at once from one client address; more get 429.
    #[arg(long, default_value_t = 2)]
    pub max_attestation_per_client: usize,
    /// Serve this copy of the policy transparency log (`veil log init`) read-only under /v1/log.
    #[arg(long, value_name = "DIR")]
    pub log_dir: Option<std::path::PathBuf>,
}

/// Runs the relay until SIGTERM or Ctrl-C.
pub async fn run(args: RelayArgs) -> anyhow::Result<()> {
    let tls = args.tls.server_config()?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let listener =
        tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("listening on {}", args.listen))?;
    if args.max_concurrent == 0 || args.max_per_client == 0 || args.max_attestation_per_client == 0 {
        anyhow::bail!("--max-concurrent, --max-per-client and --max-attestation-per-client must be at least 1");
    }
    let relay = Relay::new(RelayConfig {
        tls,
        max_concurrent: args.max_concurrent,
        max_queued: args.max_queued,
        queue_timeout: std::time::Duration::from_secs(args.queue_timeout),
        max_per_client: args.max_per_client,
        max_attestation_per_client: args.max_attestation_per_client,
        log: args.log_dir,
        ..RelayConfig::new(args.entry)
    });
    println!("listening on {scheme}://{} (entry {})", args.listen, args.entry);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = relay.serve(listener) => {}
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    Ok(())
}
