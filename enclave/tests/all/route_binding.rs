//! The route binding end to end, with the host as the adversary: a relay
//! that edits the attestation document (strips, truncates or replays the
//! shard list, swaps in shards under another root) and an operator that
//! starts the genuine entry with a permissive peer policy and shards under
//! its own root. Each is refused by the client before any prompt is sealed,
//! with the failed route check named; the rogue shards never see a request.
//!
//! Needs the reference model (`scripts/fetch-model.sh`); without it these
//! tests print SKIP unless `VEIL_REQUIRE_MODEL=1`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use crate::cluster;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cluster::{model_path, Cluster};
use veil_attestation::route::{AttestationDoc, RouteCheckId};
use veil_attestation::simulated::{SimulatedAttester, SimulatedConfig};
use veil_attestation::{KeyHash, Policy};
use veil_client::sdk::{Client, ClientError};

type Edit = Arc<dyn Fn(&mut AttestationDoc) + Send + Sync>;

/// A host relay (test double) that rewrites every attestation document
/// with `edit` and counts the sealed requests it carries.
async fn editing_host(gateway: std::net::SocketAddr, edit: Edit, sealed: Arc<AtomicUsize>) -> std::net::SocketAddr {
    struct Editing {
        edit: Edit,
        sealed: Arc<AtomicUsize>,
    }
    impl crate::relay::Tamper for Editing {
        fn sends(&self, path: &str) -> usize {
            if path.starts_with("/v1/sealed") {
                self.sealed.fetch_add(1, Ordering::SeqCst);
            }
            1
        }
        fn answer(&self, path: &str, status: hyper::StatusCode, bytes: &mut Vec<u8>) {
            if path.starts_with("/v1/attestation") && status.is_success() {
                let mut doc = AttestationDoc::from_json(bytes).unwrap();
                (self.edit)(&mut doc);
                *bytes = serde_json::to_vec(&doc).unwrap();
            }
        }
    }
    crate::relay::tampering_host(gateway, Arc::new(Editing { edit, sealed })).await
}

fn route_check(err: &ClientError) -> Option<RouteCheckId> {
    match err {
        ClientError::RouteRejected(r) => Some(r.check),
        _ => None,
    }
}

