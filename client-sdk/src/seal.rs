//! The client half of a sealed exchange: seal a Binary HTTP request to the
//! entry's key configuration (Oblivious HTTP, chunked), and open the
//! streamed response as it arrives. A response whose final chunk is missing,
//! or with any byte changed, fails to open: tampered text is never shown.
//!
//! The entry's half is `veil_enclave::gateway::seal`; both stand on the
//! `ohttp` and `bhttp` crates.

// The session cores: no unwrap or expect outside tests (a panic here would drop sessions).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use sha2::{Digest, Sha256};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use veil_attestation::receipt::{Digest32, Receipt, ReceiptCheck, ReceiptExpectation, ReceiptFailure};
use veil_wire::http::{DRAFTER_FIELD, RECEIPT_FIELD, ROUTE_FIELD};

use bhttp::stream::AsyncReadMessage;
use futures::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Why sealing or opening failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    /// The key configuration is not one this client can seal to.
    #[error("unusable key configuration: {0}")]
    Config(String),
    /// The request could not be encoded or sealed.
    #[error("cannot seal the request: {0}")]
    Seal(String),
    /// The response failed authentication, was truncated, or is not Binary HTTP.
    #[error("the sealed response does not open (tampered or truncated): {0}")]
    Open(String),
    /// The host stopped sending the response (nothing for longer than the
    /// client's between-chunks timeout). Nothing unauthenticated was shown.
    #[error("the host stalled the response: {0}")]
    Stalled(String),
    /// The answer opened, but its receipt is missing or fails a check
    /// (`veil_attestation::receipt`): the entry did not sign for this
    /// request, this body and the verified route.
    #[error("the answer's receipt: {0}")]
    Receipt(ReceiptFailure),
}

/// A read error from the response stream: a stall the transport timed out
/// (kind `TimedOut`) is told apart from a response that does not open.
fn read_error<E: std::error::Error + 'static>(e: E) -> SealError {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    let mut timed_out = false;
    while let Some(c) = cause {
        // An io::Error's `source()` skips the error it wraps; `get_ref` does not.
        cause = match c.downcast_ref::<std::io::Error>() {
            Some(io) => {
                timed_out |= io.kind() == std::io::ErrorKind::TimedOut;
                io.get_ref().map(|inner| inner as &(dyn std::error::Error + 'static))
            }
            None => c.source(),
        };
    }
    if timed_out {
        SealError::Stalled(e.to_string())
    } else {
        SealError::Open(e.to_string())
    }
}

#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl AsyncWrite for Shared {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

type OpenFn =
    Box<dyn FnOnce(Pin<Box<dyn AsyncRead + Send>>) -> Result<Pin<Box<dyn AsyncRead + Send>>, SealError> + Send>;

/// Opens the response to one sealed request (single use), and checks the
/// receipt of a completed answer when the request was sealed to a verified
/// route.
pub struct ResponseOpener(OpenFn, Option<Box<ReceiptExpectation>>);

impl std::fmt::Debug for ResponseOpener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResponseOpener")
    }
}

/// One plaintext stream read by the Binary HTTP parser and, after the
/// message ends, by us: to the end, so the final chunk is authenticated.
#[derive(Clone)]
struct SharedReader(Arc<Mutex<Pin<Box<dyn AsyncRead + Send>>>>);

impl AsyncRead for SharedReader {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<std::io::Result<usize>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).as_mut().poll_read(cx, buf)
    }
}

/// A response as it opens: status, header fields, then body pieces.
pub struct OpenedResponse {
    message: bhttp::stream::AsyncMessage<SharedReader>,
    rest: SharedReader,
    /// HTTP status.
    pub status: u16,
    /// Header fields (lower-case names).
    pub fields: Vec<(String, String)>,
    /// Trailer fields (lower-case names), once the body has been read to its end.
    pub trailer: Vec<(String, String)>,
    done: bool,
    expect: Option<Box<ReceiptExpectation>>,
    content: Sha256,
    receipt: Option<Box<Receipt>>,
}

impl std::fmt::Debug for OpenedResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenedResponse").field("status", &self.status).finish_non_exhaustive()
    }
}

/// Seals `request` to the entry of `route`: the key configuration whose hash
/// the entry's verified, nonce-fresh claims carry. Taking the proof (which
/// only `veil_attestation::route::verify_route` makes) means a request
/// cannot be sealed to a route that was not verified.
pub async fn seal(
    route: &veil_attestation::route::VerifiedRoute,
    request: bhttp::Message,
) -> Result<(Vec<u8>, ResponseOpener), SealError> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    require_hybrid(route.key_config())?;
    seal_to_config(route.key_config(), request, now, Some(ReceiptExpectation::of_route(route))).await
}

