//! `veil proxy URL --policy P --listen 127.0.0.1:PORT`: a plain
//! OpenAI-compatible endpoint on localhost that seals every call to the
//! verified entry. It refuses to start when verification fails, and when
//! the host refuses a sealed request it verifies the route again, re-sending
//! only if the attested entry's key really changed. A sealed response that
//! fails to open is never passed on: a complete one becomes a 502, a stream
//! gets an error event and is aborted without its chunked terminator.
//! With `--receipts FILE` it appends each route document it verified and
//! each answer's checked receipt to FILE as JSON lines.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use tokio::sync::RwLock;

use super::{Exit, ProxyArgs};
use crate::sdk::{Client, ClientError, ConnectOptions};
use crate::seal::OpenedResponse;
use veil_attestation::receipt::{Receipt, SavedRoute};

pub(super) type BodyError = Box<dyn std::error::Error + Send + Sync>;
pub(super) type Body = http_body_util::combinators::BoxBody<Bytes, BodyError>;

/// Largest request body forwarded.
const MAX_BODY: usize = 1 << 20;
/// Largest complete (non-streamed) response buffered before it is passed on.
const MAX_RESPONSE: usize = 16 << 20;

struct Proxy {
    policy: veil_attestation::Policy,
    options: ConnectOptions,
    client: RwLock<Arc<Client>>,
    receipts: Option<Arc<ReceiptLog>>,
}

/// `--receipts FILE`: JSON lines `{"route": SavedRoute}` (each route the
/// proxy verified, before the first answer on it) and `{"receipt": Receipt}`
/// (each answer's receipt, checked by the SDK before it is written).
#[derive(Debug)]
pub struct ReceiptLog {
    file: std::sync::Mutex<(std::fs::File, Option<u64>)>,
}

impl ReceiptLog {
    /// Opens `path` for appending (created if missing).
    pub fn open(path: &std::path::Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Self { file: std::sync::Mutex::new((file, None)) })
    }

    fn append(&self, route: &SavedRoute, receipt: Option<&Receipt>) {
        use std::io::Write as _;
        let mut guard = self.file.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (file, last) = &mut *guard;
        // A route is written once, before the first receipt on it (its
        // verification time tells one verification from the next).
        let mut lines = String::new();
        if *last != Some(route.verified_at) {
            lines += &serde_json::json!({ "route": route }).to_string();
            lines.push('\n');
        }
        if let Some(r) = receipt {
            lines += &serde_json::json!({ "receipt": r }).to_string();
            lines.push('\n');
        }
        match file.write_all(lines.as_bytes()).and_then(|()| file.flush()) {
            Ok(()) => *last = Some(route.verified_at),
            Err(e) => tracing::error!(error = %e, "cannot append to the receipts file"),
        }
    }
}

fn error_body(message: &str, kind: &str) -> serde_json::Value {
    serde_json::json!({"error": {"message": message, "type": kind, "param": null, "code": null}})
}

fn json_error(status: StatusCode, message: &str) -> Response<Body> {
    let body = error_body(message, "veil_proxy_error");
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())).map_err(|e| match e {}).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    r
}