async fn fetch_doc(gateway: std::net::SocketAddr) -> AttestationDoc {
    use http_body_util::BodyExt;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let resp = client.get(format!("http://{gateway}/v1/attestation").parse().unwrap()).await.unwrap();
    AttestationDoc::from_json(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap()
}

#[test]
fn a_host_editing_the_route_document_is_refused_before_any_prompt_is_sealed() {
    let Some(path) = model_path() else { return };
    let mut c = Cluster::new("edit-doc", &path, &[10, 20], &[1, 1, 1]);
    c.start_all();
    let gateway = c.route.sealed_listen.unwrap();
    let policy = veil_enclave::pipeline::shard::load_policy(&c.route.policy).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    // An older genuine shard list: captured now, then stage 1 restarts
    // (fresh keys, fresh evidence) and the host keeps showing the old one.
    let old = rt.block_on(fetch_doc(gateway));
    assert_eq!(old.shards.len(), 2);
    c.kill(1, 0);
    c.spawn(1, 0);
    c.wait_log(0, 0, "control link up", 3);
    let fresh = rt.block_on(fetch_doc(gateway));
    assert_ne!(fresh.shards[0].evidence, old.shards[0].evidence, "the restarted shard kept its evidence");
    // Shards re-signed under another root with the very same claims.
    let root_b =
        SimulatedAttester::from_seed(b"host root B", SimulatedConfig::new(veil_attestation::snp::Product::Genoa, b"b"))
            .unwrap();
    let old_shards = Mutex::new(old.shards.clone());
    let cases: Vec<(&str, Edit, RouteCheckId)> = vec![
        ("strip the shard list", Arc::new(|d: &mut AttestationDoc| d.shards.clear()), RouteCheckId::RouteLinks),
        (
            "drop the last stage",
            Arc::new(|d: &mut AttestationDoc| d.shards.retain(|s| s.stage != 2)),
            RouteCheckId::RouteLinks,
        ),
        (
            "replay the older shard list",
            Arc::new(move |d: &mut AttestationDoc| d.shards = old_shards.lock().unwrap().clone()),
            RouteCheckId::RouteLinks,
        ),
        (
            "swap in root-B shards",
            Arc::new(move |d: &mut AttestationDoc| {
                for s in &mut d.shards {
                    s.evidence = root_b.evidence(s.evidence.claims.as_ref().unwrap()).unwrap();
                }
            }),
            RouteCheckId::RouteLinks,
        ),
        (
            "publish a permissive policy text",
            Arc::new(|d: &mut AttestationDoc| d.peer_policy.allow_debug = true),
            RouteCheckId::PeerPolicyBinding,
        ),
    ];
    rt.block_on(async {
        for (what, edit, check) in cases {
            let sealed = Arc::new(AtomicUsize::new(0));
            let host = editing_host(gateway, edit, sealed.clone()).await;
            let err = Client::connect(&format!("http://{host}"), &policy).await.unwrap_err();
            assert_eq!(route_check(&err), Some(check), "{what}: {err}");
            assert!(err.check_table().unwrap().contains(check.name()), "{what}");
            assert_eq!(sealed.load(Ordering::SeqCst), 0, "{what}: something was sealed");
        }
        // The same relay without edits: accepted, and the route's shards are
        // the live ones, each fresh through the entry's commitment.
        let sealed = Arc::new(AtomicUsize::new(0));
        let host = editing_host(gateway, Arc::new(|_: &mut AttestationDoc| {}), sealed).await;
        let client = Client::connect(&format!("http://{host}"), &policy).await.unwrap();
        assert_eq!(client.route().shards().len(), 2);
        assert!(client.route().checks().first_failure().is_none());
    });
}

#[test]
fn an_entry_run_with_a_permissive_policy_is_refused_and_rogue_shards_see_nothing() {
    let Some(path) = model_path() else { return };
    let mut c = Cluster::new("permissive", &path, &[10, 20], &[1, 1, 1]);
    // The client's policy: the operator's root A, as `prepare` wrote it.
    let strict = veil_enclave::pipeline::shard::load_policy(&c.route.policy).unwrap();
    // The host makes its own root B, hands every shard a policy that also
    // accepts B, and runs stages 1 and 2 under B.
    let dir_b = c.dir.join("sim-b");
    let root_b =
        SimulatedAttester::from_seed(b"host root B", SimulatedConfig::new(veil_attestation::snp::Product::Genoa, b"b"))
            .unwrap();
    root_b.save(&dir_b).unwrap();
    let mut permissive: Policy = strict.clone();
    permissive.simulated_roots.push(root_b.dev_policy().unwrap().simulated_roots[0]);
    permissive.measurements.extend(root_b.dev_policy().unwrap().measurements);
    std::fs::write(&c.route.policy, permissive.to_toml()).unwrap();
    let mut route_b = c.route.clone();
    route_b.simulated_root = Some(dir_b);
    let route_b_path = c.dir.join("route-b.toml");
    std::fs::write(&route_b_path, route_b.to_toml()).unwrap();
    c.spawn_with(2, 0, &route_b_path);
    c.spawn_with(1, 0, &route_b_path);
    c.spawn(0, 0);
    c.wait_log(0, 0, "ready", 1);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let gateway = c.route.sealed_listen.unwrap();
    rt.block_on(async {
        let sealed = Arc::new(AtomicUsize::new(0));
        let host = editing_host(gateway, Arc::new(|_: &mut AttestationDoc| {}), sealed.clone()).await;
        let err = Client::connect(&format!("http://{host}"), &strict).await.unwrap_err();
        assert_eq!(route_check(&err), Some(RouteCheckId::PeerPolicy), "{err}");
        let table = err.check_table().unwrap();
        assert!(table.contains("weaker: simulated_roots"), "{table}");
        assert_eq!(sealed.load(Ordering::SeqCst), 0);
        // Pinning the permissive policy's digest still leaves the root-B
        // shards' evidence to the client's own policy: refused.
        let mut pinned = strict.clone();
        pinned.peer_policies.push(permissive.digest());
        let err = Client::connect(&format!("http://{host}"), &pinned).await.unwrap_err();
        match &err {
            ClientError::Attestation { who, source } => {
                assert!(who.contains("stage"), "{who}");
                assert_eq!(source.check(), Some(veil_attestation::CheckId::EndorsementChain), "{err}");
            }
            other => panic!("{other}"),
        }
        assert_eq!(sealed.load(Ordering::SeqCst), 0);
        // A client whose policy accepts root B as well (the host's own)
        // may use the route: the check is the client's policy, not a flag.
        let mut lax = permissive.clone();
        lax.peer_policies.clear();
        let ok = Client::connect(&format!("http://{host}"), &lax).await.unwrap();
        assert!(ok
            .route()
            .shards()
            .iter()
            .all(|s| s.evidence().simulated_root() == Some(KeyHash(root_b_ark(&root_b)))));
    });
}

fn root_b_ark(root: &SimulatedAttester) -> [u8; 32] {
    root.dev_policy().unwrap().simulated_roots[0].0
}

#[test]
fn fail_over_goes_only_to_replicas_under_the_attested_policy() {
    use std::io::{BufRead, Write};
    use veil_enclave::pipeline::entry::{Failure, GenerateEvent};
    let Some(path) = model_path() else { return };
    let mut c = Cluster::new("failover-policy", &path, &[10, 20], &[1, 2, 1]);
    // Replica 1 of the middle stage runs with another peer policy (one more
    // simulated root): the entry's link to it is refused by the pinned
    // peer-policy digest, so it can never serve a session.
    let mut other = veil_enclave::pipeline::shard::load_policy(&c.route.policy).unwrap();
    other.simulated_roots.push(KeyHash([0x42; 32]));
    let other_path = c.dir.join("other-policy.toml");
    std::fs::write(&other_path, other.to_toml()).unwrap();
    let mut route_other = c.route.clone();
    route_other.policy = other_path;
    let route_other_path = c.dir.join("route-other.toml");
    std::fs::write(&route_other_path, route_other.to_toml()).unwrap();
    c.spawn(2, 0);
    c.spawn(1, 0);
    c.spawn_with(1, 1, &route_other_path);
    c.spawn(0, 0);
    c.wait_log(0, 0, "ready", 1);
    c.wait_log(0, 0, "peer-policy digest", 1);
    let mut req = cluster::greedy(&[1, 9690, 314, 2], 400);
    req.max_tokens = 400;
    let listen = c.route.generate_listen;
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        let mut tcp = std::net::TcpStream::connect(listen).unwrap();
        tcp.write_all(format!("{}\n", serde_json::to_string(&req).unwrap()).as_bytes()).unwrap();
        let mut sent = false;
        for line in std::io::BufReader::new(tcp).lines() {
            match serde_json::from_str::<GenerateEvent>(&line.unwrap()).unwrap() {
                GenerateEvent::Text(_) if !sent => {
                    tx.send(()).unwrap();
                    sent = true;
                }
                GenerateEvent::Text(_) | GenerateEvent::Logprobs(_) => {}
                GenerateEvent::Done(_) => return Err("finished without the only good replica".to_owned()),
                GenerateEvent::Error(Failure { message: e, .. }) | GenerateEvent::Refused(e) => return Ok(e),
            }
        }
        Err("closed without an error".to_owned())
    });
    rx.recv().unwrap();
    c.kill(1, 0);
    let error = h.join().unwrap().unwrap();
    assert!(error.contains("no live replica") && error.contains("layers 10..20"), "{error}");
    let rogue = std::fs::read_to_string(c.log(1, 1)).unwrap();
    assert!(!rogue.contains("control link from the entry"), "the entry linked the other-policy replica:\n{rogue}");
    let entry = std::fs::read_to_string(c.log(0, 0)).unwrap();
    assert!(entry.contains("peer-policy digest"), "{entry}");
}

