//! `veil._native`: the Rust client SDK for Python. The Python package
//! (`veil/__init__.py`) wraps it: `veil.verify`, `veil.Client`,
//! `veil.openai`. Everything that decides trust runs here, in the same Rust
//! code as the `veil` CLI: the route's attestation, the policy, the seal to
//! the attested entry and the opening of the answer. Python sees a request's
//! plaintext only in its own process, and a response only once the seal
//! authenticated it.
//!
//! Every network wait releases the GIL (other threads and an asyncio loop's
//! worker threads run meanwhile) and checks for signals every 100 ms, so
//! Ctrl-C interrupts a wait with `KeyboardInterrupt`.

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use veil_client::sdk::{Client, ClientError, ConnectOptions, Retries, TextStream, Timeouts};
use veil_client::seal::{OpenedResponse, SealError};

create_exception!(_native, VeilError, PyException, "Any failure of a Veil call. Subclasses say whose fault it is.");
create_exception!(
    _native,
    ConfigError,
    VeilError,
    "The caller's setup is wrong (a URL, a policy or CA file, a body that does not encode); the host is not involved."
);
create_exception!(
    _native,
    Unreachable,
    VeilError,
    "The host could not be reached, or the connection dropped before an answer."
);
create_exception!(
    _native,
    ProtocolError,
    VeilError,
    "The host answered outside the protocol (a status, document or event that does not parse)."
);
create_exception!(
    _native,
    RouteRejected,
    VeilError,
    "The route failed verification: nothing was sent. `checks` holds the check table that failed."
);
create_exception!(
    _native,
    AttestationError,
    RouteRejected,
    "A shard's hardware evidence failed the policy (`who` names it; `checks` is its table). Nothing was sent."
);
create_exception!(
    _native,
    Refused,
    VeilError,
    "The host refused the sealed request with an HTTP status (unauthenticated: only a fresh verification tells a key rotation from a lie). `status` holds it."
);
create_exception!(
    _native,
    ApiError,
    VeilError,
    "The attested entry answered with an OpenAI-shaped error inside the seal (a bad parameter): the caller's to fix. `status` holds it."
);
create_exception!(
    _native,
    Truncated,
    VeilError,
    "The sealed response did not open to its authenticated end: the host cut it short or altered it. What came before was authentic; the answer is incomplete."
);
create_exception!(
    _native,
    ReceiptError,
    VeilError,
    "The answer opened to its authenticated end, but the entry's receipt for it is missing or fails a check (`check` names it): the attested entry did not sign for this request, this answer and the verified route."
);
create_exception!(
    _native,
    Timeout,
    VeilError,
    "The host did not answer within the client's limit for a stage (`stage`). Nothing is retried."
);

/// One runtime for every call of the process: two workers drive the
/// connections while Python threads wait in `block_on` with the GIL released.
fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("veil-io")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| VeilError::new_err(format!("cannot start the I/O runtime: {e}")))
}

/// Runs `fut` to completion with the GIL released, checking for signals
/// (Ctrl-C) every 100 ms; a pending signal's exception ends the wait and
/// drops the future (closing its connection).
fn wait<F>(py: Python<'_>, fut: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    let rt = runtime()?;
    py.detach(|| {
        rt.block_on(async {
            let mut fut = std::pin::pin!(fut);
            loop {
                tokio::select! {
                    out = &mut fut => return Ok(out),
                    () = tokio::time::sleep(Duration::from_millis(100)) => {
                        Python::attach(|py| py.check_signals())?;
                    }
                }
            }
        })
    })
}