/// [`seal`] with the time it is sealed at given (Unix seconds): for a
/// platform without a system clock (wasm32 in a browser, whose clock the
/// caller reads).
pub async fn seal_at(
    route: &veil_attestation::route::VerifiedRoute,
    request: bhttp::Message,
    sent_at: u64,
) -> Result<(Vec<u8>, ResponseOpener), SealError> {
    require_hybrid(route.key_config())?;
    seal_to_config(route.key_config(), request, sent_at, Some(ReceiptExpectation::of_route(route))).await
}

/// The KEM a verified entry's key configuration must name: X-Wing
/// (ML-KEM-768 and X25519, HPKE codepoint 0x647a).
pub const HYBRID_KEM: u16 = 0x647a;

/// Refuses to seal to a key configuration (RFC 9458 §3: key id, then the
/// KEM id) that is not the hybrid KEM: a request sealed with X25519 alone
/// could be recorded now and opened by a later quantum computer.
pub fn require_hybrid(config: &[u8]) -> Result<(), SealError> {
    let kem = config.get(1..3).map(|k| u16::from_be_bytes([k[0], k[1]]));
    match kem {
        Some(HYBRID_KEM) => Ok(()),
        Some(other) => Err(SealError::Config(format!(
            "the entry's key configuration uses KEM {other:#06x}, not the hybrid X-Wing ({HYBRID_KEM:#06x}); \
             refused: a request sealed to it could be opened by a later quantum computer"
        ))),
        None => Err(SealError::Config("the entry's key configuration is too short".into())),
    }
}

/// Seals to a raw key configuration, with no route verified: only for tests
/// and benchmarks of the seal itself (feature `unverified-seal`).
#[cfg(feature = "unverified-seal")]
pub async fn seal_unverified(config: &[u8], request: bhttp::Message) -> Result<(Vec<u8>, ResponseOpener), SealError> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    seal_to_config(config, request, now, None).await
}

/// Header written inside every sealed request: when it was sealed (Unix
/// seconds). The entry refuses a request outside its replay window (±60 s of
/// its clock), so a captured request cannot be replayed later.
pub use veil_wire::http::SENT_AT_FIELD;

async fn seal_to_config(
    config: &[u8],
    mut request: bhttp::Message,
    sent_at: u64,
    expect: Option<ReceiptExpectation>,
) -> Result<(Vec<u8>, ResponseOpener), SealError> {
    request.put_header(SENT_AT_FIELD, sent_at.to_string());
    let mut plain = Vec::new();
    request.write_bhttp(bhttp::Mode::KnownLength, &mut plain).map_err(|e| SealError::Seal(e.to_string()))?;
    let client = ohttp::ClientRequest::from_encoded_config(config).map_err(|e| SealError::Config(e.to_string()))?;
    let out = Shared::default();
    let mut writer = client.encapsulate_stream(out.clone()).map_err(|e| SealError::Seal(e.to_string()))?;
    writer.write_all(&plain).await.map_err(|e| SealError::Seal(e.to_string()))?;
    writer.close().await.map_err(|e| SealError::Seal(e.to_string()))?;
    let sealed = std::mem::take(&mut *out.0.lock().unwrap_or_else(|p| p.into_inner()));
    let open: OpenFn = Box::new(move |src| {
        let plain = writer.response(src).map_err(|e| SealError::Open(e.to_string()))?;
        Ok(Box::pin(plain) as Pin<Box<dyn AsyncRead + Send>>)
    });
    let expect = expect.map(|e| Box::new(ReceiptExpectation { request: Some(Digest32::of(&sealed)), ..e }));
    Ok((sealed, ResponseOpener(open, expect)))
}

impl ResponseOpener {
    /// Requires a completed answer's receipt to meet `expect` (what
    /// [`seal`] sets from the verified route and the sealed bytes): for an
    /// opener from `seal_unverified`, in tests and benchmarks.
    pub fn expect_receipt(self, expect: ReceiptExpectation) -> Self {
        Self(self.0, Some(Box::new(expect)))
    }

    /// Starts opening the sealed response read from `src`; reads the head.
    pub async fn open(self, src: Pin<Box<dyn AsyncRead + Send>>) -> Result<OpenedResponse, SealError> {
        let plain = SharedReader(Arc::new(Mutex::new((self.0)(src)?)));
        let mut message = bhttp::Message::async_read(plain.clone());
        let header = message.header().await.map_err(read_error)?;
        let status =
            header.control().status().map(|s| s.code()).ok_or_else(|| SealError::Open("not a response".into()))?;
        let fields = header
            .iter()
            .map(|f| {
                (String::from_utf8_lossy(f.name()).to_lowercase(), String::from_utf8_lossy(f.value()).into_owned())
            })
            .collect();
        Ok(OpenedResponse {
            message,
            rest: plain,
            status,
            fields,
            trailer: Vec::new(),
            done: false,
            expect: self.1,
            content: Sha256::new(),
            receipt: None,
        })
    }
}