static FORWARDS_SEEN: AtomicUsize = AtomicUsize::new(0);

/// An attested middle-stage replica that lies: it accepts the entry's links,
/// never computes, and sends verdicts and errors for sessions it carries
/// (seen in the frames it receives) and for sessions it does not (random
/// ids). Runs in-process as stage 1 replica 1.
async fn lying_middle_shard(
    route: veil_enclave::pipeline::route::Route,
    loaded: veil_enclave::pipeline::shard::Loaded,
) {
    use veil_enclave::link::frame::{ErrorCode, ErrorReport, Frame, LinkRole, SessionId, Verdict};
    let addr = route.stages[1].replicas[1];
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let control: Arc<tokio::sync::Mutex<Option<tokio::sync::mpsc::Sender<Frame>>>> = Arc::default();
    let lie = |session: SessionId, seq: u64| {
        [
            Frame::Verdict(Verdict {
                session,
                seq,
                positions: vec![vec![(42, 1.0)]],
                kv_lens: vec![0, 0, 0],
                logprobs: Vec::new(),
            }),
            Frame::Error(ErrorReport {
                session: Some(session),
                seq,
                code: ErrorCode::Invalid,
                message: "rogue".into(),
            }),
        ]
    };
    loop {
        let Ok((tcp, _)) = listener.accept().await else { continue };
        let (trust, route, control) = (loaded.trust.clone(), route.clone(), control.clone());
        tokio::spawn(async move {
            let Ok((tx, mut reader, hello, _)) = trust.accept(tcp, &route, 1).await else { return };
            if hello.role == LinkRole::Control {
                *control.lock().await = Some(tx.clone());
            }
            while let Ok(Some(frame)) = reader.next().await {
                match frame {
                    Frame::Ping(n) => {
                        let _ = tx.send(Frame::Pong(n)).await;
                    }
                    // A session it carries: answer in the last stage's name;
                    // then sessions it does not carry (guessed ids).
                    Frame::Forward(f) => {
                        FORWARDS_SEEN.fetch_add(1, Ordering::SeqCst);
                        if let Some(c) = control.lock().await.clone() {
                            let guessed =
                                [f.session.0.wrapping_add(1), veil_enclave::pipeline::sessions::random_id(), 1]
                                    .map(SessionId);
                            let lies = lie(f.session, f.seq).into_iter().chain(guessed.iter().flat_map(|&g| lie(g, 1)));
                            for lie in lies {
                                let _ = c.send(lie).await;
                            }
                        }
                    }
                    _ => {}
                }
            }
        });
    }
}

