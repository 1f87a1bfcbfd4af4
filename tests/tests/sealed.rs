//! Sealed exchanges between the client SDK's half and the entry's half:
//! interoperation, streaming, and what a malicious relay can and cannot do
//! to the ciphertext it carries.

use std::pin::Pin;

use futures::io::{AsyncRead, Cursor};
use veil_client::seal::{seal_unverified as seal, SealError as ClientError};
use veil_enclave::gateway::seal::{GatewaySealError, SealKey};

fn request(body: &str) -> bhttp::Message {
    let mut m = bhttp::Message::request(
        b"POST".to_vec(),
        b"https".to_vec(),
        b"entry".to_vec(),
        b"/v1/chat/completions".to_vec(),
    );
    m.put_header("content-type", "application/json");
    m.write_content(body.as_bytes());
    m
}

fn reader(bytes: Vec<u8>) -> Pin<Box<dyn AsyncRead + Send>> {
    Box::pin(Cursor::new(bytes))
}

/// The entry's side: open, answer with `pieces`, return the sealed chunks as sent.
async fn entry(key: &SealKey, sealed: Vec<u8>, pieces: &[&str]) -> (bhttp::Message, Vec<Vec<u8>>) {
    let mut opened = key.open(sealed).await.unwrap();
    let mut out = opened.response.take_output().unwrap();
    opened.response.head(200, &[("content-type", "text/event-stream")]).await.unwrap();
    for p in pieces {
        opened.response.body(p.as_bytes()).await.unwrap();
    }
    opened.response.finish().await.unwrap();
    let mut chunks = Vec::new();
    while let Ok(c) = out.try_recv() {
        chunks.push(c);
    }
    (opened.request, chunks)
}

