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
//!
//! What the host answers is passed on as data only, because it is served on
//! the page's own origin: a host answer that the browser took for a
//! document or a script would run with the page's rights (read the policy,
//! post through `/v1/sealed`), and browser-side verification would be
//! worth nothing. So:
//! * only the page's own fetches are forwarded: `Sec-Fetch-Dest: empty`,
//!   `Sec-Fetch-Site: same-origin` and [`PAGE_HEADER`] (which no
//!   navigation, `<script>`, `<link>`, `<img>` or form can carry, and which
//!   a page of another origin could send only after a CORS preflight, which
//!   is refused); anything else gets a 403 and the host is not contacted.
//!   Of the page's request headers only the sealed type and its declared
//!   cost (`veil-cost`, a number in range) are passed on;
//! * the answer carries none of the host's headers: its type is ours
//!   (`application/json` for an attestation document, else
//!   `application/octet-stream`), with `X-Content-Type-Options: nosniff`,
//!   `Content-Disposition: attachment` and a CSP that sandboxes it;
//! * the page's CSP names its scripts by exact URL, so a forwarded path can
//!   never be a script even if a type slipped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderMap, HeaderValue, CONTENT_DISPOSITION, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use sha2::Digest as _;
use veil_attestation::route::MAX_DOC_BYTES;
use veil_wire::http::{COST_HEADER, MAX_COST};

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
/// Every script the page runs, by path: its module, the client's JS API it
/// imports and the wasm-bindgen glue that imports. The page's CSP names
/// exactly these (the wasm module is fetched, and compiled under
/// `'wasm-unsafe-eval'`).
const SCRIPTS: [&str; 3] = ["/app.js", "/veil.js", "/veil_wasm.js"];
/// The page's only stylesheet.
const STYLES: [&str; 1] = ["/style.css"];
/// The header the page's own JS (`client-sdk/web/app.js`) sets on every
/// forwarded fetch, always to `1`. Not CORS-safelisted: another origin
/// could send it only after a preflight, which this server refuses.
pub const PAGE_HEADER: &str = "x-veil-page";
/// Largest package file read.
const MAX_FILE: u64 = 32 << 20;
/// Largest sealed request forwarded (the page pads a request far below it).
const MAX_SEALED: usize = 4 << 20;
const SEALED_TYPE: &str = "message/ohttp-chunked-req";
/// The type of a forwarded attestation document (the host's own type is
/// never passed on).
const DOCUMENT_TYPE: &str = "application/json";
/// The type of every other forwarded answer.
const DATA_TYPE: &str = "application/octet-stream";
/// The CSP of everything that is not the page's own file (forwarded
/// answers, refusals): nothing may load, and were it ever shown as a
/// document it would run sandboxed in an opaque origin.
const DATA_CSP: &str = "default-src 'none'; sandbox; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The page's CSP for a server reachable under `hosts`: it may run only its
/// own scripts (named by exact URL under each host, so that no other path
/// of this origin, a forwarded one least of all, can be a script) and the
/// wasm module, and talk only to this server: a compromised answer rendered
/// as text cannot load or send anything elsewhere.
fn page_csp(hosts: &[String]) -> String {
    let exactly = |paths: &[&str]| {
        let urls: Vec<String> =
            hosts.iter().flat_map(|h| paths.iter().map(move |p| format!("http://{h}{p}"))).collect();
        urls.join(" ")
    };
    format!(
        "default-src 'none'; script-src {} 'wasm-unsafe-eval'; style-src {}; connect-src 'self'; img-src 'none'; \
         base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        exactly(&SCRIPTS),
        exactly(&STYLES),
    )
}

struct Asset {
    content_type: &'static str,
    bytes: Bytes,
}

/// The two requests forwarded to the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Forwarded {
    /// `GET /v1/attestation?nonce=…`: answered with the attestation document.
    Attestation,
    /// `POST /v1/sealed`: answered with the sealed response.
    Sealed,
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
    /// The page's CSP ([`page_csp`] of `hosts`).
    csp: HeaderValue,
}