#[test]
fn a_lying_middle_shard_changes_no_output_and_fails_no_other_session() {
    use veil_enclave::pipeline::shard::{self, Evidence};
    let Some(path) = model_path() else { return };
    let (model, tok) = veil_enclave::generate::LocalModel::load(&path, &[]).unwrap();
    let mut c = Cluster::new("liar", &path, &[10, 20], &[1, 2, 1]);
    let sim = SimulatedAttester::load(c.route.simulated_root.as_ref().unwrap()).unwrap();
    let loaded = shard::load(&c.route, 1, Default::default(), &sim, None, Evidence::Simulated).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.spawn(lying_middle_shard(c.route.clone(), loaded));
    c.spawn(2, 0);
    c.spawn(1, 0);
    c.spawn(0, 0);
    c.wait_log(0, 0, "ready", 1);
    c.wait_log(0, 0, "control link up", 3);
    let prompts: Vec<Vec<u32>> =
        vec![vec![1, 9690, 314, 2], vec![1, 504, 3458, 282], vec![1, 2000, 17, 5], vec![1, 42, 43, 44]];
    let c = &c;
    std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .cycle()
            .take(8)
            .map(|p| {
                let req = cluster::greedy(p, 24);
                let want = cluster::local(&model, &tok, &req);
                scope.spawn(move || (c.generate(&req), want))
            })
            .collect();
        for h in handles {
            let (got, want) = h.join().unwrap();
            assert_eq!(got.expect("an honest session failed"), want, "an output changed");
        }
    });
    // The liar did carry sessions (so its lies were about real ones), and
    // was cut off for them.
    assert!(FORWARDS_SEEN.load(Ordering::SeqCst) > 0, "no session was routed through the lying shard");
    let entry = std::fs::read_to_string(c.log(0, 0)).unwrap();
    assert!(entry.contains("protocol violation"), "{entry}");
    assert!(entry.contains("re-routed"), "{entry}");
    drop(rt);
}

