//! The client SDK: connect to a Veil host, verify every shard on the route
//! against the caller's policy, then send OpenAI API calls sealed to the
//! attested entry and read the answers as they stream.
//!
//! ```no_run
//! # async fn demo(policy: veil_attestation::Policy) -> Result<(), veil_client::sdk::ClientError> {
//! let client = veil_client::sdk::Client::connect("http://127.0.0.1:7701", &policy).await?;
//! let body = serde_json::json!({"messages": [{"role": "user", "content": "Hello"}]});
//! let answer = client.call("POST", "/v1/chat/completions", &body).await?;
//! println!("{}", String::from_utf8_lossy(&answer.collect().await?));
//! # Ok(()) }
//! ```

// The session cores: no unwrap or expect outside tests (a panic here would drop sessions).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::pin::Pin;
use std::time::SystemTime;
use veil_wire::http::openai::{CHAT_COMPLETIONS_PATH, COMPLETIONS_PATH};
use veil_wire::http::{ATTESTATION_PATH, SEALED_PATH, SEALED_REQUEST_TYPE};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use http_body_util::{BodyExt, BodyStream, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use veil_attestation::receipt::{SavedRoute, SAVED_ROUTE_VERSION};
use veil_attestation::route::{verify_route, AttestationDoc, RouteError, MAX_DOC_BYTES};
use veil_attestation::{Nonce, Policy};

use crate::seal::{seal, OpenedResponse, SealError};

mod error;
mod stream;
pub use error::{ClientError, Retries, TimeoutStage, Timeouts};
pub use stream::{api_error, SseEvents, TextStream};

pub use veil_attestation::route::{VerifiedRoute, VerifiedShard};

/// How to reach the host. The host's TLS (when its URL is `https://`) only
/// hides metadata from the network; what protects a request is the seal to
/// the attested entry, whichever certificate the host presents.
#[derive(Debug, Clone, Default)]
pub struct ConnectOptions {
    /// Certificate authorities trusted for the host's TLS besides the system's.
    pub extra_roots: Vec<rustls_pki_types::CertificateDer<'static>>,
    /// How long to wait at each stage.
    pub timeouts: Timeouts,
    /// How a request shed for load is retried.
    pub retries: Retries,
    /// The local address to connect from (a multi-homed client; tests
    /// playing several clients on one machine). `None`: the system's choice.
    pub local_address: Option<std::net::IpAddr>,
}

impl ConnectOptions {
    /// Also trust the PEM certificates in `path` for the host's TLS.
    pub fn with_ca_file(mut self, path: &std::path::Path) -> Result<Self, ClientError> {
        use rustls_pki_types::pem::PemObject as _;
        let bad = |e: String| ClientError::Config(format!("CA file {}: {e}", path.display()));
        let certs = rustls_pki_types::CertificateDer::pem_file_iter(path)
            .map_err(|e| bad(e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(e.to_string()))?;
        if certs.is_empty() {
            return Err(bad("no CERTIFICATE block".into()));
        }
        self.extra_roots.extend(certs);
        Ok(self)
    }

    pub(crate) fn http_client(&self, https: bool) -> Result<HttpClient, ClientError> {
        let mut roots = rustls::RootCertStore::empty();
        if https {
            // Unreadable system certificates are skipped; an empty store is
            // an error only if no extra root was given either.
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            for c in &self.extra_roots {
                roots.add(c.clone()).map_err(|e| ClientError::Config(format!("CA certificate: {e}")))?;
            }
            if roots.is_empty() {
                return Err(ClientError::Config("no trusted certificate authority for https".into()));
            }
        }
        // X25519MLKEM768 offered first (`veil_tls_pq`), classical groups after.
        let provider = veil_tls_pq::client_provider();
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| ClientError::Config(e.to_string()))?;
        let tls = if https {
            let webpki =
                rustls::client::WebPkiServerVerifier::builder_with_provider(std::sync::Arc::new(roots), provider)
                    .build()
                    .map_err(|e| ClientError::Config(format!("certificate verifier: {e}")))?;
            let verifier = PinnedOrWebPki { pinned: self.extra_roots.clone(), webpki };
            builder.dangerous().with_custom_certificate_verifier(std::sync::Arc::new(verifier)).with_no_client_auth()
        } else {
            builder.with_root_certificates(roots).with_no_client_auth()
        };
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_local_address(self.local_address);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Ok(hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(connector))
    }
}

/// The host's TLS certificate verifier: a certificate the user gave with
/// `--ca` is accepted when the host presents exactly it (a self-signed
/// certificate made the usual way, `openssl req -x509`, is marked CA:TRUE and
/// webpki refuses it as an end entity; trusting those exact bytes is what the
/// user asked for, as curl does); everything else is WebPKI verification.
/// Handshake signatures are always verified with the presented key.
#[derive(Debug)]
struct PinnedOrWebPki {
    pinned: Vec<rustls_pki_types::CertificateDer<'static>>,
    webpki: std::sync::Arc<rustls::client::WebPkiServerVerifier>,
}

impl rustls::client::danger::ServerCertVerifier for PinnedOrWebPki {
    fn verify_server_cert(
        &self,
        end_entity: &rustls_pki_types::CertificateDer<'_>,
        intermediates: &[rustls_pki_types::CertificateDer<'_>],
        server_name: &rustls_pki_types::ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        if self.pinned.iter().any(|p| p.as_ref() == end_entity.as_ref()) {
            return Ok(rustls::client::danger::ServerCertVerified::assertion());
        }
        self.webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// An error with its causes (a connection error's reason, such as an
/// untrusted certificate, is only in the chain).
fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out += &format!(": {c}");
        cause = c.source();
    }
    out
}

pub(crate) type HttpClient = hyper_util::client::legacy::Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Most bytes of an unsealed error body read (the host wrote them; only the
/// first KiB is kept as the error's message).
pub const MAX_ERROR_BODY: usize = 64 << 10;
/// First back-off before asking a busy attestation endpoint again.
const ATTEST_BACKOFF_FIRST: std::time::Duration = std::time::Duration::from_millis(50);
/// Longest back-off between attestation tries.
const ATTEST_BACKOFF_MAX: std::time::Duration = std::time::Duration::from_secs(2);

/// A uniform draw in [0, 1) for back-off jitter.
fn jitter() -> f64 {
    let b = Nonce::random();
    let mut x = [0u8; 8];
    x.copy_from_slice(&b.as_bytes()[..8]);
    (u64::from_le_bytes(x) >> 11) as f64 / (1u64 << 53) as f64
}

/// Reads a body the host wrote: at most `limit` bytes (the rest is left
/// unread, and the connection dropped), each piece within `idle` of the last
/// and the whole by `deadline`. A host that streams forever or stalls gets a
/// typed error (or a truncated body), never unbounded memory or time.
async fn read_bounded(
    body: hyper::body::Incoming,
    limit: usize,
    idle: std::time::Duration,
    (deadline, total): (tokio::time::Instant, std::time::Duration),
) -> Result<Vec<u8>, ClientError> {
    let mut body = body;
    let mut out = Vec::new();
    while out.len() < limit {
        let next = tokio::time::timeout_at(deadline.min(tokio::time::Instant::now() + idle), body.frame()).await;
        let frame = match next {
            Err(_) if tokio::time::Instant::now() >= deadline => {
                return Err(ClientError::Timeout { stage: TimeoutStage::FirstByte, after: total })
            }
            Err(_) => return Err(ClientError::Timeout { stage: TimeoutStage::BetweenChunks, after: idle }),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(ClientError::Unreachable(with_causes(&e))),
            Ok(Some(Ok(f))) => f,
        };
        if let Ok(data) = frame.into_data() {
            let room = limit - out.len();
            out.extend_from_slice(&data[..data.len().min(room)]);
        }
    }
    Ok(out)
}

/// A connection to a verified route.
#[derive(Debug)]
pub struct Client {
    base: String,
    http: HttpClient,
    route: VerifiedRoute,
    saved: SavedRoute,
    timeouts: Timeouts,
    retries: Retries,
}

impl Client {
    /// Fetches the route's attestation document with a fresh nonce and
    /// verifies it as one (`veil_attestation::route::verify_route`): the
    /// entry's evidence must bind the nonce, the key configuration this client
    /// will seal to, the published peer policy and route shape, and the exact
    /// list of shards it has linked; every listed shard must pass `policy`
    /// with the route's pins; every stage must be covered; and the peer
    /// policy the shards enforce must be at least as strict as `policy` or
    /// pinned in it by digest.
    pub async fn connect(url: &str, policy: &Policy) -> Result<Self, ClientError> {
        Self::connect_with(url, policy, &ConnectOptions::default()).await
    }

    /// [`connect`](Self::connect) with options for reaching the host.
    pub async fn connect_with(url: &str, policy: &Policy, options: &ConnectOptions) -> Result<Self, ClientError> {
        let base = url.trim_end_matches('/').to_owned();
        let https = base.starts_with("https://");
        if !https && !base.starts_with("http://") {
            return Err(ClientError::Config(format!("{base}: the host's URL must start with http:// or https://")));
        }
        let http = options.http_client(https)?;
        let limit = options.timeouts.attest;
        let deadline = tokio::time::Instant::now() + limit;
        let fetch = Self::fetch_doc_retrying(&http, &base, https, &options.timeouts, deadline);
        let (doc, nonce) = tokio::time::timeout_at(deadline, fetch)
            .await
            .map_err(|_| ClientError::Timeout { stage: TimeoutStage::Attest, after: limit })?
            .map_err(|e| match e {
                ClientError::Timeout { stage: TimeoutStage::FirstByte, .. } => {
                    ClientError::Timeout { stage: TimeoutStage::Attest, after: limit }
                }
                other => other,
            })?;
        // Whole seconds: the saved route verifies again as of this instant.
        let verified_at = SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(verified_at);
        let route = verify_route(&doc, policy, &nonce, at).map_err(|e| match e {
            RouteError::Evidence { who, source } => ClientError::Attestation { who, source },
            RouteError::Rejected(r) => ClientError::RouteRejected(r),
            other => ClientError::Route(other.to_string()),
        })?;
        let saved = SavedRoute { version: SAVED_ROUTE_VERSION, nonce, verified_at, doc };
        Ok(Self { base, http, route, saved, timeouts: options.timeouts, retries: options.retries })
    }

    async fn fetch_doc(
        http: &HttpClient,
        base: &str,
        https: bool,
        idle: std::time::Duration,
        deadline: tokio::time::Instant,
    ) -> Result<(AttestationDoc, Nonce), ClientError> {
        let nonce = Nonce::random();
        let uri = format!("{base}{ATTESTATION_PATH}?nonce={}", hex::encode(nonce.as_bytes()));
        let resp =
            http.get(uri.parse().map_err(|e| ClientError::Config(format!("bad URL: {e}")))?).await.map_err(|e| {
                let mut why = with_causes(&e);
                // A TLS server answering plain HTTP looks like a broken HTTP version.
                if !https && why.contains("invalid HTTP version") {
                    why += &format!("; the host may serve HTTPS: try {}", base.replacen("http://", "https://", 1));
                }
                // A plain-HTTP server answering a TLS hello: rustls reads "HTTP/1.1" as a record.
                if https && (why.contains("InvalidContentType") || why.contains("corrupt message")) {
                    why += &format!("; the host serves plain HTTP: try {}", base.replacen("https://", "http://", 1));
                }
                ClientError::Unreachable(why)
            })?;
        let status = resp.status();
        if !status.is_success() {
            return Err(ClientError::Refused {
                status: status.as_u16(),
                message: if status == hyper::StatusCode::NOT_FOUND {
                    format!(
                        "attestation endpoint answered {status}: give the Veil host's root URL \
                         (http(s)://HOST:PORT, no path such as /v1), not `veil proxy`'s address"
                    )
                } else {
                    format!("attestation endpoint answered {status}")
                },
            });
        }
        let body = read_bounded(resp.into_body(), MAX_DOC_BYTES + 1, idle, (deadline, idle)).await?;
        if body.len() > MAX_DOC_BYTES {
            return Err(ClientError::Protocol(format!("attestation document over {MAX_DOC_BYTES} bytes")));
        }
        let doc = AttestationDoc::from_json(&body).map_err(|e| ClientError::Protocol(e.to_string()))?;
        Ok((doc, nonce))
    }

    /// [`fetch_doc`](Self::fetch_doc), retried while the host answers 503 or
    /// 429 (the entry builds few evidences at once; a crowd of verifiers
    /// must queue, not fail), with exponential back-off and full jitter,
    /// until `deadline`. Each try asks with a fresh nonce.
    async fn fetch_doc_retrying(
        http: &HttpClient,
        base: &str,
        https: bool,
        timeouts: &Timeouts,
        deadline: tokio::time::Instant,
    ) -> Result<(AttestationDoc, Nonce), ClientError> {
        let mut backoff = ATTEST_BACKOFF_FIRST;
        loop {
            match Self::fetch_doc(http, base, https, timeouts.between_chunks, deadline).await {
                Err(ClientError::Refused { status: 429 | 503, .. })
                    if tokio::time::Instant::now() + backoff < deadline =>
                {
                    let wait = backoff.mul_f64(jitter());
                    tracing::debug!(?wait, "attestation busy; retrying");
                    tokio::time::sleep(wait).await;
                    backoff = (backoff * 2).min(ATTEST_BACKOFF_MAX);
                }
                Err(ClientError::Refused { status, message }) => {
                    return Err(ClientError::Protocol(format!("{message} ({status})")));
                }
                other => return other,
            }
        }
    }

    /// The verified route.
    pub fn route(&self) -> &VerifiedRoute {
        &self.route
    }

    /// The route document as verified (with the nonce and the time), to
    /// keep beside the answers' receipts: `veil receipt verify` checks a
    /// receipt against it later, offline.
    pub fn saved_route(&self) -> &SavedRoute {
        &self.saved
    }

    /// After the host refused a sealed request or the connection failed:
    /// verifies the route again (fresh nonce, the same checks) and returns
    /// the new client when the attested entry's key changed — a restart the
    /// entry's evidence proves — or `None` when it did not (then the refusal
    /// was not a key rotation, and a request must not be re-sent).
    pub async fn reverified(&self, policy: &Policy, options: &ConnectOptions) -> Result<Option<Client>, ClientError> {
        let fresh = Self::connect_with(&self.base, policy, options).await?;
        Ok((fresh.route.key_config() != self.route.key_config()).then_some(fresh))
    }

    /// Whether `error` (from [`call`](Self::call)) may mean the entry's key
    /// changed: the host refused what was sealed (400, 409, 422) or the
    /// connection failed. Only [`reverified`](Self::reverified) can tell.
    pub fn may_be_key_rotation(error: &ClientError) -> bool {
        matches!(error, ClientError::Refused { status: 400 | 409 | 422, .. } | ClientError::Unreachable(_))
    }

    /// [`call_raw`](Self::call_raw), through a key rotation: when the host
    /// refused what was sealed or the connection failed
    /// ([`may_be_key_rotation`](Self::may_be_key_rotation)), verifies the
    /// route again and, only if the freshly attested entry has another key,
    /// re-seals the call to it and sends it once more. The new client comes
    /// back with the answer so the caller keeps using it. A refusal without
    /// a key change is returned as is: nothing is re-sent on a status code
    /// the host chose. Chat, proxy and SDK users share this transition.
    pub async fn call_reverifying(
        &self,
        policy: &Policy,
        options: &ConnectOptions,
        method: &str,
        path: &str,
        body: Vec<u8>,
    ) -> Result<(OpenedResponse, Option<Client>), ClientError> {
        match self.call_raw(method, path, body.clone()).await {
            Err(e) if Self::may_be_key_rotation(&e) => {
                let Some(fresh) = self.reverified(policy, options).await? else {
                    tracing::warn!(error = %e, "refused or unreachable, but the entry's key is unchanged: not re-sent");
                    return Err(e);
                };
                tracing::warn!("the entry's key changed (attested): route verified again, request re-sealed");
                let answer = fresh.call_raw(method, path, body).await?;
                Ok((answer, Some(fresh)))
            }
            other => other.map(|answer| (answer, None)),
        }
    }

    /// Sends one API call (`method`, `path`, JSON body) sealed to the entry;
    /// returns the response as it opens.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<OpenedResponse, ClientError> {
        let bytes = if method == "GET" {
            Vec::new()
        } else {
            serde_json::to_vec(body).map_err(|e| ClientError::Config(e.to_string()))?
        };
        self.call_raw(method, path, bytes).await
    }

    /// `POST /v1/chat/completions` with `messages` (`{"role", "content"}`
    /// objects) and any further OpenAI parameters in `params`; set
    /// `"stream": true` there to read server-sent events piece by piece.
    pub async fn chat(
        &self,
        messages: &[serde_json::Value],
        params: serde_json::Value,
    ) -> Result<OpenedResponse, ClientError> {
        let mut body = match params {
            serde_json::Value::Object(m) => m,
            _ => serde_json::Map::new(),
        };
        body.insert("messages".into(), messages.to_vec().into());
        self.call("POST", CHAT_COMPLETIONS_PATH, &body.into()).await
    }

    /// `POST /v1/completions` with `prompt` (text, or token ids as OpenAI
    /// allows) and further parameters in `params`.
    pub async fn complete(
        &self,
        prompt: serde_json::Value,
        params: serde_json::Value,
    ) -> Result<OpenedResponse, ClientError> {
        let mut body = match params {
            serde_json::Value::Object(m) => m,
            _ => serde_json::Map::new(),
        };
        body.insert("prompt".into(), prompt);
        self.call("POST", COMPLETIONS_PATH, &body.into()).await
    }

    /// [`call`](Self::call) with the JSON body as bytes (a proxy's path).
    /// A request the service shed for load (429 or 503, the host's or the
    /// entry's) is sealed again and re-sent as [`Retries`] says.
    pub async fn call_raw(&self, method: &str, path: &str, body: Vec<u8>) -> Result<OpenedResponse, ClientError> {
        let mut backoff = self.retries.first_backoff;
        let mut tries = 0;
        loop {
            let mut advised = None;
            let result = self.try_once(method, path, body.clone(), &mut advised).await;
            let shed = match &result {
                Err(ClientError::Refused { status: 429 | 503, .. }) => true,
                Ok(answer) => matches!(answer.status, 429 | 503),
                Err(_) => false,
            };
            if !shed || tries >= self.retries.max {
                return result;
            }
            tries += 1;
            let wait = advised.unwrap_or_default() + backoff.mul_f64(jitter());
            tracing::debug!(?wait, tries, "shed for load; sealing the request again");
            // An answer shed inside the seal is dropped unread (its body is
            // the entry's error message).
            drop(result);
            tokio::time::sleep(wait).await;
            backoff = (backoff * 2).min(self.retries.max_backoff);
        }
    }

    /// One try of [`call_raw`](Self::call_raw); `advised` gets the
    /// `Retry-After` the host gave when it refused.
    async fn try_once(
        &self,
        method: &str,
        path: &str,
        body: Vec<u8>,
        advised: &mut Option<std::time::Duration>,
    ) -> Result<OpenedResponse, ClientError> {
        let mut message = bhttp::Message::request(
            method.as_bytes().to_vec(),
            b"https".to_vec(),
            b"veil-entry".to_vec(),
            path.as_bytes().to_vec(),
        );
        let cost = crate::seal::declared_cost(&body);
        if !body.is_empty() {
            message.put_header("content-type", "application/json");
            message.write_content(body);
        }
        let (sealed, opener) = seal(&self.route, message).await?;
        let req = hyper::Request::post(format!("{}{SEALED_PATH}", self.base))
            .header(hyper::header::CONTENT_TYPE, SEALED_REQUEST_TYPE)
            .header(veil_wire::http::COST_HEADER, cost.to_string())
            .body(Full::new(Bytes::from(sealed)))
            .map_err(|e| ClientError::Config(e.to_string()))?;
        let first_byte = self.timeouts.first_byte;
        let late = || ClientError::Timeout { stage: TimeoutStage::FirstByte, after: first_byte };
        let deadline = tokio::time::Instant::now() + first_byte;
        let resp = tokio::time::timeout_at(deadline, self.http.request(req))
            .await
            .map_err(|_| late())?
            .map_err(|e| ClientError::Unreachable(with_causes(&e)))?;
        if !resp.status().is_success() {
            // The host's bytes, unauthenticated: read at most
            // MAX_ERROR_BODY of them, within the same deadlines as an answer.
            let status = resp.status();
            *advised = resp
                .headers()
                .get(hyper::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(veil_wire::http::retry_after_secs)
                .map(std::time::Duration::from_secs);
            let body =
                read_bounded(resp.into_body(), MAX_ERROR_BODY, self.timeouts.between_chunks, (deadline, first_byte))
                    .await?;
            return Err(ClientError::Refused {
                status: status.as_u16(),
                message: String::from_utf8_lossy(&body[..body.len().min(1024)]).into_owned(),
            });
        }
        let idle = self.timeouts.between_chunks;
        let frames = BodyStream::new(resp.into_body());
        // Every wait for the host's next bytes is bounded; a stall ends the
        // stream with a `TimedOut` error (`SealError::Stalled` to the reader).
        let stream = futures::stream::unfold(Some(frames), move |state| async move {
            let mut frames = state?;
            loop {
                match tokio::time::timeout(idle, frames.next()).await {
                    Err(_) => {
                        let e = std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("nothing from the host for {idle:?}"),
                        );
                        return Some((Err(e), None));
                    }
                    Ok(None) => return None,
                    Ok(Some(Err(e))) => return Some((Err(std::io::Error::other(e)), None)),
                    Ok(Some(Ok(frame))) => {
                        if let Ok(data) = frame.into_data() {
                            return Some((Ok(data), Some(frames)));
                        }
                    }
                }
            }
        })
        .boxed();
        let reader: Pin<Box<dyn futures::io::AsyncRead + Send>> = Box::pin(stream.into_async_read());
        match tokio::time::timeout_at(deadline, opener.open(reader)).await {
            Err(_) | Ok(Err(SealError::Stalled(_))) => Err(late()),
            Ok(r) => Ok(r?),
        }
    }
}