/// A Python exception of the class that says whose fault `e` is, with the
/// fields a program branches on as attributes (`checks`: the check table of
/// a refused route, else `None`; `who`, `status`, `stage` where they apply).
fn py_error(py: Python<'_>, e: ClientError) -> PyErr {
    let message = e.to_string();
    let err = match &e {
        ClientError::Config(_) => ConfigError::new_err(message),
        ClientError::Unreachable(_) => Unreachable::new_err(message),
        ClientError::Attestation { .. } => AttestationError::new_err(message),
        ClientError::RouteRejected(_) | ClientError::Route(_) => RouteRejected::new_err(message),
        ClientError::Refused { .. } => Refused::new_err(message),
        ClientError::Api { .. } => ApiError::new_err(message),
        ClientError::Seal(SealError::Open(_)) => Truncated::new_err(message),
        ClientError::Seal(SealError::Receipt(_)) => ReceiptError::new_err(message),
        ClientError::Seal(SealError::Stalled(_)) | ClientError::Timeout { .. } => Timeout::new_err(message),
        _ => ProtocolError::new_err(message),
    };
    let attributes = {
        let value = err.value(py);
        let set = || -> PyResult<()> {
            value.setattr("checks", e.check_table())?;
            match &e {
                ClientError::Attestation { who, .. } => value.setattr("who", who),
                ClientError::Refused { status, .. } | ClientError::Api { status, .. } => {
                    value.setattr("status", *status)
                }
                ClientError::Timeout { stage, .. } => value.setattr("stage", stage.to_string()),
                ClientError::Seal(SealError::Stalled(_)) => value.setattr("stage", "between response chunks"),
                ClientError::Seal(SealError::Receipt(f)) => value.setattr("check", f.check.name()),
                _ => Ok(()),
            }
        };
        set()
    };
    match attributes {
        Ok(()) => err,
        Err(failed) => failed,
    }
}

fn seal_error(py: Python<'_>, e: SealError) -> PyErr {
    py_error(py, ClientError::Seal(e))
}

/// A verified route: what `veil verify` shows, as values.
#[pyclass(module = "veil._native", frozen)]
#[derive(Debug)]
struct Route {
    /// `veil verify --json`'s document.
    json: String,
    /// The check tables as `veil verify` prints them.
    #[pyo3(get)]
    checks: String,
    /// Whether any shard's evidence (or GPU's) is simulated.
    #[pyo3(get)]
    simulated: bool,
    /// How many shards presented simulated evidence.
    #[pyo3(get)]
    simulated_shards: usize,
    /// Every warning a reviewer must see.
    #[pyo3(get)]
    warnings: Vec<String>,
    /// The model the route serves.
    #[pyo3(get)]
    model: String,
    /// `ACCEPTED`, with the simulated notice where there is one.
    #[pyo3(get)]
    verdict: String,
    /// The route document as verified, with the nonce and the time (JSON):
    /// what `veil receipt verify --route` checks receipts against.
    #[pyo3(get)]
    saved: String,
}

impl Route {
    fn new(route: &veil_client::sdk::VerifiedRoute, saved: &veil_attestation::receipt::SavedRoute) -> Self {
        let json = veil_client::report::route_json(route);
        Self {
            checks: veil_client::report::route_text(route),
            simulated: route.simulated_count() > 0,
            simulated_shards: route.simulated_count(),
            warnings: veil_client::report::route_warnings(route),
            model: route.model().to_owned(),
            verdict: json["verdict"].as_str().unwrap_or_default().to_owned(),
            json: json.to_string(),
            saved: serde_json::to_string(saved).unwrap_or_default(),
        }
    }
}

#[pymethods]
impl Route {
    /// The whole verdict as JSON (the document `veil verify --json` prints).
    fn to_json(&self) -> String {
        self.json.clone()
    }

    fn __repr__(&self) -> String {
        format!("<veil.Route {:?}: {}>", self.model, self.verdict)
    }
}

/// A verified connection to a Veil host.
#[pyclass(module = "veil._native", frozen)]
#[derive(Debug)]
struct NativeClient {
    policy: veil_attestation::Policy,
    options: ConnectOptions,
    /// Replaced when the entry restarted with a new (attested) key.
    client: Mutex<Arc<Client>>,
}

fn seconds(what: &str, s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| ConfigError::new_err(format!("{what} must be a positive number of seconds, not {s}")))
}

