//! The Veil client compiled to WebAssembly: the route verifier
//! (`veil_attestation::route::verify_route`, with its certificate, CRL and
//! report parsing) and the seal (`veil_client::seal`) are the Rust SDK's own
//! code. JS does the I/O (`fetch`) and supplies the clock (`Date.now()`) and
//! the nonce (Web Crypto); `js/veil.js` is the API apps use.
//!
//! Errors reach JS as `Error`s with a `kind` (`config`, `protocol`,
//! `attestation`, `route_rejected`, `truncated`, `api`), and for a refused
//! route its check table in `checks` (and the shard in `who`).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::channel::mpsc;
use futures::TryStreamExt;
use veil_attestation::route::{verify_route, AttestationDoc, RouteError, VerifiedRoute};
use veil_attestation::{Nonce, Policy};
use veil_client::seal::{OpenedResponse, ResponseOpener, SealError};
use wasm_bindgen::prelude::*;

/// A JS `Error` with `kind` and, where given, `checks` and `who`.
fn error(kind: &str, message: &str, checks: Option<String>, who: Option<&str>) -> JsValue {
    let e = js_sys::Error::new(message);
    e.set_name("VeilError");
    let set = |k: &str, v: JsValue| {
        // Setting a property of a fresh Error cannot fail.
        let _ = js_sys::Reflect::set(&e, &JsValue::from_str(k), &v);
    };
    set("kind", JsValue::from_str(kind));
    set("checks", checks.map(|c| JsValue::from_str(&c)).unwrap_or(JsValue::NULL));
    set("who", who.map(JsValue::from_str).unwrap_or(JsValue::NULL));
    e.into()
}

fn seal_error(e: SealError) -> JsValue {
    match e {
        SealError::Open(_) => error("truncated", &e.to_string(), None, None),
        SealError::Receipt(_) => error("receipt", &e.to_string(), None, None),
        _ => error("protocol", &e.to_string(), None, None),
    }
}

/// The time `ms` milliseconds after the Unix epoch (the browser's
/// `Date.now()`): the verifier checks certificates' validity against it.
fn at(ms: f64) -> Result<SystemTime, JsValue> {
    if !(ms.is_finite() && ms >= 0.0) {
        return Err(error("config", &format!("bad time {ms}"), None, None));
    }
    Ok(UNIX_EPOCH + Duration::from_millis(ms as u64))
}

/// Verifies the attestation document `doc` (the bytes the host answered to
/// `GET /v1/attestation?nonce=…`) against the policy (TOML text) for the
/// nonce the caller sent, at the caller's time: every shard's evidence, the
/// entry's binding of the nonce and of the shards it links, the route's
/// coverage and peer policy. The same checks as `veil verify`.
#[wasm_bindgen(js_name = verifyDocument)]
pub fn verify_document(doc: &[u8], policy_toml: &str, nonce: &[u8], now_ms: f64) -> Result<Route, JsValue> {
    let policy = Policy::from_toml(policy_toml).map_err(|e| error("config", &format!("policy: {e}"), None, None))?;
    let nonce = Nonce::new(nonce.to_vec()).map_err(|e| error("config", &e.to_string(), None, None))?;
    let doc = AttestationDoc::from_json(doc).map_err(|e| error("protocol", &e.to_string(), None, None))?;
    let route = verify_route(&doc, &policy, &nonce, at(now_ms)?).map_err(|e| match e {
        RouteError::Evidence { who, source } => {
            let checks = match &source {
                veil_attestation::Error::Rejected(r) => Some(match &r.gpu {
                    Some(g) => g.appraisal.to_string(),
                    None => r.report.to_string(),
                }),
                _ => None,
            };
            error("attestation", &format!("attestation of {who} failed: {source}"), checks, Some(&who))
        }
        RouteError::Rejected(r) => error("route_rejected", &r.to_string(), Some(r.report.to_string()), None),
        other => error("route_rejected", &other.to_string(), None, None),
    })?;
    Ok(Route { inner: Rc::new(route) })
}

