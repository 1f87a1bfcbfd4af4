//! Opening sealed requests and sealing streamed responses, on the `ohttp`
//! and `bhttp` crates (X-Wing, the hybrid ML-KEM-768 + X25519 KEM, with
//! HKDF-SHA256 and AES-128-GCM): no home-made cryptography. (The design asks for AES-256-GCM; the `ohttp` crate's
//! pure-Rust backend offers only AES-128-GCM and ChaCha20-Poly1305 today, see
//! [`AEAD`].) Requests use the chunked request format; responses are
//! chunked, and the last chunk is authenticated as final, so a client
//! detects a truncated stream. The response inside is an
//! indeterminate-length Binary HTTP message written as it is produced
//! (head, then body pieces), so tokens stream through the seal.
//!
//! Replay protection, bounded by time: the client writes the time it sealed
//! the request into the sealed message (the `veil-sent-at` header, Unix
//! seconds, authenticated with the rest); the entry opens the request, refuses
//! it unless that time is within [`REPLAY_SKEW`] of its own clock, and only
//! then checks and records the request's HPKE encapsulated key (fresh
//! randomness of the client's; the window keeps its SHA-256). A key is remembered until its timestamp
//! leaves the window, when the timestamp check alone refuses it. Only what
//! authenticates is recorded, so junk cannot flush the window; the window
//! holds at most [`REPLAY_CAPACITY`] keys and refuses new requests (busy)
//! rather than forget one early.
//!
//! The entry's clock is the host's to set (SEV-SNP guests read time the
//! hypervisor provides). So the window is measured from a high-water mark:
//! the latest time the entry has ever read. Keys are forgotten only when
//! their timestamp is older than the mark minus the skew, and any request
//! sealed before that is refused, whatever the clock says now. Moving the
//! clock forward, letting the window forget, then moving it back opens
//! nothing; moving it forward only makes honest requests stale (a denial of
//! service the host has anyway).

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt, Cursor};
/// HPKE KEMs (`KEM`, and X25519 alone for the benchmark's reference).
pub use ohttp::hpke::Kem;
use ohttp::hpke::{Aead, Kdf};
use ohttp::{KeyConfig, Server, SymmetricSuite};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

/// The AEAD of every sealed exchange. AES-256-GCM is what the design names;
/// `ohttp` 0.7's rust-hpke backend supports AES-128-GCM and
/// ChaCha20-Poly1305 only, so this stays AES-128-GCM until it does.
pub const AEAD: Aead = Aead::Aes128Gcm;

/// Largest sealed request accepted.
pub const MAX_SEALED_REQUEST: usize = 1 << 20;
/// How far a request's sealed timestamp may be from the entry's clock.
pub const REPLAY_SKEW: Duration = Duration::from_secs(60);
/// Most encapsulated keys remembered at once (authenticated requests within
/// the window); beyond it new requests are refused as busy, never forgotten.
pub const REPLAY_CAPACITY: usize = 1 << 20;
/// Header inside the sealed request: when the client sealed it (Unix seconds).
pub use veil_wire::http::SENT_AT_FIELD;
/// The KEM of the entry's key configuration: X-Wing (ML-KEM-768 and
/// X25519 combined, codepoint 0x647a), so a sealed request recorded today
/// stays closed to a later quantum computer unless both break.
pub const KEM: Kem = Kem::XWing;
/// Bytes before the encapsulated key: key id, KEM, KDF, AEAD.
const HEADER_LEN: usize = 7;
/// What the replay window keeps of an encapsulated key: its SHA-256.
const ENC_LEN: usize = 32;

pub use crate::error::seal::GatewaySealError;

/// Encapsulated keys of authenticated requests, each with the Unix second
/// after which its timestamp is refused anyway; arrival order for eviction.
#[derive(Debug, Default)]
struct ReplayWindow {
    expires: HashMap<[u8; ENC_LEN], u64>,
    order: VecDeque<([u8; ENC_LEN], u64)>,
    /// The latest entry time seen (Unix seconds): never goes back.
    high_water: u64,
}

impl ReplayWindow {
    /// Raises the high-water mark to `now` and returns it.
    fn advance(&mut self, now: u64) -> u64 {
        self.high_water = self.high_water.max(now);
        self.high_water
    }

