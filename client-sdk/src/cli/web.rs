//! `veil web URL --policy P --listen 127.0.0.1:PORT`: the private chat page,
//! served from the user's own machine. The page (`client-sdk/web`, built
//! into this binary) and the WebAssembly client it runs (the npm package
//! `scripts/build-wasm.sh` builds, read once at start) come from the
//! release the user installed, never from the host. The page verifies every
//! shard and seals the prompt itself; this server only hands it the policy
//! and forwards two requests to the host: `GET /v1/attestation?nonce=…` and
//! `POST /v1/sealed`, whose bytes are sealed in the page. Everything else is
//! refused. The host's relay sends no CORS headers, and should not: a page
//! the relay served could be any code the host chose.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use sha2::Digest as _;
use veil_attestation::route::MAX_DOC_BYTES;

use super::{Exit, WebArgs};
use crate::sdk::{ConnectOptions, HttpClient};

use super::proxy::{Body, BodyError};

/// The page's own files, part of this binary.
const PAGE: [(&str, &str, &str); 3] = [
    ("/index.html", "text/html; charset=utf-8", include_str!("../../web/index.html")),
    ("/app.js", "text/javascript; charset=utf-8", include_str!("../../web/app.js")),
    ("/style.css", "text/css; charset=utf-8", include_str!("../../web/style.css")),
];
/// The WebAssembly client's files, read from the package directory at start.
const PACKAGE: [(&str, &str); 3] = [
    ("veil.js", "text/javascript; charset=utf-8"),
    ("veil_wasm.js", "text/javascript; charset=utf-8"),
    ("veil_wasm_bg.wasm", "application/wasm"),
];
/// Largest package file read.
const MAX_FILE: u64 = 32 << 20;
/// Largest sealed request forwarded (the page pads a request far below it).
const MAX_SEALED: usize = 4 << 20;
const SEALED_TYPE: &str = "message/ohttp-chunked-req";
/// The page may run only its own scripts and the wasm module, and talk only
/// to this server: a compromised answer rendered as text cannot load or send
/// anything elsewhere.
const CSP: &str = "default-src 'none'; script-src 'self' 'wasm-unsafe-eval'; style-src 'self'; \
                   connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

struct Asset {
    content_type: &'static str,
    bytes: Bytes,
}

struct Web {
    upstream: String,
    http: HttpClient,
    options: ConnectOptions,
    /// The served files by path, including `/policy.toml` and `/config.json`.
    assets: std::collections::HashMap<String, Asset>,
    /// The `Host` values a request may carry (this listener's address under
    /// its loopback names): anything else is a DNS-rebinding page.
    hosts: Vec<String>,
}

fn response(status: StatusCode, content_type: &str, body: Body) -> Response<Body> {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    if let Ok(v) = HeaderValue::from_str(content_type) {
        r.headers_mut().insert(CONTENT_TYPE, v);
    }
    let h = r.headers_mut();
    h.insert("content-security-policy", HeaderValue::from_static(CSP));
    h.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert("cache-control", HeaderValue::from_static("no-store"));
    r
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|e| match e {}).boxed()
}

fn text(status: StatusCode, message: &str) -> Response<Body> {
    response(status, "text/plain; charset=utf-8", full(format!("veil web: {message}\n")))
}

/// `nonce=<64 hex digits>`, the only query the page sends.
fn valid_nonce_query(query: Option<&str>) -> bool {
    query
        .and_then(|q| q.strip_prefix("nonce="))
        .is_some_and(|n| n.len() == 64 && n.bytes().all(|b| b.is_ascii_hexdigit()))
}