/// A verified route.
#[wasm_bindgen]
#[derive(Debug)]
pub struct Route {
    inner: Rc<VerifiedRoute>,
}

#[wasm_bindgen]
impl Route {
    /// The whole verdict: the document `veil verify --json` prints.
    #[wasm_bindgen(getter)]
    pub fn json(&self) -> String {
        veil_client::report::route_json(&self.inner).to_string()
    }

    /// Every shard's check table and the route's, as `veil verify` prints them.
    #[wasm_bindgen(getter)]
    pub fn checks(&self) -> String {
        veil_client::report::route_text(&self.inner)
    }

    /// Whether any shard's (or GPU's) evidence is simulated.
    #[wasm_bindgen(getter)]
    pub fn simulated(&self) -> bool {
        self.inner.simulated_count() > 0
    }

    /// Every warning a reviewer must see.
    #[wasm_bindgen(getter)]
    pub fn warnings(&self) -> Vec<String> {
        veil_client::report::route_warnings(&self.inner)
    }

    /// The model the route serves (the OpenAI `model`).
    #[wasm_bindgen(getter)]
    pub fn model(&self) -> String {
        self.inner.model().to_owned()
    }

    /// Seals one API call (`method`, `path`, JSON `body`) to the route's
    /// attested entry, stamped with the caller's time.
    pub fn seal(&self, method: &str, path: &str, body: &[u8], now_ms: f64) -> Result<Sealed, JsValue> {
        let mut message =
            bhttp::Message::request(method.into(), b"https".to_vec(), b"veil-entry".to_vec(), path.into());
        let cost = veil_client::seal::declared_cost(body);
        if !body.is_empty() {
            message.put_header("content-type", "application/json");
            message.write_content(body);
        }
        let sent_at = at(now_ms)?.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        // Sealing writes to memory only: the future is ready at once.
        let (request, opener) = futures::executor::block_on(veil_client::seal::seal_at(&self.inner, message, sent_at))
            .map_err(seal_error)?;
        Ok(Sealed { request, opener: Some(opener), cost })
    }
}

/// A sealed request: its bytes to POST, and the key to open its answer.
#[wasm_bindgen]
#[derive(Debug)]
pub struct Sealed {
    request: Vec<u8>,
    opener: Option<ResponseOpener>,
    cost: u32,
}

#[wasm_bindgen]
impl Sealed {
    /// The body of `POST /v1/sealed` (media type `message/ohttp-chunked-req`).
    #[wasm_bindgen(getter)]
    pub fn request(&self) -> Vec<u8> {
        self.request.clone()
    }

    /// What the request costs in slots, for the `veil-cost` header of its
    /// POST (one per choice, more for log-probabilities); the entry refuses
    /// a request that costs more than it declared.
    #[wasm_bindgen(getter)]
    pub fn cost(&self) -> u32 {
        self.cost
    }

    /// Starts opening the answer: push its bytes as they arrive, then read
    /// its head and pieces (each authenticated).
    pub fn open(&mut self) -> Result<Opening, JsValue> {
        let opener =
            self.opener.take().ok_or_else(|| error("config", "this answer is already being opened", None, None))?;
        let (tx, rx) = mpsc::unbounded::<std::io::Result<Vec<u8>>>();
        Ok(Opening {
            tx: RefCell::new(Some(tx)),
            state: Rc::new(RefCell::new(State::Unopened(opener, Some(rx)))),
            receipt: Rc::new(RefCell::new(None)),
        })
    }
}

#[derive(Debug)]
enum State {
    Unopened(ResponseOpener, Option<mpsc::UnboundedReceiver<std::io::Result<Vec<u8>>>>),
    Open(Box<OpenedResponse>),
    /// A read is in progress (its future holds the response).
    Busy,
    Ended,
}

