//! The entry's gateway, served to the (untrusted) host over HTTP/1.1:
//! ciphertext and evidence only.
//!
//! - `GET /v1/attestation[?nonce=HEX]`: the attestation document
//!   ([`AttestationDoc`]): the sealing key configuration, the peer policy
//!   every shard enforces on its links, the route's shape, the entry's
//!   evidence (freshly bound to the nonce when one is given: the nonces that
//!   arrive while one evidence is being built are batched, the claims carry
//!   their Merkle root and each document the inclusion path of its nonce,
//!   `veil_attestation::nonce_batch`; the claims also carry the key
//!   configuration's hash, the peer policy's, the shape's and the drafter's
//!   digests and a commitment to the listed shards) and the evidence of every shard
//!   the entry has verified and holds a live link to, which each client
//!   verifies again against its own policy
//!   (`veil_attestation::route::verify_route`).
//! - `POST /v1/sealed`: a chunked Oblivious HTTP request; the answer streams
//!   back as a chunked Oblivious HTTP response. Inside: the OpenAI API
//!   ([`super::openai`]).
//! - `GET /healthz`: 200 once every stage has a verified shard.
//! - `GET /metrics`: speculation counts across all sessions (rounds, drafted
//!   and kept tokens, committed tokens), Prometheus text; counts only.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use serde_json::json;
use tokio::sync::mpsc;
use veil_attestation::receipt::{route_id, Answered, Digest32, ReceiptSigner};
use veil_attestation::route::{links_commitment, AttestationDoc, DrafterInfo, LinkedShard, RouteShape, DOC_VERSION};
use veil_attestation::{Attester, Claims, Nonce, Policy};

use super::answer::{AnswerCore, Signed, Step};
use super::openai::{self, ApiError, Call, Ids, Kind, Route};
use super::seal::{GatewaySealError, ResponseSealer, SealKey, MAX_SEALED_REQUEST};
use crate::pipeline::entry::format_jobs::FormatRefusal;
use crate::pipeline::entry::{Entry, Failure, GenerateEvent};
use veil_wire::Blame;

use veil_wire::http::{request_cost, ATTESTATION_PATH, COST_HEADER, HEALTH_PATH, JSON_TYPE, METRICS_PATH, SEALED_PATH};
pub use veil_wire::http::{DRAFTER_FIELD, RECEIPT_FIELD, ROUTE_FIELD, SEALED_REQUEST_TYPE, SEALED_RESPONSE_TYPE};

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// What the gateway needs.
pub struct Gateway {
    entry: Arc<Entry>,
    key: SealKey,
    attester: Arc<dyn Attester>,
    claims: Claims,
    model_name: String,
    peer_policy: Arc<Policy>,
    shape: RouteShape,
    /// The drafter this entry speculates with (its digest is in `claims`).
    drafter: DrafterInfo,
    /// Signs a receipt for every answer; its public key is in `claims`.
    receipts: ReceiptSigner,
    /// The route id every receipt names (`route_id` of `claims`, fixed at start).
    route_id: Digest32,
    /// Evidence generations in flight for requests without a nonce: more
    /// get 503, so the attestation endpoint cannot be used to burn the
    /// entry's CPU.
    evidence_permits: Arc<tokio::sync::Semaphore>,
    /// Slots of generation requests in flight (a request holds one per
    /// choice, more for log-probabilities: `veil_wire::http::request_cost`).
    units: Arc<tokio::sync::Semaphore>,
    /// Generation requests refused at the ceiling of `units`.
    shed: std::sync::atomic::AtomicU64,
    /// Nonce-bound requests waiting for the next batch's evidence.
    batch_tx: mpsc::Sender<Waiting>,
    batch_rx: std::sync::Mutex<Option<mpsc::Receiver<Waiting>>>,
}

/// A verifier waiting for evidence over its nonce.
struct Waiting {
    nonce: Nonce,
    reply: tokio::sync::oneshot::Sender<Result<Batched, EvidenceFailure>>,
}

/// Why fresh evidence could not be built (the host gets a 500 and the text).
#[derive(Clone, Debug, thiserror::Error)]
enum EvidenceFailure {
    /// The attester refused or failed.
    #[error("evidence: {0}")]
    Attester(String),
    /// The blocking task that signs it did not finish.
    #[error("evidence task failed")]
    Task,
    /// The batch's root is not a nonce (cannot happen for 32 bytes).
    #[error("batch root: {0}")]
    Root(String),
}