impl Proxy {
    /// Sends once; through a key rotation the entry's evidence proves (not a
    /// status code the host chose), re-seals to the new key and keeps the
    /// re-verified client (`Client::call_reverifying`).
    /// Also returns the route the answer is on.
    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Vec<u8>,
    ) -> Result<(OpenedResponse, Arc<Client>), ClientError> {
        let client = self.client.read().await.clone();
        let (answer, fresh) = client.call_reverifying(&self.policy, &self.options, method, path, body).await?;
        match fresh {
            Some(fresh) => {
                let fresh = Arc::new(fresh);
                *self.client.write().await = fresh.clone();
                Ok((answer, fresh))
            }
            None => Ok((answer, client)),
        }
    }

    /// Appends the answer's receipt (and its route, the first time) to the log.
    fn log_receipt(log: Option<&ReceiptLog>, client: &Client, opened: &OpenedResponse) {
        if let (Some(log), Some(receipt)) = (log, opened.receipt()) {
            log.append(client.saved_route(), Some(receipt));
        }
    }

    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let method = req.method().as_str().to_owned();
        let path = req.uri().path_and_query().map(|p| p.as_str().to_owned()).unwrap_or_default();
        let path = match path.strip_prefix("/v1/") {
            Some(_) => path,
            None => return json_error(StatusCode::NOT_FOUND, "only /v1/ endpoints are proxied"),
        };
        let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
            Ok(b) => b.to_bytes().to_vec(),
            Err(_) => return json_error(StatusCode::PAYLOAD_TOO_LARGE, "request body too large"),
        };
        let (mut opened, client) = match self.call(&method, &path, body).await {
            Ok(o) => o,
            Err(e @ ClientError::Timeout { .. }) => return json_error(StatusCode::GATEWAY_TIMEOUT, &e.to_string()),
            Err(e) => return json_error(StatusCode::BAD_GATEWAY, &e.to_string()),
        };
        let status = StatusCode::from_u16(opened.status).unwrap_or(StatusCode::BAD_GATEWAY);
        let content_type =
            opened.fields.iter().find(|(n, _)| n == "content-type").map(|(_, v)| v.clone()).unwrap_or_default();
        let streamed = content_type.starts_with("text/event-stream");
        if !streamed {
            // A complete response is passed on only once it has opened to its
            // authenticated end: a cut or tampered one becomes a 502.
            let mut all = Vec::new();
            loop {
                match opened.next().await {
                    Ok(Some(piece)) if all.len() + piece.len() <= MAX_RESPONSE => all.extend(piece),
                    Ok(Some(_)) => return json_error(StatusCode::BAD_GATEWAY, "sealed response too large"),
                    Ok(None) => break,
                    Err(e) => {
                        tracing::error!(error = %e, "sealed response failed to open");
                        return json_error(StatusCode::BAD_GATEWAY, &format!("the sealed response did not open: {e}"));
                    }
                }
            }
            Self::log_receipt(self.receipts.as_deref(), &client, &opened);
            let mut r = Response::new(Full::new(Bytes::from(all)).map_err(|e| match e {}).boxed());
            *r.status_mut() = status;
            if let Ok(v) = content_type.parse() {
                r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
            }
            return r;
        }
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Bytes, BodyError>>(16);
        let log = self.receipts.clone();
        tokio::spawn(async move {
            // The stream's terminator (`data: [DONE]`) is held back until the
            // sealed stream's authenticated end has been read: a client that
            // stops at [DONE] must not stop at a stream the host cut.
            let mut held: Option<Bytes> = None;
            loop {
                match opened.next().await {
                    Ok(Some(piece)) => {
                        let piece = Bytes::from(piece);
                        if let Some(h) = held.take() {
                            if tx.send(Ok(h)).await.is_err() {
                                return;
                            }
                        }
                        if piece.windows(12).any(|w| w == b"data: [DONE]") {
                            held = Some(piece);
                        } else if tx.send(Ok(piece)).await.is_err() {
                            return;
                        }
                    }
                    Ok(None) => {
                        Self::log_receipt(log.as_deref(), &client, &opened);
                        if let Some(h) = held.take() {
                            let _ = tx.send(Ok(h)).await;
                        }
                        return;
                    }
                    Err(e) => {
                        // Never pass on unauthenticated text. The client
                        // cannot miss this: an error event, then the
                        // connection is aborted without the chunked
                        // terminator (no ordinary end of stream).
                        tracing::error!(error = %e, "sealed response failed to open; stream aborted");
                        let event = format!(
                            "data: {}\n\n",
                            error_body(&format!("the sealed response did not open: {e}"), "veil_proxy_error")
                        );
                        let _ = tx.send(Ok(Bytes::from(event))).await;
                        // Let the body report pending once, so hyper flushes
                        // what it holds (the error event) before the abort.
                        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                        let _ = tx.send(Err("sealed response did not open".into())).await;
                        return;
                    }
                }
            }
        });
        let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|p| p.map(|b| b.map(Frame::data))));
        let mut r = Response::new(BodyExt::boxed(StreamBody::new(Box::pin(stream))));
        *r.status_mut() = status;
        if let Ok(v) = content_type.parse() {
            r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
        }
        r
    }
}

