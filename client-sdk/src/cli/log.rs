//! `veil log …`: the transparency log of policy bundles
//! ([`veil_attestation::tlog`]), and [`require_logged`], which every
//! `--policy` flag runs on a signed bundle: the bundle must be in the log at
//! a checkpoint signed by the log's key (and cosigned by the witnesses
//! required) that extends the last checkpoint this client accepted, and must
//! not differ from a bundle of the same version accepted before.

use std::path::Path;

use veil_attestation::policy_bundle;
use veil_attestation::tlog::http::{self, ProofWire};
use veil_attestation::tlog::store::{self, LogDir};
use veil_attestation::tlog::{
    self, Hash, KeyKind, LogError, LogSource, LogState, LogTrust, Note, NoteSigner, NoteVerifier,
};

use super::error::CliError;
use super::{
    Exit, LogAppendArgs, LogCommand, LogCosignArgs, LogInitArgs, LogKeygenArgs, LogProveArgs, LogServeArgs,
    LogTrustArgs, LogVerifyArgs,
};

/// The relying party's log state in its state directory.
const STATE: &str = "transparency-log.json";
/// Largest answer read from a log over HTTP.
const MAX_ANSWER: usize = tlog::MAX_ENTRY_BYTES + 4096;

/// A log read over HTTP (`veil log serve`, or a host's `/v1/log`).
struct HttpLog {
    base: String,
    http: crate::sdk::HttpClient,
    rt: tokio::runtime::Runtime,
}

impl HttpLog {
    fn new(url: &str) -> Result<Self, LogError> {
        let unavailable = |e: &dyn std::fmt::Display| LogError::Unavailable(format!("{url}: {e}"));
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| unavailable(&e))?;
        let http = crate::sdk::ConnectOptions::default()
            .http_client(url.starts_with("https://"))
            .map_err(|e| unavailable(&e))?;
        Ok(Self { base: url.trim_end_matches('/').to_owned(), http, rt })
    }

    /// GET `path`: the body of a 2xx answer; `Ok(Err(status))` for a 404.
    fn fetch(&self, path: &str) -> Result<Result<Vec<u8>, u16>, LogError> {
        use http_body_util::{BodyExt as _, Limited};
        let url = format!("{}{path}", self.base);
        let fail = |e: &dyn std::fmt::Display| LogError::Unavailable(format!("GET {url}: {e}"));
        let uri: hyper::Uri = url.parse().map_err(|e| fail(&e))?;
        self.rt.block_on(async {
            let fetch = async {
                let resp = self.http.get(uri).await.map_err(|e| fail(&e))?;
                let status = resp.status();
                let body = Limited::new(resp.into_body(), MAX_ANSWER).collect().await.map_err(|e| fail(&e))?;
                let body = body.to_bytes().to_vec();
                if status == hyper::StatusCode::NOT_FOUND {
                    return Ok(Err(status.as_u16()));
                }
                if !status.is_success() {
                    let why = String::from_utf8_lossy(&body[..body.len().min(200)]).trim().to_owned();
                    return Err(fail(&format!("{status}: {why}")));
                }
                Ok(Ok(body))
            };
            tokio::time::timeout(std::time::Duration::from_secs(30), fetch).await.map_err(|_| fail(&"timed out"))?
        })
    }

    fn get(&self, path: &str) -> Result<Vec<u8>, LogError> {
        self.fetch(path)?.map_err(|_| LogError::Unavailable(format!("GET {}{path}: 404 Not Found", self.base)))
    }

    fn proof(&self, body: &[u8]) -> Result<ProofWire, LogError> {
        serde_json::from_slice(body).map_err(|e| LogError::Malformed(format!("proof: {e}")))
    }
}

impl LogSource for HttpLog {
    fn checkpoint(&self) -> Result<Vec<u8>, LogError> {
        self.get("/checkpoint")
    }

    fn inclusion(&self, leaf: &Hash, size: u64) -> Result<(u64, Vec<Hash>), LogError> {
        // 404: the log says the entry is not in it.
        let body = self
            .fetch(&format!("/proof/inclusion?leaf={}&size={size}", hex::encode(leaf.0)))?
            .map_err(|_| LogError::Inclusion { size })?;
        let p = self.proof(&body)?;
        let index = p.index.ok_or_else(|| LogError::Malformed("an inclusion proof without its index".into()))?;
        Ok((index, p.decode()?))
    }

