//! RA-TLS: two peers with simulated evidence over loopback, and the ways a
//! peer is refused (mismatching key, replayed evidence, policy, simulated
//! under a strict policy, no evidence, a binding signature for another
//! connection).

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use veil_attestation::ratls::{self, tokio as ratls_tokio, RaTlsIdentity, RaTlsVerifier, Role, VerifiedPeer};
use veil_attestation::snp::Product;
use veil_attestation::{CheckId, Claims, Error, ExpectedClaims, LayerRange, Policy};
use veil_tests::{sim, sim_policy};

fn claims(range: (u32, u32)) -> Claims {
    Claims {
        layer_range: Some(LayerRange::new(range.0, range.1).unwrap()),
        software_version: "veil-test".into(),
        ..Default::default()
    }
}

fn verifier(policy: Policy) -> Arc<RaTlsVerifier> {
    Arc::new(RaTlsVerifier::new(Arc::new(policy), ExpectedClaims::default()))
}

/// Runs a server with `server_id` and a client with `client_id`; returns
/// (client result, server result).
async fn pair(
    server_id: RaTlsIdentity,
    server_verifier: Arc<RaTlsVerifier>,
    client_id: RaTlsIdentity,
    client_verifier: Arc<RaTlsVerifier>,
) -> (Result<VerifiedPeer, Error>, Result<VerifiedPeer, Error>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        match ratls_tokio::accept(tcp, &server_id, server_verifier).await {
            Ok((mut tls, peer)) => {
                // Echo one ping; a client that refused us after the handshake sends none.
                let mut buf = [0u8; 4];
                if tls.read_exact(&mut buf).await.is_ok() {
                    tls.write_all(&buf).await.unwrap();
                    tls.flush().await.unwrap();
                }
                Ok(peer)
            }
            Err(e) => Err(e),
        }
    });
    let tcp = TcpStream::connect(addr).await.unwrap();
    let client = match ratls_tokio::connect(tcp, &client_id, client_verifier).await {
        Ok((mut tls, peer)) => {
            tls.write_all(b"ping").await.unwrap();
            let mut buf = [0u8; 4];
            tls.read_exact(&mut buf).await.unwrap();
            assert_eq!(&buf, b"ping");
            Ok(peer)
        }
        Err(e) => Err(e),
    };
    let server = tokio::time::timeout(std::time::Duration::from_secs(10), server).await.unwrap().unwrap();
    (client, server)
}

#[tokio::test]
async fn two_simulated_peers_connect_mutually() {
    let a = sim(Product::Genoa);
    let b = sim(Product::Milan);
    let server_id = RaTlsIdentity::new(&a, claims((0, 10))).unwrap();
    let client_id = RaTlsIdentity::new(&b, claims((10, 20))).unwrap();
    let (client, server) = pair(server_id, verifier(sim_policy()), client_id, verifier(sim_policy())).await;
    let server_seen_by_client = client.unwrap();
    let client_seen_by_server = server.unwrap();
    assert!(server_seen_by_client.evidence().is_simulated());
    assert_eq!(server_seen_by_client.evidence().product(), Product::Genoa);
    assert_eq!(server_seen_by_client.evidence().claims().unwrap().layer_range, Some(LayerRange::new(0, 10).unwrap()));
    assert_eq!(client_seen_by_server.evidence().claims().unwrap().layer_range, Some(LayerRange::new(10, 20).unwrap()));
    assert!(!server_seen_by_client.evidence().checks().warnings.is_empty(), "simulated evidence must carry a warning");
}

#[tokio::test]
async fn refuses_replayed_evidence_in_another_certificate() {
    let s = sim(Product::Genoa);
    let genuine = RaTlsIdentity::new(&s, claims((0, 10))).unwrap();
    // An attacker copies the genuine bundle into a certificate for its own key.
    let attacker_key = p256::SecretKey::random(&mut rand_core::OsRng);
    let forged = RaTlsIdentity::from_key_and_evidence(attacker_key, genuine.bundle().clone()).unwrap();
    let honest_client = RaTlsIdentity::new(&s, claims((10, 20))).unwrap();
    let (client, _server) = pair(forged, verifier(sim_policy()), honest_client, verifier(sim_policy())).await;
    let err = client.unwrap_err();
    assert_eq!(err.check(), Some(CheckId::ReportDataBinding), "{err}");
    assert!(err.to_string().contains("TLS key hash"), "{err}");
}