/// Fail-over of the last stage, mid-stream, for a sampled session and a
/// speculating one at once: both continue on the warm replica and end
/// exactly as on the undisturbed route (the sampler's seed and the verified
/// distributions are the same).
#[test]
fn losing_the_last_stage_mid_stream_keeps_sampled_and_speculating_streams_unchanged() {
    use std::io::{BufRead, Write};
    use veil_enclave::pipeline::entry::{GenerateEvent, GenerateWire, SpeculationRequest};
    let Some(path) = model_path() else { return };
    let mut c = Cluster::new("last-failover", &path, &[10, 20], &[1, 1, 2]);
    c.spawn(2, 0);
    c.spawn(1, 0);
    c.spawn(0, 0);
    c.wait_log(0, 0, "ready", 1);
    let prompt = vec![1, 9690, 314, 2, 504, 3458, 282];
    // Long enough that the streams outlast starting the replica on a loaded machine.
    let mut sampled = cluster::greedy(&prompt, 320);
    (sampled.sampling.temperature, sampled.sampling.top_k, sampled.sampling.seed) = (0.8, 40, 1234);
    let speculating = GenerateWire {
        speculation: SpeculationRequest {
            enabled: Some(true),
            drafter: Some(veil_wire::route::Drafter::Ngram),
            ..SpeculationRequest::default()
        },
        ..cluster::greedy(&prompt, 320)
    };
    // The undisturbed outputs, on the same route.
    let want: Vec<_> = [&sampled, &speculating].iter().map(|r| c.generate(r).unwrap()).collect();
    let listen = c.route.generate_listen;
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let run = |req: GenerateWire, tx: std::sync::mpsc::Sender<()>| {
        std::thread::spawn(move || {
            let mut tcp = std::net::TcpStream::connect(listen).unwrap();
            tcp.write_all(format!("{}\n", serde_json::to_string(&req).unwrap()).as_bytes()).unwrap();
            let mut pieces = 0;
            for line in std::io::BufReader::new(tcp).lines() {
                match serde_json::from_str::<GenerateEvent>(&line.unwrap()).unwrap() {
                    GenerateEvent::Text(_) => {
                        pieces += 1;
                        if pieces == 6 {
                            let _ = tx.send(());
                        }
                    }
                    GenerateEvent::Logprobs(_) => {}
                    GenerateEvent::Done(g) => return Ok(*g),
                    GenerateEvent::Error(f) => return Err(f.message),
                    GenerateEvent::Refused(e) => return Err(e),
                }
            }
            Err("closed".to_owned())
        })
    };
    let handles = [run(sampled, tx.clone()), run(speculating, tx)];
    rx.recv().unwrap();
    c.spawn(2, 1);
    c.wait_log(0, 0, "control link up", 3);
    c.kill(2, 0);
    for (h, want) in handles.into_iter().zip(want) {
        let got = h.join().unwrap().expect("a session failed over the last stage's loss");
        assert_eq!((got.ids, got.text), (want.ids, want.text), "the stream changed across the re-route");
    }
    let log = std::fs::read_to_string(c.log(0, 0)).unwrap();
    assert!(log.contains("re-routed"), "no session was re-routed:\n{log}");
}

use crate::big_vocab;