/// The answer being opened: JS pushes the bytes the host sends; `head()` and
/// `next()` return authenticated results only.
#[wasm_bindgen]
#[derive(Debug)]
pub struct Opening {
    tx: RefCell<Option<mpsc::UnboundedSender<std::io::Result<Vec<u8>>>>>,
    state: Rc<RefCell<State>>,
    /// The checked receipt (JSON), once a completed answer has ended.
    receipt: Rc<RefCell<Option<String>>>,
}

#[wasm_bindgen]
impl Opening {
    /// The next bytes of the sealed response, as the host sent them.
    pub fn push(&self, bytes: &[u8]) {
        if let Some(tx) = self.tx.borrow().as_ref() {
            let _ = tx.unbounded_send(Ok(bytes.to_vec()));
        }
    }

    /// The host's body ended (cleanly, as far as the transport knows; only
    /// the seal can say whether the answer was complete).
    pub fn finish(&self) {
        self.tx.borrow_mut().take();
    }

    /// The transport failed (the connection dropped).
    pub fn fail(&self, why: &str) {
        if let Some(tx) = self.tx.borrow_mut().take() {
            let _ = tx.unbounded_send(Err(std::io::Error::other(why.to_owned())));
        }
    }

    /// Resolves to the answer's authenticated HTTP status once its head has
    /// opened.
    pub fn head(&self) -> js_sys::Promise {
        let state = self.state.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            let taken = std::mem::replace(&mut *state.borrow_mut(), State::Busy);
            let State::Unopened(opener, Some(rx)) = taken else {
                *state.borrow_mut() = taken;
                return Err(error("config", "head() was already called", None, None));
            };
            let reader: std::pin::Pin<Box<dyn futures::io::AsyncRead + Send>> = Box::pin(rx.into_async_read());
            match opener.open(reader).await {
                Ok(resp) => {
                    let status = resp.status;
                    *state.borrow_mut() = State::Open(Box::new(resp));
                    Ok(JsValue::from(status))
                }
                Err(e) => {
                    *state.borrow_mut() = State::Ended;
                    Err(seal_error(e))
                }
            }
        })
    }

    /// The entry's receipt for a completed answer (JSON), checked against
    /// the verified route, the sealed request and the body: once `next()`
    /// has resolved to `undefined`; `undefined` before, or for an error.
    #[wasm_bindgen(getter)]
    pub fn receipt(&self) -> Option<String> {
        self.receipt.borrow().clone()
    }

    /// Resolves to the next authenticated piece of the body (a
    /// `Uint8Array`), or to `undefined` at its authenticated end; rejects
    /// with kind `truncated` when the host cut or altered it, and kind
    /// `receipt` when a completed answer's receipt is missing or wrong.
    pub fn next(&self) -> js_sys::Promise {
        let state = self.state.clone();
        let receipt = self.receipt.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            let taken = std::mem::replace(&mut *state.borrow_mut(), State::Busy);
            let mut resp = match taken {
                State::Open(resp) => resp,
                State::Ended => {
                    *state.borrow_mut() = State::Ended;
                    return Ok(JsValue::UNDEFINED);
                }
                other => {
                    *state.borrow_mut() = other;
                    return Err(error(
                        "config",
                        "next() before head() resolved, or while another next() runs",
                        None,
                        None,
                    ));
                }
            };
            match resp.next().await {
                Ok(Some(piece)) => {
                    *state.borrow_mut() = State::Open(resp);
                    Ok(js_sys::Uint8Array::from(piece.as_slice()).into())
                }
                Ok(None) => {
                    *receipt.borrow_mut() = resp.receipt().map(|r| r.to_json());
                    *state.borrow_mut() = State::Ended;
                    Ok(JsValue::UNDEFINED)
                }
                Err(e) => {
                    *state.borrow_mut() = State::Ended;
                    Err(seal_error(e))
                }
            }
        })
    }
}