#[pymethods]
impl NativeClient {
    /// Fetches the route's attestation with a fresh nonce and verifies every
    /// shard against the policy file (TOML, or a signed bundle with
    /// `policy_key`, found in the transparency log `log` under `log_key` and
    /// `witnesses_required` of `witnesses`, or `unlogged`). Raises before
    /// anything is sent when it fails.
    #[new]
    #[pyo3(signature = (url, policy, *, policy_key=None, log=None, log_key=None, witnesses=Vec::new(), witnesses_required=0, unlogged=false, ca=None, attest_timeout=30.0, first_byte_timeout=300.0, between_chunks_timeout=120.0, retries=3))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        url: &str,
        policy: PathBuf,
        policy_key: Option<PathBuf>,
        log: Option<String>,
        log_key: Option<PathBuf>,
        witnesses: Vec<PathBuf>,
        witnesses_required: usize,
        unlogged: bool,
        ca: Option<PathBuf>,
        attest_timeout: f64,
        first_byte_timeout: f64,
        between_chunks_timeout: f64,
        retries: u32,
    ) -> PyResult<Self> {
        let log = veil_client::cli::LogTrustArgs { source: log, log_key, witnesses, witnesses_required, unlogged };
        let policy = py
            .detach(|| veil_client::cli::policy_bundle::load_policy(&policy, policy_key.as_deref(), &log))
            .map_err(|e| ConfigError::new_err(e.to_string()))?;
        let mut options = ConnectOptions {
            timeouts: Timeouts {
                attest: seconds("attest_timeout", attest_timeout)?,
                first_byte: seconds("first_byte_timeout", first_byte_timeout)?,
                between_chunks: seconds("between_chunks_timeout", between_chunks_timeout)?,
            },
            retries: Retries { max: retries, ..Retries::default() },
            ..ConnectOptions::default()
        };
        if let Some(ca) = ca {
            options = options.with_ca_file(&ca).map_err(|e| py_error(py, e))?;
        }
        let client = wait(py, Client::connect_with(url, &policy, &options))?.map_err(|e| py_error(py, e))?;
        Ok(Self { policy, options, client: Mutex::new(Arc::new(client)) })
    }

    /// The verified route.
    fn route(&self) -> Route {
        let client = self.current();
        Route::new(client.route(), client.saved_route())
    }

    /// Sends one API call sealed to the entry and returns the response once
    /// its head opens. A call shed for load (429 or 503) is sealed again and
    /// re-sent up to `retries` times. When the host refused it otherwise or
    /// the connection failed, the route is verified again and the call
    /// re-sent only if the entry's attested key changed (a restart).
    fn call(&self, py: Python<'_>, method: &str, path: &str, body: Vec<u8>) -> PyResult<NativeResponse> {
        let client = self.current();
        let answer = wait(py, client.call_reverifying(&self.policy, &self.options, method, path, body))?;
        let (resp, fresh) = answer.map_err(|e| py_error(py, e))?;
        if let Some(fresh) = fresh {
            *self.client.lock().unwrap_or_else(PoisonError::into_inner) = Arc::new(fresh);
        }
        Ok(NativeResponse::new(resp))
    }

    /// [`call`](Self::call) of a streamed answer (`"stream": true` in the
    /// body), read as text pieces.
    fn stream(&self, py: Python<'_>, path: &str, body: Vec<u8>) -> PyResult<NativeTextStream> {
        let resp = self.call(py, "POST", path, body)?;
        let Some(resp) = resp.take() else {
            return Err(VeilError::new_err("the response was already read"));
        };
        let stream = wait(py, TextStream::new(resp))?.map_err(|e| py_error(py, e))?;
        Ok(NativeTextStream { inner: Mutex::new(Some(stream)), end: EndSlot::default() })
    }
}

impl NativeClient {
    fn current(&self) -> Arc<Client> {
        self.client.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// What a response said about itself once read to its authenticated end
/// (all `None` before): the route and drafter the entry reports (inside the
/// seal), and for a stream its finish reason and token counts (JSON).
#[pyclass(module = "veil._native", frozen, get_all)]
#[derive(Debug, Clone, Default)]
struct Ending {
    route_used: Option<String>,
    drafter_used: Option<String>,
    finish_reason: Option<String>,
    usage: Option<String>,
    receipt: Option<String>,
}

/// Where a reader leaves its [`Ending`].
#[derive(Debug, Default)]
struct EndSlot(Mutex<Option<Ending>>);

impl EndSlot {
    fn get(&self) -> Ending {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone().unwrap_or_default()
    }

    fn set(&self, ending: Ending) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(ending);
    }
}

/// An opened response: its authenticated status and headers, then the body
/// piece by piece.
#[pyclass(module = "veil._native", frozen)]
#[derive(Debug)]
struct NativeResponse {
    /// The status inside the seal.
    #[pyo3(get)]
    status: u16,
    /// The headers inside the seal, names in lower case.
    #[pyo3(get)]
    headers: Vec<(String, String)>,
    /// Taken out while a piece is read (never held across a wait).
    inner: Mutex<Option<OpenedResponse>>,
    end: EndSlot,
}

impl NativeResponse {
    fn new(resp: OpenedResponse) -> Self {
        Self {
            status: resp.status,
            headers: resp.fields.clone(),
            inner: Mutex::new(Some(resp)),
            end: EndSlot::default(),
        }
    }

