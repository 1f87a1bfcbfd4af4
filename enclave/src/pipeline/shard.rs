//! A shard process: one stage of the route. Accepts data links from the
//! previous stage and a control link from the entry, runs what arrives in
//! batches, and passes hidden states on (or, as the last stage, returns the
//! verdict straight to the entry).

use std::path::Path;
use std::sync::Arc;

use tokio::sync::{mpsc, Mutex};
use veil_attestation::ratls::RaTlsIdentity;
use veil_attestation::route::RouteShape;
use veil_attestation::{Attester, ManifestRoot, Policy};

use super::net::{listen, Downstream, ForwardError, Trust};
use super::route::Route;
use super::worker::{Command, Job, Output, StageWorker};
use crate::error::{Error, Result};
use crate::link::frame::{ErrorCode, ErrorReport, Frame, Hello, LinkRole, PROTOCOL_VERSION};
use crate::model::{GgufFile, LayerSlice};

/// A loaded stage, ready to serve.
#[derive(Debug)]
pub struct Loaded {
    /// The slice.
    pub slice: Arc<LayerSlice>,
    /// Our attested identity and the policy.
    pub trust: Arc<Trust>,
    /// The claims our evidence binds (without the TLS key), for fresh evidence.
    pub claims: veil_attestation::Claims,
    /// The route's shape (its digest is in the claims).
    pub shape: RouteShape,
    /// The peer policy whose digest the claims carry.
    pub policy: Arc<Policy>,
    /// The vocabulary, read from the very header the manifest root covers:
    /// the entry's tokenizer, and the last stage's for response formats
    /// (the first and last stages only).
    pub tokenizer: Option<Arc<crate::text::tokenizer::Tokenizer>>,
}

/// How this shard attests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evidence {
    /// Veil's simulated root (development).
    Simulated,
    /// SEV-SNP hardware: the peer policy must not accept simulated peers or
    /// waive their measurement.
    Hardware,
}

/// Loads stage `stage` of `route`: the slice (refusing weights whose
/// manifest root differs from the route's pin), the policy, and an RA-TLS
/// identity whose evidence binds the layer range, the manifest root, the
/// digest of the peer policy, the route's shape and (on the entry) the hash
/// of the sealing key configuration.
pub fn load(
    route: &Route,
    stage: usize,
    device: crate::model::ComputeDevice,
    attester: &dyn Attester,
    hpke_config_hash: Option<[u8; 32]>,
    evidence: Evidence,
) -> Result<Loaded> {
    route.fully_pinned()?;
    let s = route.stages.get(stage).ok_or_else(|| Error::Config(format!("the route has no stage {stage}")))?;
    let policy = load_policy(&route.policy)?;
    policy.fit_for_serving_path().map_err(|e| Error::Refused(format!("policy {}: {e}", route.policy.display())))?;
    if evidence == Evidence::Hardware {
        policy.fit_for_hardware().map_err(|e| {
            Error::Refused(format!("policy {} refused for a hardware shard: {e}", route.policy.display()))
        })?;
    }
    // One read of the file: the slice, the configuration and (entry) the
    // tokenizer come from the same parsed header, which the root covers.
    let mut gguf = GgufFile::open(&route.model)?;
    let slice = LayerSlice::from_gguf_on(&mut gguf, s.layers.start() as usize..s.layers.end() as usize, device)?;
    let shape = route.shape(u32::try_from(slice.config().n_layer).unwrap_or(u32::MAX))?;
    let last = stage + 1 == route.stages.len();
    let tokenizer =
        (stage == 0 || last).then(|| crate::text::tokenizer::Tokenizer::from_gguf(&gguf).map(Arc::new)).transpose()?;
    let root = ManifestRoot(slice.manifest().root());
    if Some(root) != s.manifest_root {
        return Err(Error::Refused(format!(
            "the weights loaded for layers {} have manifest root {root}, the route pins {}",
            s.layers,
            s.manifest_root.map(|r| r.to_string()).unwrap_or_default()
        )));
    }
    let mut claims = crate::attest::claims(Some(s.layers), None);
    claims.manifest_root = Some(root);
    claims.hpke_config_hash = hpke_config_hash.map(veil_attestation::KeyHash);
    let (peer_policy, route_shape) = (policy.digest(), shape.digest());
    claims.peer_policy = Some(peer_policy);
    claims.route_shape = Some(route_shape);
    let identity = RaTlsIdentity::new(attester, claims.clone())?;
    let hello = Hello { version: PROTOCOL_VERSION, role: LinkRole::Data, layers: s.layers, manifest_root: root };
    let policy = Arc::new(policy);
    tracing::info!(%peer_policy, %route_shape, "peer policy and route shape bound into this shard's claims");
    let trust = Arc::new(Trust { identity, policy: policy.clone(), hello, peer_policy, route_shape });
    Ok(Loaded { slice: Arc::new(slice), trust, claims, shape, policy, tokenizer })
}