#[tokio::test]
async fn refuses_a_mismatching_key_with_edited_claims() {
    let s = sim(Product::Genoa);
    let genuine = RaTlsIdentity::new(&s, claims((0, 10))).unwrap();
    // The attacker edits the claims to name its own key; REPORT_DATA no longer matches.
    let attacker_key = p256::SecretKey::random(&mut rand_core::OsRng);
    let mut bundle = genuine.bundle().clone();
    bundle.claims.as_mut().unwrap().tls_key_hash = Some(ratls::tls_key_hash(&attacker_key).unwrap());
    let forged = RaTlsIdentity::from_key_and_evidence(attacker_key, bundle).unwrap();
    let client_id = RaTlsIdentity::new(&s, claims((10, 20))).unwrap();
    let (client, _) = pair(forged, verifier(sim_policy()), client_id, verifier(sim_policy())).await;
    let err = client.unwrap_err();
    assert_eq!(err.check(), Some(CheckId::ReportDataBinding), "{err}");
    assert!(err.to_string().contains("SHA-512(claims)"), "{err}");
}

#[tokio::test]
async fn server_refuses_client_evidence_the_policy_refuses() {
    let s = sim(Product::Genoa);
    let server_id = RaTlsIdentity::new(&s, claims((0, 10))).unwrap();
    let client_id = RaTlsIdentity::new(&s, claims((10, 20))).unwrap();
    // The server only allows a measurement the client does not have.
    let strict = Policy { measurements: vec!["00".repeat(48).parse().unwrap()], ..sim_policy() };
    let (client, server) = pair(server_id, verifier(strict), client_id, verifier(sim_policy())).await;
    assert_eq!(server.unwrap_err().check(), Some(CheckId::Measurement));
    assert!(client.is_err(), "client must not get a working link when the server refused it");
}

#[tokio::test]
async fn strict_policy_refuses_simulated_peers() {
    let s = sim(Product::Genoa);
    let server_id = RaTlsIdentity::new(&s, claims((0, 10))).unwrap();
    let client_id = RaTlsIdentity::new(&s, claims((10, 20))).unwrap();
    let strict = Policy { allow_simulated: false, ..sim_policy() };
    let (client, _) = pair(server_id, verifier(sim_policy()), client_id, verifier(strict)).await;
    assert_eq!(client.unwrap_err().check(), Some(CheckId::EndorsementChain));
}

#[tokio::test]
async fn expected_layer_range_is_enforced() {
    let s = sim(Product::Genoa);
    let server_id = RaTlsIdentity::new(&s, claims((0, 10))).unwrap();
    let client_id = RaTlsIdentity::new(&s, claims((10, 20))).unwrap();
    let want = ExpectedClaims { layer_range: Some(LayerRange::new(0, 15).unwrap()), ..Default::default() };
    let client_verifier = Arc::new(RaTlsVerifier::new(Arc::new(sim_policy()), want));
    let (client, _) = pair(server_id, verifier(sim_policy()), client_id, client_verifier).await;
    let err = client.unwrap_err();
    assert_eq!(err.check(), Some(CheckId::ReportDataBinding));
    assert!(err.to_string().contains("layer range"), "{err}");
}

#[test]
fn certificate_without_evidence_is_malformed() {
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let cert = rcgen::CertificateParams::new(vec!["x.invalid".to_owned()]).unwrap().self_signed(&kp).unwrap();
    let v = RaTlsVerifier::new(Arc::new(sim_policy()), ExpectedClaims::default());
    let err = v.verify_certificate(cert.der(), std::time::SystemTime::now()).unwrap_err();
    assert!(matches!(err, Error::Malformed(_)), "{err}");
}

