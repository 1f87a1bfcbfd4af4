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
