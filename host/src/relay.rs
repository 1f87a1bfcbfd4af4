//! The host's public API: an untrusted relay in front of the entry's
//! gateway. It forwards ciphertext and evidence, holds no key that opens a
//! request, and bounds what a client can make it do: body size, concurrent
//! sealed requests (in all, and per client address, so one client cannot
//! hold every slot), attestation fetches per client address, header and
//! body read timeouts (slowloris). Sealed requests past the slots wait in a
//! bounded queue, served by client address in turn ([`crate::admission`]);
//! a full queue or a wait past its limit is shed with 503 and a
//! `Retry-After` estimated from the recent service time, a client over its
//! share gets 429 and one too. A sealed request's slot is released when
//! its client disconnects, and the relay then drops its connection to the
//! entry, which ends the session there. Metrics count requests, bytes,
//! queue depth, shed requests and latency, never content.
//!
//! - `GET /v1/attestation[?nonce=HEX]` → the entry's evidence document
//! - `POST /v1/sealed` → a sealed request; the sealed response streams back
//! - `GET /healthz` → whether the entry answers
//! - `GET /metrics` → Prometheus text (the relay's counters, then the
//!   entry's speculation counts)
//!
//! TLS on the public side is optional ([`tls_server_config`]): the sealed
//! layer already hides content from everyone but the entry; TLS also hides
//! which endpoint a client calls and the sizes of its messages' headers from
//! the network between the client and the host.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use veil_attestation::tlog::http as tlog_http;
use veil_wire::http::{
    ATTESTATION_PATH, COST_HEADER, HEALTH_PATH, MAX_COST, METRICS_PATH, NOT_FOUND_MESSAGE, SEALED_PATH,
    SEALED_REQUEST_TYPE,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use veil_wire::metrics::Histogram;

use crate::admission::{Admission, Shed};

type Body = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;

/// Limits and addresses of a relay.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    /// The entry's gateway (`sealed_listen` in the route).
    pub entry: SocketAddr,
    /// Largest request body accepted.
    pub max_body: usize,
    /// Slots of sealed requests in flight at once; more wait in the queue.
    /// A request holds the cost it declares (`veil-cost`: one slot per
    /// choice, more for log-probabilities).
    pub max_concurrent: usize,
    /// Sealed requests that may wait for a slot, all clients together; more
    /// get 503 at once (0: no queue).
    pub max_queued: usize,
    /// Longest a sealed request waits for a slot before a 503.
    pub queue_timeout: Duration,
    /// Slots of sealed requests in flight or queued at once from one client
    /// address; more get 429. Keeps one client from holding every slot, or
    /// filling the queue.
    pub max_per_client: usize,
    /// Attestation fetches in flight at once from one client address; more
    /// get 429 (the entry builds few evidences at once; a flood from one
    /// address must leave room for everyone else).
    pub max_attestation_per_client: usize,
    /// Time allowed to send the request head.
    pub header_timeout: Duration,
    /// Time allowed to send the request body.
    pub body_timeout: Duration,
    /// Serve HTTPS with this configuration instead of plain HTTP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// A copy of the policy transparency log to serve read-only under
    /// `/v1/log/` (clients verify every checkpoint and proof themselves).
    pub log: Option<std::path::PathBuf>,
}

impl RelayConfig {
    /// Defaults for `entry`.
    pub fn new(entry: SocketAddr) -> Self {
        Self {
            entry,
            max_body: 1 << 20,
            max_concurrent: 64,
            max_queued: 256,
            queue_timeout: Duration::from_secs(30),
            max_per_client: 16,
            max_attestation_per_client: 2,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            tls: None,
            log: None,
        }
    }
}

/// Stops a background task when the server that owns it is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How often the relay checks the entry's health for `veil_entry_up`.
pub const HEALTH_PROBE_INTERVAL: Duration = Duration::from_secs(2);

/// The longest `Retry-After` the relay advises (seconds).
const MAX_RETRY_AFTER: u64 = veil_wire::http::MAX_RETRY_AFTER_SECS;