    fn consistency(&self, old: u64, size: u64) -> Result<Vec<Hash>, LogError> {
        self.proof(&self.get(&format!("/proof/consistency?from={old}&size={size}"))?)?.decode()
    }

    fn entry(&self, index: u64) -> Result<Vec<u8>, LogError> {
        self.get(&format!("/entry/{index}"))
    }
}

/// Whether a `--log` value is a URL (else a directory).
fn is_url(spec: &str) -> bool {
    spec.starts_with("http://") || spec.starts_with("https://")
}

fn source(spec: &str) -> Result<Box<dyn LogSource>, LogError> {
    if is_url(spec) {
        Ok(Box::new(HttpLog::new(spec)?))
    } else {
        Ok(Box::new(LogDir::open(Path::new(spec))?))
    }
}

fn verifier(path: &Path, kind: KeyKind) -> Result<NoteVerifier, CliError> {
    let text = std::fs::read_to_string(path).map_err(CliError::read(path))?;
    let v = NoteVerifier::parse(&text).map_err(CliError::malformed(path))?;
    if v.kind() != kind {
        return Err(CliError::Usage(format!("{}: a {kind:?} key was expected", path.display())));
    }
    Ok(v)
}

/// The log and its trusted keys from the flags.
fn trust(args: &LogTrustArgs) -> Result<(String, LogTrust), CliError> {
    let (Some(spec), Some(key)) = (&args.source, &args.log_key) else {
        return Err(CliError::Usage(
            "a signed policy bundle must be in a transparency log: give --log URL|DIR and --log-key FILE \
             (or --unlogged to accept it without one)"
                .into(),
        ));
    };
    let log = verifier(key, KeyKind::Log)?;
    let witnesses = args.witnesses.iter().map(|w| verifier(w, KeyKind::Witness)).collect::<Result<Vec<_>, _>>()?;
    // A witness is counted once per public key, whatever names it is listed under.
    let mut same = Vec::new();
    for (i, w) in witnesses.iter().enumerate() {
        if let Some(j) = witnesses[..i].iter().position(|v| v.public_key() == w.public_key()) {
            same.push(format!("{} and {}", args.witnesses[j].display(), args.witnesses[i].display()));
        }
    }
    let trust = LogTrust { log, witnesses, required: args.witnesses_required };
    let distinct = trust.witness_keys().len();
    if args.witnesses_required > distinct {
        let same = if same.is_empty() {
            String::new()
        } else {
            format!(" (one public key under two names counts once: {})", same.join(", "))
        };
        return Err(CliError::Usage(format!(
            "--witnesses-required {} but only {distinct} distinct witness key(s) given{same}",
            args.witnesses_required,
        )));
    }
    if !same.is_empty() {
        eprintln!(
            "WARNING: --witness {}: the same public key under two names, counted as one witness",
            same.join(", ")
        );
    }
    Ok((spec.clone(), trust))
}

fn read_state(path: &Path) -> Result<LogState, CliError> {
    match std::fs::read(path) {
        Ok(b) => serde_json::from_slice(&b).map_err(CliError::malformed(path)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(LogState::default()),
        Err(e) => Err(CliError::read(path)(e)),
    }
}

fn write_state(path: &Path, state: &LogState) -> Result<(), CliError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(CliError::io(dir))?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, serde_json::to_vec_pretty(state).map_err(CliError::failed)?).map_err(CliError::io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(CliError::io(path))
}

/// Runs `f` on a thread of its own: the HTTP source keeps its own runtime,
/// which cannot run inside a caller's.
fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| s.spawn(f).join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
}

/// Where a bundle was found.
#[derive(Debug)]
pub struct Found {
    /// The log's origin.
    pub origin: String,
    /// The bundle's index.
    pub index: u64,
    /// The checkpoint's size.
    pub size: u64,
}