impl OpenedResponse {
    /// The next authenticated piece of the body; `None` at the (authenticated) end.
    pub async fn next(&mut self) -> Result<Option<Vec<u8>>, SealError> {
        if self.done {
            return Ok(None);
        }
        let mut buf = vec![0u8; 16 << 10];
        let n = {
            let mut body = self.message.body().map_err(|e| SealError::Open(e.to_string()))?;
            body.read(&mut buf).await.map_err(read_error)?
        };
        if n == 0 {
            // The body ended: the trailer, then the stream to its end, so the
            // chunk marked final authenticates (anything after must be padding).
            let trailer = self.message.trailer().await.map_err(read_error)?;
            self.trailer = trailer
                .iter()
                .map(|f| {
                    (String::from_utf8_lossy(f.name()).to_lowercase(), String::from_utf8_lossy(f.value()).into_owned())
                })
                .collect();
            let mut padding = Vec::new();
            self.rest.read_to_end(&mut padding).await.map_err(read_error)?;
            if padding.iter().any(|&b| b != 0) {
                return Err(SealError::Open("data after the end of the message".into()));
            }
            self.done = true;
            self.check_receipt()?;
            return Ok(None);
        }
        buf.truncate(n);
        self.content.update(&buf);
        Ok(Some(buf))
    }

    /// A completed answer (status 200) to a request sealed to a verified
    /// route must end with the entry's receipt for this request, this body
    /// and that route, signed by the key the entry attested.
    fn check_receipt(&mut self) -> Result<(), SealError> {
        let Some(expect) = &self.expect else { return Ok(()) };
        if self.status != 200 {
            return Ok(());
        }
        let Some((_, json)) = self.trailer.iter().find(|(n, _)| n == RECEIPT_FIELD) else {
            return Err(SealError::Receipt(ReceiptFailure {
                check: ReceiptCheck::Format,
                expected: format!("a `{RECEIPT_FIELD}` trailer at the end of the answer"),
                actual: "none".into(),
            }));
        };
        let receipt = Receipt::from_json(json.as_bytes()).map_err(SealError::Receipt)?;
        let expect = ReceiptExpectation {
            response: Some(Digest32(self.content.clone().finalize().into())),
            ..(**expect).clone()
        };
        receipt.check(&expect).map_err(SealError::Receipt)?;
        self.receipt = Some(Box::new(receipt));
        Ok(())
    }

    /// The entry's receipt for this answer, checked: once the body of a
    /// completed answer (status 200) has been read to its end.
    pub fn receipt(&self) -> Option<&Receipt> {
        self.receipt.as_deref()
    }

    /// The route the entry reports this generation ran on (`veil-route`, a
    /// header of a complete response or a trailer of a stream read to its
    /// end), authenticated by the seal. See the gateway for its format.
    pub fn route_used(&self) -> Option<&str> {
        self.fields.iter().chain(&self.trailer).find(|(n, _)| n == ROUTE_FIELD).map(|(_, v)| v.as_str())
    }

    /// The drafter the entry reports ran for this generation (`veil-drafter`:
    /// `none`, or its name and how many rounds carried drafts), authenticated
    /// by the seal; what it may be is the route's attested drafter.
    pub fn drafter_used(&self) -> Option<&str> {
        self.fields.iter().chain(&self.trailer).find(|(n, _)| n == DRAFTER_FIELD).map(|(_, v)| v.as_str())
    }

    /// The whole remaining body.
    pub async fn collect(mut self) -> Result<Vec<u8>, SealError> {
        let mut all = Vec::new();
        while let Some(piece) = self.next().await? {
            all.extend(piece);
        }
        Ok(all)
    }
}

/// The cost a request's JSON body declares in the `veil-cost` header
/// ([`veil_wire::http::request_cost`]): its `n` choices and `top_logprobs`
/// (or the completions endpoint's integer `logprobs`). A body that is not
/// JSON costs 1 (the entry refuses it anyway).
pub fn declared_cost(body: &[u8]) -> u32 {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else { return 1 };
    let count = |key: &str| v.get(key).and_then(serde_json::Value::as_u64).map(|n| n.min(u64::from(u32::MAX)) as u32);
    let top = count("top_logprobs").or_else(|| count("logprobs")).unwrap_or(0);
    veil_wire::http::request_cost(count("n").unwrap_or(1), top)
}

#[cfg(test)]
mod cost_tests {
    use super::declared_cost;

    #[test]
    fn a_body_declares_its_choices_and_log_probabilities() {
        assert_eq!(declared_cost(br#"{"messages":[]}"#), 1);
        assert_eq!(declared_cost(br#"{"n":8}"#), 8);
        assert_eq!(declared_cost(br#"{"n":8,"logprobs":true,"top_logprobs":20}"#), 24);
        assert_eq!(declared_cost(br#"{"prompt":"x","logprobs":5}"#), 2);
        assert_eq!(declared_cost(br#"{"n":1000}"#), 9, "past the maximum: more than any valid request");
        assert_eq!(declared_cost(b"not json"), 1);
    }
}
