//! Attestation documents per second, as the entry produces them for a crowd
//! of verifiers: one evidence per nonce (the reference: what the entry did
//! before batching, measured in the same run) against one evidence per batch
//! of nonces with an inclusion path each (`nonce_batch`), for crowds of 1 to
//! 256 verifiers. Each verifier's work is included on both sides: it checks
//! its evidence (chain, signature, every check) and, batched, recomputes the
//! root from its path. Simulated attester (a software P-384 key, about the
//! cost of the hardware's signing request), one thread.
//!
//! Run: `cargo bench -p veil-attestation --bench attest`

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::{Duration, Instant, SystemTime};

use veil_attestation::nonce_batch::{batch, leaf, root, NoncePath};
use veil_attestation::simulated::{default_measurement, SimulatedAttester, SimulatedConfig};
use veil_attestation::snp::Product;
use veil_attestation::{verify, Claims, ExpectedClaims, Nonce, Policy};

fn nonces(n: usize, round: usize) -> Vec<Nonce> {
    (0..n).map(|i| Nonce::new(format!("round {round} verifier {i}").into_bytes()).unwrap()).collect()
}

/// Documents per second over at least `min` of wall time.
fn rate(min: Duration, mut crowd: impl FnMut(usize) -> usize) -> f64 {
    let start = Instant::now();
    let (mut docs, mut round) = (0usize, 0usize);
    while start.elapsed() < min {
        docs += crowd(round);
        round += 1;
    }
    docs as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let att = SimulatedAttester::from_seed(b"bench attest", SimulatedConfig::new(Product::Genoa, b"bench")).unwrap();
    let policy = Policy {
        allow_simulated: true,
        measurements: vec![default_measurement()],
        products: vec![Product::Genoa],
        ..Policy::default()
    };
    let base = Claims { software_version: "bench".into(), ..Claims::default() };
    let now = SystemTime::now();
    let min = Duration::from_secs(2);
    println!("attestation documents per second the entry produces, one thread (evidence built over the nonce, or over");
    println!("the batch's root plus one inclusion path per verifier)");
    println!("| verifiers at once | one evidence per nonce (reference) | one evidence per batch | ratio |");
    println!("|---|---|---|---|");
    for crowd in [1usize, 4, 16, 64, 256] {
        let per_nonce = rate(min, |round| {
            for n in nonces(crowd, round) {
                att.evidence(&Claims { nonce: Some(n), ..base.clone() }).unwrap();
            }
            crowd
        });
        let batched = rate(min, |round| {
            let ns = nonces(crowd, round);
            let leaves: Vec<[u8; 32]> = ns.iter().map(leaf).collect();
            let (root, paths) = batch(&leaves);
            let claimed = Nonce::new(root.to_vec()).unwrap();
            att.evidence(&Claims { nonce: Some(claimed), ..base.clone() }).unwrap();
            std::hint::black_box(paths);
            crowd
        });
        println!("| {crowd} | {per_nonce:.0} | {batched:.0} | {:.1}× |", batched / per_nonce);
    }
    // What each verifier then spends, the same on both sides but for the path.
    let ns = nonces(64, 0);
    let leaves: Vec<[u8; 32]> = ns.iter().map(leaf).collect();
    let claimed = Nonce::new(root(&leaves).to_vec()).unwrap();
    let bundle = att.evidence(&Claims { nonce: Some(claimed), ..base.clone() }).unwrap();
    let per_client = rate(min, |_| {
        let path = NoncePath::of(5, &leaves);
        let expected = ExpectedClaims { nonce: Some(path.claimed_nonce(&ns[5]).unwrap()), ..ExpectedClaims::default() };
        verify(&bundle, &policy, &expected, now).unwrap();
        1
    });
    println!("a verifier checks {per_client:.0} documents per second (whole evidence verification, its path included)");
}