    /// Refuses a request sealed at `sent` before the window that ends at the
    /// high-water mark (its key may have been forgotten).
    fn check_not_before(&mut self, sent: u64, now: u64) -> Result<(), GatewaySealError> {
        let mark = self.advance(now);
        let floor = mark.saturating_sub(REPLAY_SKEW.as_secs());
        if sent < floor {
            return Err(GatewaySealError::Stale(format!(
                "sealed {}s before the latest time this entry has seen; the window is {}s",
                floor - sent + REPLAY_SKEW.as_secs(),
                REPLAY_SKEW.as_secs()
            )));
        }
        Ok(())
    }

    /// Forgets keys whose timestamps are out of the window (measured from
    /// the high-water mark, never from a clock that went back), then records
    /// `enc` until `until`, unless it is there already.
    fn record(&mut self, enc: [u8; ENC_LEN], sent: u64, until: u64, now: u64) -> Result<(), GatewaySealError> {
        self.check_not_before(sent, now)?;
        let mark = self.high_water;
        while let Some(&(old, t)) = self.order.front() {
            if t >= mark {
                break;
            }
            self.order.pop_front();
            if self.expires.get(&old) == Some(&t) {
                self.expires.remove(&old);
            }
        }
        if self.expires.contains_key(&enc) {
            return Err(GatewaySealError::Replay);
        }
        if self.expires.len() >= REPLAY_CAPACITY {
            return Err(GatewaySealError::Busy);
        }
        self.expires.insert(enc, until);
        self.order.push_back((enc, until));
        Ok(())
    }
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The entry's HPKE key and its published configuration.
pub struct SealKey {
    server: Server,
    config: Vec<u8>,
    config_hash: [u8; 32],
    key_id: u8,
    /// The KEM's encapsulated key length.
    n_enc: usize,
    seen: Mutex<ReplayWindow>,
}

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealKey").field("key_id", &self.key_id).field("private", &"<redacted>").finish()
    }
}

/// An opened request: the Binary HTTP message and the sealer for its response.
pub struct Opened {
    /// The request.
    pub request: bhttp::Message,
    /// Seals the response to the same client.
    pub response: ResponseSealer,
    /// SHA-256 of the sealed request as received (what its receipt names).
    pub sealed_digest: [u8; 32],
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the request's content.
        f.debug_struct("Opened").field("response", &self.response).finish_non_exhaustive()
    }
}

impl SealKey {
    /// A fresh key for [`KEM`], generated inside the enclave and never exported.
    pub fn generate(key_id: u8) -> Result<Self, GatewaySealError> {
        Self::generate_for(key_id, KEM)
    }

    /// A fresh key for `kem` (X25519 alone: the benchmark's reference).
    pub fn generate_for(key_id: u8, kem: Kem) -> Result<Self, GatewaySealError> {
        let suite = SymmetricSuite::new(Kdf::HkdfSha256, AEAD);
        let config = KeyConfig::new(key_id, kem, vec![suite]).map_err(|e| GatewaySealError::WrongKey(e.to_string()))?;
        let server = Server::new(config).map_err(|e| GatewaySealError::WrongKey(e.to_string()))?;
        let encoded = server.config().encode().map_err(|e| GatewaySealError::WrongKey(e.to_string()))?;
        let config_hash = Sha256::digest(&encoded).into();
        let n_enc = kem.n_enc();
        Ok(Self { server, config: encoded, config_hash, key_id, n_enc, seen: Mutex::new(Default::default()) })
    }

    /// The key configuration clients seal to (RFC 9458 §3).
    pub fn config(&self) -> &[u8] {
        &self.config
    }

    /// SHA-256 of [`config`](Self::config): bound into the entry's claims.
    pub fn config_hash(&self) -> [u8; 32] {
        self.config_hash
    }

    /// Opens a sealed (chunked) request at the entry's current time.
    pub async fn open(&self, sealed: Vec<u8>) -> Result<Opened, GatewaySealError> {
        self.open_at(sealed, SystemTime::now()).await
    }