/// A response with the headers every answer carries: its type (ours), the
/// CSP given, no sniffing, no referrer, no caching, not readable by another
/// origin's `no-cors` load.
fn response(status: StatusCode, content_type: &'static str, csp: HeaderValue, body: Body) -> Response<Body> {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert("content-security-policy", csp);
    h.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert("cache-control", HeaderValue::from_static("no-store"));
    h.insert("cross-origin-resource-policy", HeaderValue::from_static("same-origin"));
    r
}

/// A forwarded answer: the host's status and body, and nothing else of it.
/// The type is ours, never the host's, and the answer is an attachment, so
/// a browser neither renders nor runs it.
fn forwarded(kind: Forwarded, status: StatusCode, body: Body) -> Response<Body> {
    let content_type = match kind {
        Forwarded::Attestation if status.is_success() => DOCUMENT_TYPE,
        Forwarded::Attestation | Forwarded::Sealed => DATA_TYPE,
    };
    let mut r = response(status, content_type, HeaderValue::from_static(DATA_CSP), body);
    r.headers_mut().insert(CONTENT_DISPOSITION, HeaderValue::from_static("attachment"));
    r
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|e| match e {}).boxed()
}

fn text(status: StatusCode, message: &str) -> Response<Body> {
    let body = full(format!("veil web: {message}\n"));
    response(status, "text/plain; charset=utf-8", HeaderValue::from_static(DATA_CSP), body)
}

/// `nonce=<64 hex digits>`, the only query the page sends.
fn valid_nonce_query(query: Option<&str>) -> bool {
    query
        .and_then(|q| q.strip_prefix("nonce="))
        .is_some_and(|n| n.len() == 64 && n.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The one value of header `name`, if it was sent exactly once.
fn only_value<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a [u8]> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(v), None) => Some(v.as_bytes()),
        _ => None,
    }
}

/// Why a request for a forwarded path is not the page's own fetch, if it is
/// not. A navigation (a link, a typed or scripted URL, a form), a
/// `<script>`, `<link>`, `<img>` or frame load carries another
/// `Sec-Fetch-Dest` and cannot set [`PAGE_HEADER`]; another origin's fetch
/// with the header is preflighted, and the preflight refused.
fn not_the_pages_fetch(headers: &HeaderMap) -> Option<&'static str> {
    if only_value(headers, "sec-fetch-dest") != Some(b"empty") {
        return Some("only the page's own fetches are forwarded (Sec-Fetch-Dest: empty), never a navigation or a load");
    }
    if only_value(headers, "sec-fetch-site") != Some(b"same-origin") {
        return Some("only the page's own fetches are forwarded (Sec-Fetch-Site: same-origin)");
    }
    if only_value(headers, PAGE_HEADER) != Some(b"1") {
        return Some("only the page's own fetches are forwarded (X-Veil-Page: 1)");
    }
    None
}

impl Web {
    fn new(upstream: String, http: HttpClient, options: ConnectOptions, hosts: Vec<String>) -> Result<Self, String> {
        let csp = HeaderValue::from_str(&page_csp(&hosts)).map_err(|e| format!("the page's CSP: {e}"))?;
        Ok(Web { upstream, http, options, assets: std::collections::HashMap::new(), hosts, csp })
    }