    fn take(&self) -> Option<OpenedResponse> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

#[pymethods]
impl NativeResponse {
    /// The next authenticated piece of the body; `None` at its
    /// authenticated end. Raises `Truncated` when the host cut or altered it.
    fn read<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let Some(mut resp) = self.take() else {
            return Ok(None);
        };
        match wait(py, async {
            let piece = resp.next().await;
            (resp, piece)
        })? {
            (resp, Ok(Some(piece))) => {
                *self.inner.lock().unwrap_or_else(PoisonError::into_inner) = Some(resp);
                Ok(Some(PyBytes::new(py, &piece)))
            }
            (resp, Ok(None)) => {
                self.end.set(Ending {
                    route_used: resp.route_used().map(str::to_owned),
                    drafter_used: resp.drafter_used().map(str::to_owned),
                    receipt: resp.receipt().map(|r| r.to_json()),
                    ..Ending::default()
                });
                Ok(None)
            }
            (_, Err(e)) => Err(seal_error(py, e)),
        }
    }

    /// Stops reading (the connection closes).
    fn close(&self) {
        drop(self.take());
    }

    /// What the response said about itself, once read to its end.
    #[getter]
    fn ending(&self) -> Ending {
        self.end.get()
    }
}

/// A streamed answer as text pieces.
#[pyclass(module = "veil._native", frozen)]
#[derive(Debug)]
struct NativeTextStream {
    inner: Mutex<Option<TextStream>>,
    end: EndSlot,
}

#[pymethods]
impl NativeTextStream {
    /// The next piece of text; `None` at the authenticated end of the
    /// stream. Raises `Truncated` when the host cut or altered it, and
    /// `ApiError` for an error event.
    fn next_text(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let Some(mut stream) = self.inner.lock().unwrap_or_else(PoisonError::into_inner).take() else {
            return Ok(None);
        };
        match wait(py, async {
            let piece = stream.next_text().await;
            (stream, piece)
        })? {
            (stream, Ok(Some(text))) => {
                *self.inner.lock().unwrap_or_else(PoisonError::into_inner) = Some(stream);
                Ok(Some(text))
            }
            (stream, Ok(None)) => {
                let resp = stream.response();
                self.end.set(Ending {
                    route_used: resp.route_used().map(str::to_owned),
                    drafter_used: resp.drafter_used().map(str::to_owned),
                    finish_reason: stream.finish_reason().map(str::to_owned),
                    usage: stream.usage().map(ToString::to_string),
                    receipt: resp.receipt().map(|r| r.to_json()),
                });
                Ok(None)
            }
            (_, Err(e)) => Err(py_error(py, e)),
        }
    }

    /// Stops reading (the connection closes; the entry cancels the request).
    fn close(&self) {
        drop(self.inner.lock().unwrap_or_else(PoisonError::into_inner).take());
    }

    /// What the stream said about itself, once it ended.
    #[getter]
    fn ending(&self) -> Ending {
        self.end.get()
    }
}

/// The module `veil._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<Route>()?;
    m.add_class::<NativeClient>()?;
    m.add_class::<NativeResponse>()?;
    m.add_class::<NativeTextStream>()?;
    m.add_class::<Ending>()?;
    m.add("VeilError", py.get_type::<VeilError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("Unreachable", py.get_type::<Unreachable>())?;
    m.add("ProtocolError", py.get_type::<ProtocolError>())?;
    m.add("RouteRejected", py.get_type::<RouteRejected>())?;
    m.add("AttestationError", py.get_type::<AttestationError>())?;
    m.add("Refused", py.get_type::<Refused>())?;
    m.add("ApiError", py.get_type::<ApiError>())?;
    m.add("ReceiptError", py.get_type::<ReceiptError>())?;
    m.add("Truncated", py.get_type::<Truncated>())?;
    m.add("Timeout", py.get_type::<Timeout>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