#[tokio::test]
async fn client_and_entry_interoperate_and_stream() {
    let key = SealKey::generate(3).unwrap();
    let (sealed, opener) = seal(key.config(), request(r#"{"canary":"zebra-canary-42"}"#)).await.unwrap();
    assert!(!sealed.windows(14).any(|w| w == b"zebra-canary-4"), "plaintext visible to the relay");
    let (req, chunks) = entry(&key, sealed, &["data: one\n\n", "data: two\n\n", "data: [DONE]\n\n"]).await;
    assert_eq!(req.content(), br#"{"canary":"zebra-canary-42"}"#);
    let wire: Vec<u8> = chunks.concat();
    assert!(!wire.windows(3).any(|w| w == b"one"));
    let mut resp = opener.open(reader(wire)).await.unwrap();
    assert_eq!(resp.status, 200);
    assert!(resp.fields.contains(&("content-type".into(), "text/event-stream".into())));
    let mut body = Vec::new();
    while let Some(p) = resp.next().await.unwrap() {
        body.extend(p);
    }
    assert_eq!(body, b"data: one\n\ndata: two\n\ndata: [DONE]\n\n");
}

#[tokio::test]
async fn a_malicious_relay_is_detected_every_time() {
    let key = SealKey::generate(3).unwrap();
    let pieces = ["data: one\n\n", "data: two\n\n", "data: three\n\n"];
    async fn attempt(
        key: &SealKey,
        pieces: &[&str],
        tamper: impl FnOnce(Vec<Vec<u8>>) -> Vec<u8>,
    ) -> Result<Vec<u8>, ClientError> {
        let (sealed, opener) = seal(key.config(), request("{}")).await.unwrap();
        let (_, chunks) = entry(key, sealed, pieces).await;
        let mut resp = opener.open(reader(tamper(chunks))).await?;
        let mut body = Vec::new();
        while let Some(p) = resp.next().await? {
            body.extend(p);
        }
        Ok(body)
    }
    // Untouched: fine.
    assert!(attempt(&key, &pieces, |c| c.concat()).await.is_ok());
    // Each single-bit flip anywhere in the response.
    let (sealed, _) = seal(key.config(), request("{}")).await.unwrap();
    let len = entry(&key, sealed, &pieces).await.1.concat().len();
    for at in 0..len {
        for bit in 0..8 {
            let r = attempt(&key, &pieces, |c| {
                let mut w = c.concat();
                w[at] ^= 1 << bit;
                w
            })
            .await;
            assert!(matches!(r, Err(ClientError::Open(_))), "flip of bit {bit} at byte {at} of {len}: {r:?}");
        }
    }
    // Truncation at every byte: never an answer.
    for cut in 0..len {
        let r = attempt(&key, &pieces, |c| c.concat()[..cut].to_vec()).await;
        assert!(r.is_err(), "a response cut at byte {cut} of {len} opened");
    }
    // Truncation at every chunk boundary (the final chunk never arrives).
    for keep in 1..4 {
        let r = attempt(&key, &pieces, |c| c[..keep.min(c.len() - 1)].concat()).await;
        assert!(matches!(r, Err(ClientError::Open(_))), "truncation after {keep} chunks: {r:?}");
    }
    // Only the final chunk withheld: everything else intact.
    let r = attempt(&key, &pieces, |c| c[..c.len() - 1].concat()).await;
    assert!(matches!(r, Err(ClientError::Open(_))), "a stream without its final chunk was accepted: {r:?}");
    // Reordered chunks (E4): two whole chunks — each its length and its
    // ciphertext — change places, so the framing stays valid and only the
    // AEAD's per-chunk nonce (the chunk counter) can tell. Swapping writes
    // would only break the framing and test nothing.
    for first in 0..3 {
        let r = attempt(&key, &pieces, |c| {
            let wire = c.concat();
            let (nonce, mut records, last) = veil_tests::ohttp_response_records(&wire);
            let before = records.len();
            records.swap(first, first + 1);
            assert_ne!(records[first], records[first + 1], "swapping identical chunks proves nothing");
            let swapped = [nonce.to_vec(), records.concat(), last.to_vec()].concat();
            // Still well framed: the same chunks, in another order.
            assert_eq!(veil_tests::ohttp_response_records(&swapped).1.len(), before);
            swapped
        })
        .await;
        match r {
            Err(ClientError::Open(why)) => assert!(
                why.to_lowercase().contains("decrypt")
                    || why.to_lowercase().contains("aead")
                    || why.to_lowercase().contains("crypt"),
                "chunks {first} and {} swapped: {why}",
                first + 1
            ),
            other => panic!("chunks {first} and {} swapped: {other:?}", first + 1),
        }
    }
    // An old response replayed onto a new request.
    let (sealed, _) = seal(key.config(), request("{}")).await.unwrap();
    let old = entry(&key, sealed, &pieces).await.1.concat();
    let r = attempt(&key, &pieces, |_| old).await;
    assert!(matches!(r, Err(ClientError::Open(_))), "an old response opened on a new request: {r:?}");
}

#[tokio::test]
async fn the_entry_refuses_replays_foreign_keys_and_junk() {
    let key = SealKey::generate(3).unwrap();
    let (sealed, _) = seal(key.config(), request("{}")).await.unwrap();
    key.open(sealed.clone()).await.unwrap();
    assert!(matches!(key.open(sealed).await, Err(GatewaySealError::Replay)));
    // Sealed to a key a host swapped in: the entry cannot open it.
    let swapped = SealKey::generate(3).unwrap();
    let (sealed, _) = seal(swapped.config(), request("{}")).await.unwrap();
    assert!(matches!(key.open(sealed).await, Err(GatewaySealError::Open(_))));
    assert!(seal(b"not a key config", request("{}")).await.is_err());
    // The entry keeps serving after all of that.
    let (sealed, opener) = seal(key.config(), request("{}")).await.unwrap();
    let (_, chunks) = entry(&key, sealed, &["ok"]).await;
    let resp = opener.open(reader(chunks.concat())).await.unwrap();
    assert_eq!(resp.collect().await.unwrap(), b"ok");
}

/// The entry's side of a completed answer, ending with `receipt` (given the
/// sealed request's digest and the body's) as its trailer, or with none.
async fn answer_with(
    key: &SealKey,
    sealed: Vec<u8>,
    body: &str,
    receipt: impl Fn([u8; 32], [u8; 32]) -> Option<String>,
) -> Vec<u8> {
    let mut opened = key.open(sealed).await.unwrap();
    let mut out = opened.response.take_output().unwrap();
    opened.response.head(200, &[("content-type", "application/json")]).await.unwrap();
    opened.response.body(body.as_bytes()).await.unwrap();
    match receipt(opened.sealed_digest, opened.response.content_digest()) {
        Some(r) => opened
            .response
            .finish_with_trailer(&[(veil_enclave::gateway::server::RECEIPT_FIELD, r.as_str())])
            .await
            .unwrap(),
        None => opened.response.finish().await.unwrap(),
    }
    let mut wire = Vec::new();
    while let Ok(c) = out.try_recv() {
        wire.extend(c);
    }
    wire
}

#[tokio::test]
async fn a_completed_answer_needs_the_attested_entrys_receipt_for_this_request_and_body() {
    use veil_attestation::receipt::{Answered, Digest32, ReceiptCheck, ReceiptExpectation, ReceiptSigner};
    use veil_attestation::ManifestRoot;
    let key = SealKey::generate(3).unwrap();
    let entry_key = ReceiptSigner::generate().unwrap();
    let other_entry = ReceiptSigner::generate().unwrap();
    let (route, model) = (Digest32([7; 32]), ManifestRoot([9; 32]));
    let sign = |by: &ReceiptSigner, request: [u8; 32], response: [u8; 32], route: Digest32| {
        let answered = Answered {
            request: Digest32(request),
            response: Digest32(response),
            model,
            route,
            prompt_tokens: 5,
            completion_tokens: 2,
            drafter: "none".into(),
            shards: "s1r0:00".into(),
        };
        Some(by.sign(answered, std::time::SystemTime::now()).to_json())
    };
    type Case<'a> = (&'a str, Box<dyn Fn([u8; 32], [u8; 32]) -> Option<String> + 'a>, Option<ReceiptCheck>);
    let cases: Vec<Case> = vec![
        ("signed for this request and body", Box::new(|q, b| sign(&entry_key, q, b, route)), None),
        ("no receipt (cut before it)", Box::new(|_, _| None), Some(ReceiptCheck::Format)),
        ("not JSON", Box::new(|_, _| Some("{".into())), Some(ReceiptCheck::Format)),
        ("another entry's key", Box::new(|q, b| sign(&other_entry, q, b, route)), Some(ReceiptCheck::Key)),
        ("another route", Box::new(|q, b| sign(&entry_key, q, b, Digest32([8; 32]))), Some(ReceiptCheck::Route)),
        ("another request", Box::new(|_, b| sign(&entry_key, [0; 32], b, route)), Some(ReceiptCheck::Request)),
        ("another body", Box::new(|q, _| sign(&entry_key, q, [0; 32], route)), Some(ReceiptCheck::Response)),
    ];
    for (what, receipt, want) in cases {
        let (sealed, opener) = seal(key.config(), request("{}")).await.unwrap();
        let expect = ReceiptExpectation {
            key: Some(entry_key.public()),
            route,
            model,
            request: Some(Digest32::of(&sealed)),
            response: None,
            not_before: None,
        };
        let wire = answer_with(&key, sealed, r#"{"ok":true}"#, receipt).await;
        let mut resp = opener.expect_receipt(expect).open(reader(wire)).await.unwrap();
        let mut body = Vec::new();
        let end = loop {
            match resp.next().await {
                Ok(Some(p)) => body.extend(p),
                other => break other,
            }
        };
        match (want, end) {
            (None, Ok(None)) => {
                let r = resp.receipt().expect("a checked receipt");
                assert_eq!((r.prompt_tokens, r.completion_tokens), (5, 2));
                assert_eq!(body, br#"{"ok":true}"#, "{what}");
            }
            (Some(check), Err(ClientError::Receipt(f))) => {
                assert_eq!(f.check, check, "{what}: {f}");
                assert!(resp.receipt().is_none(), "{what}");
            }
            (want, got) => panic!("{what}: wanted {want:?}, got {got:?}"),
        }
    }
}