/// Reads a policy file.
pub fn load_policy(path: &Path) -> Result<Policy> {
    let text = std::fs::read_to_string(path).map_err(Error::io(format!("reading policy {}", path.display())))?;
    let policy = Policy::from_toml(&text).map_err(|e| Error::Config(format!("policy {}: {e}", path.display())))?;
    if policy.allow_simulated {
        tracing::warn!("the cluster policy accepts SIMULATED attestation: development only");
    }
    Ok(policy)
}

type EntrySink = Arc<Mutex<Option<mpsc::Sender<Frame>>>>;

/// Re-hashes `slice`'s resident weights every `every` on its own thread,
/// against the digest taken right after load; calls `changed` once, with
/// what differs, if they ever change (SECURITY-CASES G5). The shard's binary
/// stops the process there, so the supervisor restarts it from the verified
/// file and the route fails over meanwhile.
pub fn watch_weights(
    slice: Arc<LayerSlice>,
    every: std::time::Duration,
    changed: impl FnOnce(String) + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    watch(every, move || slice.resident_digest().map_err(|e| e.to_string()), changed)
}

/// The loop of [`watch_weights`], over any digest.
pub fn watch(
    every: std::time::Duration,
    digest: impl Fn() -> Result<[u8; 32], String> + Send + 'static,
    changed: impl FnOnce(String) + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("weight-watch".into()).spawn(move || {
        let baseline = match digest() {
            Ok(d) => d,
            Err(e) => return changed(format!("cannot hash the resident weights: {e}")),
        };
        tracing::info!(digest = %hex::encode(&baseline[..8]), every_s = every.as_secs(), "resident weights hashed");
        loop {
            std::thread::sleep(every);
            match digest() {
                Ok(now) if now == baseline => tracing::debug!("resident weights unchanged"),
                Ok(now) => {
                    return changed(format!(
                        "resident weights changed since load: {} -> {}",
                        hex::encode(&baseline[..8]),
                        hex::encode(&now[..8])
                    ))
                }
                Err(e) => return changed(format!("cannot hash the resident weights: {e}")),
            }
        }
    })
}

/// Serves stage `stage` (≥ 1) at replica address `replica` until the process ends.
///
/// Listens on the replica's address in the route, or on `bind` when the
/// route's address is one the network forwards here (a Kubernetes Service IP,
/// a NAT): peers still dial the route's address, and RA-TLS makes the
/// forwarding irrelevant to trust.
pub async fn serve(
    route: Route,
    stage: usize,
    replica: usize,
    loaded: Loaded,
    bind: Option<std::net::SocketAddr>,
) -> Result<()> {
    if stage == 0 {
        return Err(Error::Config("stage 0 is the entry: serve it with the entry server".into()));
    }
    let advertised = *route.stages[stage]
        .replicas
        .get(replica)
        .ok_or_else(|| Error::Config(format!("stage {stage} has no replica {replica}")))?;
    let addr = bind.unwrap_or(advertised);
    let listener = listen(addr).await.map_err(Error::io(format!("listening on {addr}")))?;
    let (cmd_tx, cmd_rx) = mpsc::channel::<Command>(1024);
    let (out_tx, mut out_rx) = mpsc::channel::<Output>(1024);
    let mut worker = StageWorker::new(loaded.slice.clone(), stage, route.kv_budget_bytes);
    if let Some(tokenizer) = loaded.tokenizer.clone() {
        worker = worker.with_vocabulary(tokenizer);
    }
    std::thread::Builder::new()
        .name(format!("stage-{stage}"))
        .stack_size(crate::pipeline::entry::format_jobs::STAGE_STACK_BYTES)
        .spawn(move || worker.run(cmd_rx, out_tx))
        .map_err(Error::io("starting the stage worker"))?;
    let entry: EntrySink = Arc::new(Mutex::new(None));
    let downstream =
        route.stages.get(stage + 1).map(|next| Arc::new(Downstream::new(loaded.trust.clone(), next.clone())));
    // Outputs: hidden states on, verdicts and errors back to the entry.
    let sink = entry.clone();
    tokio::spawn(async move {
        while let Some(out) = out_rx.recv().await {
            let to_entry = match out {
                Output::Downstream { replica, frame } => {
                    let (session, seq, mirror) = (frame.session, frame.seq, frame.mirror);
                    let sent = match &downstream {
                        Some(d) => d.send(replica, Frame::Forward(frame)).await,
                        None => Err(ForwardError::NoNextStage),
                    };
                    match sent {
                        Ok(()) => continue,
                        Err(e) if mirror => {
                            // A shadow out of reach shadows nothing; the session goes on.
                            tracing::debug!(%session, error = %e, "cannot reach a shadow replica");
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!(%session, error = %e, "cannot reach the next stage");
                            Frame::Error(ErrorReport {
                                session: Some(session),
                                seq,
                                code: ErrorCode::Unavailable,
                                message: e.to_string(),
                            })
                        }
                    }
                }
                Output::Verdict(v) => Frame::Verdict(v),
                Output::Error(e) => Frame::Error(e),
            };
            let tx = sink.lock().await.clone();
            match tx {
                Some(tx) if tx.send(to_entry).await.is_ok() => {}
                _ => tracing::warn!("no control link to the entry: result dropped"),
            }
        }
    });
    tracing::info!(%addr, stage, layers = ?route.stages[stage].layers, "shard listening");
    loop {
        let (tcp, from) = super::net::accept(&listener).await;
        let (trust, route, cmd_tx, entry) = (loaded.trust.clone(), route.clone(), cmd_tx.clone(), entry.clone());
        let width = loaded.slice.config().n_embd;
        tokio::spawn(async move {
            if let Err(e) = serve_link(tcp, &trust, &route, stage, width, cmd_tx, entry).await {
                tracing::warn!(%from, error = %e, "link refused or dropped");
            }
        });
    }
}

