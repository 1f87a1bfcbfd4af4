//! Attested links for the pipeline: dialling a stage's replica, accepting a
//! peer, and the per-stage map of downstream links.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Mutex};
use veil_attestation::ratls::{self, RaTlsIdentity, RaTlsVerifier, VerifiedPeer};
use veil_attestation::{EvidenceBundle, ExpectedClaims, LayerRange, Policy, PolicyDigest, RouteDigest};

use super::route::Stage;
use crate::link::frame::{Frame, Hello, LinkRole, DEFAULT_MAX_FRAME, PROTOCOL_VERSION};
use crate::link::state::{PeerRequirement, Side};
use crate::link::{open, LinkReader};

/// How long dialling a peer (TCP and attested handshake) may take.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// Reader half of an attested link.
pub type Reader<S> = LinkReader<tokio::io::ReadHalf<S>>;

pub use crate::error::net::{DialError, ForwardError, RoleMismatch};

/// This shard's attested identity and the cluster policy.
#[derive(Debug)]
pub struct Trust {
    /// Our RA-TLS identity.
    pub identity: RaTlsIdentity,
    /// The policy every peer is verified against (our claims carry its digest).
    pub policy: Arc<Policy>,
    /// The hello we send (role filled per link).
    pub hello: Hello,
    /// Our attested peer-policy digest: every peer must attest the same.
    pub peer_policy: PolicyDigest,
    /// Our attested route-shape digest: every peer must attest the same.
    pub route_shape: RouteDigest,
}

/// Proof that a verified peer attested the claims of a stage of this route
/// (its layers, its manifest, the same peer policy and route shape as ours).
/// Only [`Trust::attested_as`] makes one; links are registered with it.
#[derive(Debug, Clone)]
pub struct PeerInRole {
    peer: VerifiedPeer,
    layers: LayerRange,
}

impl PeerInRole {
    /// The verified peer.
    pub fn peer(&self) -> &VerifiedPeer {
        &self.peer
    }
    /// The layers it attested.
    pub fn layers(&self) -> LayerRange {
        self.layers
    }
}

impl Trust {
    /// What a peer serving `stage` of this route must attest to (pinned in
    /// the RA-TLS verifier, so a mismatch fails the handshake by name).
    pub fn expected_for(&self, stage: Option<&Stage>) -> ExpectedClaims {
        ExpectedClaims {
            layer_range: stage.map(|s| s.layers),
            manifest_root: stage.and_then(|s| s.manifest_root),
            peer_policy: Some(self.peer_policy),
            route_shape: Some(self.route_shape),
            ..ExpectedClaims::default()
        }
    }

    /// Whether a verified peer's attested claims are those of `stage` of this
    /// route (layers, manifest, peer policy, shape); the proof if so.
    pub fn attested_as(&self, peer: &VerifiedPeer, stage: &Stage) -> Result<PeerInRole, RoleMismatch> {
        let claims = peer.evidence().claims().ok_or(RoleMismatch::NoClaims)?;
        if claims.layer_range != Some(stage.layers) {
            return Err(RoleMismatch::Layers { attested: claims.layer_range, expected: stage.layers });
        }
        if claims.manifest_root != stage.manifest_root {
            return Err(RoleMismatch::ManifestRoot);
        }
        if claims.peer_policy != Some(self.peer_policy) {
            return Err(RoleMismatch::PeerPolicy);
        }
        if claims.route_shape != Some(self.route_shape) {
            return Err(RoleMismatch::RouteShape);
        }
        Ok(PeerInRole { peer: peer.clone(), layers: stage.layers })
    }

    fn hello(&self, role: LinkRole) -> Hello {
        Hello { role, version: PROTOCOL_VERSION, ..self.hello.clone() }
    }

    /// Dials `addr`, which must serve `stage`: TCP, mutual RA-TLS with the
    /// stage's claims pinned, then hellos.
    pub async fn dial(
        &self,
        addr: SocketAddr,
        stage: &Stage,
        role: LinkRole,
    ) -> Result<(mpsc::Sender<Frame>, Reader<ratls::tokio::ClientStream>, PeerInRole, EvidenceBundle), DialError> {
        let attempt = async {
            let tcp = TcpStream::connect(addr).await.map_err(|source| DialError::Connect { addr, source })?;
            tcp.set_nodelay(true).ok();
            let verifier = Arc::new(RaTlsVerifier::new(self.policy.clone(), self.expected_for(Some(stage))));
            let (tls, peer) = ratls::tokio::connect(tcp, &self.identity, verifier)
                .await
                .map_err(|source| DialError::Attestation { addr, source })?;
            // The evidence as presented (certificate and post-handshake GPUs,
            // verified above), for relying parties further out.
            let bundle = peer.bundle().clone();
            let proof = self.attested_as(&peer, stage).map_err(|source| DialError::NotInRole { addr, source })?;
            let require =
                PeerRequirement { role: Some(role), layers: Some(stage.layers), manifest_root: stage.manifest_root };
            let (tx, reader, _) = open(tls, Side::Dialer, self.hello(role), require, DEFAULT_MAX_FRAME)
                .await
                .map_err(|source| DialError::Link { addr, source })?;
            Ok((tx, reader, proof, bundle))
        };
        tokio::time::timeout(DIAL_TIMEOUT, attempt).await.map_err(|_| DialError::Timeout { addr })?
    }