    /// Opens a sealed (chunked) request as of `now`: size and key id before
    /// decryption; then, only for a request that authenticates, its sealed
    /// timestamp against `now` and its encapsulated key against the window.
    pub async fn open_at(&self, sealed: Vec<u8>, now: SystemTime) -> Result<Opened, GatewaySealError> {
        if sealed.len() > MAX_SEALED_REQUEST {
            return Err(GatewaySealError::TooLarge(sealed.len()));
        }
        if sealed.len() < HEADER_LEN + self.n_enc {
            return Err(GatewaySealError::WrongKey("shorter than a request header".into()));
        }
        if sealed[0] != self.key_id {
            return Err(GatewaySealError::WrongKey(format!("key id {} (this entry's is {})", sealed[0], self.key_id)));
        }
        let enc: [u8; ENC_LEN] = Sha256::digest(&sealed[HEADER_LEN..HEADER_LEN + self.n_enc]).into();
        let sealed_digest: [u8; 32] = Sha256::digest(&sealed).into();
        let mut request = self.server.clone().decapsulate_stream(Cursor::new(sealed));
        let mut plain = Vec::new();
        request.read_to_end(&mut plain).await.map_err(|e| GatewaySealError::Open(e.to_string()))?;
        let message = bhttp::Message::read_bhttp(&mut std::io::Cursor::new(&plain[..]))
            .map_err(|e| GatewaySealError::Message(e.to_string()))?;
        // Authenticated: now the timestamp, then the replay window.
        let sent = message
            .header()
            .get(SENT_AT_FIELD.as_bytes())
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                GatewaySealError::Stale(format!("no {SENT_AT_FIELD} header (Unix seconds) in the sealed request"))
            })?;
        let (now, skew) = (unix(now), REPLAY_SKEW.as_secs());
        if sent.abs_diff(now) > skew {
            return Err(GatewaySealError::Stale(format!(
                "sealed {}s from the entry's clock; the window is ±{skew}s",
                i128::from(sent) - i128::from(now)
            )));
        }
        self.remember(enc, sent, sent.saturating_add(skew), now)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let probe = tx.clone();
        let writer = request.response(ChannelWriter(tx)).map_err(|e| GatewaySealError::Open(e.to_string()))?;
        let writer: Pin<Box<dyn AsyncWrite + Send>> = Box::pin(writer);
        let response = ResponseSealer { writer, out: Some(rx), probe, state: State::Head, content: Sha256::new() };
        Ok(Opened { request: message, response, sealed_digest })
    }

    fn remember(&self, enc: [u8; ENC_LEN], sent: u64, until: u64, now: u64) -> Result<(), GatewaySealError> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).record(enc, sent, until, now)
    }

    /// Encapsulated keys remembered now (for tests and metrics).
    pub fn remembered(&self) -> usize {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).expires.len()
    }
}

/// Where sealed response bytes go: a channel the relay drains as they come.
#[derive(Debug)]
struct ChannelWriter(mpsc::UnboundedSender<Vec<u8>>);

impl AsyncWrite for ChannelWriter {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.0.send(buf.to_vec()) {
            Ok(()) => Poll::Ready(Ok(buf.len())),
            Err(_) => Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into())),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[derive(Debug, PartialEq, Eq)]
enum State {
    Head,
    Body,
    Done,
}

/// Writes one response through the seal: head, body pieces, then finish.
pub struct ResponseSealer {
    writer: Pin<Box<dyn AsyncWrite + Send>>,
    out: Option<mpsc::UnboundedReceiver<Vec<u8>>>,
    /// A handle on the output channel that writes nothing: it tells when the
    /// reader (the connection to the client, through the host) is gone.
    probe: mpsc::UnboundedSender<Vec<u8>>,
    state: State,
    /// SHA-256 of the body written so far (what the receipt names).
    content: Sha256,
}

impl std::fmt::Debug for ResponseSealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseSealer").field("state", &self.state).finish_non_exhaustive()
    }
}

fn varint(v: u64, out: &mut Vec<u8>) {
    match v {
        0..=0x3f => out.push(v as u8),
        0x40..=0x3fff => out.extend_from_slice(&(v as u16 | 0x4000).to_be_bytes()),
        0x4000..=0x3fff_ffff => out.extend_from_slice(&(v as u32 | 0x8000_0000).to_be_bytes()),
        _ => out.extend_from_slice(&(v | 0xc000_0000_0000_0000).to_be_bytes()),
    }
}

impl ResponseSealer {
    /// The sealed bytes, in order, as they are produced (take once).
    pub fn take_output(&mut self) -> Option<mpsc::UnboundedReceiver<Vec<u8>>> {
        self.out.take()
    }

    /// Resolves when nobody reads the sealed output any more: the client's
    /// connection closed (or the host dropped it). A response still being
    /// computed is then for nobody, and its work should stop.
    pub fn reader_gone(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let probe = self.probe.clone();
        async move { probe.closed().await }
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), GatewaySealError> {
        self.writer.write_all(bytes).await.map_err(|e| GatewaySealError::Response(e.to_string()))?;
        self.writer.flush().await.map_err(|e| GatewaySealError::Response(e.to_string()))
    }