#[test]
fn binding_signature_from_another_connection_is_refused() {
    let s = sim(Product::Genoa);
    let id = RaTlsIdentity::new(&s, claims((0, 10))).unwrap();
    let exporter_a = [1u8; 32];
    let exporter_b = [2u8; 32];
    let sig = id.sign_binding(Role::Server, &exporter_a);
    ratls::verify_binding(id.cert_der(), Role::Server, &exporter_a, &sig).unwrap();
    // Replayed onto another connection.
    assert!(matches!(
        ratls::verify_binding(id.cert_der(), Role::Server, &exporter_b, &sig),
        Err(Error::PeerMisbehaved(_))
    ));
    // Reflected back with the other role.
    assert!(matches!(
        ratls::verify_binding(id.cert_der(), Role::Client, &exporter_a, &sig),
        Err(Error::PeerMisbehaved(_))
    ));
    // Garbage.
    assert!(matches!(
        ratls::verify_binding(id.cert_der(), Role::Server, &exporter_a, b"nope"),
        Err(Error::PeerMisbehaved(_))
    ));
}

#[test]
fn verified_peer_needs_a_verified_certificate() {
    let s = sim(Product::Genoa);
    let id = RaTlsIdentity::new(&s, claims((0, 10))).unwrap();
    let v = RaTlsVerifier::new(Arc::new(sim_policy()), ExpectedClaims::default());
    let sig = id.sign_binding(Role::Server, &[0; 32]);
    // Not verified through this verifier: no VerifiedPeer.
    assert!(VerifiedPeer::establish(&v, id.cert_der(), Role::Server, &[0; 32], &sig, &[]).is_err());
    v.verify_certificate(id.cert_der(), std::time::SystemTime::now()).unwrap();
    VerifiedPeer::establish(&v, id.cert_der(), Role::Server, &[0; 32], &sig, &[]).unwrap();
}

fn gpus(seed: &str, n: usize) -> veil_attestation::attester::gpu::CompositeAttester {
    use veil_attestation::attester::gpu::simulated::{SimulatedGpu, SimulatedGpuConfig};
    use veil_attestation::attester::gpu::{CompositeAttester, GpuSource};
    let gpus: Vec<SimulatedGpu> = (0..n)
        .map(|i| SimulatedGpu::from_seed(format!("{seed} {i}").as_bytes(), SimulatedGpuConfig::default()).unwrap())
        .collect();
    CompositeAttester::new(Box::new(sim(Product::Genoa)), GpuSource::Simulated(gpus)).unwrap()
}

fn gpu_policy(count: u32) -> Policy {
    use veil_attestation::policy::GpuPolicy;
    Policy { gpu: GpuPolicy { required: true, count: Some(count), ..Default::default() }, ..sim_policy() }
}

/// SECURITY-CASES D8: GPU evidence (SPDM transcripts and device chains, about
/// 10 KiB per GPU) is sent after the handshake, so the certificate stays far
/// under rustls's 64 KiB handshake-message cap however many GPUs a shard has;
/// the peer verifies every GPU before the link exists. (In the certificate,
/// eight GPUs made 101,055 bytes: no handshake.)
#[tokio::test]
async fn eight_and_sixteen_gpus_of_evidence_link_with_a_small_certificate() {
    for n in [8usize, 16] {
        let server_id = RaTlsIdentity::new(&gpus("veil d8 gpu", n), claims((0, 10))).unwrap();
        let size = server_id.cert_der().len();
        println!("RA-TLS certificate of a shard with {n} GPUs: {size} bytes");
        assert!(size < 16 * 1024, "{size} bytes");
        // The whole bundle still round-trips where relying parties read it (the route document).
        let json = server_id.bundle().to_json();
        assert_eq!(veil_attestation::EvidenceBundle::from_json(json.as_bytes()).unwrap().gpus.len(), n);
        let client_id = RaTlsIdentity::new(&sim(Product::Milan), claims((10, 20))).unwrap();
        let policy = gpu_policy(u32::try_from(n).unwrap());
        let (client, server) = pair(server_id, verifier(sim_policy()), client_id, verifier(policy)).await;
        server.unwrap();
        let seen = client.unwrap();
        assert_eq!(seen.evidence().gpus().expect("GPU evidence verified").reports().len(), n);
        assert_eq!(seen.bundle().gpus.len(), n, "the peer's whole evidence, for the route document");
    }
}