/// What one batch's evidence gives each of its verifiers.
struct Batched {
    evidence: veil_attestation::EvidenceBundle,
    shards: Vec<LinkedShard>,
    path: veil_attestation::nonce_batch::NoncePath,
}

/// Attestation documents without a nonce generated at once; more are
/// refused with 503.
pub const MAX_EVIDENCE_IN_FLIGHT: usize = 4;
/// Nonce-bound attestation requests waiting for a batch; more get 503.
pub const MAX_ATTESTATION_QUEUE: usize = 4096;
/// Slots of generation requests the entry runs at once, whatever the relay
/// lets through: twice a default relay's total (64), so an honest relay's
/// limits bind first.
pub const MAX_UNITS_IN_FLIGHT: u32 = 128;

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").field("model", &self.model_name).finish_non_exhaustive()
    }
}

fn full(status: StatusCode, content_type: &str, body: Vec<u8>) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

fn plain_error(status: StatusCode, message: &str) -> Response<Body> {
    full(status, JSON_TYPE, serde_json::to_vec(&json!({ "error": { "message": message } })).unwrap_or_default())
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

impl Gateway {
    /// A gateway for `entry`, sealing with `key`; fresh evidence comes from
    /// `attester` over `claims` (the entry's, including the key's hash and
    /// the digests of `peer_policy` and `shape`, which the document
    /// publishes) and the digest of `drafter`, which it publishes too, and
    /// the public half of a receipt key generated here.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        entry: Arc<Entry>,
        key: SealKey,
        attester: Arc<dyn Attester>,
        claims: Claims,
        model_name: String,
        peer_policy: Arc<Policy>,
        shape: RouteShape,
        drafter: DrafterInfo,
    ) -> Result<Self, String> {
        let evidence_permits = Arc::new(tokio::sync::Semaphore::new(MAX_EVIDENCE_IN_FLIGHT));
        let receipts = ReceiptSigner::generate().map_err(|e| e.to_string())?;
        let claims = Claims { drafter: Some(drafter.digest()), receipt_key: Some(receipts.public()), ..claims };
        let route_id = route_id(&claims).map_err(|e| e.to_string())?;
        let (batch_tx, batch_rx) = mpsc::channel(MAX_ATTESTATION_QUEUE);
        Ok(Self {
            entry,
            key,
            attester,
            claims,
            model_name,
            peer_policy,
            shape,
            drafter,
            receipts,
            route_id,
            evidence_permits,
            units: Arc::new(tokio::sync::Semaphore::new(MAX_UNITS_IN_FLIGHT as usize)),
            shed: std::sync::atomic::AtomicU64::new(0),
            batch_tx,
            batch_rx: std::sync::Mutex::new(Some(batch_rx)),
        })
    }

    /// Builds evidence for waiting verifiers, a batch at a time: every nonce
    /// waiting when a build starts goes into it (up to
    /// [`veil_attestation::nonce_batch::MAX_BATCH`]), so a lone verifier
    /// waits for no one and a crowd costs one evidence per build, not one
    /// per nonce.
    async fn batch_evidence(self: Arc<Self>, mut waiting: mpsc::Receiver<Waiting>) {
        use veil_attestation::nonce_batch::{batch as tree, leaf, MAX_BATCH};
        while let Some(first) = waiting.recv().await {
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match waiting.try_recv() {
                    Ok(w) => batch.push(w),
                    Err(_) => break,
                }
            }
            // A verifier that left is not worth a leaf.
            batch.retain(|w| !w.reply.is_closed());
            if batch.is_empty() {
                continue;
            }
            let leaves: Vec<[u8; 32]> = batch.iter().map(|w| leaf(&w.nonce)).collect();
            let (root, paths) = tree(&leaves);
            let built = match Nonce::new(root.to_vec()) {
                Ok(claimed) => self.build_evidence(Some(claimed)).await,
                Err(e) => Err(EvidenceFailure::Root(e.to_string())),
            };
            for (w, path) in batch.into_iter().zip(paths) {
                let answer = built.clone().map(|(evidence, shards)| Batched { evidence, shards, path });
                let _ = w.reply.send(answer);
            }
        }
    }

    /// Fresh evidence over `nonce` committing to the shards linked now.
    async fn build_evidence(
        &self,
        nonce: Option<Nonce>,
    ) -> Result<(veil_attestation::EvidenceBundle, Vec<LinkedShard>), EvidenceFailure> {
        // The shards listed are exactly those this fresh evidence commits to.
        let shards = self.linked_shards().await;
        let claims = Claims { nonce, route_links: Some(links_commitment(&shards)), ..self.claims.clone() };
        let attester = self.attester.clone();
        match tokio::task::spawn_blocking(move || attester.evidence(&claims)).await {
            Ok(Ok(b)) => Ok((b, shards)),
            Ok(Err(e)) => Err(EvidenceFailure::Attester(e.to_string())),
            Err(_) => Err(EvidenceFailure::Task),
        }
    }

    /// The shards the entry has verified and holds live links to.
    async fn linked_shards(&self) -> Vec<LinkedShard> {
        self.entry
            .verified_shards()
            .await
            .into_iter()
            .map(|s| LinkedShard { stage: s.stage as u32, replica: s.replica as u32, evidence: s.bundle })
            .collect()
    }

    /// The signed receipt (JSON) for an answer whose whole body hashes to
    /// `response` (`ResponseSealer::content_digest`), naming the route by
    /// the id the entry's evidence attests (`veil_attestation::receipt::route_id`)
    /// and, in `ran`, the drafter that ran and the shards the session ran on.
    fn receipt(&self, request: [u8; 32], response: [u8; 32], tokens: (usize, usize), ran: [&str; 2]) -> String {
        let answered = Answered {
            request: Digest32(request),
            response: Digest32(response),
            model: self.claims.manifest_root.unwrap_or(veil_attestation::ManifestRoot([0; 32])),
            route: self.route_id,
            prompt_tokens: tokens.0 as u64,
            completion_tokens: tokens.1 as u64,
            drafter: ran[0].to_owned(),
            shards: ran[1].to_owned(),
        };
        self.receipts.sign(answered, SystemTime::now()).to_json()
    }

    /// Serves the gateway until the listener fails.
    pub async fn serve(self: Arc<Self>, listener: tokio::net::TcpListener) {
        let waiting = self.batch_rx.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(waiting) = waiting {
            tokio::spawn(self.clone().batch_evidence(waiting));
        }
        loop {
            let (tcp, _) = crate::pipeline::net::accept(&listener).await;
            let gw = self.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let gw = gw.clone();
                    async move { Ok::<_, Infallible>(gw.handle(req).await) }
                });
                let io = hyper_util::rt::TokioIo::new(tcp);
                if let Err(e) = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await {
                    tracing::debug!(error = %e, "gateway connection ended");
                }
            });
        }
    }

    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path().to_owned();
        match (req.method().as_str(), path.as_str()) {
            ("GET", HEALTH_PATH) if self.entry.ready().await => {
                // The supervisor's cluster id (not a secret), so a supervisor
                // knows the ready entry is its own and not another cluster's.
                let id = std::env::var("VEIL_CLUSTER_ID").unwrap_or_default();
                full(StatusCode::OK, "text/plain", format!("ok {id}\n").into_bytes())
            }
            ("GET", HEALTH_PATH) => {
                plain_error(StatusCode::SERVICE_UNAVAILABLE, "waiting for a verified shard per stage")
            }
            ("GET", ATTESTATION_PATH) => self.attestation(req.uri().query()).await,
            ("GET", METRICS_PATH) => full(
                StatusCode::OK,
                "text/plain; version=0.0.4",
                [
                    self.entry.counters().render_with(self.entry.stage_counters()),
                    self.entry.format_counters().render(),
                    self.load_metrics(),
                    format!(
                        "# HELP veil_entry_panics_contained_total Panics that failed one request or batch, not the process.\n# TYPE veil_entry_panics_contained_total counter\nveil_entry_panics_contained_total {}\n",
                        crate::contain::CONTAINED.load(std::sync::atomic::Ordering::Relaxed)
                    ),
                ]
                .concat()
                .into(),
            ),
            ("POST", SEALED_PATH) => self.sealed(req).await,
            _ => plain_error(StatusCode::NOT_FOUND, veil_wire::http::NOT_FOUND_MESSAGE),
        }
    }

    async fn attestation(&self, query: Option<&str>) -> Response<Body> {
        let nonce = query
            .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("nonce=")))
            .map(|h| hex::decode(h).map_err(|e| e.to_string()).and_then(|b| Nonce::new(b).map_err(|e| e.to_string())));
        let nonce = match nonce.transpose() {
            Ok(n) => n,
            Err(e) => return plain_error(StatusCode::BAD_REQUEST, &format!("bad nonce: {e}")),
        };
        let (evidence, shards, nonce_path) = match nonce {
            Some(nonce) => {
                let (reply, answer) = tokio::sync::oneshot::channel();
                if self.batch_tx.try_send(Waiting { nonce, reply }).is_err() {
                    return plain_error(StatusCode::SERVICE_UNAVAILABLE, "attestation busy; retry shortly");
                }
                match answer.await {
                    Ok(Ok(b)) => (b.evidence, b.shards, Some(b.path)),
                    Ok(Err(e)) => return plain_error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
                    Err(_) => return plain_error(StatusCode::INTERNAL_SERVER_ERROR, "evidence batch failed"),
                }
            }
            None => {
                let Ok(_permit) = self.evidence_permits.clone().try_acquire_owned() else {
                    return plain_error(StatusCode::SERVICE_UNAVAILABLE, "attestation busy; retry shortly");
                };
                match self.build_evidence(None).await {
                    Ok((e, s)) => (e, s, None),
                    Err(e) => return plain_error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
                }
            }
        };
        let doc = AttestationDoc {
            version: DOC_VERSION,
            model: self.model_name.clone(),
            key_config: self.key.config().to_vec(),
            peer_policy: (*self.peer_policy).clone(),
            route: self.shape.clone(),
            entry: evidence,
            shards,
            drafter: Some(self.drafter.clone()),
            nonce_path,
        };
        match serde_json::to_vec(&doc) {
            Ok(body) => full(StatusCode::OK, JSON_TYPE, body),
            Err(_) => plain_error(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode the attestation document"),
        }
    }

    async fn sealed(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        // The cost the client declared (the relay charged its share by it);
        // checked against the opened request below.
        let declared = match req.headers().get(COST_HEADER).map(|v| v.to_str().ok().and_then(|v| v.parse::<u32>().ok()))
        {
            None => 1,
            Some(Some(c)) if c >= 1 => c,
            Some(_) => return plain_error(StatusCode::BAD_REQUEST, "a malformed veil-cost header"),
        };
        let body = match Limited::new(req.into_body(), MAX_SEALED_REQUEST).collect().await {
            Ok(b) => b.to_bytes().to_vec(),
            Err(_) => return plain_error(StatusCode::PAYLOAD_TOO_LARGE, "sealed request too large or unreadable"),
        };
        let opened = match self.key.open(body).await {
            Ok(o) => o,
            Err(e) => {
                let status = match e {
                    GatewaySealError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
                    GatewaySealError::Replay => StatusCode::CONFLICT,
                    GatewaySealError::Busy => StatusCode::SERVICE_UNAVAILABLE,
                    GatewaySealError::WrongKey(_) => StatusCode::UNPROCESSABLE_ENTITY,
                    _ => StatusCode::BAD_REQUEST,
                };
                return plain_error(status, &e.to_string());
            }
        };
        let mut sealer = opened.response;
        let Some(mut chunks) = sealer.take_output() else {
            return plain_error(StatusCode::INTERNAL_SERVER_ERROR, "response stream unavailable");
        };
        let request = opened.request;
        let sealed_digest = opened.sealed_digest;
        let control = request.control();
        let method = control.method().unwrap_or_default().to_vec();
        let path = control.path().unwrap_or_default().to_vec();
        let content = request.content().to_vec();
        let gw = self.clone();
        let handling = async move {
            // Templating and tokenizing are CPU work: off the reactor, so
            // heartbeats and other sessions' traffic keep flowing.
            let parser = gw.clone();
            let routed = tokio::task::spawn_blocking(move || {
                let (entry, name) = (&parser.entry, &parser.model_name);
                openai::parse(&method, &path, &content, entry.tokenizer(), name, entry.context())
            })
            .await
            .unwrap_or_else(|_| {
                Err(ApiError {
                    status: 500,
                    kind: "server_error",
                    param: None,
                    message: "request parsing failed".into(),
                })
            });
            let result = match routed {
                Ok(Route::Model) => gw.listing(sealer, sealed_digest, &openai::model_body(&gw.model_name, now())).await,
                Ok(Route::Models) => {
                    gw.listing(sealer, sealed_digest, &openai::models_body(&gw.model_name, now())).await
                }
                Ok(Route::Generate(call)) => {
                    let cost = request_cost(call.n as u32, u32::from(call.request.sampling.logprobs.unwrap_or(0)));
                    let units = match gw.units(cost, declared) {
                        Ok(u) => u,
                        Err(e) => {
                            let _ = respond(sealer, e.status, JSON_TYPE, &e.body()).await;
                            return;
                        }
                    };
                    let _units = units;
                    // The client leaving drops the compile (and kills its worker).
                    let gone = sealer.reader_gone();
                    let vetted = tokio::select! {
                        v = gw.entry.check_format(&call.request.sampling) => Some(v),
                        () = gone => None,
                    };
                    match vetted {
                        None => Ok(()),
                        Some(Err(refused)) => {
                            let e = match refused {
                                FormatRefusal::Busy => ApiError {
                                    status: 503,
                                    kind: "server_error",
                                    param: Some("response_format"),
                                    message: refused.to_string(),
                                },
                                FormatRefusal::Unavailable(_) => ApiError {
                                    status: 500,
                                    kind: "server_error",
                                    param: None,
                                    message: refused.to_string(),
                                },
                                _ => ApiError::invalid("response_format", refused.to_string()),
                            };
                            respond(sealer, e.status, JSON_TYPE, &e.body()).await
                        }
                        Some(Ok(())) => gw.run(*call, sealer, sealed_digest).await,
                    }
                }
                Err(e) => respond(sealer, e.status, JSON_TYPE, &e.body()).await,
            };
            if let Err(e) = result {
                tracing::debug!(error = %e, "sealed response ended early");
            }
        };
        tokio::spawn(crate::contain::contain(handling, "sealed request"));
        let stream = futures::stream::poll_fn(move |cx| {
            chunks.poll_recv(cx).map(|c| c.map(|c| Ok(Frame::data(Bytes::from(c)))))
        });
        let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
        if let Ok(v) = SEALED_RESPONSE_TYPE.parse() {
            r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
        }
        r
    }

    /// The slots a request of `cost` holds while it runs: refused when it
    /// costs more than the client `declared` (so the relay's per-client
    /// share, charged by the declaration, holds), or when the entry's own
    /// ceiling is reached (the relay is the host's, and may not limit).
    fn units(&self, cost: u32, declared: u32) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
        if cost > declared {
            return Err(ApiError::invalid(
                "n",
                format!("this request costs {cost} slots (n and top_logprobs) but its {COST_HEADER} header declared {declared}"),
            ));
        }
        self.units.clone().try_acquire_many_owned(cost).map_err(|_| {
            self.shed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            ApiError {
                status: 503,
                kind: "server_error",
                param: None,
                message: format!("the entry is at its ceiling of {MAX_UNITS_IN_FLIGHT} slots in flight; retry later"),
            }
        })
    }

    /// The entry's own load: slots held and requests shed at its ceiling.
    fn load_metrics(&self) -> String {
        let held = MAX_UNITS_IN_FLIGHT as usize - self.units.available_permits();
        let shed = self.shed.load(std::sync::atomic::Ordering::Relaxed);
        format!(
            "# HELP veil_entry_slots_in_use Slots held by generation requests at the entry.\n# TYPE veil_entry_slots_in_use gauge\nveil_entry_slots_in_use {held}\n\
             # HELP veil_entry_shed_total Generation requests refused at the entry's ceiling ({MAX_UNITS_IN_FLIGHT} slots).\n# TYPE veil_entry_shed_total counter\nveil_entry_shed_total {shed}\n"
        )
    }

    /// A model listing: a completed answer, so it carries a receipt too
    /// (no tokens, no shards).
    async fn listing(&self, mut sealer: ResponseSealer, sealed: [u8; 32], body: &[u8]) -> Result<(), GatewaySealError> {
        sealer.head(200, &[("content-type", JSON_TYPE)]).await?;
        sealer.body(&openai::pad_body(body.to_vec())).await?;
        let receipt = self.receipt(sealed, sealer.content_digest(), (0, 0), ["none", ""]);
        sealer.finish_with_trailer(&[(RECEIPT_FIELD, receipt.as_str())]).await
    }

    /// Runs a generation call: one session per choice (seeds `seed + i`),
    /// their events through an [`AnswerCore`], its steps into the sealer.
    async fn run(&self, call: Call, mut sealer: ResponseSealer, sealed: [u8; 32]) -> Result<(), GatewaySealError> {
        let (tx, mut rx) = mpsc::unbounded_channel::<(usize, GenerateEvent)>();
        let (routes_tx, mut routes_rx) = mpsc::unbounded_channel();
        // Each choice's events tagged with the choice. Dropping `rx` (the
        // client left, or the answer is whole) ends every session at its
        // next event.
        for i in 0..call.n {
            let mut req = call.request.clone();
            req.sampling.seed = req.sampling.seed.wrapping_add(i as u64);
            let (choice_tx, mut choice_rx) = mpsc::unbounded_channel();
            let (entry, routes, tx) = (self.entry.clone(), routes_tx.clone(), tx.clone());
            tokio::spawn(async move {
                let failed = choice_tx.clone();
                let ran = crate::contain::contain(entry.generate_traced(req, choice_tx, Some(routes)), "a session");
                if ran.await.is_none() {
                    let message = "the session failed (an internal fault)".into();
                    let _ = failed.send(GenerateEvent::Error(Failure { message, blame: Blame::Internal }));
                }
            });
            tokio::spawn(async move {
                while let Some(ev) = choice_rx.recv().await {
                    if tx.send((i, ev)).is_err() {
                        break;
                    }
                }
            });
        }
        drop((tx, routes_tx));
        let prefix = if call.kind == Kind::Chat { "chatcmpl-" } else { "cmpl-" };
        let ids = Ids {
            id: format!("{prefix}{}", hex::encode(&Nonce::random().as_bytes()[..12])),
            created: now(),
            model: call.model.clone(),
        };
        let mut core = AnswerCore::new(&call, ids, self.entry.tokenizer());
        let mut steps = core.start();
        loop {
            for step in steps {
                match step {
                    Step::Finish { receipt, trailer } => return self.finish(sealer, sealed, receipt, trailer).await,
                    Step::Head { status, fields } => {
                        let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
                        sealer.head(status, &fields).await?;
                    }
                    Step::Body(chunk) => sealer.body(&chunk).await?,
                }
            }
            // The client may leave before the answer is whole: then the
            // sessions end and their slots are free.
            let ev = tokio::select! {
                ev = rx.recv() => ev,
                () = sealer.reader_gone() => {
                    return Err(GatewaySealError::Response("the client left before the answer was whole".into()));
                }
            };
            while let Ok(route) = routes_rx.try_recv() {
                core.route(route);
            }
            steps = match ev {
                Some((i, ev)) => core.event(i, ev),
                None => core.ended(),
            };
        }
    }

    /// Ends a sealed answer; with `receipt`, signs one over the body
    /// sealed so far and adds it to the trailer.
    async fn finish(
        &self,
        sealer: ResponseSealer,
        sealed: [u8; 32],
        receipt: Option<Signed>,
        mut trailer: Vec<(&'static str, String)>,
    ) -> Result<(), GatewaySealError> {
        if let Some(r) = receipt {
            let receipt = self.receipt(sealed, sealer.content_digest(), r.tokens, [&r.drafter, &r.route]);
            trailer.push((RECEIPT_FIELD, receipt));
        }
        let trailer: Vec<(&str, &str)> = trailer.iter().map(|(k, v)| (*k, v.as_str())).collect();
        sealer.finish_with_trailer(&trailer).await
    }
}

async fn respond(
    mut sealer: ResponseSealer,
    status: u16,
    content_type: &str,
    body: &[u8],
) -> Result<(), GatewaySealError> {
    sealer.head(status, &[("content-type", content_type)]).await?;
    // JSON bodies (answers, errors, model lists) are padded to a bucket.
    let body = if content_type == JSON_TYPE { openai::pad_body(body.to_vec()) } else { body.to_vec() };
    sealer.body(&body).await?;
    sealer.finish().await
}