impl Web {
    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let host = req.headers().get(hyper::header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
        if !self.hosts.iter().any(|h| h == host) {
            return text(
                StatusCode::FORBIDDEN,
                "unexpected Host header (open the page at the address veil web printed)",
            );
        }
        // A page from another origin may send requests here; it gets nothing.
        if let Some(origin) = req.headers().get(hyper::header::ORIGIN) {
            if origin.to_str().ok().and_then(|o| o.strip_prefix("http://")) != Some(host) {
                return text(StatusCode::FORBIDDEN, "cross-origin request refused");
            }
        }
        let path = req.uri().path().to_owned();
        match (req.method(), path.as_str()) {
            (&Method::GET, "/v1/attestation") => {
                if !valid_nonce_query(req.uri().query()) {
                    return text(
                        StatusCode::BAD_REQUEST,
                        "the attestation request takes exactly nonce=<64 hex digits>",
                    );
                }
                let uri = format!("{}/v1/attestation?{}", self.upstream, req.uri().query().unwrap_or(""));
                self.forward(Request::get(uri).body(Full::new(Bytes::new())), Some(MAX_DOC_BYTES)).await
            }
            (&Method::POST, "/v1/sealed") => {
                let typed = req.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) == Some(SEALED_TYPE);
                if !typed {
                    return text(StatusCode::UNSUPPORTED_MEDIA_TYPE, &format!("a sealed request is {SEALED_TYPE}"));
                }
                let body = match Limited::new(req.into_body(), MAX_SEALED).collect().await {
                    Ok(b) => b.to_bytes(),
                    Err(_) => return text(StatusCode::PAYLOAD_TOO_LARGE, "sealed request too large"),
                };
                let upstream = Request::post(format!("{}/v1/sealed", self.upstream))
                    .header(CONTENT_TYPE, SEALED_TYPE)
                    .body(Full::new(body));
                self.forward(upstream, None).await
            }
            (&Method::GET, _) => {
                let path = if path == "/" { "/index.html" } else { path.as_str() };
                match self.assets.get(path) {
                    Some(a) => response(StatusCode::OK, a.content_type, full(a.bytes.clone())),
                    None => text(StatusCode::NOT_FOUND, "no such file"),
                }
            }
            _ => text(StatusCode::METHOD_NOT_ALLOWED, "only the page's files and its two host requests are served"),
        }
    }

    /// Sends `req` to the host and passes its answer on as it arrives: the
    /// status, the content type and the body (sealed, or the attestation
    /// document, which the page verifies). A host that does not answer
    /// within the first-byte limit gets a 504; one that stalls between
    /// chunks, or sends more than `max` bytes, has its answer cut (the
    /// connection aborted, which the page reports).
    async fn forward(
        &self,
        req: Result<Request<Full<Bytes>>, hyper::http::Error>,
        max: Option<usize>,
    ) -> Response<Body> {
        let req = match req {
            Ok(r) => r,
            Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
        };
        let limit = self.options.timeouts.first_byte;
        let resp = match tokio::time::timeout(limit, self.http.request(req)).await {
            Err(_) => return text(StatusCode::GATEWAY_TIMEOUT, &format!("the host did not answer within {limit:?}")),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "host unreachable");
                return text(StatusCode::BAD_GATEWAY, &format!("host unreachable: {e}"));
            }
            Ok(Ok(r)) => r,
        };
        let status = resp.status();
        let content_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/octet-stream")
            .to_owned();
        response(status, &content_type, bounded(resp.into_body(), max, self.options.timeouts.between_chunks))
    }
}

/// The host's body passed on frame by frame, ended with an error (so the
/// page's connection is aborted, never ended cleanly) when the host is
/// silent for `idle` or has sent more than `max` bytes.
fn bounded(body: Incoming, max: Option<usize>, idle: std::time::Duration) -> Body {
    use futures::StreamExt as _;
    let frames = http_body_util::BodyStream::new(body);
    let stream = futures::stream::unfold(Some((frames, 0usize)), move |state| async move {
        let (mut frames, sent) = state?;
        let failed = |why: String| Some((Err::<Frame<Bytes>, BodyError>(why.into()), None));
        match tokio::time::timeout(idle, frames.next()).await {
            Err(_) => failed(format!("nothing from the host for {idle:?}")),
            Ok(None) => None,
            Ok(Some(Err(e))) => failed(format!("the host's answer broke off: {e}")),
            Ok(Some(Ok(frame))) => {
                let sent = sent + frame.data_ref().map_or(0, Bytes::len);
                if max.is_some_and(|m| sent > m) {
                    return failed(format!("the host's answer is over {} bytes", max.unwrap_or_default()));
                }
                Some((Ok(frame), Some((frames, sent))))
            }
        }
    });
    BodyExt::boxed(http_body_util::StreamBody::new(stream))
}

/// Where the npm package is when `--pkg` is not given: `$VEIL_WEB_PKG`, else
/// `npm/veil-client` beside the directory holding this executable (where
/// `scripts/build-wasm.sh` puts it for `target/*/veil`).
fn default_package() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("VEIL_WEB_PKG") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.join("npm").join("veil-client"))
}