/// A peer whose certificate's claims commit to GPU evidence, but which sends
/// none after the handshake, or sends other GPUs' evidence, is refused.
#[tokio::test]
async fn a_peer_that_withholds_or_swaps_its_gpu_evidence_is_refused() {
    use veil_attestation::Attester as _;
    let key = p256::SecretKey::random(&mut rand_core::OsRng);
    let mut c = claims((0, 10));
    c.tls_key_hash = Some(ratls::tls_key_hash(&key).unwrap());
    let genuine = gpus("veil d8 gpu", 2).evidence(&c).unwrap();
    let other = gpus("other gpus", 2).evidence(&c).unwrap();
    let withheld = veil_attestation::EvidenceBundle { gpus: Vec::new(), ..genuine.clone() };
    let swapped = veil_attestation::EvidenceBundle { gpus: other.gpus, ..genuine.clone() };
    for (name, bundle, policy) in [
        ("withheld under a policy requiring GPUs", withheld.clone(), gpu_policy(2)),
        ("withheld under a policy not requiring them", withheld, sim_policy()),
        ("swapped", swapped, gpu_policy(2)),
    ] {
        let server_id = RaTlsIdentity::from_key_and_evidence(key.clone(), bundle).unwrap();
        let client_id = RaTlsIdentity::new(&sim(Product::Milan), claims((10, 20))).unwrap();
        let (client, _) = pair(server_id, verifier(sim_policy()), client_id, verifier(policy)).await;
        let err = client.expect_err(name);
        assert!(matches!(err, Error::Rejected(_)), "{name}: {err}");
    }
    // The genuine pair links.
    let server_id = RaTlsIdentity::from_key_and_evidence(key, genuine).unwrap();
    let client_id = RaTlsIdentity::new(&sim(Product::Milan), claims((10, 20))).unwrap();
    let (client, _) = pair(server_id, verifier(sim_policy()), client_id, verifier(gpu_policy(2))).await;
    client.unwrap();
}

/// A client that completes a real RA-TLS handshake and then sends, as its
/// channel binding, `binding(exporter of this connection)`; returns what the
/// server's `accept` concluded and this connection's exporter value.
async fn client_sending(
    addr: std::net::SocketAddr,
    id: &RaTlsIdentity,
    binding: impl FnOnce(&[u8; 32]) -> Vec<u8>,
) -> [u8; 32] {
    let config = ratls::client_config(id, verifier(sim_policy())).unwrap();
    let name = rustls::pki_types::ServerName::try_from("veil-shard.invalid").unwrap();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await.unwrap();
    let mut ekm = [0u8; 32];
    let ekm_vec = tls.get_ref().1.export_keying_material([0u8; 32], ratls::EXPORTER_LABEL, None).unwrap();
    ekm.copy_from_slice(&ekm_vec);
    let sig = binding(&ekm);
    let mut out = (sig.len() as u16).to_be_bytes().to_vec();
    out.extend_from_slice(&sig);
    out.extend_from_slice(&0u32.to_be_bytes());
    tls.write_all(&out).await.unwrap();
    tls.flush().await.unwrap();
    // Keep the connection open until the server has judged it.
    let mut buf = [0u8; 1];
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), tls.read(&mut buf)).await;
    ekm
}