/// A vocabulary of Qwen2/3's size (151,936 tokens) through a 2-stage
/// pipeline: greedy and sampled (temperature 1, no top-k or top-p: the whole
/// vocabulary crosses the link in each verdict), plain and speculative, all
/// equal to one process.
#[test]
fn a_large_vocabulary_serves_greedy_and_sampled_plain_and_speculative() {
    use veil_enclave::pipeline::entry::{GenerateWire, SpeculationRequest};
    if model_path().is_none() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("veil-bigvocab-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("big-vocab.gguf");
    big_vocab::write_big_vocab_model(&model, 151_936, 2, 64);
    let (local_model, tok) = veil_enclave::generate::LocalModel::load(&model, &[]).unwrap();
    assert_eq!(tok.vocab_size(), 151_936);
    let mut c = Cluster::with_layers("bigvocab", &model, &[1], &[1, 1], 2);
    c.start_all();
    let prompt = vec![1, 300, 70_000, 151_000, 12];
    let greedy = cluster::greedy(&prompt, 12);
    let mut sampled = greedy.clone();
    (sampled.sampling.temperature, sampled.sampling.seed) = (1.0, 99);
    let spec = |r: &GenerateWire| GenerateWire {
        speculation: SpeculationRequest {
            enabled: Some(true),
            drafter: Some(veil_wire::route::Drafter::Script),
            k: Some(3),
            depth: None,
            script: Some(vec![5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]),
        },
        ..r.clone()
    };
    for (name, req) in [("greedy", greedy.clone()), ("sampled", sampled.clone())] {
        let want = cluster::local(&local_model, &tok, &req);
        let got = c.generate(&req).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!((&got.ids, &got.text), (&want.ids, &want.text), "{name}");
        let got = c.generate(&spec(&req)).unwrap_or_else(|e| panic!("{name} speculative: {e}"));
        if name == "greedy" {
            assert_eq!(got.ids, want.ids, "speculative greedy differs");
        } else {
            // Rejection sampling keeps the distribution, not the draws.
            assert_eq!(got.ids.len(), want.ids.len(), "{name} speculative");
        }
        assert!(got.ids.iter().all(|&t| (t as usize) < 151_936));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A request that is the caller's fault is refused as such (a 400 through
/// the gateway), not reported as a pipeline failure (503).
#[test]
fn invalid_requests_are_refused_not_failed() {
    use std::io::{BufRead, Write};
    use veil_enclave::pipeline::entry::GenerateEvent;
    let Some(path) = model_path() else { return };
    let mut c = Cluster::new("refused", &path, &[15], &[1, 1]);
    c.start_all();
    // A token outside the vocabulary; a drafter no entry has (only a hand-written line can name one).
    let mut oracle = serde_json::to_value(cluster::greedy(&[1, 2, 3], 4)).unwrap();
    oracle["speculation"] = serde_json::json!({ "drafter": "oracle" });
    let bad = [serde_json::to_string(&cluster::greedy(&[1, 10_000_000], 4)).unwrap(), oracle.to_string()];
    for req in bad {
        let mut tcp = std::net::TcpStream::connect(c.route.generate_listen).unwrap();
        tcp.write_all(format!("{req}\n").as_bytes()).unwrap();
        let line = std::io::BufReader::new(tcp).lines().next().unwrap().unwrap();
        let ev: GenerateEvent = serde_json::from_str(&line).unwrap();
        assert!(matches!(ev, GenerateEvent::Refused(_)), "{line}");
    }
    // The entry keeps serving.
    assert!(c.generate(&cluster::greedy(&[1, 2, 3], 4)).is_ok());
}

/// `veil chat` as a person uses it: after the entry restarts (a new sealing
/// key) the next turn verifies the route again and is answered; a request
/// error is one line and the conversation goes on.
#[test]
fn veil_chat_survives_an_entry_restart_and_reports_errors_in_one_line() {
    use std::io::{BufRead, Write};
    let Some(path) = model_path() else { return };
    let veil = std::path::PathBuf::from(env!("CARGO_BIN_EXE_veil-shard")).with_file_name("veil");
    if !veil.exists() {
        veil_tests::skip("veil is not built next to veil-shard");
        return;
    }
    let mut c = Cluster::new("chat", &path, &[15], &[1, 1]);
    c.start_all();
    let url = format!("http://{}", c.route.sealed_listen.unwrap());
    let policy = c.route.policy.clone();
    let chat_with = |temperature: &str, max_tokens: &str| {
        std::process::Command::new(&veil)
            .args(["chat", &url, "--max-tokens", max_tokens, "--temperature", temperature, "--policy"])
            .arg(&policy)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let chat = |temperature: &str| chat_with(temperature, "12");
    let mut child = chat("0");
    let mut stdin = child.stdin.take().unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut answer = String::new();
    stdin.write_all(b"What is the capital of France? Answer in one sentence.\n").unwrap();
    out.read_line(&mut answer).unwrap();
    assert!(!answer.trim().is_empty(), "no first answer");
    // The entry restarts: a new key, the old one gone.
    c.kill(0, 0);
    c.spawn(0, 0);
    c.wait_log(0, 0, "ready", 1);
    let mut second = String::new();
    stdin.write_all(b"And of Italy?\n").unwrap();
    out.read_line(&mut second).unwrap();
    drop(stdin);
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{err}");
    assert!(err.contains("verified again") && !second.trim().is_empty(), "second turn: {second:?}\n{err}");
    // A request error: one line per failed turn, and the session goes on;
    // with stdin not a terminal the exit status says a turn went unanswered.
    let mut child = chat_with("0", "100000");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"Hello\nHello again\n").unwrap();
    drop(stdin);
    let done = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&done.stderr);
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 2, "{err}");
    assert!(errors[0].contains("max_tokens") && errors[0].contains("context") && !errors[0].contains('{'), "{err}");
    assert_eq!(done.status.code(), Some(3), "{err}");
    // Out-of-range arguments are refused before anything is verified or sent.
    for (temperature, max_tokens, says) in [("-1", "12", "between 0 and 2"), ("0", "0", "at least 1")] {
        let done = chat_with(temperature, max_tokens).wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&done.stderr);
        assert_eq!(done.status.code(), Some(2), "{err}");
        assert!(err.contains(says) && !err.contains("verified"), "{err}");
    }
}

