//! A cluster of `veil-shard serve` processes on loopback, shared by the
//! pipeline tests and the pipeline benchmark.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::io::{BufRead, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use veil_enclave::generate::{generate, GenerateRequest, Generation, LocalModel};
use veil_enclave::pipeline::entry::{GenerateEvent, GenerateWire};
use veil_enclave::pipeline::route::{Route, Stage};
use veil_enclave::text::sampler::Sampler;

pub fn model_path() -> Option<PathBuf> {
    let path = match std::env::var_os("VEIL_MODEL") {
        Some(p) => PathBuf::from(p),
        None => std::env::var_os("VEIL_MODELS")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/veil/models"))
            .join("SmolLM2-135M-Instruct.Q4_1.gguf"),
    };
    if path.exists() {
        return Some(path);
    }
    if std::env::var("VEIL_REQUIRE_MODEL").as_deref() == Ok("1") {
        panic!("VEIL_REQUIRE_MODEL=1 but {} is missing", path.display());
    }
    veil_tests::skip("reference model not found (run scripts/fetch-model.sh)");
    None
}

/// A loopback port never handed out before in this test process.
pub fn free_port() -> SocketAddr {
    veil_tests::free_loopback_port()
}

/// Shard processes of one route, killed on drop.
pub struct Cluster {
    pub dir: PathBuf,
    pub route: Route,
    pub route_path: PathBuf,
    pub children: Vec<((usize, usize), Child)>,
}

impl Cluster {
    /// Writes a route for `cuts` (layer boundaries) with `replicas[i]`
    /// addresses for stage i, prepared (simulated root, policy, roots).
    pub fn new(name: &str, model: &Path, cuts: &[u32], replicas: &[usize]) -> Self {
        Self::with_layers(name, model, cuts, replicas, 30)
    }