/// D6 on a live connection: a binding signature that was valid on one
/// connection, replayed on another, is refused by the server's handshake;
/// the honest binding on each connection is accepted. Fails if
/// `VerifiedPeer::establish` skips the binding, or if the binding signs a
/// constant instead of the connection's exporter value.
#[tokio::test]
async fn a_binding_signature_replayed_on_a_live_connection_is_refused() {
    let server_id = RaTlsIdentity::new(&sim(Product::Genoa), claims((10, 20))).unwrap();
    let client_id = RaTlsIdentity::new(&sim(Product::Genoa), claims((0, 10))).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (verdicts_tx, mut verdicts) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let server_id = Arc::new(server_id);
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (server_id, tx) = (server_id.clone(), verdicts_tx.clone());
            tokio::spawn(async move {
                let r = ratls_tokio::accept(tcp, &server_id, verifier(sim_policy())).await;
                let _ = tx.send(r.map(|_| ()));
            });
        }
    });
    // Connection A: honest binding, accepted; its signature is captured.
    let mut captured = Vec::new();
    let ekm_a = client_sending(addr, &client_id, |ekm| {
        captured = client_id.sign_binding(Role::Client, ekm);
        captured.clone()
    })
    .await;
    verdicts.recv().await.unwrap().expect("an honest binding was refused");
    // Connection B: A's signature replayed.
    let ekm_b = client_sending(addr, &client_id, |_| captured.clone()).await;
    assert_ne!(ekm_a, ekm_b, "two connections shared an exporter value");
    match verdicts.recv().await.unwrap() {
        Err(Error::PeerMisbehaved(why)) => assert!(why.contains("binding"), "{why}"),
        other => panic!("a binding replayed from another connection was accepted: {other:?}"),
    }
    // Connection C: honest again (the server keeps serving).
    client_sending(addr, &client_id, |ekm| client_id.sign_binding(Role::Client, ekm)).await;
    verdicts.recv().await.unwrap().expect("an honest binding was refused after a replay");
}

#[tokio::test]
async fn links_negotiate_x25519mlkem768_and_refuse_a_classical_only_peer() {
    use rustls::NamedGroup;
    let server_id = RaTlsIdentity::new(&sim(Product::Genoa), claims((0, 10))).unwrap();
    let client_id = RaTlsIdentity::new(&sim(Product::Milan), claims((10, 20))).unwrap();

    // Two shards: the hybrid group, seen from both ends.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server_verifier = verifier(sim_policy());
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let (tls, _) = ratls_tokio::accept(tcp, &server_id, server_verifier.clone()).await.unwrap();
        let group = tls.get_ref().1.negotiated_key_exchange_group().map(|g| g.name());
        // Then a peer that offers X25519 alone.
        let (tcp, _) = listener.accept().await.unwrap();
        let refused = ratls_tokio::accept(tcp, &server_id, server_verifier).await.err();
        (group, refused)
    });
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (tls, _) = ratls_tokio::connect(tcp, &client_id, verifier(sim_policy())).await.unwrap();
    assert_eq!(tls.get_ref().1.negotiated_key_exchange_group().map(|g| g.name()), Some(NamedGroup::X25519MLKEM768));
    drop(tls);

    let classical = Arc::new(rustls::crypto::CryptoProvider {
        kx_groups: vec![rustls::crypto::ring::kx_group::X25519],
        ..rustls::crypto::ring::default_provider()
    });
    let (chain, key) = client_id.rustls_parts().unwrap();
    let config = rustls::ClientConfig::builder_with_provider(classical)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(verifier(sim_policy()))
        .with_client_auth_cert(chain, key)
        .unwrap();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("veil-shard.invalid").unwrap();
    let attempt = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await;
    assert!(attempt.is_err(), "a classical-only peer must not complete a link handshake");
    let (group, refused) = tokio::time::timeout(std::time::Duration::from_secs(10), server).await.unwrap().unwrap();
    assert_eq!(group, Some(NamedGroup::X25519MLKEM768));
    let refused = refused.expect("the shard refuses the classical-only peer").to_string();
    assert!(refused.contains("handshake") || refused.contains("group"), "{refused}");
}
