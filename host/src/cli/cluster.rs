//! `veil-host cluster`: starts the shard processes a route describes on this
//! machine and supervises them — restart on crash with backoff, clean
//! shutdown on Ctrl-C or SIGTERM. Every shard runs `--supervised`: it holds a
//! pipe from us on stdin and exits when that closes, so no shard outlives
//! the supervisor, even one killed with SIGKILL.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use veil_wire::route::RouteFile;

use anyhow::Context;
use tokio::process::{Child, Command};

/// Arguments of `veil-host cluster`.
#[derive(Debug, clap::Args)]
pub struct ClusterArgs {
    /// Route file (see deploy/local/cluster.toml).
    #[arg(long)]
    pub config: PathBuf,
    /// Start every shard with `--bind-config`: each refuses to start unless its HOST_DATA
    /// commits to the route and peer policy it is handed (`veil-shard config-digest`).
    #[arg(long)]
    pub bind_config: bool,
    /// The `veil-shard` binary (default: next to this one).
    #[arg(long)]
    pub shard_bin: Option<PathBuf>,
    /// Where the completed route is written (default: next to the config, `.run/`).
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// Use this model file instead of the route's.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The public API (relay to the entry's gateway).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// HTTPS for the public API.
    #[command(flatten)]
    pub tls: super::TlsArgs,
    /// Serve this copy of the policy transparency log (`veil log init`) read-only under /v1/log.
    #[arg(long, value_name = "DIR")]
    pub log_dir: Option<std::path::PathBuf>,
}

/// First restart delay; doubles per crash up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// Longest restart delay.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A process that ran this long resets its backoff.
const STABLE_AFTER: Duration = Duration::from_secs(60);
/// `veil-shard serve`'s exit status for a configuration error (EX_CONFIG).
const EXIT_CONFIG: i32 = 78;
/// Consecutive exits within [`QUICK_EXIT`] of starting that stop the cluster.
const MAX_QUICK_EXITS: u32 = 5;
/// An exit this soon after starting counts as a start failure.
const QUICK_EXIT: Duration = Duration::from_secs(10);
/// How long shards get to exit after their pipe closes.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

struct Shard {
    stage: usize,
    replica: usize,
    layers: [u32; 2],
    child: Option<Child>,
    started: Instant,
    backoff: Duration,
    restart_at: Option<Instant>,
    quick_exits: u32,
}

/// Runs the cluster until Ctrl-C or SIGTERM.
pub async fn run(args: ClusterArgs) -> anyhow::Result<()> {
    let shard_bin = match args.shard_bin {
        Some(p) => p,
        None => std::env::current_exe()?.with_file_name("veil-shard"),
    };
    if !shard_bin.exists() {
        anyhow::bail!("{} not found (build it, or pass --shard-bin)", shard_bin.display());
    }
    let run_dir = args.run_dir.unwrap_or_else(|| args.config.parent().unwrap_or(Path::new(".")).join(".run"));
    std::fs::create_dir_all(&run_dir).with_context(|| format!("creating {}", run_dir.display()))?;
    let route = run_dir.join("route.toml");
    tracing::info!(config = %args.config.display(), "preparing the route (simulated root, manifest roots)");
    let mut prepare = Command::new(&shard_bin);
    prepare.args(["prepare", "--config"]).arg(&args.config).arg("--out").arg(&route);
    if let Some(m) = &args.model {
        prepare.arg("--model").arg(m);
    }
    let status = prepare.status().await.context("running veil-shard prepare")?;
    if !status.success() {
        anyhow::bail!("veil-shard prepare failed ({status})");
    }
    let text = std::fs::read_to_string(&route)?;
    let view = RouteFile::from_toml(&text).context("reading the completed route")?;
    let mut shards: Vec<Shard> = Vec::new();
    for (stage, s) in view.stage.iter().enumerate().rev() {
        for replica in 0..s.replicas.len() {
            shards.push(Shard {
                stage,
                replica,
                layers: s.layers,
                child: None,
                started: Instant::now(),
                backoff: FIRST_BACKOFF,
                restart_at: Some(Instant::now()),
                quick_exits: 0,
            });
        }
    }
    tracing::info!(
        generate = %view.entry.generate_listen,
        "starting {} shard processes; the entry's internal generate endpoint will be at {}",
        shards.len(),
        view.entry.generate_listen
    );
    // The public API, once the entry's gateway answers. A bad certificate or
    // key stops the cluster before any shard starts.
    let tls = args.tls.server_config()?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    // This cluster's id, handed to its shards: the relay says it is ready only
    // when its own entry answers (not another cluster's on the same address).
    let cluster_id: String = rand_id().iter().map(|b| format!("{b:02x}")).collect();
    let relay_task = match view.entry.sealed_listen {
        None => {
            tracing::warn!("the route sets no entry.sealed_listen: no public API");
            None
        }
        Some(gateway) => {
            let listener = tokio::net::TcpListener::bind(args.listen)
                .await
                .with_context(|| format!("listening on {}", args.listen))?;
            let relay = crate::relay::Relay::new(crate::relay::RelayConfig {
                tls,
                log: args.log_dir.clone(),
                ..crate::relay::RelayConfig::new(gateway)
            });
            let listen = args.listen;
            let id = cluster_id.clone();
            Some(tokio::spawn(async move {
                wait_for_gateway(gateway, &id).await;
                // The line scripts wait for (stdout): the API is ready.
                println!("listening on {scheme}://{listen}");
                relay.serve(listener).await;
            }))
        }
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let mut fatal: Option<String> = None;
    'supervise: loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
            _ = tick.tick() => {}
        }
        for s in &mut shards {
            if let Some(why) = s.reap() {
                fatal = Some(why);
                break 'supervise;
            }
            if s.child.is_none() && s.restart_at.is_some_and(|t| Instant::now() >= t) {
                s.start(&shard_bin, &route, &cluster_id, args.bind_config);
            }
        }
    }
    if let Some(t) = relay_task {
        t.abort();
    }
    stop_all(&mut shards).await;
    tracing::info!("all shards stopped");
    match fatal {
        Some(why) => anyhow::bail!(why),
        None => Ok(()),
    }
}

