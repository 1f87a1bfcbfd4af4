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
                let mut buf = [0u8; 4];
                tls.read_exact(&mut buf).await.unwrap();
                tls.write_all(&buf).await.unwrap();
                tls.flush().await.unwrap();
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
    assert!(VerifiedPeer::establish(&v, id.cert_der(), Role::Server, &[0; 32], &sig).is_err());
    v.verify_certificate(id.cert_der(), std::time::SystemTime::now()).unwrap();
    VerifiedPeer::establish(&v, id.cert_der(), Role::Server, &[0; 32], &sig).unwrap();
}
