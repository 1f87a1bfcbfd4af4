//! What post-quantum key exchange costs: TLS 1.3 handshakes in memory with
//! X25519 (the reference, measured in the same run) and with X25519MLKEM768
//! (`veil-tls-pq`), for an RA-TLS link between two shards (mutual, with
//! the RA-TLS verifiers, which remember evidence they have verified, so the
//! rows compare the handshake itself) and for the client's TLS to the relay
//! (a plain server certificate); and the key exchange alone. One thread;
//! median of the runs.
//!
//! Run: `cargo bench -p veil-tests --bench handshake`

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, ClientConnection, ServerConfig, ServerConnection};
use veil_attestation::ratls::{RaTlsIdentity, RaTlsVerifier};
use veil_attestation::snp::Product;
use veil_attestation::{Claims, ExpectedClaims, LayerRange};
use veil_tests::{sim, sim_policy};

fn classical() -> Arc<CryptoProvider> {
    Arc::new(CryptoProvider {
        kx_groups: vec![rustls::crypto::ring::kx_group::X25519],
        ..rustls::crypto::ring::default_provider()
    })
}

fn hybrid() -> Arc<CryptoProvider> {
    veil_tls_pq::link_provider()
}

/// One handshake, both ends in memory; returns the negotiated group.
fn handshake(client: &Arc<ClientConfig>, server: &Arc<ServerConfig>) -> rustls::NamedGroup {
    let name = rustls::pki_types::ServerName::try_from("veil-shard.invalid").unwrap();
    let mut c = ClientConnection::new(client.clone(), name).unwrap();
    let mut s = ServerConnection::new(server.clone()).unwrap();
    let mut buf = Vec::new();
    for _ in 0..100 {
        if !c.is_handshaking() && !s.is_handshaking() {
            return c.negotiated_key_exchange_group().unwrap().name();
        }
        buf.clear();
        while c.wants_write() {
            c.write_tls(&mut buf).unwrap();
        }
        // read_tls takes a bounded amount per call: feed it all.
        let mut rest = &buf[..];
        while !rest.is_empty() {
            s.read_tls(&mut rest).unwrap();
            s.process_new_packets().unwrap();
        }
        buf.clear();
        while s.wants_write() {
            s.write_tls(&mut buf).unwrap();
        }
        let mut rest = &buf[..];
        while !rest.is_empty() {
            c.read_tls(&mut rest).unwrap();
            c.process_new_packets().unwrap();
        }
    }
    panic!("the handshake did not finish");
}

fn median(mut f: impl FnMut(), runs: usize) -> Duration {
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    times.sort();
    times[runs / 2]
}

fn link_configs(provider: Arc<CryptoProvider>) -> (Arc<ClientConfig>, Arc<ServerConfig>) {
    let claims = |a, b| Claims {
        layer_range: Some(LayerRange::new(a, b).unwrap()),
        software_version: "bench".into(),
        ..Claims::default()
    };
    let server_id = RaTlsIdentity::new(&sim(Product::Genoa), claims(0, 10)).unwrap();
    let client_id = RaTlsIdentity::new(&sim(Product::Milan), claims(10, 20)).unwrap();
    let verifier = Arc::new(RaTlsVerifier::new(Arc::new(sim_policy()), ExpectedClaims::default()));
    let (chain, key) = client_id.rustls_parts().unwrap();
    let client = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(verifier.clone())
        .with_client_auth_cert(chain, key)
        .unwrap();
    let (chain, key) = server_id.rustls_parts().unwrap();
    let server = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .unwrap();
    (Arc::new(client), Arc::new(server))
}

fn relay_configs(provider: Arc<CryptoProvider>) -> (Arc<ClientConfig>, Arc<ServerConfig>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["veil-shard.invalid".to_string()]).unwrap().self_signed(&key).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).unwrap();
    let client = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let der = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap();
    let server = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], der)
        .unwrap();
    (Arc::new(client), Arc::new(server))
}

fn main() {
    // `cargo test --benches` runs this once as a check.
    let quick = !std::env::args().any(|a| a == "--bench");
    let runs = if quick { 1 } else { 101 };
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!("\nTLS 1.3 handshakes in memory, one thread, median of {runs}");
    println!("| handshake | X25519 (reference) | X25519MLKEM768 | added |");
    println!("|---|---|---|---|");
    for (what, configs) in [
        ("RA-TLS link (mutual; each verifier has seen the peer's evidence before)", link_configs as fn(Arc<CryptoProvider>) -> _),
        ("client to relay (server certificate)", relay_configs),
    ] {
        let (c0, s0) = configs(classical());
        let (c1, s1) = configs(hybrid());
        assert_eq!(handshake(&c0, &s0), rustls::NamedGroup::X25519);
        assert_eq!(handshake(&c1, &s1), rustls::NamedGroup::X25519MLKEM768);
        let before = median(|| _ = std::hint::black_box(handshake(&c0, &s0)), runs);
        let after = median(|| _ = std::hint::black_box(handshake(&c1, &s1)), runs);
        println!("| {what} | {:.0} µs | {:.0} µs | {:+.0} µs |", us(before), us(after), us(after) - us(before));
    }
    let kx = |group: &'static dyn rustls::crypto::SupportedKxGroup| {
        move || {
            let client = group.start().unwrap();
            let server = group.start_and_complete(client.pub_key()).unwrap();
            std::hint::black_box(client.complete(&server.pub_key).unwrap());
        }
    };
    let before = median(kx(rustls::crypto::ring::kx_group::X25519), runs * 10);
    let after = median(kx(veil_tls_pq::X25519MLKEM768), runs * 10);
    println!(
        "| key exchange alone (both sides) | {:.0} µs | {:.0} µs | {:+.0} µs |",
        us(before),
        us(after),
        us(after) - us(before)
    );
    println!("key shares on the wire: X25519 32 + 32 bytes; X25519MLKEM768 1216 (client) + 1120 (server) bytes");
}