impl Shard {
    /// Notes an exit of its process: a restart is scheduled with backoff,
    /// or, for a configuration error or too many quick exits, the reason
    /// to stop the cluster.
    fn reap(&mut self) -> Option<String> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        if self.started.elapsed() > STABLE_AFTER {
            self.backoff = FIRST_BACKOFF;
        }
        // A configuration error (bad route or policy, address in use) does
        // not heal by restarting: stop, naming it.
        if status.code() == Some(EXIT_CONFIG) {
            return Some(format!(
                "shard stage {} replica {} cannot start (configuration error, its message is above); not restarting",
                self.stage, self.replica
            ));
        }
        self.quick_exits = if self.started.elapsed() < QUICK_EXIT { self.quick_exits + 1 } else { 0 };
        if self.quick_exits >= MAX_QUICK_EXITS {
            return Some(format!(
                "shard stage {} replica {} exited {} times within {:?} of starting; not restarting",
                self.stage, self.replica, self.quick_exits, QUICK_EXIT
            ));
        }
        tracing::warn!(stage = self.stage, replica = self.replica, %status, restart_in = ?self.backoff, "shard exited; restarting");
        self.child = None;
        self.restart_at = Some(Instant::now() + self.backoff);
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        None
    }

    /// Starts its process; a failed start is retried after the backoff.
    fn start(&mut self, shard_bin: &Path, route: &Path, cluster_id: &str, bind_config: bool) {
        match spawn(shard_bin, route, self.stage, self.replica, cluster_id, bind_config) {
            Ok(child) => {
                tracing::info!(
                    stage = self.stage,
                    replica = self.replica,
                    layers = ?self.layers,
                    pid = child.id().unwrap_or(0),
                    "shard started"
                );
                self.child = Some(child);
                self.started = Instant::now();
                self.restart_at = None;
            }
            Err(e) => {
                tracing::error!(stage = self.stage, error = %e, "cannot start shard");
                self.restart_at = Some(Instant::now() + self.backoff);
                self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Closes every shard's supervision pipe (each exits cleanly when it
/// closes) and kills those still running after the grace period.
async fn stop_all(shards: &mut [Shard]) {
    tracing::info!("shutting down: closing every shard's supervision pipe");
    for s in shards.iter_mut() {
        if let Some(child) = &mut s.child {
            drop(child.stdin.take());
        }
    }
    let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
    for s in shards.iter_mut() {
        if let Some(child) = &mut s.child {
            if tokio::time::timeout_at(deadline, child.wait()).await.is_err() {
                tracing::warn!(stage = s.stage, replica = s.replica, "shard did not exit in time: killing it");
                let _ = child.kill().await;
            }
        }
    }
}

/// Waits until the gateway serves evidence for every stage (the entry is
/// ready when its shards are verified).
async fn wait_for_gateway(gateway: SocketAddr, cluster_id: &str) {
    loop {
        if let Ok(mut tcp) = tokio::net::TcpStream::connect(gateway).await {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let req = format!("GET /healthz HTTP/1.1\r\nHost: {gateway}\r\nConnection: close\r\n\r\n");
            let mut answer = Vec::new();
            if tcp.write_all(req.as_bytes()).await.is_ok()
                && tcp.read_to_end(&mut answer).await.is_ok()
                && answer.starts_with(b"HTTP/1.1 200")
                && String::from_utf8_lossy(&answer).contains(&format!("ok {cluster_id}"))
            {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// 16 random bytes from the OS (an id, not a secret: it tells this cluster's
/// entry from another's).
fn rand_id() -> [u8; 16] {
    let mut b = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut b);
    }
    b
}

fn spawn(
    bin: &Path,
    route: &Path,
    stage: usize,
    replica: usize,
    cluster_id: &str,
    bind_config: bool,
) -> std::io::Result<Child> {
    Command::new(bin)
        .env("VEIL_CLUSTER_ID", cluster_id)
        .args(["serve", "--config"])
        .arg(route)
        .args(["--stage", &stage.to_string(), "--replica", &replica.to_string(), "--supervised"])
        .args(bind_config.then_some("--bind-config"))
        .stdin(Stdio::piped())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
}