    /// The status and header fields (an indeterminate-length response head).
    pub async fn head(&mut self, status: u16, fields: &[(&str, &str)]) -> Result<(), GatewaySealError> {
        if self.state != State::Head {
            return Err(GatewaySealError::Response("head written twice".into()));
        }
        let mut b = Vec::with_capacity(64);
        varint(3, &mut b); // framing indicator: indeterminate-length response
        varint(u64::from(status), &mut b);
        for (name, value) in fields {
            varint(name.len() as u64, &mut b);
            b.extend_from_slice(name.as_bytes());
            varint(value.len() as u64, &mut b);
            b.extend_from_slice(value.as_bytes());
        }
        varint(0, &mut b); // end of header fields
        self.state = State::Body;
        self.write(&b).await
    }

    /// One piece of the body, sealed and sent at once.
    pub async fn body(&mut self, piece: &[u8]) -> Result<(), GatewaySealError> {
        if self.state != State::Body {
            return Err(GatewaySealError::Response("body before head or after finish".into()));
        }
        if piece.is_empty() {
            return Ok(());
        }
        self.content.update(piece);
        let mut b = Vec::with_capacity(piece.len() + 8);
        varint(piece.len() as u64, &mut b);
        b.extend_from_slice(piece);
        self.write(&b).await
    }

    /// SHA-256 of the body written so far: once it is whole, the digest a
    /// client computes over what it read.
    pub fn content_digest(&self) -> [u8; 32] {
        self.content.clone().finalize().into()
    }

    /// Ends the body and trailers and closes the seal with the final chunk.
    pub async fn finish(self) -> Result<(), GatewaySealError> {
        self.finish_with_trailer(&[]).await
    }