/// Requires `bundle` (opened: `publisher`, `version`) to be in the log the
/// flags name; keeps the checkpoint and the bundle's digest in `state_dir`.
pub fn require_logged(
    bundle: &[u8],
    publisher: &str,
    version: u64,
    args: &LogTrustArgs,
    state_dir: &Path,
) -> Result<Found, CliError> {
    let (spec, trust) = trust(args)?;
    let path = state_dir.join(STATE);
    let mut state = read_state(&path)?;
    state.check_bundle(publisher, version, bundle).map_err(CliError::failed)?;
    let logged = off_runtime(|| {
        let log = source(&spec)?;
        state.check_logged(bundle, &trust, log.as_ref())
    })
    .map_err(CliError::failed)?;
    state.accept(&logged.checkpoint);
    state.accept_bundle(publisher, version, bundle);
    write_state(&path, &state)?;
    Ok(Found { origin: logged.checkpoint.origin, index: logged.index, size: logged.checkpoint.size })
}

/// Requires `bundle` (signed by `publisher`) to be the newest version its
/// publisher has in the log the flags name: the checkpoint verified as for
/// [`require_logged`] (extending the one this client last accepted, read
/// from `state_dir` and not written back), the bundle's inclusion proof, and
/// every entry read to find the publisher's highest version. Writes nothing.
pub fn require_newest(
    bundle: &[u8],
    publisher: &p256::PublicKey,
    args: &LogTrustArgs,
    state_dir: &Path,
) -> Result<tlog::Newest, CliError> {
    let (spec, trust) = trust(args)?;
    let state = read_state(&state_dir.join(STATE))?;
    off_runtime(|| state.check_newest(bundle, publisher, &trust, source(&spec)?.as_ref())).map_err(CliError::failed)
}

/// Whether `e` is a log's answer that was checked and refused (a rejection),
/// rather than a log that could not be read or understood.
pub fn is_refusal(e: &CliError) -> bool {
    matches!(e, CliError::Failed(b) if b.downcast_ref::<LogError>().is_some_and(refused))
}

/// Appends a signed bundle (verified with `publisher`) to the log in `dir`,
/// refusing it when the log holds another bundle of the same version from
/// that publisher. Returns its index and the checkpoint's size.
pub fn append_bundle(dir: &Path, bundle: &[u8], publisher: &p256::PublicKey) -> Result<(u64, u64), CliError> {
    let log = LogDir::open(dir).map_err(CliError::failed)?;
    let opened = policy_bundle::open(bundle, &[*publisher], |_| None).map_err(CliError::failed)?;
    let cp = log.current().map_err(CliError::failed)?;
    let mut state = LogState::default();
    let signer = opened.signer.to_string();
    for i in 0..cp.size {
        let entry = log.entry(i).map_err(CliError::failed)?;
        if policy_bundle::is_bundle(&entry) {
            if let Ok(o) = policy_bundle::open(&entry, &[*publisher], |_| None) {
                state.accept_bundle(&signer, o.version, &entry);
            }
        }
    }
    state.check_bundle(&signer, opened.version, bundle).map_err(CliError::failed)?;
    let (index, cp) = log.append(bundle).map_err(CliError::failed)?;
    Ok((index, cp.size))
}

/// `veil log …`
pub fn run(command: &LogCommand) -> Exit {
    let (name, result) = match command {
        LogCommand::Init(a) => ("init", init(a)),
        LogCommand::Keygen(a) => ("keygen", keygen(a)),
        LogCommand::Append(a) => ("append", append(a)),
        LogCommand::Serve(a) => ("serve", serve(a)),
        LogCommand::Prove(a) => ("prove", prove(a)),
        LogCommand::Verify(a) => ("verify", verify_log(a)),
        LogCommand::Cosign(a) => ("cosign", cosign(a)),
    };
    match result {
        Ok(exit) => exit,
        Err(e) => {
            eprintln!("veil log {name}: {e}");
            // A log that answered and was refused is a rejection; anything else, unreadable input.
            if is_refusal(&e) {
                Exit::Rejected
            } else {
                Exit::Unreadable
            }
        }
    }
}

fn refused(e: &LogError) -> bool {
    !matches!(e, LogError::Malformed(_) | LogError::Unavailable(_))
}