#[derive(Debug, Default)]
struct Metrics {
    sealed_ok: AtomicU64,
    sealed_err: AtomicU64,
    attestation: AtomicU64,
    rejected: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    /// Sealed request duration, to the end of its response.
    duration: Histogram,
    /// Time a sealed request waited for a slot (0 when one was free).
    queue_wait: Histogram,
    /// From forwarding a sealed request to the entry's first chunk back.
    first_chunk: Histogram,
    /// Sealed requests shed: the queue was full, the wait ran out, the
    /// client held its share.
    shed_full: AtomicU64,
    shed_timeout: AtomicU64,
    shed_client: AtomicU64,
    entry_up: AtomicU64,
    /// TLS handshakes on the public side that negotiated X25519MLKEM768,
    /// and those that fell back to a classical group.
    tls_hybrid: AtomicU64,
    tls_classical: AtomicU64,
}

impl Metrics {
    fn render(&self, admission: &Admission, capacity: usize) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut out = String::new();
        out += "# HELP veil_relay_requests_total Requests relayed, by endpoint and outcome.\n# TYPE veil_relay_requests_total counter\n";
        out += &format!("veil_relay_requests_total{{endpoint=\"sealed\",outcome=\"ok\"}} {}\n", g(&self.sealed_ok));
        out += &format!("veil_relay_requests_total{{endpoint=\"sealed\",outcome=\"error\"}} {}\n", g(&self.sealed_err));
        out +=
            &format!("veil_relay_requests_total{{endpoint=\"attestation\",outcome=\"ok\"}} {}\n", g(&self.attestation));
        out += &format!("veil_relay_requests_total{{endpoint=\"any\",outcome=\"rejected\"}} {}\n", g(&self.rejected));
        out += "# HELP veil_relay_tls_handshakes_total TLS handshakes on the public side, by key exchange.\n# TYPE veil_relay_tls_handshakes_total counter\n";
        out += &format!("veil_relay_tls_handshakes_total{{group=\"X25519MLKEM768\"}} {}\n", g(&self.tls_hybrid));
        out += &format!("veil_relay_tls_handshakes_total{{group=\"classical\"}} {}\n", g(&self.tls_classical));
        out += "# HELP veil_relay_bytes_total Ciphertext bytes relayed.\n# TYPE veil_relay_bytes_total counter\n";
        out += &format!("veil_relay_bytes_total{{direction=\"in\"}} {}\n", g(&self.bytes_in));
        out += &format!("veil_relay_bytes_total{{direction=\"out\"}} {}\n", g(&self.bytes_out));
        out += &self
            .duration
            .render("veil_relay_sealed_duration_seconds", "Sealed request duration to the end of the response.");
        out += &self
            .queue_wait
            .render("veil_relay_queue_wait_seconds", "Time a sealed request waited for a slot (0 when one was free).");
        out += &self.first_chunk.render(
            "veil_relay_first_chunk_seconds",
            "From forwarding a sealed request to the entry's first chunk of its answer (ciphertext: the relay cannot tell a token from padding).",
        );
        out +=
            "# HELP veil_relay_queue_depth Sealed requests waiting for a slot.\n# TYPE veil_relay_queue_depth gauge\n";
        out += &format!("veil_relay_queue_depth {}\n", admission.queued());
        out += "# HELP veil_relay_slots_in_use Slots held by sealed requests in flight.\n# TYPE veil_relay_slots_in_use gauge\n";
        out += &format!("veil_relay_slots_in_use {}\n", admission.in_use());
        out += "# HELP veil_relay_slots Slots in all (--max-concurrent).\n# TYPE veil_relay_slots gauge\n";
        out += &format!("veil_relay_slots {capacity}\n");
        out += "# HELP veil_relay_shed_total Sealed requests refused for load, by reason.\n# TYPE veil_relay_shed_total counter\n";
        out += &format!("veil_relay_shed_total{{reason=\"queue_full\"}} {}\n", g(&self.shed_full));
        out += &format!("veil_relay_shed_total{{reason=\"queue_timeout\"}} {}\n", g(&self.shed_timeout));
        out += &format!("veil_relay_shed_total{{reason=\"client_share\"}} {}\n", g(&self.shed_client));
        out += "# HELP veil_entry_up Whether the entry answered its last health check.\n# TYPE veil_entry_up gauge\n";
        out += &format!("veil_entry_up {}\n", g(&self.entry_up));
        out
    }
}

/// Slots held per client address, with a ceiling each.
#[derive(Debug, Default)]
struct PerClient {
    held: std::sync::Mutex<HashMap<IpAddr, usize>>,
}