    async fn handle<B>(self: Arc<Self>, req: Request<B>) -> Response<Body>
    where
        B: hyper::body::Body<Data = Bytes>,
        B::Error: Into<BodyError>,
    {
        let host = req.headers().get(hyper::header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
        if !self.hosts.iter().any(|h| h == host) {
            return text(
                StatusCode::FORBIDDEN,
                "unexpected Host header (open the page at the address veil web printed)",
            );
        }
        // A page from another origin may send requests here; it gets nothing
        // (a CORS preflight included: no answer here allows anything).
        if let Some(origin) = req.headers().get(hyper::header::ORIGIN) {
            if origin.to_str().ok().and_then(|o| o.strip_prefix("http://")) != Some(host) {
                return text(StatusCode::FORBIDDEN, "cross-origin request refused");
            }
        }
        let path = req.uri().path().to_owned();
        let kind = match path.as_str() {
            "/v1/attestation" => Some(Forwarded::Attestation),
            "/v1/sealed" => Some(Forwarded::Sealed),
            _ => None,
        };
        if kind.is_some() {
            if let Some(why) = not_the_pages_fetch(req.headers()) {
                return text(StatusCode::FORBIDDEN, why);
            }
        }
        match (req.method(), kind) {
            (&Method::GET, Some(Forwarded::Attestation)) => {
                if !valid_nonce_query(req.uri().query()) {
                    return text(
                        StatusCode::BAD_REQUEST,
                        "the attestation request takes exactly nonce=<64 hex digits>",
                    );
                }
                let uri = format!("{}/v1/attestation?{}", self.upstream, req.uri().query().unwrap_or(""));
                self.forward(
                    Forwarded::Attestation,
                    Request::get(uri).body(Full::new(Bytes::new())),
                    Some(MAX_DOC_BYTES),
                )
                .await
            }
            (&Method::POST, Some(Forwarded::Sealed)) => {
                let typed = req.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()) == Some(SEALED_TYPE);
                if !typed {
                    return text(StatusCode::UNSUPPORTED_MEDIA_TYPE, &format!("a sealed request is {SEALED_TYPE}"));
                }
                // The only request header passed on: the cost the page
                // declares (the relay charges by it), a number in range.
                let cost = match req.headers().get(COST_HEADER) {
                    None => None,
                    Some(v) => match v.to_str().ok().and_then(|v| v.parse::<u32>().ok()) {
                        Some(c) if (1..=MAX_COST).contains(&c) => Some(c),
                        _ => {
                            return text(
                                StatusCode::BAD_REQUEST,
                                &format!("{COST_HEADER} must be an integer from 1 to {MAX_COST}"),
                            )
                        }
                    },
                };
                let body = match Limited::new(req.into_body(), MAX_SEALED).collect().await {
                    Ok(b) => b.to_bytes(),
                    Err(_) => return text(StatusCode::PAYLOAD_TOO_LARGE, "sealed request too large"),
                };
                let mut upstream =
                    Request::post(format!("{}/v1/sealed", self.upstream)).header(CONTENT_TYPE, SEALED_TYPE);
                if let Some(c) = cost {
                    upstream = upstream.header(COST_HEADER, c.to_string());
                }
                let upstream = upstream.body(Full::new(body));
                self.forward(Forwarded::Sealed, upstream, None).await
            }
            (&Method::GET, None) => {
                let path = if path == "/" { "/index.html" } else { path.as_str() };
                match self.assets.get(path) {
                    Some(a) => response(StatusCode::OK, a.content_type, self.csp.clone(), full(a.bytes.clone())),
                    None => text(StatusCode::NOT_FOUND, "no such file"),
                }
            }
            _ => text(StatusCode::METHOD_NOT_ALLOWED, "only the page's files and its two host requests are served"),
        }
    }

    /// Sends `req` to the host and passes its answer on as it arrives, as
    /// data ([`forwarded`]): the status and the body (sealed, or the
    /// attestation document, which the page verifies), none of its headers.
    /// A host that does not answer within the first-byte limit gets a 504;
    /// one that stalls between chunks, or sends more than `max` bytes, has
    /// its answer cut (the connection aborted, which the page reports).
    async fn forward(
        &self,
        kind: Forwarded,
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
        forwarded(kind, status, bounded(resp.into_body(), max, self.options.timeouts.between_chunks))
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
        let mut web = match Web::new(upstream, http, options, loopback_hosts(listen)) {
            Ok(w) => w,
            Err(e) => {
                eprintln!("veil web: {e}");
                return Exit::Unreadable;
            }
        };
        web.assets = assets;
        serve(listener, Arc::new(web)).await
    })
}

/// The `Host` values the page may be opened under, the address to print
/// last. A CSP cannot name an IPv6 literal, so on an IPv6 loopback the page
/// is served as `localhost` only (the browser finds `::1` under it).
fn loopback_hosts(listen: SocketAddr) -> Vec<String> {
    let port = listen.port();
    let mut hosts = vec![format!("localhost:{port}")];
    if let SocketAddr::V4(a) = listen {
        hosts.push(format!("{}:{port}", a.ip()));
    }
    hosts
}