    /// [`new`](Self::new) for a model of `layers` layers.
    pub fn with_layers(name: &str, model: &Path, cuts: &[u32], replicas: &[usize], layers: u32) -> Self {
        let dir = std::env::temp_dir().join(format!("veil-pipeline-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut bounds = vec![0];
        bounds.extend_from_slice(cuts);
        bounds.push(layers);
        let stages = bounds
            .windows(2)
            .zip(replicas)
            .map(|(w, &n)| Stage {
                layers: veil_attestation::LayerRange::new(w[0], w[1]).unwrap(),
                manifest_root: None,
                device: Default::default(),
                replicas: (0..n).map(|_| free_port()).collect(),
            })
            .collect();
        let route = Route {
            model: model.to_owned(),
            policy: dir.join("sim/policy.dev.toml"),
            simulated_root: Some(dir.join("sim")),
            simulated_gpus: 0,
            kv_budget_bytes: 256 << 20,
            prefill_chunk: 32,
            heartbeat: Duration::from_millis(100),
            round_timeout: Duration::from_secs(60),
            // Often, so every cluster test also runs the resident-weights watch.
            weight_recheck: Some(Duration::from_secs(2)),
            precision: veil_enclave::link::frame::Precision::F32,
            generate_listen: free_port(),
            sealed_listen: Some(free_port()),
            shadows: true,
            speculation: Default::default(),
            stages,
        };
        let route = veil_enclave::pipeline::local::prepare(route).unwrap();
        let route_path = dir.join("route.toml");
        std::fs::write(&route_path, route.to_toml()).unwrap();
        Self { dir, route, route_path, children: Vec::new() }
    }

    /// Speculation with `draft` as the entry's draft model (prompt lookup by
    /// default) and adaptive k up to `k_max` (before the shards start).
    #[allow(dead_code)]
    pub fn set_draft_model(&mut self, draft: &Path, k_max: usize) {
        use veil_enclave::pipeline::route::{DrafterKind, Speculation};
        self.set_speculation(Speculation {
            drafter: DrafterKind::Ngram,
            draft_model: Some(draft.to_owned()),
            k_max,
            ..Speculation::default()
        });
    }

    /// Sets the route's speculation (before the shards start).
    #[allow(dead_code)]
    pub fn set_speculation(&mut self, speculation: veil_enclave::pipeline::route::Speculation) {
        self.route.speculation = speculation;
        std::fs::write(&self.route_path, self.route.to_toml()).unwrap();
    }

    pub fn log(&self, stage: usize, replica: usize) -> PathBuf {
        self.dir.join(format!("s{stage}r{replica}.log"))
    }

    pub fn spawn(&mut self, stage: usize, replica: usize) {
        self.spawn_with(stage, replica, &self.route_path.clone());
    }

    pub fn spawn_with(&mut self, stage: usize, replica: usize, route: &Path) {
        let log = std::fs::File::create(self.log(stage, replica)).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_veil-shard"))
            .args(["serve", "--config"])
            .arg(route)
            .args(["--stage", &stage.to_string(), "--replica", &replica.to_string(), "--supervised"])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.children.push(((stage, replica), child));
    }

    pub fn start_all(&mut self) {
        for s in (0..self.route.stages.len()).rev() {
            for r in 0..self.route.stages[s].replicas.len() {
                self.spawn(s, r);
            }
        }
        self.wait_log(0, 0, "ready", 1);
    }

    /// Starts every shard in this process ([`veil_enclave::node::Node`], the
    /// code `veil-shard serve` runs) on the returned runtime; waits until the
    /// entry has a verified replica per stage.
    #[allow(dead_code)]
    pub fn start_in_process(&self) -> tokio::runtime::Runtime {
        use veil_enclave::node::{Attestation, Node, NodeOptions};
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let mut entry = None;
        for stage in (0..self.route.stages.len()).rev() {
            for replica in 0..self.route.stages[stage].replicas.len() {
                let options = NodeOptions {
                    stage,
                    replica,
                    attestation: Attestation::for_route(&self.route, false, false, Default::default(), None).unwrap(),
                    bind_config: false,
                    listen: None,
                    device: None,
                    format_worker: veil_enclave::pipeline::entry::format_jobs::FormatWorker::Process(
                        env!("CARGO_BIN_EXE_veil-shard").into(),
                    ),
                };
                let node = Node::load(self.route.clone(), options).unwrap();
                node.watch_weights(|why| panic!("resident weights changed: {why}")).unwrap();
                let _guard = rt.enter();
                let task = rt.spawn(node.serve());
                if stage == 0 {
                    entry = Some(task);
                }
            }
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(self.route.generate_listen).is_err() {
            assert!(
                Instant::now() < deadline,
                "the in-process entry did not start: {:?}",
                entry.map(|t| t.is_finished())
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        rt
    }

    /// Starts one process per stage (first replicas), each reaching the
    /// others through a WAN shim adding `delay` one way per hop (three legs
    /// per token: entry → 1 → 2 → entry); returns the shims.
    #[allow(dead_code)]
    pub fn start_behind_shims(
        &mut self,
        rt: &tokio::runtime::Runtime,
        delay: Duration,
    ) -> Vec<veil_host::wan::WanShim> {
        let shape = veil_host::wan::LinkShape::IDEAL.with_delay(delay);
        let mut shims = Vec::new();
        let mut via = self.route.clone();
        for stage in 1..via.stages.len() {
            let real = self.route.stages[stage].replicas[0];
            let shim = rt.block_on(veil_host::wan::WanShim::start(free_port(), real, shape)).unwrap();
            via.stages[stage].replicas[0] = shim.local_addr();
            shims.push(shim);
        }
        for stage in (0..self.route.stages.len()).rev() {
            let mut own = via.clone();
            own.stages[stage] = self.route.stages[stage].clone();
            let file = self.dir.join(format!("route-{stage}.toml"));
            std::fs::write(&file, own.to_toml()).unwrap();
            self.spawn_with(stage, 0, &file);
        }
        self.wait_log(0, 0, "ready", 1);
        shims
    }

    /// Waits until the (stage, replica) log holds `needle` at least `count` times.
    pub fn wait_log(&self, stage: usize, replica: usize, needle: &str, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let text = std::fs::read_to_string(self.log(stage, replica)).unwrap_or_default();
            if text.matches(needle).count() >= count {
                return;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {needle:?} in stage {stage}:\n{text}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn kill(&mut self, stage: usize, replica: usize) {
        for ((s, r), c) in &mut self.children {
            if (*s, *r) == (stage, replica) {
                c.kill().unwrap(); // SIGKILL
                c.wait().unwrap();
            }
        }
        self.children.retain(|((s, r), _)| (*s, *r) != (stage, replica));
    }

    pub fn generate(&self, req: &GenerateWire) -> Result<Generation, String> {
        self.stream(req, |_| {})
    }

    /// Runs a request, calling `on_text` per piece.
    pub fn stream(&self, req: &GenerateWire, on_text: impl FnMut(&str)) -> Result<Generation, String> {
        stream_to(self.route.generate_listen, req, on_text)
    }
}

impl Cluster {
    /// Streams `req` through the entry while, after its 8th text event, the
    /// second replica of `stage` is started and linked and the first is
    /// killed (kill -9): the fail-over every replica test drives.
    pub fn stream_across_a_kill(&mut self, req: &GenerateWire, stage: usize) -> Result<Generation, String> {
        self.stream_during(
            req,
            8,
            |_| {},
            |c| {
                c.spawn(stage, 1);
                c.wait_log(0, 0, "control link up", 3);
                c.kill(stage, 0);
            },
        )
    }

    /// Streams `req` through the entry, calling `on_text` per piece; after
    /// the `at`th piece runs `during` on the cluster while the stream goes on.
    pub fn stream_during(
        &mut self,
        req: &GenerateWire,
        at: usize,
        mut on_text: impl FnMut(&str) + Send,
        during: impl FnOnce(&mut Self),
    ) -> Result<Generation, String> {
        let entry = self.route.generate_listen;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|scope| {
            let h = scope.spawn(move || {
                let mut pieces = 0;
                stream_to(entry, req, |piece| {
                    on_text(piece);
                    pieces += 1;
                    if pieces == at {
                        let _ = tx.send(());
                    }
                })
            });
            if rx.recv().is_ok() {
                during(self);
            }
            h.join().unwrap()
        })
    }
}

/// One streamed generation from the entry's internal endpoint at `addr`
/// (without holding the cluster, so a test can kill a shard meanwhile).
pub fn stream_to(addr: SocketAddr, req: &GenerateWire, mut on_text: impl FnMut(&str)) -> Result<Generation, String> {
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.write_all(format!("{}\n", serde_json::to_string(req).unwrap()).as_bytes()).unwrap();
    for line in std::io::BufReader::new(tcp).lines() {
        match serde_json::from_str::<GenerateEvent>(&line.unwrap()).unwrap() {
            GenerateEvent::Text(t) => on_text(&t),
            GenerateEvent::Logprobs(_) => {}
            GenerateEvent::Done(g) => return Ok(*g),
            GenerateEvent::Error(f) => return Err(f.message),
            GenerateEvent::Refused(e) => return Err(e),
        }
    }
    Err("connection closed".into())
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, c) in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

pub fn greedy(ids: &[u32], max_tokens: usize) -> GenerateWire {
    GenerateWire {
        prompt: None,
        prompt_ids: Some(ids.to_vec()),
        chat: false,
        max_tokens,
        sampling: Default::default(),
        stop: vec![],
        speculation: Default::default(),
        score_prompt: false,
    }
}

/// `base` speculating with the scripted drafter (it proposes `script`, the
/// tokens it expects), `k` drafts a round and `depth` rounds in flight.
pub fn scripted(base: &GenerateWire, script: Vec<u32>, k: usize, depth: usize) -> GenerateWire {
    GenerateWire {
        speculation: veil_enclave::pipeline::entry::SpeculationRequest {
            enabled: Some(true),
            drafter: Some(veil_wire::route::Drafter::Script),
            k: Some(k),
            depth: Some(depth),
            script: Some(script),
        },
        ..base.clone()
    }
}

pub fn local(model: &LocalModel, tok: &veil_enclave::text::tokenizer::Tokenizer, req: &GenerateWire) -> Generation {
    let mut sampler = Sampler::new(req.sampling.clone()).unwrap();
    let g = GenerateRequest {
        prompt_ids: req.prompt_ids.clone().unwrap(),
        max_tokens: req.max_tokens,
        stop: req.stop.clone(),
    };
    generate(model, tok, &mut sampler, &g, |_| {}).unwrap()
}

/// A chat completion with `body` as the entry receives it, sealed to `route`
/// the way the SDK seals it (what a test that speaks HTTP itself sends).
pub async fn seal_chat(
    route: &veil_client::sdk::VerifiedRoute,
    body: &serde_json::Value,
) -> (Vec<u8>, veil_client::seal::ResponseOpener) {
    let mut message = bhttp::Message::request(
        b"POST".to_vec(),
        b"https".to_vec(),
        b"veil-entry".to_vec(),
        b"/v1/chat/completions".to_vec(),
    );
    message.put_header("content-type", "application/json");
    message.write_content(serde_json::to_vec(body).unwrap());
    veil_client::seal::seal(route, message).await.unwrap()
}