/// One slot of one client address; released when dropped.
#[derive(Debug)]
struct ClientSlot {
    table: Arc<PerClient>,
    ip: IpAddr,
    count: usize,
}

impl PerClient {
    /// A slot for `ip`, unless it holds `max` already.
    fn acquire(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<ClientSlot> {
        self.acquire_many(ip, 1, max)
    }

    /// `count` slots for `ip`, unless that would take it past `max`.
    fn acquire_many(self: &Arc<Self>, ip: IpAddr, count: usize, max: usize) -> Option<ClientSlot> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let n = held.entry(ip).or_insert(0);
        if *n + count > max {
            if *n == 0 {
                held.remove(&ip);
            }
            return None;
        }
        *n += count;
        Some(ClientSlot { table: self.clone(), ip, count })
    }

    /// Slots `ip` holds now.
    fn held(&self, ip: IpAddr) -> usize {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).get(&ip).copied().unwrap_or(0)
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut held = self.table.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.ip) {
            *n -= self.count.min(*n);
            if *n == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

/// A running relay.
#[derive(Debug)]
pub struct Relay {
    config: RelayConfig,
    client: hyper_util::client::legacy::Client<HttpConnector, Full<Bytes>>,
    admission: Arc<Admission>,
    sealed_per_client: Arc<PerClient>,
    attestation_per_client: Arc<PerClient>,
    metrics: Metrics,
}

fn text(status: StatusCode, body: impl Into<String>) -> Response<Body> {
    let body: String = body.into();
    let mut r = Response::new(Full::new(Bytes::from(body)).map_err(|never| match never {}).boxed());
    *r.status_mut() = status;
    r
}

/// [`text`] with a `Retry-After` of `secs`.
fn busy(status: StatusCode, secs: u64, body: impl Into<String>) -> Response<Body> {
    let mut r = text(status, body);
    r.headers_mut().insert(hyper::header::RETRY_AFTER, hyper::header::HeaderValue::from(secs));
    r
}

impl Relay {
    /// A relay with `config`.
    pub fn new(config: RelayConfig) -> Arc<Self> {
        let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http();
        let admission = Admission::new(config.max_concurrent, config.max_queued);
        Arc::new(Self {
            config,
            client,
            admission,
            sealed_per_client: Arc::default(),
            attestation_per_client: Arc::default(),
            metrics: Metrics::default(),
        })
    }

    /// Slots held by sealed requests in flight, every client together (a
    /// request holds its declared cost: one per choice, more for
    /// log-probabilities).
    pub fn sealed_in_flight(&self) -> usize {
        self.admission.in_use()
    }

    /// Sealed requests waiting for a slot.
    pub fn sealed_queued(&self) -> usize {
        self.admission.queued()
    }

    /// The `Retry-After` (seconds) advised to a request shed now: the time
    /// the queue ahead of it would take to drain at the recent mean
    /// service time, from 1 to [`MAX_RETRY_AFTER`].
    fn retry_after(&self) -> u64 {
        let Some(mean) = self.metrics.duration.mean() else { return 1 };
        let ahead = (self.admission.queued() + 1) as f64 / self.config.max_concurrent.max(1) as f64;
        (mean.as_secs_f64() * ahead).ceil().clamp(1.0, MAX_RETRY_AFTER as f64) as u64
    }

    /// Slots held by sealed requests in flight from client address `ip`.
    pub fn sealed_in_flight_from(&self, ip: IpAddr) -> usize {
        self.sealed_per_client.held(ip)
    }

    /// Serves on `listener` until the task is dropped.
    pub async fn serve(self: Arc<Self>, listener: tokio::net::TcpListener) {
        // `veil_entry_up` reflects the entry whether or not anyone asks /healthz.
        let prober = self.clone();
        let _probe = AbortOnDrop(tokio::spawn(async move {
            loop {
                let _ = prober.health().await;
                tokio::time::sleep(HEALTH_PROBE_INTERVAL).await;
            }
        }));
        let acceptor = self.config.tls.clone().map(tokio_rustls::TlsAcceptor::from);
        loop {
            let (tcp, peer) = veil_wire::net::accept(&listener).await;
            let relay = self.clone();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Some(acceptor) = acceptor else { return relay.serve_connection(tcp, peer.ip()).await };
                // The handshake counts against the header timeout: a client
                // that stalls it holds a connection no longer than one that
                // stalls its request head.
                match tokio::time::timeout(relay.config.header_timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let group = tls.get_ref().1.negotiated_key_exchange_group().map(|g| g.name());
                        let counter = if group == Some(rustls::NamedGroup::X25519MLKEM768) {
                            &relay.metrics.tls_hybrid
                        } else {
                            &relay.metrics.tls_classical
                        };
                        counter.fetch_add(1, Ordering::Relaxed);
                        relay.serve_connection(tls, peer.ip()).await
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!("TLS handshake timed out"),
                }
            });
        }
    }

    async fn serve_connection<I>(self: Arc<Self>, io: I, client: IpAddr)
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let header_timeout = self.config.header_timeout;
        let relay = self;
        let service = hyper::service::service_fn(move |req| {
            let relay = relay.clone();
            async move { Ok::<_, Infallible>(relay.handle(req, client).await) }
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder.timer(TokioTimer::new()).header_read_timeout(header_timeout);
        if let Err(e) = builder.serve_connection(TokioIo::new(io), service).await {
            tracing::debug!(error = %e, "client connection ended");
        }
    }

    async fn handle(self: Arc<Self>, req: Request<Incoming>, client: IpAddr) -> Response<Body> {
        match (req.method().as_str(), req.uri().path()) {
            ("GET", HEALTH_PATH) => self.health().await,
            ("GET", METRICS_PATH) => text(
                StatusCode::OK,
                self.metrics.render(&self.admission, self.config.max_concurrent) + &self.entry_metrics().await,
            ),
            ("GET", ATTESTATION_PATH) => self.attestation(req.uri().query().map(str::to_owned), client).await,
            ("POST", SEALED_PATH) => self.sealed(req, client).await,
            ("GET", path) if path.starts_with(tlog_http::RELAY_PREFIX) => self.log(req.uri()).await,
            _ => text(StatusCode::NOT_FOUND, format!("{NOT_FOUND_MESSAGE}\n")),
        }
    }

    /// `/v1/log/…`: the log's read API from the directory configured, if any.
    async fn log(&self, uri: &hyper::Uri) -> Response<Body> {
        let Some(dir) = self.config.log.clone() else {
            return text(StatusCode::NOT_FOUND, "this host serves no transparency log\n");
        };
        let path = uri.path().strip_prefix(tlog_http::RELAY_PREFIX).unwrap_or_default().to_owned();
        let query = uri.query().map(str::to_owned);
        let answer = tokio::task::spawn_blocking(move || match veil_attestation::tlog::store::LogDir::open(&dir) {
            Ok(log) => tlog_http::serve(&log, &path, query.as_deref()),
            Err(e) => {
                tlog_http::Answer { status: 503, content_type: "text/plain", body: format!("{e}\n").into_bytes() }
            }
        })
        .await;
        match answer {
            Ok(a) => {
                let mut r = text(StatusCode::from_u16(a.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), "");
                *r.body_mut() = Full::new(Bytes::from(a.body)).map_err(|never| match never {}).boxed();
                if let Ok(v) = hyper::header::HeaderValue::from_str(a.content_type) {
                    r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
                }
                r
            }
            Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "log read failed\n"),
        }
    }

    /// The entry's own counters (speculation), appended to the relay's.
    async fn entry_metrics(&self) -> String {
        let Ok(uri) = format!("http://{}/metrics", self.config.entry).parse() else { return String::new() };
        let Ok(Ok(resp)) = tokio::time::timeout(Duration::from_secs(2), self.client.get(uri)).await else {
            return String::new();
        };
        if !resp.status().is_success() {
            return String::new();
        }
        let body =
            tokio::time::timeout(Duration::from_secs(2), Limited::new(resp.into_body(), 64 << 10).collect()).await;
        match body {
            Ok(Ok(b)) => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
            _ => String::new(),
        }
    }

    async fn health(&self) -> Response<Body> {
        let up = match format!("http://{}/healthz", self.config.entry).parse() {
            Ok(uri) => matches!(
                tokio::time::timeout(Duration::from_secs(2), self.client.get(uri)).await,
                Ok(Ok(r)) if r.status().is_success()
            ),
            Err(_) => false,
        };
        self.metrics.entry_up.store(u64::from(up), Ordering::Relaxed);
        if up {
            text(StatusCode::OK, "ok\n")
        } else {
            text(StatusCode::SERVICE_UNAVAILABLE, "entry unreachable\n")
        }
    }

    async fn attestation(&self, query: Option<String>, client: IpAddr) -> Response<Body> {
        let Some(slot) = self.attestation_per_client.acquire(client, self.config.max_attestation_per_client) else {
            self.metrics.rejected.fetch_add(1, Ordering::Relaxed);
            return text(StatusCode::TOO_MANY_REQUESTS, "too many attestation requests from this client\n");
        };
        let q = query.map(|q| format!("?{q}")).unwrap_or_default();
        if q.len() > 256 {
            self.metrics.rejected.fetch_add(1, Ordering::Relaxed);
            return text(StatusCode::BAD_REQUEST, "query too long\n");
        }
        let Ok(uri) = format!("http://{}/v1/attestation{q}", self.config.entry).parse() else {
            return text(StatusCode::BAD_REQUEST, "bad query\n");
        };
        match self.client.get(uri).await {
            Ok(resp) => {
                self.metrics.attestation.fetch_add(1, Ordering::Relaxed);
                let (parts, body) = resp.into_parts();
                // The slot is held until the document has been sent.
                let body = body.map_frame(move |f| {
                    let _held = &slot;
                    f
                });
                Response::from_parts(parts, body.boxed())
            }
            Err(e) => text(StatusCode::BAD_GATEWAY, format!("entry unreachable: {e}\n")),
        }
    }

    async fn sealed(self: Arc<Self>, req: Request<Incoming>, client: IpAddr) -> Response<Body> {
        let started = Instant::now();
        // What the request costs: one slot per choice and more for
        // log-probabilities, as the client declares (the entry refuses a
        // request that costs more than it declared).
        let cost = match req.headers().get(COST_HEADER).map(|v| v.to_str().ok().and_then(|v| v.parse::<u32>().ok())) {
            None => 1,
            Some(Some(c)) if (1..=MAX_COST).contains(&c) => c,
            Some(_) => {
                self.metrics.rejected.fetch_add(1, Ordering::Relaxed);
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("{COST_HEADER} must be an integer from 1 to {MAX_COST}\n"),
                );
            }
        };
        let share = self.config.max_per_client.min(self.config.max_concurrent);
        if cost as usize > share {
            self.metrics.rejected.fetch_add(1, Ordering::Relaxed);
            return text(
                StatusCode::TOO_MANY_REQUESTS,
                format!("this request costs {cost} slots; one client holds at most {share}\n"),
            );
        }
        // The client's share counts its queued requests too, so one client
        // cannot fill the queue either.
        let Some(slot) = self.sealed_per_client.acquire_many(client, cost as usize, self.config.max_per_client) else {
            self.metrics.rejected.fetch_add(1, Ordering::Relaxed);
            self.metrics.shed_client.fetch_add(1, Ordering::Relaxed);
            return busy(
                StatusCode::TOO_MANY_REQUESTS,
                self.retry_after(),
                "too many requests in flight or queued from this client\n",
            );
        };
        let waited = Instant::now();
        let permit = match self.admission.admit(client, cost as usize, self.config.queue_timeout).await {
            Ok(grant) => grant,
            Err(shed) => {
                self.metrics.rejected.fetch_add(1, Ordering::Relaxed);
                let (counter, why) = match shed {
                    Shed::QueueFull => (&self.metrics.shed_full, "every slot is held and the queue is full"),
                    Shed::Timeout => (&self.metrics.shed_timeout, "no slot came free within the queue's time limit"),
                };
                counter.fetch_add(1, Ordering::Relaxed);
                return busy(StatusCode::SERVICE_UNAVAILABLE, self.retry_after(), format!("overloaded: {why}\n"));
            }
        };
        self.metrics.queue_wait.observe(waited.elapsed());
        let declared = req
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if declared.is_some_and(|n| n > self.config.max_body) {
            self.metrics.rejected.fetch_add(1, Ordering::Relaxed);
            return text(StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n");
        }
        let body = Limited::new(req.into_body(), self.config.max_body).collect();
        let body = match tokio::time::timeout(self.config.body_timeout, body).await {
            Err(_) => {
                self.metrics.rejected.fetch_add(1, Ordering::Relaxed);
                return text(StatusCode::REQUEST_TIMEOUT, "request body too slow\n");
            }
            Ok(Err(_)) => {
                self.metrics.rejected.fetch_add(1, Ordering::Relaxed);
                return text(StatusCode::PAYLOAD_TOO_LARGE, "request body too large or unreadable\n");
            }
            Ok(Ok(b)) => b.to_bytes(),
        };
        self.metrics.bytes_in.fetch_add(body.len() as u64, Ordering::Relaxed);
        let forward = hyper::Request::post(format!("http://{}/v1/sealed", self.config.entry))
            .header(hyper::header::CONTENT_TYPE, SEALED_REQUEST_TYPE)
            .header(COST_HEADER, cost.to_string())
            .body(Full::new(body));
        let Ok(forward) = forward else { return text(StatusCode::INTERNAL_SERVER_ERROR, "cannot forward\n") };
        let forwarded = Instant::now();
        let resp = match self.client.request(forward).await {
            Ok(r) => r,
            Err(e) => {
                self.metrics.sealed_err.fetch_add(1, Ordering::Relaxed);
                return text(StatusCode::BAD_GATEWAY, format!("entry unreachable: {e}\n"));
            }
        };
        let ok = resp.status().is_success();
        let (parts, mut body) = resp.into_parts();
        // Stream the sealed chunks back as they come, counting bytes; the
        // permit is held until the response ends or the client leaves. A
        // client that leaves (its connection closed, so the body was
        // dropped) ends the loop at once: the upstream body is dropped, which
        // closes the connection to the entry and ends the session there.
        let relay = self.clone();
        let stream = async_stream(move |tx| async move {
            let _permit = (permit, slot);
            let mut first = true;
            loop {
                let frame = tokio::select! {
                    frame = body.frame() => frame,
                    () = tx.closed() => break,
                };
                let Some(frame) = frame else { break };
                match frame {
                    Ok(f) => {
                        if let Some(d) = f.data_ref() {
                            if std::mem::take(&mut first) {
                                relay.metrics.first_chunk.observe(forwarded.elapsed());
                            }
                            relay.metrics.bytes_out.fetch_add(d.len() as u64, Ordering::Relaxed);
                        }
                        if tx.send(Ok(f)).await.is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        break;
                    }
                }
            }
            let counter = if ok { &relay.metrics.sealed_ok } else { &relay.metrics.sealed_err };
            counter.fetch_add(1, Ordering::Relaxed);
            relay.metrics.duration.observe(started.elapsed());
        });
        Response::from_parts(parts, stream)
    }
}

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    /// The certificate file is missing, unreadable or holds no certificate.
    #[error("certificate chain {path}: {reason}")]
    Certificates {
        /// The file.
        path: String,
        /// What was wrong.
        reason: String,
    },
    /// The key file is missing, unreadable or holds no private key.
    #[error("private key {path}: {reason}")]
    Key {
        /// The file.
        path: String,
        /// What was wrong.
        reason: String,
    },
    /// rustls refused the pair (for instance, the key does not match the certificate).
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// A TLS 1.2/1.3 server configuration (HTTP/1.1 over ALPN) from a PEM
/// certificate chain (leaf first) and a PEM private key.
pub fn tls_server_config(
    cert_chain: &std::path::Path,
    key: &std::path::Path,
) -> Result<Arc<rustls::ServerConfig>, TlsConfigError> {
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs_err = |reason: String| TlsConfigError::Certificates { path: cert_chain.display().to_string(), reason };
    let certs = CertificateDer::pem_file_iter(cert_chain)
        .map_err(|e| certs_err(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| certs_err(e.to_string()))?;
    if certs.is_empty() {
        return Err(certs_err("no CERTIFICATE block".into()));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| TlsConfigError::Key { path: key.display().to_string(), reason: e.to_string() })?;
    // X25519MLKEM768 preferred, classical groups for clients without it.
    let provider = veil_tls_pq::server_provider();
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A body fed by a task through a channel.
fn async_stream<F, Fut>(f: F) -> Body
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<Frame<Bytes>, hyper::Error>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(f(tx));
    let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
    http_body_util::StreamBody::new(stream).boxed()
}