    /// Ends the body, writes `trailer` fields (authenticated like the rest,
    /// e.g. what is known only at the end of a stream), and closes the seal.
    pub async fn finish_with_trailer(mut self, trailer: &[(&str, &str)]) -> Result<(), GatewaySealError> {
        if self.state != State::Body {
            return Err(GatewaySealError::Response("finish before head".into()));
        }
        self.state = State::Done;
        // Content terminator, then the trailer section and its end.
        let mut b = vec![0];
        for (name, value) in trailer {
            varint(name.len() as u64, &mut b);
            b.extend_from_slice(name.as_bytes());
            varint(value.len() as u64, &mut b);
            b.extend_from_slice(value.as_bytes());
        }
        varint(0, &mut b);
        self.write(&b).await?;
        self.writer.close().await.map_err(|e| GatewaySealError::Response(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bhttp::stream::AsyncReadMessage;

    /// What a client does (the SDK's half lives in `veil-client`).
    #[derive(Clone, Default)]
    struct SharedBuf(std::sync::Arc<Mutex<Vec<u8>>>);

    impl AsyncWrite for SharedBuf {
        fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    type Opener = Box<dyn FnOnce(Vec<u8>) -> Result<Pin<Box<dyn futures::io::AsyncRead + Send>>, String>>;

    async fn client_seal(config: &[u8], request: &bhttp::Message) -> (Vec<u8>, Opener) {
        let mut plain = Vec::new();
        request.write_bhttp(bhttp::Mode::KnownLength, &mut plain).unwrap();
        let client = ohttp::ClientRequest::from_encoded_config(config).unwrap();
        let buf = SharedBuf::default();
        let mut w = client.encapsulate_stream(buf.clone()).unwrap();
        w.write_all(&plain).await.unwrap();
        w.close().await.unwrap();
        let sealed = buf.0.lock().unwrap().clone();
        let opener: Opener = Box::new(move |response: Vec<u8>| {
            let r = w.response(Cursor::new(response)).map_err(|e| e.to_string())?;
            Ok(Box::pin(r) as Pin<Box<dyn futures::io::AsyncRead + Send>>)
        });
        (sealed, opener)
    }

    fn request() -> bhttp::Message {
        request_sent_at(unix(SystemTime::now()))
    }

    fn request_sent_at(sent: u64) -> bhttp::Message {
        let mut m = bhttp::Message::request(
            b"POST".to_vec(),
            b"https".to_vec(),
            b"entry".to_vec(),
            b"/v1/completions".to_vec(),
        );
        m.put_header("content-type", "application/json");
        m.put_header(SENT_AT_FIELD, sent.to_string());
        m.write_content(br#"{"prompt":"secret"}"#);
        m
    }

    async fn respond(key: &SealKey, sealed: Vec<u8>, pieces: &[&str], finish: bool) -> (bhttp::Message, Vec<u8>) {
        let mut opened = key.open(sealed).await.unwrap();
        let mut out = opened.response.take_output().unwrap();
        opened.response.head(200, &[("content-type", "text/event-stream")]).await.unwrap();
        for p in pieces {
            opened.response.body(p.as_bytes()).await.unwrap();
        }
        if finish {
            opened.response.finish().await.unwrap();
        } else {
            drop(opened.response);
        }
        let mut bytes = Vec::new();
        while let Ok(b) = out.try_recv() {
            bytes.extend(b);
        }
        (opened.request, bytes)
    }

    async fn client_open(opener: Opener, sealed: Vec<u8>) -> Result<(u16, Vec<u8>), String> {
        let plain = opener(sealed)?;
        let mut msg = bhttp::Message::async_read(plain);
        let header = msg.header().await.map_err(|e| e.to_string())?;
        let status = header.control().status().map(|s| s.code()).unwrap_or(0);
        let mut body = Vec::new();
        msg.body().map_err(|e| e.to_string())?.read_to_end(&mut body).await.map_err(|e| e.to_string())?;
        msg.trailer().await.map_err(|e| e.to_string())?;
        Ok((status, body))
    }

    #[tokio::test]
    async fn round_trip_streams_and_detects_truncation_tampering_and_replay() {
        let key = SealKey::generate(7).unwrap();
        let (sealed, opener) = client_seal(key.config(), &request()).await;
        let (req, response) = respond(&key, sealed.clone(), &["data: a\n\n", "data: b\n\n"], true).await;
        assert_eq!(req.content(), br#"{"prompt":"secret"}"#);
        assert_eq!(req.control().path(), Some(&b"/v1/completions"[..]));
        // The plaintext appears nowhere in what the relay carries.
        assert!(!sealed.windows(6).any(|w| w == b"secret"));
        assert!(!response.windows(7).any(|w| w == b"data: a"));
        assert_eq!(client_open(opener, response.clone()).await.unwrap(), (200, b"data: a\n\ndata: b\n\n".to_vec()));
        // Replay of the same sealed request.
        assert!(matches!(key.open(sealed).await, Err(GatewaySealError::Replay)));
        // Truncated: no final chunk.
        let (sealed, opener) = client_seal(key.config(), &request()).await;
        let (_, cut) = respond(&key, sealed, &["data: a\n\n"], false).await;
        assert!(client_open(opener, cut).await.is_err(), "a stream without its final chunk was accepted");
        // One flipped bit in the response.
        let (sealed, opener) = client_seal(key.config(), &request()).await;
        let (_, mut flipped) = respond(&key, sealed, &["data: a\n\n"], true).await;
        let at = flipped.len() - 20;
        flipped[at] ^= 1;
        assert!(client_open(opener, flipped).await.is_err());
    }

    #[tokio::test]
    async fn timestamps_outside_the_window_or_missing_are_refused() {
        let key = SealKey::generate(3).unwrap();
        let now = SystemTime::now();
        let t = unix(now);
        for (sent, ok) in [(t, true), (t - 60, true), (t + 60, true), (t - 61, false), (t + 61, false), (0, false)] {
            let (sealed, _) = client_seal(key.config(), &request_sent_at(sent)).await;
            let r = key.open_at(sealed, now).await;
            assert_eq!(r.is_ok(), ok, "sent {sent} vs now {t}: {r:?}");
            if !ok {
                assert!(matches!(r, Err(GatewaySealError::Stale(_))));
            }
        }
        // No timestamp at all.
        let mut bare = bhttp::Message::request(b"POST".to_vec(), b"https".to_vec(), b"e".to_vec(), b"/".to_vec());
        bare.write_content(b"{}");
        let (sealed, _) = client_seal(key.config(), &bare).await;
        assert!(matches!(key.open_at(sealed, now).await, Err(GatewaySealError::Stale(_))));
    }

    /// A captured request never opens twice: not after a flood of 20,000
    /// junk requests (none authenticates, none is remembered), not after many
    /// valid ones, and after its window it is refused by its timestamp. The
    /// window holds only the authenticated requests of the last two minutes.
    #[tokio::test]
    async fn a_flood_cannot_make_a_captured_request_open_again() {
        let key = SealKey::generate(5).unwrap();
        let now = SystemTime::now();
        let (captured, _) = client_seal(key.config(), &request_sent_at(unix(now))).await;
        key.open_at(captured.clone(), now).await.unwrap();
        // Junk with the right key id and header: fails to authenticate.
        let mut junk = captured.clone();
        for i in 0..20_000u32 {
            junk[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&i.to_be_bytes());
            assert!(key.open_at(junk.clone(), now).await.is_err());
        }
        assert_eq!(key.remembered(), 1, "junk was remembered");
        // Valid requests from other clients, over the following minute.
        for i in 0..500u64 {
            let at = now + Duration::from_millis(i * 100);
            let (sealed, _) = client_seal(key.config(), &request_sent_at(unix(at))).await;
            key.open_at(sealed, at).await.unwrap();
        }
        let later = now + Duration::from_secs(50);
        assert!(matches!(key.open_at(captured.clone(), later).await, Err(GatewaySealError::Replay)));
        // Past its window: refused by the timestamp, and forgotten.
        let much_later = now + Duration::from_secs(200);
        assert!(matches!(key.open_at(captured, much_later).await, Err(GatewaySealError::Stale(_))));
        let (fresh, _) = client_seal(key.config(), &request_sent_at(unix(much_later))).await;
        key.open_at(fresh, much_later).await.unwrap();
        assert_eq!(key.remembered(), 1, "expired keys were kept");
    }

    /// The host controls the entry's clock. Captured request (a replay is
    /// 409); clock +130 s and one genuine request (which purged the window
    /// when it was measured from the clock); clock back to +5 s: the captured
    /// request is still refused, by the high-water mark, and runs nothing.
    #[tokio::test]
    async fn a_clock_rollback_does_not_reopen_a_captured_request() {
        let key = SealKey::generate(6).unwrap();
        let t0 = SystemTime::now();
        let (captured, _) = client_seal(key.config(), &request_sent_at(unix(t0))).await;
        key.open_at(captured.clone(), t0).await.unwrap();
        assert!(matches!(key.open_at(captured.clone(), t0).await, Err(GatewaySealError::Replay)));
        let ahead = t0 + Duration::from_secs(130);
        let (genuine, _) = client_seal(key.config(), &request_sent_at(unix(ahead))).await;
        key.open_at(genuine, ahead).await.unwrap();
        assert_eq!(key.remembered(), 1, "the captured key is forgotten once out of the window");
        let back = t0 + Duration::from_secs(5);
        match key.open_at(captured, back).await {
            Err(GatewaySealError::Stale(why)) => assert!(why.contains("latest time"), "{why}"),
            other => panic!("a captured request opened after a clock rollback: {:?}", other.map(|_| ())),
        }
        // Honest clients whose clocks follow the rolled-back entry are
        // refused too until time catches up: the rollback buys the host a
        // denial of service, never a replay.
        let (honest, _) = client_seal(key.config(), &request_sent_at(unix(back))).await;
        assert!(matches!(key.open_at(honest, back).await, Err(GatewaySealError::Stale(_))));
    }

    /// The entry's key is the hybrid KEM (X-Wing): the configuration names
    /// it, a request sealed to it carries its 1120-byte encapsulated key and
    /// opens, and the client refuses an X25519-only configuration.
    #[tokio::test]
    async fn sealed_requests_use_the_hybrid_kem_and_open() {
        let key = SealKey::generate(1).unwrap();
        assert_eq!(key.config()[1..3], 0x647au16.to_be_bytes(), "KEM id in the key configuration");
        veil_client::seal::require_hybrid(key.config()).unwrap();
        let (sealed, _) = client_seal(key.config(), &request()).await;
        assert_eq!(sealed[1..3], 0x647au16.to_be_bytes(), "KEM id in the request header");
        assert_eq!(key.n_enc, 1120);
        let opened = key.open(sealed).await.unwrap();
        assert_eq!(opened.request.content(), br#"{"prompt":"secret"}"#);
        let classical = SealKey::generate_for(1, Kem::X25519Sha256).unwrap();
        let err = veil_client::seal::require_hybrid(classical.config()).unwrap_err().to_string();
        assert!(err.contains("0x0020") && err.contains("X-Wing"), "{err}");
    }

    #[tokio::test]
    async fn bad_requests_are_refused_before_decryption() {
        let key = SealKey::generate(1).unwrap();
        let other = SealKey::generate(2).unwrap();
        let (sealed, _) = client_seal(other.config(), &request()).await;
        assert!(matches!(key.open(sealed).await, Err(GatewaySealError::WrongKey(_))));
        assert!(matches!(key.open(vec![1; 10]).await, Err(GatewaySealError::WrongKey(_))));
        assert!(matches!(key.open(vec![1; MAX_SEALED_REQUEST + 1]).await, Err(GatewaySealError::TooLarge(_))));
        let (mut sealed, _) = client_seal(key.config(), &request()).await;
        let last = sealed.len() - 1;
        sealed[last] ^= 0x80;
        assert!(matches!(key.open(sealed).await, Err(GatewaySealError::Open(_))));
        let other_same_id = SealKey::generate(1).unwrap();
        let (sealed, _) = client_seal(other_same_id.config(), &request()).await;
        assert!(matches!(key.open(sealed).await, Err(GatewaySealError::Open(_))));
    }

    /// An attacker's own HPKE sender (RFC 9180 base mode, DHKEM(X25519,
    /// HKDF-SHA256), HKDF-SHA256, AES-128-GCM) for a chunked OHTTP request of
    /// one final chunk, given the Diffie-Hellman result it believes the entry
    /// will compute. With an honest ephemeral key the entry opens it (which
    /// proves this construction right); with a low-order point the attacker
    /// knows the shared secret is all zero without knowing the entry's key.
    fn attacker_seal(config: &[u8], enc: [u8; 32], dh: [u8; 32], plain: &[u8]) -> Vec<u8> {
        use aes_gcm::aead::{Aead as _, KeyInit as _, Payload};
        let (kem, kdf, aead) = (0x0020u16, 0x0001u16, 0x0001u16);
        let hdr = [&[config[0]][..], &kem.to_be_bytes(), &kdf.to_be_bytes(), &aead.to_be_bytes()].concat();
        let pk_r = &config[3..35];
        let extract = |suite: &[u8], salt: &[u8], label: &[u8], ikm: &[u8]| {
            let (prk, _) = hkdf::Hkdf::<Sha256>::extract(Some(salt), &[b"HPKE-v1", suite, label, ikm].concat());
            prk.to_vec()
        };
        let expand = |suite: &[u8], prk: &[u8], label: &[u8], info: &[u8], len: usize| {
            let h = hkdf::Hkdf::<Sha256>::from_prk(prk).unwrap();
            let mut out = vec![0u8; len];
            h.expand(&[&(len as u16).to_be_bytes()[..], b"HPKE-v1", suite, label, info].concat(), &mut out).unwrap();
            out
        };
        let kem_suite = [&b"KEM"[..], &kem.to_be_bytes()].concat();
        let eae = extract(&kem_suite, b"", b"eae_prk", &dh);
        let shared = expand(&kem_suite, &eae, b"shared_secret", &[&enc[..], pk_r].concat(), 32);
        let suite = [&b"HPKE"[..], &kem.to_be_bytes(), &kdf.to_be_bytes(), &aead.to_be_bytes()].concat();
        let info = [&b"message/bhttp chunked request"[..], &[0], &hdr].concat();
        let ctx = [&[0u8][..], &extract(&suite, b"", b"psk_id_hash", b""), &extract(&suite, b"", b"info_hash", &info)]
            .concat();
        let secret = extract(&suite, &shared, b"secret", b"");
        let key = expand(&suite, &secret, b"key", &ctx, 16);
        let nonce = expand(&suite, &secret, b"base_nonce", &ctx, 12);
        let cipher = aes_gcm::Aes128Gcm::new_from_slice(&key).unwrap();
        let ct = cipher.encrypt(nonce.as_slice().into(), Payload { msg: plain, aad: b"final" }).unwrap();
        [&hdr[..], &enc, &[0], &ct].concat()
    }

    fn plain_request() -> Vec<u8> {
        let mut plain = Vec::new();
        request().write_bhttp(bhttp::Mode::KnownLength, &mut plain).unwrap();
        plain
    }

    #[tokio::test]
    async fn the_attackers_construction_opens_with_an_honest_ephemeral_key() {
        let key = SealKey::generate_for(1, Kem::X25519Sha256).unwrap();
        let e = [0x5Au8; 32];
        let enc = x25519_dalek::x25519(e, x25519_dalek::X25519_BASEPOINT_BYTES);
        let pk_r: [u8; 32] = key.config()[3..35].try_into().unwrap();
        let dh = x25519_dalek::x25519(e, pk_r);
        let opened = key.open(attacker_seal(key.config(), enc, dh, &plain_request())).await.unwrap();
        assert_eq!(opened.request.content(), br#"{"prompt":"secret"}"#);
    }

    /// SECURITY-CASES E9: an encapsulated key that is a low-order point makes
    /// the X25519 result all zero whatever the entry's private key; RFC 9180
    /// §7.1.4 requires refusing it. Each of these requests would open if the
    /// check were missing (the construction is proven by the test above).
    /// The entry's own key is X-Wing, whose shared secret also needs the
    /// ML-KEM-768 part; this checks the X25519-only configuration the crate
    /// still supports, should one ever be offered.
    #[tokio::test]
    async fn low_order_encapsulated_keys_are_refused() {
        let key = SealKey::generate_for(1, Kem::X25519Sha256).unwrap();
        let low_order = [
            "0000000000000000000000000000000000000000000000000000000000000000",
            "0100000000000000000000000000000000000000000000000000000000000000",
            "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800",
            "5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157",
            "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
            "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
            "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
        ];
        for point in low_order {
            let enc: [u8; 32] = hex::decode(point).unwrap().try_into().unwrap();
            // What the entry's key would compute with this point: zero for every one of them.
            assert_eq!(x25519_dalek::x25519(*b"entry's private key, any value..", enc), [0; 32], "{point}");
            let sealed = attacker_seal(key.config(), enc, [0; 32], &plain_request());
            assert!(matches!(key.open(sealed).await, Err(GatewaySealError::Open(_))), "{point} must not open");
        }
        assert_eq!(key.remembered(), 0, "nothing unauthenticated is remembered");
    }

    /// SECURITY-CASES E10: a request whose KEM, KDF or AEAD identifiers were
    /// rewritten (a downgrade, or an unknown suite) is refused without opening.
    #[tokio::test]
    async fn rewritten_suite_identifiers_are_refused() {
        let key = SealKey::generate(1).unwrap();
        let (sealed, _) = client_seal(key.config(), &request()).await;
        // 0x0020: a downgrade of the X-Wing key to X25519 alone.
        for (at, value) in [
            (1usize, 0x0020u16),
            (1, 0x0010),
            (1, 0xFFFF),
            (3, 0x0002),
            (3, 0x0003),
            (5, 0x0002),
            (5, 0x0003),
            (5, 0xFFFF),
        ] {
            let mut edited = sealed.clone();
            edited[at..at + 2].copy_from_slice(&value.to_be_bytes());
            let err = key.open(edited).await.err().unwrap_or_else(|| panic!("byte {at} = {value:#06x} opened"));
            assert!(matches!(err, GatewaySealError::Open(_) | GatewaySealError::WrongKey(_)), "{err:?}");
        }
        key.open(sealed).await.unwrap();
    }

    // SECURITY-CASES E8: sealing state is never duplicated or persisted, so no
    // (key, nonce) pair can be used twice through a copy.
    static_assertions::assert_not_impl_any!(SealKey: Clone, serde::Serialize);
    static_assertions::assert_not_impl_any!(ResponseSealer: Clone, serde::Serialize);
    static_assertions::assert_not_impl_any!(Opened: Clone);

    /// E8, observed from outside: the same plaintext sealed again — in the
    /// next chunk of one response, in another response, or as the request —
    /// never gives the same ciphertext, which a repeated nonce under one key
    /// would.
    #[tokio::test]
    async fn identical_plaintexts_never_seal_to_identical_ciphertexts() {
        let key = SealKey::generate(4).unwrap();
        let pieces = vec!["data: same same same\n\n"; 64];
        let mut seen = std::collections::HashSet::new();
        for _ in 0..4 {
            let (sealed, _) = client_seal(key.config(), &request()).await;
            let (_, response) = respond(&key, sealed.clone(), &pieces, true).await;
            let chunks = veil_tests::ohttp_response_chunks(&response);
            assert!(chunks.len() > pieces.len(), "one sealed chunk per body piece, then the final one");
            assert!(seen.insert(sealed[HEADER_LEN + key.n_enc..].to_vec()));
            for c in chunks {
                assert!(seen.insert(c.to_vec()), "a ciphertext repeated: a nonce was reused");
            }
        }
    }
}
