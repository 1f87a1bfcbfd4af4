//! What the trust mechanisms cost, each next to a reference measured in the
//! same run.
//!
//! Receipts, per request: a sealed request and its answer, both ends in
//! process (seal, open, answer, open the answer: the reference), against
//! the same with the entry signing a receipt into the trailer and the client
//! checking it (`veil_attestation::receipt`); and signing and checking alone.
//!
//! The sealed channel's KEM, per request: the same exchange with the entry's
//! X-Wing key and with an X25519 key (the reference).
//!
//! Post-quantum key exchange, per connection: TLS 1.3 handshakes in memory with
//! X25519 (the reference, measured in the same run) and with X25519MLKEM768
//! (`veil-tls-pq`), for an RA-TLS link between two shards (mutual, with
//! the RA-TLS verifiers, which remember evidence they have verified, so the
//! rows compare the handshake itself) and for the client's TLS to the relay
//! (a plain server certificate); and the key exchange alone. One thread;
//! median of the runs.
//!
//! Run: `cargo bench -p veil-tests --bench trust`

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
    let cert =
        rcgen::CertificateParams::new(vec!["veil-shard.invalid".to_string()]).unwrap().self_signed(&key).unwrap();
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

/// One sealed exchange, both ends in process; with `receipt`, the entry
/// signs one into the trailer and the client checks it.
async fn exchange(
    key: &veil_enclave::gateway::seal::SealKey,
    receipt: Option<&veil_attestation::receipt::ReceiptSigner>,
) {
    use veil_attestation::receipt::{Answered, Digest32, ReceiptExpectation};
    let mut m =
        bhttp::Message::request(b"POST".to_vec(), b"https".to_vec(), b"e".to_vec(), b"/v1/chat/completions".to_vec());
    m.write_content(br#"{"messages":[{"role":"user","content":"hello"}]}"#);
    let (sealed, opener) = veil_client::seal::seal_unverified(key.config(), m).await.unwrap();
    let (route, model) = (Digest32([4; 32]), veil_attestation::ManifestRoot([3; 32]));
    let opener = match receipt {
        Some(signer) => opener.expect_receipt(ReceiptExpectation {
            key: Some(signer.public()),
            route,
            model,
            request: Some(Digest32::of(&sealed)),
            response: None,
            not_before: None,
        }),
        None => opener,
    };
    let mut opened = key.open(sealed).await.unwrap();
    let mut out = opened.response.take_output().unwrap();
    opened.response.head(200, &[("content-type", "application/json")]).await.unwrap();
    opened.response.body(br#"{"choices":[{"message":{"content":"hi"}}]}"#).await.unwrap();
    match receipt {
        Some(signer) => {
            let answered = Answered {
                request: Digest32(opened.sealed_digest),
                response: Digest32(opened.response.content_digest()),
                model,
                route,
                prompt_tokens: 120,
                completion_tokens: 64,
                drafter: "ngram; 12 of 16 rounds drafted".into(),
                shards: "s1r0:0011223344556677,s2r0:8899aabbccddeeff".into(),
            };
            let json = signer.sign(answered, std::time::SystemTime::now()).to_json();
            let field = veil_enclave::gateway::server::RECEIPT_FIELD;
            opened.response.finish_with_trailer(&[(field, json.as_str())]).await.unwrap();
        }
        None => opened.response.finish().await.unwrap(),
    }
    let mut wire = Vec::new();
    while let Ok(c) = out.try_recv() {
        wire.extend(c);
    }
    let mut resp = opener.open(Box::pin(futures::io::Cursor::new(wire))).await.unwrap();
    while resp.next().await.unwrap().is_some() {}
    assert_eq!(resp.receipt().is_some(), receipt.is_some());
}

fn main() {
    // `cargo test --benches` runs this once as a check.
    let quick = !std::env::args().any(|a| a == "--bench");
    let runs = if quick { 1 } else { 101 };
    let us = |d: Duration| d.as_secs_f64() * 1e6;

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let key = veil_enclave::gateway::seal::SealKey::generate(1).unwrap();
    let signer = veil_attestation::receipt::ReceiptSigner::generate().unwrap();
    let n = if quick { 1 } else { 1001 };
    let before = median(|| rt.block_on(exchange(&key, None)), n);
    let after = median(|| rt.block_on(exchange(&key, Some(&signer))), n);
    println!("\nA sealed request and its answer, both ends in process, one thread, median of {n}");
    println!("| per request | without a receipt (reference) | with a receipt signed and checked | added |");
    println!("|---|---|---|---|");
    println!(
        "| seal, open, answer, open | {:.0} µs | {:.0} µs | {:+.0} µs |",
        us(before),
        us(after),
        us(after) - us(before)
    );

    // The two receipt steps alone, as shares of the cost added above.
    let answered = || veil_attestation::receipt::Answered {
        request: veil_attestation::receipt::Digest32([1; 32]),
        response: veil_attestation::receipt::Digest32([2; 32]),
        model: veil_attestation::ManifestRoot([3; 32]),
        route: veil_attestation::receipt::Digest32([4; 32]),
        prompt_tokens: 120,
        completion_tokens: 64,
        drafter: "ngram; 12 of 16 rounds drafted".into(),
        shards: "s1r0:0011223344556677,s2r0:8899aabbccddeeff".into(),
    };
    let now = std::time::SystemTime::now();
    let receipt = signer.sign(answered(), now);
    let expect = veil_attestation::receipt::ReceiptExpectation {
        key: Some(signer.public()),
        route: veil_attestation::receipt::Digest32([4; 32]),
        model: veil_attestation::ManifestRoot([3; 32]),
        request: Some(veil_attestation::receipt::Digest32([1; 32])),
        response: Some(veil_attestation::receipt::Digest32([2; 32])),
        not_before: None,
    };
    receipt.check(&expect).unwrap();
    let sign = median(|| _ = std::hint::black_box(signer.sign(answered(), now).to_json()), n);
    let check = median(
        || {
            let r = veil_attestation::receipt::Receipt::from_json(receipt.to_json().as_bytes()).unwrap();
            r.check(&expect).unwrap();
        },
        n,
    );
    let added = us(after) - us(before);
    println!(
        "| of which: sign a receipt and encode it (entry) | | {:.0} µs | {:.0}% of the added cost |",
        us(sign),
        100.0 * us(sign) / added
    );
    println!(
        "| of which: parse and check a receipt (client) | | {:.0} µs | {:.0}% of the added cost |",
        us(check),
        100.0 * us(check) / added
    );

    // The seal's KEM: X-Wing (the entry's) against X25519 alone, no receipt.
    let classical_key =
        veil_enclave::gateway::seal::SealKey::generate_for(1, veil_enclave::gateway::seal::Kem::X25519Sha256).unwrap();
    let x25519 = median(|| rt.block_on(exchange(&classical_key, None)), n);
    let xwing = median(|| rt.block_on(exchange(&key, None)), n);
    println!("\n| per request, no receipt | X25519 (reference) | X-Wing (ML-KEM-768 + X25519) | added |");
    println!("|---|---|---|---|");
    println!(
        "| seal, open, answer, open | {:.0} µs | {:.0} µs | {:+.0} µs |",
        us(x25519),
        us(xwing),
        us(xwing) - us(x25519)
    );
    println!("encapsulated key in every sealed request: X25519 32 bytes; X-Wing 1120 bytes");

    println!("\nTLS 1.3 handshakes in memory, one thread, median of {runs}");
    println!("| handshake | X25519 (reference) | X25519MLKEM768 | added |");
    println!("|---|---|---|---|");
    for (what, configs) in [
        (
            "RA-TLS link (mutual; each verifier has seen the peer's evidence before)",
            link_configs as fn(Arc<CryptoProvider>) -> _,
        ),
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
