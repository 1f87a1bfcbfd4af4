//! Arbitrary bytes as the route's attestation document: parsing and the
//! whole route verification (and the peer-policy comparison) never panic;
//! what parses re-encodes to a document that parses to the same digests.
#![no_main]

use libfuzzer_sys::fuzz_target;
use veil_attestation::route::{links_commitment, verify_route, AttestationDoc};
use veil_attestation::{Nonce, Policy};

fuzz_target!(|data: &[u8]| {
    let Ok(doc) = AttestationDoc::from_json(data) else { return };
    let policy = Policy { allow_simulated: true, any_measurement: true, ..Policy::default() };
    let _ = policy.gaps_in(&doc.peer_policy);
    let nonce = Nonce::new(vec![0x5a; 32]).unwrap();
    let _ = verify_route(&doc, &policy, &nonce, std::time::SystemTime::UNIX_EPOCH);
    let again = AttestationDoc::from_json(&serde_json::to_vec(&doc).unwrap()).unwrap();
    assert_eq!(again.peer_policy.digest(), doc.peer_policy.digest());
    assert_eq!(again.route.digest(), doc.route.digest());
    assert_eq!(links_commitment(&again.shards), links_commitment(&doc.shards));
});