/// Runs the proxy until interrupted.
pub fn run(args: &ProxyArgs) -> Exit {
    let policy = match args.policy.load() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("veil proxy: policy {e}");
            return Exit::Unreadable;
        }
    };
    if !args.listen.ip().is_loopback() {
        eprintln!("veil proxy: --listen must be a loopback address (the proxy speaks plaintext)");
        return Exit::Unreadable;
    }
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("veil proxy: {e}");
            return Exit::Unreadable;
        }
    };
    let options = match super::connect_options(args.ca.as_deref()) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("veil proxy: {e}");
            return Exit::Unreadable;
        }
    };
    let receipts = match args.receipts.as_deref().map(ReceiptLog::open).transpose() {
        Ok(log) => log.map(Arc::new),
        Err(e) => {
            eprintln!("veil proxy: --receipts: {e}");
            return Exit::Unreadable;
        }
    };
    rt.block_on(serve(args.url.clone(), policy, options, args.listen, receipts))
}

async fn serve(
    url: String,
    policy: veil_attestation::Policy,
    options: ConnectOptions,
    listen: SocketAddr,
    receipts: Option<Arc<ReceiptLog>>,
) -> Exit {
    let listener = match tokio::net::TcpListener::bind(listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("veil proxy: cannot listen on {listen}: {e}");
            return Exit::Unreadable;
        }
    };
    serve_on(listener, url, policy, options, receipts).await
}

/// Verifies the route at `url` against `policy`, then serves the plain API
/// on `listener` until Ctrl-C; refuses to start (returns) when verification
/// fails. The listener should be on loopback: what it serves is plaintext.
/// With `receipts`, every verified route and answer's receipt is appended.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    url: String,
    policy: veil_attestation::Policy,
    options: ConnectOptions,
    receipts: Option<Arc<ReceiptLog>>,
) -> Exit {
    let listen = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("veil proxy: {e}");
            return Exit::Unreadable;
        }
    };
    let client = match Client::connect_with(&url, &policy, &options).await {
        Ok(c) => c,
        Err(e) => {
            if let Some(t) = e.check_table() {
                eprintln!("{t}");
            }
            eprintln!("veil proxy: refusing to start: {e}");
            return if matches!(e, ClientError::Attestation { .. } | ClientError::RouteRejected(_)) {
                Exit::Rejected
            } else {
                Exit::Unreadable
            };
        }
    };
    eprintln!(
        "veil proxy: route verified ({} stage(s), {} shard process(es)); sealing every call",
        client.route().shape().stages().len(),
        1 + client.route().shards().len()
    );
    if let Some(notice) = client.route().simulated_notice() {
        eprintln!("veil proxy: WARNING: {notice}");
    }
    println!("listening on http://{listen}/v1");
    if let Some(log) = &receipts {
        log.append(client.saved_route(), None);
    }
    let proxy = Arc::new(Proxy { policy, options, client: RwLock::new(Arc::new(client)), receipts });
    serve_until_ctrl_c(&listener, move |req| proxy.clone().handle(req)).await
}

/// Serves HTTP/1.1 on `listener`, every request answered by `handle`, until
/// Ctrl-C (`veil proxy`, `veil web`).
pub(super) async fn serve_until_ctrl_c<F, Fut>(listener: &tokio::net::TcpListener, handle: F) -> Exit
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Response<Body>> + Send + 'static,
{
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Exit::Accepted,
            (tcp, _) = veil_wire::net::accept(listener) => {
                let handle = handle.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let answer = handle(req);
                        async move { Ok::<_, Infallible>(answer.await) }
                    });
                    let io = hyper_util::rt::TokioIo::new(tcp);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
            }
        }
    }
}