fn read_package(dir: &Path) -> Result<Vec<(String, Asset)>, String> {
    let mut out = Vec::new();
    for (name, content_type) in PACKAGE {
        let path = dir.join(name);
        let len = std::fs::metadata(&path)
            .map_err(|e| {
                format!("{}: {e} (build the package with scripts/build-wasm.sh, or give --pkg)", path.display())
            })?
            .len();
        if len > MAX_FILE {
            return Err(format!("{}: over {MAX_FILE} bytes", path.display()));
        }
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        out.push((format!("/{name}"), Asset { content_type, bytes: Bytes::from(bytes) }));
    }
    Ok(out)
}

/// Runs the page's server until interrupted.
pub fn run(args: &WebArgs) -> Exit {
    let policy = match args.policy.load() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("veil web: policy {e}");
            return Exit::Unreadable;
        }
    };
    if !args.listen.ip().is_loopback() {
        eprintln!("veil web: --listen must be a loopback address (the page is for this machine's browser only)");
        return Exit::Unreadable;
    }
    let upstream = args.url.trim_end_matches('/').to_owned();
    let https = upstream.starts_with("https://");
    if !https && !upstream.starts_with("http://") {
        eprintln!("veil web: {upstream}: the host's URL must start with http:// or https://");
        return Exit::Unreadable;
    }
    let Some(pkg) = args.pkg.clone().or_else(default_package) else {
        eprintln!("veil web: give the WebAssembly client's directory with --pkg");
        return Exit::Unreadable;
    };
    let package = match read_package(&pkg) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("veil web: {e}");
            return Exit::Unreadable;
        }
    };
    let (options, http) = match super::connect_options(args.ca.as_deref()).and_then(|o| {
        let http = o.http_client(https)?;
        Ok((o, http))
    }) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("veil web: {e}");
            return Exit::Unreadable;
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("veil web: {e}");
            return Exit::Unreadable;
        }
    };
    let mut assets: std::collections::HashMap<String, Asset> = PAGE
        .iter()
        .map(|(p, t, body)| (p.to_string(), Asset { content_type: t, bytes: Bytes::from_static(body.as_bytes()) }))
        .collect();
    for (path, asset) in package {
        let digest = hex::encode(sha2::Sha256::digest(&asset.bytes));
        eprintln!("veil web: {} sha256 {digest}", pkg.join(&path[1..]).display());
        assets.insert(path, asset);
    }
    assets.insert(
        "/policy.toml".into(),
        Asset { content_type: "text/plain; charset=utf-8", bytes: Bytes::from(policy.to_toml()) },
    );
    let config = serde_json::json!({ "host": upstream, "version": env!("CARGO_PKG_VERSION") });
    assets.insert(
        "/config.json".into(),
        Asset { content_type: "application/json", bytes: Bytes::from(config.to_string()) },
    );
    rt.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(args.listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("veil web: cannot listen on {}: {e}", args.listen);
                return Exit::Unreadable;
            }
        };
        let listen = match listener.local_addr() {
            Ok(a) => a,
            Err(e) => {
                eprintln!("veil web: {e}");
                return Exit::Unreadable;
            }
        };
        let web = Web { upstream, http, options, assets, hosts: loopback_hosts(listen) };
        serve(listener, Arc::new(web), listen).await
    })
}

fn loopback_hosts(listen: SocketAddr) -> Vec<String> {
    let port = listen.port();
    let mut hosts = vec![format!("localhost:{port}")];
    hosts.push(match listen {
        SocketAddr::V4(a) => format!("{}:{port}", a.ip()),
        SocketAddr::V6(a) => format!("[{}]:{port}", a.ip()),
    });
    hosts
}

async fn serve(listener: tokio::net::TcpListener, web: Arc<Web>, listen: SocketAddr) -> Exit {
    eprintln!("veil web: the page verifies the route and seals every prompt itself; this server forwards sealed bytes");
    println!("open http://{listen}/");
    super::proxy::serve_until_ctrl_c(&listener, move |req| web.clone().handle(req)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_nonce_of_32_hex_bytes_is_forwarded() {
        let nonce = "ab".repeat(32);
        assert!(valid_nonce_query(Some(&format!("nonce={nonce}"))));
        assert!(!valid_nonce_query(None));
        assert!(!valid_nonce_query(Some(&format!("nonce={nonce}&x=1"))));
        assert!(!valid_nonce_query(Some(&format!("nonce={}", &nonce[2..]))));
        assert!(!valid_nonce_query(Some(&format!("nonce={}zz", &nonce[2..]))));
        assert!(!valid_nonce_query(Some(&format!("x=1&nonce={nonce}"))));
    }
}