async fn serve(listener: tokio::net::TcpListener, web: Arc<Web>) -> Exit {
    eprintln!("veil web: the page verifies the route and seals every prompt itself; this server forwards sealed bytes");
    // `hosts` is never empty (loopback_hosts).
    println!("open http://{}/", web.hosts.last().map_or("localhost", String::as_str));
    super::proxy::serve_until_ctrl_c(&listener, move |req| web.clone().handle(req)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    const HOST: &str = "127.0.0.1:8001";

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

    /// `script-src` and `style-src` list the page's files by exact URL under
    /// each name of the listener: no `'self'`, no directory, so no forwarded
    /// path (nor any other of this origin) can be a script.
    #[test]
    fn the_pages_csp_names_its_scripts_exactly() {
        let csp = page_csp(&loopback_hosts("127.0.0.1:8001".parse().unwrap()));
        let directive = |name: &str| {
            csp.split(';').map(str::trim).find_map(|d| d.strip_prefix(name)).unwrap_or_default().to_owned()
        };
        let script_src = directive("script-src ");
        let mut scripts: Vec<&str> = script_src.split(' ').collect();
        scripts.sort_unstable();
        assert_eq!(
            scripts,
            [
                "'wasm-unsafe-eval'",
                "http://127.0.0.1:8001/app.js",
                "http://127.0.0.1:8001/veil.js",
                "http://127.0.0.1:8001/veil_wasm.js",
                "http://localhost:8001/app.js",
                "http://localhost:8001/veil.js",
                "http://localhost:8001/veil_wasm.js",
            ]
        );
        assert_eq!(directive("style-src "), "http://localhost:8001/style.css http://127.0.0.1:8001/style.css");
        assert_eq!(directive("default-src "), "'none'");
        assert!(HeaderValue::from_str(&csp).is_ok());
        // On an IPv6 loopback, which a CSP cannot name, the page is localhost's.
        assert_eq!(loopback_hosts("[::1]:8001".parse().unwrap()), ["localhost:8001"]);
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    const PAGE_FETCH: [(&str, &str); 3] =
        [("sec-fetch-dest", "empty"), ("sec-fetch-site", "same-origin"), (PAGE_HEADER, "1")];

    #[test]
    fn only_the_pages_own_fetch_is_forwarded() {
        assert_eq!(not_the_pages_fetch(&headers(&PAGE_FETCH)), None);
        let refused: [&[(&str, &str)]; 9] = [
            // A navigation from another site, a typed URL, a script, a stylesheet, an image.
            &[("sec-fetch-dest", "document"), ("sec-fetch-site", "cross-site"), ("sec-fetch-mode", "navigate")],
            &[("sec-fetch-dest", "document"), ("sec-fetch-site", "none"), (PAGE_HEADER, "1")],
            &[("sec-fetch-dest", "script"), ("sec-fetch-site", "same-origin"), (PAGE_HEADER, "1")],
            &[("sec-fetch-dest", "style"), ("sec-fetch-site", "same-origin"), (PAGE_HEADER, "1")],
            &[("sec-fetch-dest", "image"), ("sec-fetch-site", "same-origin"), (PAGE_HEADER, "1")],
            // A fetch without the page's header, or from another site.
            &[("sec-fetch-dest", "empty"), ("sec-fetch-site", "same-origin")],
            &[("sec-fetch-dest", "empty"), ("sec-fetch-site", "same-site"), (PAGE_HEADER, "1")],
            // No fetch metadata at all, or a header sent twice.
            &[(PAGE_HEADER, "1")],
            &[
                ("sec-fetch-dest", "empty"),
                ("sec-fetch-dest", "empty"),
                ("sec-fetch-site", "same-origin"),
                (PAGE_HEADER, "1"),
            ],
        ];
        for r in refused {
            assert!(not_the_pages_fetch(&headers(r)).is_some(), "{r:?}");
        }
        let mut wrong = headers(&PAGE_FETCH);
        wrong.insert(PAGE_HEADER, HeaderValue::from_static("0"));
        assert!(not_the_pages_fetch(&wrong).is_some());
    }

    /// A hostile host: every answer is HTML or JavaScript with headers of
    /// its own choosing (a cookie, CORS, an inline disposition, a redirect).
    /// Records the requests that reach it: each path and declared cost.
    async fn hostile_host(requests: Requests) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else { return };
                let requests = requests.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let cost = req.headers().get(COST_HEADER).map(|v| v.to_str().unwrap_or("?").to_owned());
                        requests.lock().unwrap().push((req.uri().path().to_owned(), cost));
                        let (status, content_type, body) = match req.uri().path() {
                            "/v1/attestation" if req.uri().query().is_some_and(|q| q.ends_with("00")) => {
                                (StatusCode::NOT_FOUND, "text/html", "<script>alert(1)</script>")
                            }
                            "/v1/attestation" => {
                                (StatusCode::OK, "text/html", "<script src=\"/v1/attestation?nonce=00\"></script>")
                            }
                            _ => (StatusCode::OK, "application/javascript", "fetch('/policy.toml')"),
                        };
                        let r = Response::builder()
                            .status(status)
                            .header(CONTENT_TYPE, content_type)
                            .header(CONTENT_DISPOSITION, "inline")
                            .header("set-cookie", "host=1")
                            .header("access-control-allow-origin", "*")
                            .header("location", "http://evil.example/")
                            .header("refresh", "0; url=http://evil.example/")
                            .header("content-security-policy", "script-src *")
                            .body(Full::new(Bytes::from_static(body.as_bytes())));
                        async move { r }
                    });
                    let io = hyper_util::rt::TokioIo::new(tcp);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
            }
        });
        format!("http://{addr}")
    }

    type Requests = Arc<Mutex<Vec<(String, Option<String>)>>>;

    async fn web_before(upstream: String) -> Arc<Web> {
        let options = ConnectOptions::default();
        let http = options.http_client(false).unwrap();
        let mut web = Web::new(upstream, http, options, loopback_hosts(HOST.parse().unwrap())).unwrap();
        for (path, content_type, body) in PAGE {
            web.assets.insert(path.into(), Asset { content_type, bytes: Bytes::from_static(body.as_bytes()) });
        }
        Arc::new(web)
    }

    fn request(
        method: Method,
        uri: &str,
        pairs: &[(&'static str, &'static str)],
        body: &'static [u8],
    ) -> Request<Full<Bytes>> {
        let mut r = Request::builder().method(method).uri(uri).header("host", HOST);
        for (k, v) in pairs {
            r = r.header(*k, *v);
        }
        r.body(Full::new(Bytes::from_static(body))).unwrap()
    }

    fn attestation_uri(last: &str) -> String {
        format!("/v1/attestation?nonce={}{last}", "ab".repeat(31))
    }

    async fn body_of(r: Response<Body>) -> String {
        String::from_utf8_lossy(&r.into_body().collect().await.unwrap().to_bytes()).into_owned()
    }

    fn header<'a>(r: &'a Response<Body>, name: &str) -> &'a str {
        r.headers().get(name).map_or("", |v| v.to_str().unwrap())
    }

    /// The answer is data: our type, nosniff, an attachment, a sandboxing
    /// CSP, and none of the host's headers.
    fn assert_data(r: &Response<Body>, content_type: &str) {
        assert_eq!(header(r, "content-type"), content_type);
        assert_eq!(header(r, "x-content-type-options"), "nosniff");
        assert_eq!(header(r, "content-disposition"), "attachment");
        assert_eq!(header(r, "content-security-policy"), DATA_CSP);
        assert!(DATA_CSP.contains("sandbox") && DATA_CSP.contains("default-src 'none'"));
        for name in ["set-cookie", "access-control-allow-origin", "location", "refresh"] {
            assert!(r.headers().get(name).is_none(), "{name} passed through");
        }
        assert_eq!(r.headers().get_all("content-security-policy").iter().count(), 1);
    }

    /// The attack of issue 53 (E): a navigation to a forwarded path, or a
    /// `<script>` pointing at one, is refused before the host is asked.
    #[tokio::test]
    async fn a_navigation_or_a_script_load_of_a_forwarded_path_never_reaches_the_host() {
        let requests = Requests::default();
        let web = web_before(hostile_host(requests.clone()).await).await;
        let cross_site_navigation =
            [("sec-fetch-dest", "document"), ("sec-fetch-mode", "navigate"), ("sec-fetch-site", "cross-site")];
        let script = [("sec-fetch-dest", "script"), ("sec-fetch-mode", "no-cors"), ("sec-fetch-site", "same-origin")];
        let page_fetch_without_header = [("sec-fetch-dest", "empty"), ("sec-fetch-site", "same-origin")];
        for h in [&cross_site_navigation[..], &script, &page_fetch_without_header, &[]] {
            let r = web.clone().handle(request(Method::GET, &attestation_uri("ab"), h, b"")).await;
            assert_eq!(r.status(), StatusCode::FORBIDDEN, "{h:?}");
            assert_eq!(header(&r, "content-type"), "text/plain; charset=utf-8");
            assert!(body_of(r).await.starts_with("veil web: only the page's own fetches"));
            let sealed = [h, &[("content-type", SEALED_TYPE)]].concat();
            let r = web.clone().handle(request(Method::POST, "/v1/sealed", &sealed, b"sealed")).await;
            assert_eq!(r.status(), StatusCode::FORBIDDEN, "{h:?}");
        }
        // Another origin's preflight (its fetch would carry the page's
        // header) is refused and allows nothing.
        let preflight = [
            ("origin", "http://evil.example"),
            ("access-control-request-method", "POST"),
            ("access-control-request-headers", PAGE_HEADER),
            ("sec-fetch-mode", "cors"),
        ];
        let r = web.clone().handle(request(Method::OPTIONS, "/v1/sealed", &preflight, b"")).await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert!(r.headers().keys().all(|k| !k.as_str().starts_with("access-control-")));
        // Even with every header of the page's fetch, another origin gets nothing.
        let other_origin = [&PAGE_FETCH[..], &[("origin", "http://evil.example")]].concat();
        let r = web.clone().handle(request(Method::GET, &attestation_uri("ab"), &other_origin, b"")).await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert_eq!(requests.lock().unwrap().len(), 0);
    }

    #[tokio::test]
    async fn the_hosts_answers_are_passed_on_as_data_never_as_a_page_or_a_script() {
        let requests = Requests::default();
        let web = web_before(hostile_host(requests.clone()).await).await;
        // The document (the host said text/html) comes out as JSON.
        let r = web.clone().handle(request(Method::GET, &attestation_uri("ab"), &PAGE_FETCH, b"")).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_data(&r, DOCUMENT_TYPE);
        assert!(body_of(r).await.contains("<script"), "the bytes themselves pass unchanged");
        // An error answer is not a document: octet-stream.
        let r = web.clone().handle(request(Method::GET, &attestation_uri("00"), &PAGE_FETCH, b"")).await;
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        assert_data(&r, DATA_TYPE);
        // The sealed answer (the host said application/javascript) is octet-stream.
        let sealed = [&PAGE_FETCH[..], &[("content-type", SEALED_TYPE), ("origin", "http://127.0.0.1:8001")]].concat();
        let r = web.clone().handle(request(Method::POST, "/v1/sealed", &sealed, b"sealed")).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_data(&r, DATA_TYPE);
        // The page's declared cost is the one request header passed on; an
        // invalid one is refused here.
        let costed = [&sealed[..], &[(COST_HEADER, "3")]].concat();
        let r = web.clone().handle(request(Method::POST, "/v1/sealed", &costed, b"sealed")).await;
        assert_eq!(r.status(), StatusCode::OK);
        let bad_cost = [&sealed[..], &[(COST_HEADER, "0")]].concat();
        let r = web.clone().handle(request(Method::POST, "/v1/sealed", &bad_cost, b"sealed")).await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        let seen = requests.lock().unwrap().clone();
        assert_eq!(
            seen.iter().map(|(p, c)| (p.as_str(), c.as_deref())).collect::<Vec<_>>(),
            [("/v1/attestation", None), ("/v1/attestation", None), ("/v1/sealed", None), ("/v1/sealed", Some("3"))]
        );
        // The page itself carries the page's CSP, which names its scripts.
        let r = web.clone().handle(request(Method::GET, "/", &[("sec-fetch-dest", "document")], b"")).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, "content-type"), "text/html; charset=utf-8");
        let csp = header(&r, "content-security-policy");
        assert!(csp.contains("script-src http://localhost:8001/app.js ") && !csp.contains("'self' 'wasm"), "{csp}");
        assert!(r.headers().get("content-disposition").is_none());
    }
}