/// Ctrl-C while an answer streams stops that answer only: the program
/// keeps the conversation and answers the next message.
#[test]
fn veil_chat_ctrl_c_stops_the_answer_not_the_conversation() {
    use std::io::{Read, Write};
    let Some(path) = model_path() else { return };
    let veil = std::path::PathBuf::from(env!("CARGO_BIN_EXE_veil-shard")).with_file_name("veil");
    if !veil.exists() {
        veil_tests::skip("veil is not built next to veil-shard");
        return;
    }
    let mut c = Cluster::new("chat-interrupt", &path, &[15], &[1, 1]);
    c.start_all();
    let url = format!("http://{}", c.route.sealed_listen.unwrap());
    let mut child = std::process::Command::new(&veil)
        .args(["chat", &url, "--max-tokens", "1000", "--temperature", "0", "--policy"])
        .arg(&c.route.policy)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    // Read the answer as it streams, on a thread.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
    let reader = {
        let seen = seen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                seen.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        })
    };
    stdin.write_all(b"Write a very long story about a dragon who learns to cook, with many chapters.\n").unwrap();
    stdin.flush().unwrap();
    let started = std::time::Instant::now();
    while seen.lock().unwrap().len() < 16 {
        assert!(started.elapsed() < std::time::Duration::from_secs(120), "no answer began");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let status = std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let at_interrupt = seen.lock().unwrap().len();
    stdin.write_all(b"Say hello.\n").unwrap();
    drop(stdin);
    let done = child.wait().unwrap();
    reader.join().unwrap();
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(done.success(), "the program ended with {done:?}: {err}");
    assert!(err.contains("(stopped; the conversation goes on)"), "{err}");
    assert!(!err.contains("error:"), "{err}");
    let seen = seen.lock().unwrap().clone();
    assert!(seen.len() > at_interrupt + 1, "no answer to the next message after Ctrl-C");
}