fn init(args: &LogInitArgs) -> Result<Exit, CliError> {
    let (_, vkey) = LogDir::create(&args.dir, &args.origin).map_err(CliError::failed)?;
    println!("{vkey}");
    eprintln!("log {} created in {} (private key log.key, verifier key log.vkey)", args.origin, args.dir.display());
    Ok(Exit::Accepted)
}

fn keygen(args: &LogKeygenArgs) -> Result<Exit, CliError> {
    let signer = NoteSigner::generate(&args.name, KeyKind::Witness).map_err(CliError::failed)?;
    store::write_private(&args.out, signer.private_text().as_bytes()).map_err(CliError::io(&args.out))?;
    let public = args.out.with_extension("vkey");
    std::fs::write(&public, format!("{}\n", signer.verifier())).map_err(CliError::io(&public))?;
    println!("{}", signer.verifier());
    eprintln!("witness key {} (keep it secret), verifier key {}", args.out.display(), public.display());
    Ok(Exit::Accepted)
}

fn append(args: &LogAppendArgs) -> Result<Exit, CliError> {
    let log = LogDir::open(&args.dir).map_err(CliError::failed)?;
    let publisher = match &args.policy_key {
        Some(p) => {
            let pem = std::fs::read_to_string(p).map_err(CliError::read(p))?;
            Some(policy_bundle::public_key_from_pem(&pem).map_err(CliError::malformed(p))?)
        }
        None => None,
    };
    for file in &args.files {
        let bytes = std::fs::read(file).map_err(CliError::read(file))?;
        let (index, size) = if policy_bundle::is_bundle(&bytes) {
            let key = publisher.as_ref().ok_or_else(|| {
                CliError::Usage(format!(
                    "{} is a policy bundle: give its publisher's key with --policy-key",
                    file.display()
                ))
            })?;
            append_bundle(&args.dir, &bytes, key)?
        } else {
            let (index, cp) = log.append(&bytes).map_err(CliError::failed)?;
            (index, cp.size)
        };
        println!("{}: entry {index} (checkpoint size {size})", file.display());
    }
    Ok(Exit::Accepted)
}

fn prove(args: &LogProveArgs) -> Result<Exit, CliError> {
    let (spec, trust) = trust(&args.log)?;
    let entry = std::fs::read(&args.file).map_err(CliError::read(&args.file))?;
    let out = off_runtime(|| -> Result<serde_json::Value, LogError> {
        let log = source(&spec)?;
        let mut state = LogState::default();
        if let Some(since) = args.since {
            // A checkpoint of that size is what the caller saw; prove from it.
            let root = tlog_root(log.as_ref(), since)?;
            state.logs.insert(trust.log.name().to_owned(), tlog::Seen { size: since, root });
        }
        let logged = state.check_logged(&entry, &trust, log.as_ref())?;
        let (_, inclusion) = log.inclusion(&tlog::leaf_hash(&entry), logged.checkpoint.size)?;
        let consistency = match args.since {
            Some(since) if since > 0 && since < logged.checkpoint.size => {
                Some(ProofWire { index: None, hashes: encode(&log.consistency(since, logged.checkpoint.size)?) })
            }
            _ => None,
        };
        Ok(serde_json::json!({
            "checkpoint": logged.checkpoint.note.to_text(),
            "index": logged.index,
            "inclusion": encode(&inclusion),
            "consistency": consistency.map(|c| c.hashes),
        }))
    })
    .map_err(CliError::failed)?;
    println!("{}", serde_json::to_string_pretty(&out).map_err(CliError::failed)?);
    Ok(Exit::Accepted)
}

/// The root of the log's tree at `size`, recomputed from its entries (for `prove --since`).
fn tlog_root(log: &dyn LogSource, size: u64) -> Result<String, LogError> {
    use base64::Engine as _;
    let leaves = (0..size).map(|i| log.entry(i).map(|e| tlog::leaf_hash(&e).0)).collect::<Result<Vec<_>, _>>()?;
    Ok(base64::engine::general_purpose::STANDARD.encode(veil_attestation::merkle::root(&leaves)))
}