async fn serve_link(
    tcp: tokio::net::TcpStream,
    trust: &Trust,
    route: &Route,
    stage: usize,
    width: usize,
    cmd_tx: mpsc::Sender<Command>,
    entry: EntrySink,
) -> Result<()> {
    // Only a peer proven to be the stage its role requires gets a link.
    let (tx, mut reader, hello, _proof) = trust.accept(tcp, route, stage).await?;
    if hello.role == LinkRole::Control {
        *entry.lock().await = Some(tx.clone());
        tracing::info!("control link from the entry (attested)");
    }
    let stages_after_entry = route.stages.len() - 1;
    loop {
        let frame = match reader.next().await {
            Ok(Some(f)) => f,
            Ok(None) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        match frame {
            Frame::Ping(n) => {
                let _ = tx.send(Frame::Pong(n)).await;
            }
            Frame::EndSession(s) => {
                let _ = cmd_tx.send(Command::End(s)).await;
            }
            Frame::Cancel(c) => {
                let _ = cmd_tx.send(Command::Cancel { session: c.session, through: c.through }).await;
            }
            Frame::Forward(f) => {
                if f.route.len() != stages_after_entry || f.width as usize != width {
                    return Err(Error::Peer(format!(
                        "forward frame with a route of {} stages or width {}",
                        f.route.len(),
                        f.width
                    )));
                }
                let (session, seq) = (f.session, f.seq);
                match Job::from_forward(f) {
                    Ok(job) => cmd_tx
                        .send(Command::Run(Box::new(job)))
                        .await
                        .map_err(|_| Error::Internal("the stage worker stopped".into()))?,
                    Err(e) => {
                        let _ = tx
                            .send(Frame::Error(ErrorReport {
                                session: Some(session),
                                seq,
                                code: ErrorCode::Invalid,
                                message: e.to_string(),
                            }))
                            .await;
                    }
                }
            }
            Frame::Error(e) => tracing::warn!(code = ?e.code, message = %e.message, "peer reported an error"),
            Frame::Pong(_) | Frame::Hello(_) | Frame::Verdict(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn the_watch_reports_a_change_once_and_stays_quiet_otherwise() {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        // The digest changes on the fourth reading.
        let digest = move || Ok(if c.fetch_add(1, Ordering::SeqCst) < 3 { [1; 32] } else { [2; 32] });
        let (tx, rx) = std::sync::mpsc::channel();
        let handle = watch(std::time::Duration::from_millis(5), digest, move |why| tx.send(why).unwrap()).unwrap();
        let why = rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap();
        assert!(why.contains("changed since load: 0101010101010101 -> 0202020202020202"), "{why}");
        handle.join().unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        // Unchanged: no report within many periods.
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let _quiet =
            watch(std::time::Duration::from_millis(2), || Ok([3; 32]), move |why| tx.send(why).unwrap()).unwrap();
        assert!(rx.recv_timeout(std::time::Duration::from_millis(100)).is_err());
    }
}