    /// Accepts one attested connection for `stage` of `route`: mutual
    /// RA-TLS (the peer policy and shape pinned), the hello, then the proof
    /// that the peer's attested claims are those of the stage its declared
    /// role requires (the previous stage for data links, the entry for
    /// control links). No link without the proof.
    pub async fn accept(
        &self,
        tcp: TcpStream,
        route: &super::route::Route,
        stage: usize,
    ) -> Result<(mpsc::Sender<Frame>, Reader<ratls::tokio::ServerStream>, Hello, PeerInRole), DialError> {
        let addr = tcp.peer_addr().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        tcp.set_nodelay(true).ok();
        let attempt = async {
            let verifier = Arc::new(RaTlsVerifier::new(self.policy.clone(), self.expected_for(None)));
            let (tls, peer) = ratls::tokio::accept(tcp, &self.identity, verifier)
                .await
                .map_err(|source| DialError::Attestation { addr, source })?;
            let require = PeerRequirement { role: None, layers: None, manifest_root: None };
            // Our hello answers with the role the dialer declares.
            let (tx, reader, hello) = open(tls, Side::Acceptor, self.hello(LinkRole::Data), require, DEFAULT_MAX_FRAME)
                .await
                .map_err(|source| DialError::Link { addr, source })?;
            let expected = match hello.role {
                LinkRole::Data => stage.checked_sub(1).and_then(|s| route.stages.get(s)),
                LinkRole::Control => route.stages.first(),
            }
            .ok_or_else(|| DialError::WrongPeer {
                addr,
                reason: format!("no {:?} link to stage {stage}", hello.role),
            })?;
            let proof = self.attested_as(&peer, expected).map_err(|reason| DialError::WrongPeer {
                addr,
                reason: format!("{:?} link refused: {reason}", hello.role),
            })?;
            if hello.layers != expected.layers || Some(hello.manifest_root) != expected.manifest_root {
                return Err(DialError::WrongPeer {
                    addr,
                    reason: format!("{:?} link refused: hello does not match the attested stage", hello.role),
                });
            }
            Ok((tx, reader, hello, proof))
        };
        tokio::time::timeout(DIAL_TIMEOUT, attempt).await.map_err(|_| DialError::Timeout { addr })?
    }
}

pub use veil_wire::net::accept;

/// Binds a listener, with a clear error.
pub async fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Open links by replica, with the generation that opened each.
type LinkMap = HashMap<u8, (u64, mpsc::Sender<Frame>)>;

/// Data links to the replicas of the next stage, dialled on first use and
/// forgotten as soon as the peer closes them (so the next frame redials).
/// The link map is locked only briefly; a dial holds only its replica's own
/// lock, so a slow or dead replica never delays frames to the others (and
/// frames to one replica stay on one link, in order).
#[derive(Debug)]
pub struct Downstream {
    trust: Arc<Trust>,
    stage: Stage,
    links: Arc<Mutex<LinkMap>>,
    dialing: Vec<Mutex<()>>,
    generation: std::sync::atomic::AtomicU64,
}

impl Downstream {
    /// Links to `stage`'s replicas.
    pub fn new(trust: Arc<Trust>, stage: Stage) -> Self {
        let dialing = stage.replicas.iter().map(|_| Mutex::new(())).collect();
        Self { trust, stage, links: Arc::default(), dialing, generation: Default::default() }
    }

    async fn live(&self, replica: u8) -> Option<mpsc::Sender<Frame>> {
        self.links.lock().await.get(&replica).map(|(_, tx)| tx.clone())
    }

    /// Sends `frame` to replica `replica`, dialling it if needed.
    pub async fn send(&self, replica: u8, frame: Frame) -> Result<(), ForwardError> {
        let addr = *self.stage.replicas.get(usize::from(replica)).ok_or(ForwardError::NoReplica(replica))?;
        let dial_lock = &self.dialing[usize::from(replica)];
        if let Some(tx) = self.live(replica).await {
            if tx.send(frame.clone()).await.is_ok() {
                return Ok(());
            }
        }
        // This replica's dial lock only: others keep flowing meanwhile.
        let _dialing = dial_lock.lock().await;
        // Another sender may have redialled while we waited.
        if let Some(tx) = self.live(replica).await {
            if tx.send(frame.clone()).await.is_ok() {
                return Ok(());
            }
            self.links.lock().await.remove(&replica);
        }
        let (tx, mut reader, _peer, _bundle) = self.trust.dial(addr, &self.stage, LinkRole::Data).await?;
        tracing::info!(%addr, layers = ?self.stage.layers, "data link up (peer attested)");
        let generation = self.generation.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let map = self.links.clone();
        tokio::spawn(async move {
            loop {
                match reader.next().await {
                    Ok(Some(Frame::Error(e))) => {
                        tracing::warn!(%addr, code = ?e.code, message = %e.message, "downstream reported an error")
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(%addr, error = %e, "data link dropped");
                        break;
                    }
                }
            }
            let mut links = map.lock().await;
            if links.get(&replica).is_some_and(|(g, _)| *g == generation) {
                links.remove(&replica);
            }
        });
        tx.send(frame).await.map_err(|_| ForwardError::LinkClosed { addr })?;
        self.links.lock().await.insert(replica, (generation, tx));
        Ok(())
    }
}