fn encode(hashes: &[Hash]) -> Vec<String> {
    use base64::Engine as _;
    hashes.iter().map(|h| base64::engine::general_purpose::STANDARD.encode(h.0)).collect()
}

/// Audits the log at `spec` (a URL or directory): see [`tlog::audit`].
pub fn audit(spec: &str, trust: &LogTrust, publishers: &[p256::PublicKey]) -> Result<tlog::Audit, LogError> {
    off_runtime(|| tlog::audit(source(spec)?.as_ref(), trust, publishers))
}

fn verify_log(args: &LogVerifyArgs) -> Result<Exit, CliError> {
    let (spec, trust) = trust(&args.log)?;
    let mut publishers = Vec::new();
    for p in &args.policy_keys {
        let pem = std::fs::read_to_string(p).map_err(CliError::read(p))?;
        publishers.push(policy_bundle::public_key_from_pem(&pem).map_err(CliError::malformed(p))?);
    }
    let audit = audit(&spec, &trust, &publishers).map_err(CliError::failed)?;
    println!(
        "log {}: {} entries, root recomputed from every entry; {} policy bundle(s) of the given publishers, \
         no version signed twice",
        audit.checkpoint.origin, audit.checkpoint.size, audit.bundles
    );
    Ok(Exit::Accepted)
}

fn cosign(args: &LogCosignArgs) -> Result<Exit, CliError> {
    let (spec, trust) = trust(&args.log)?;
    let text = std::fs::read_to_string(&args.key).map_err(CliError::read(&args.key))?;
    let witness = NoteSigner::parse(&text).map_err(CliError::malformed(&args.key))?;
    let state_path = args.state.join("witness-state.json");
    let mut state = read_state(&state_path)?;
    let trust = LogTrust { witnesses: vec![], required: 0, ..trust };
    let cp = off_runtime(|| state.check_checkpoint(&trust, source(&spec)?.as_ref())).map_err(CliError::failed)?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let mut note: Note = cp.note.clone();
    note.cosign(&witness, now).map_err(CliError::failed)?;
    match &args.out {
        Some(out) => std::fs::write(out, note.to_text()).map_err(CliError::io(out))?,
        None if !is_url(&spec) => {
            LogDir::open(Path::new(&spec)).and_then(|l| l.add_cosignatures(&note)).map_err(CliError::failed)?;
        }
        None => return Err(CliError::Usage("the log is a URL: write the cosigned checkpoint with --out".into())),
    }
    state.accept(&cp);
    write_state(&state_path, &state)?;
    println!("cosigned {} at size {} as {}", cp.origin, cp.size, witness.verifier().name());
    Ok(Exit::Accepted)
}

fn serve(args: &LogServeArgs) -> Result<Exit, CliError> {
    use bytes::Bytes;
    use http_body_util::{BodyExt as _, Full};
    let log = LogDir::open(&args.dir).map_err(CliError::failed)?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(CliError::failed)?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen).await.map_err(CliError::failed)?;
        let addr = listener.local_addr().map_err(CliError::failed)?;
        println!("serving log {} on http://{addr}", args.dir.display());
        let log = std::sync::Arc::new(log);
        Ok(super::proxy::serve_until_ctrl_c(&listener, move |req: hyper::Request<hyper::body::Incoming>| {
            let log = log.clone();
            async move {
                let (path, query) = (req.uri().path().to_owned(), req.uri().query().map(str::to_owned));
                let answer = if req.method() == hyper::Method::GET {
                    tokio::task::spawn_blocking(move || http::serve(log.as_ref(), &path, query.as_deref()))
                        .await
                        .unwrap_or_else(|_| http::Answer { status: 500, content_type: "text/plain", body: vec![] })
                } else {
                    http::Answer { status: 405, content_type: "text/plain", body: b"the log is read-only\n".to_vec() }
                };
                let mut resp =
                    hyper::Response::new(Full::new(Bytes::from(answer.body)).map_err(|never| match never {}).boxed());
                *resp.status_mut() = hyper::StatusCode::from_u16(answer.status).unwrap_or(hyper::StatusCode::OK);
                if let Ok(v) = hyper::header::HeaderValue::from_str(answer.content_type) {
                    resp.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
                }
                resp
            }
        })
        .await)
    })
}
