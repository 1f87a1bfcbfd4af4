//! `veil-host cluster` end to end: starts shards, restarts a killed one,
//! and on SIGTERM stops them all (no orphans). Needs the reference model
//! (`scripts/fetch-model.sh`) and the `veil-shard` binary next to
//! `veil-host` (a workspace build); prints SKIP otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::io::{BufRead, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

fn model() -> Option<PathBuf> {
    let path = std::env::var_os("VEIL_MODEL").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/veil/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    });
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var("VEIL_REQUIRE_MODEL").as_deref() != Ok("1"),
        "VEIL_REQUIRE_MODEL=1 but {} is missing",
        path.display()
    );
    veil_tests::skip("reference model not found");
    None
}

fn port() -> SocketAddr {
    veil_tests::free_loopback_port()
}

fn wait_for(log: &std::path::Path, needle: &str, count: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.matches(needle).count() >= count {
            return text;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {needle:?}:\n{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn generate(addr: SocketAddr) -> String {
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.write_all(b"{\"prompt_ids\": [504, 3575, 282, 4649, 314], \"max_tokens\": 6}\n").unwrap();
    std::io::BufReader::new(tcp).lines().map(|l| l.unwrap()).last().unwrap_or_default()
}

/// A child process stopped (SIGTERM, then SIGKILL) when the test ends,
/// whether it passes or panics: no test leaves a cluster running.
struct Stopped(std::process::Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while matches!(self.0.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

#[test]
fn supervises_restarts_and_stops_every_shard() {
    let Some(model) = model() else { return };
    let host = PathBuf::from(env!("CARGO_BIN_EXE_veil-host"));
    if !host.with_file_name("veil-shard").exists() {
        veil_tests::skip("veil-shard is not built next to veil-host");
        return;
    }
    let dir = std::env::temp_dir().join(format!("veil-cluster-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (gen, gateway) = (port(), port());
    let config = format!(
        "model = {:?}\npolicy = \"sim/policy.dev.toml\"\nsimulated_root = \"sim\"\nsimulated_gpus = 1\nheartbeat_ms = 100\n\
         [entry]\ngenerate_listen = \"{gen}\"\nsealed_listen = \"{gateway}\"\n\
         [[stage]]\nlayers = [0, 12]\nreplicas = [\"{}\"]\n\
         [[stage]]\nlayers = [12, 30]\nreplicas = [\"{}\"]\n",
        model.display().to_string(),
        port(),
        port()
    );
    let public = port();
    std::fs::write(dir.join("cluster.toml"), config).unwrap();
    let log = dir.join("cluster.log");
    let stdout = dir.join("stdout.log");
    let mut sup = Stopped(
        Command::new(&host)
            .args(["cluster", "--listen", &public.to_string(), "--config"])
            .arg(dir.join("cluster.toml"))
            .env("RUST_LOG", "info")
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let text = wait_for(&log, "every stage has a verified shard: ready", 1);
    assert!(generate(gen).contains("\"done\""));
    wait_for(&stdout, &format!("listening on http://{public}"), 1);
    sealed_chat_through_the_relay(&dir, public, &log);
    sealed_chat_over_https(&dir, gateway);
    policy_init_pins_what_it_saw(&host, &dir, public);
    a_second_cluster_on_the_same_route_does_not_relay_the_first(&host, &dir);
    let pid_of = |text: &str, stage: usize| -> Vec<u32> {
        text.lines()
            .filter(|l| l.contains("shard started") && l.contains(&format!("stage={stage} ")))
            .filter_map(|l| l.rsplit("pid=").next()?.trim().parse().ok())
            .collect()
    };
    let victim = *pid_of(&text, 1).last().unwrap();
    Command::new("kill").args(["-KILL", &victim.to_string()]).status().unwrap();
    wait_for(&log, "shard exited; restarting", 1);
    wait_for(&log, "shard verified; control link up", 2);
    assert!(generate(gen).contains("\"done\""), "no service after the restart");
    openai_python_client_through_veil_proxy(&host, &dir, public, &log);
    let text = std::fs::read_to_string(&log).unwrap();
    // The processes running now: the latest start of each stage.
    let shards: Vec<u32> = [0, 1].iter().filter_map(|&s| pid_of(&text, s).last().copied()).collect();
    assert_eq!(shards.len(), 2);
    assert!(!shards.contains(&victim));
    Command::new("kill").args(["-TERM", &sup.0.id().to_string()]).status().unwrap();
    let status = sup.0.wait().unwrap();
    assert!(status.success(), "supervisor exited with {status}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while shards.iter().any(|&p| alive(p)) {
        assert!(Instant::now() < deadline, "shards outlived the supervisor: {shards:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(std::fs::read_to_string(&log).unwrap().contains("all shards stopped"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client talks to the public API through a recording proxy: the canary
/// prompt and the answer never appear in what the host received, sent back
/// or logged.
fn sealed_chat_through_the_relay(dir: &std::path::Path, public: SocketAddr, host_log: &std::path::Path) {
    use std::sync::{Arc, Mutex};
    // A recording TCP proxy in front of the host: everything the host receives and sends.
    let seen = Arc::new(Mutex::new(Vec::<u8>::new()));
    let proxy = TcpListener::bind(port()).unwrap();
    let proxy_addr = proxy.local_addr().unwrap();
    let record = seen.clone();
    std::thread::spawn(move || {
        for client in proxy.incoming() {
            let Ok(client) = client else { return };
            let upstream = TcpStream::connect(public).unwrap();
            for (mut from, mut to) in [(client.try_clone().unwrap(), upstream.try_clone().unwrap()), (upstream, client)]
            {
                let record = record.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 16 << 10];
                    loop {
                        match std::io::Read::read(&mut from, &mut buf) {
                            Ok(0) | Err(_) => {
                                let _ = to.shutdown(std::net::Shutdown::Write);
                                return;
                            }
                            Ok(n) => {
                                record.lock().unwrap().extend_from_slice(&buf[..n]);
                                if to.write_all(&buf[..n]).is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        }
    });
    let policy_text = std::fs::read_to_string(dir.join("sim/policy.dev.toml")).unwrap();
    let mut policy = veil_attestation::Policy::from_toml(&policy_text).unwrap();
    // The shards' simulated GPUs carry current OCSP responses for their
    // device chains, so a client that requires revocation checking (and the
    // RIMs) on the serving path connects. The shards' own peer policy does
    // not require them, which the client accepts only by its digest.
    policy.peer_policies.push(policy.digest());
    policy.gpu.require_revocation = true;
    policy.gpu.require_rim = true;
    let canary = "zebra-canary-7731 what colour is the sky";
    let answer = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
        let client = veil_client::sdk::Client::connect(&format!("http://{proxy_addr}"), &policy).await.unwrap();
        let body =
            serde_json::json!({"messages": [{"role": "user", "content": canary}], "max_tokens": 12, "temperature": 0});
        let resp = client.call("POST", "/v1/chat/completions", &body).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&resp.collect().await.unwrap()).unwrap();
        v["choices"][0]["message"]["content"].as_str().unwrap().to_owned()
    });
    assert!(!answer.trim().is_empty());
    let seen = seen.lock().unwrap().clone();
    let log = std::fs::read(host_log).unwrap();
    for needle in [canary.as_bytes(), b"zebra-canary", answer.trim().as_bytes()] {
        assert!(!seen.windows(needle.len()).any(|w| w == needle), "the host saw {:?}", String::from_utf8_lossy(needle));
        assert!(!log.windows(needle.len()).any(|w| w == needle), "a log holds {:?}", String::from_utf8_lossy(needle));
    }
    let metrics = generate_metrics(public);
    assert!(metrics.contains("veil_relay_requests_total{endpoint=\"sealed\",outcome=\"ok\"} 1"), "{metrics}");
    // An OpenAI client pointed at the host instead of `veil proxy`, or a
    // Veil client given a path, is told where to go.
    for path in ["/v1/chat/completions", "/v1/v1/attestation"] {
        let mut tcp = TcpStream::connect(public).unwrap();
        write!(tcp, "POST {path} HTTP/1.1\r\nHost: {public}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut wrong = String::new();
        std::io::Read::read_to_string(&mut tcp, &mut wrong).unwrap();
        assert!(
            wrong.starts_with("HTTP/1.1 404") && wrong.contains("veil proxy") && wrong.contains("root URL"),
            "{wrong}"
        );
    }
    // The relay probes the entry itself: up, though nobody asked /healthz.
    assert!(metrics.contains("veil_entry_up 1"), "{metrics}");
    // The entry's counts ride along (the chat's decode rounds), never content.
    let rounds = metrics
        .lines()
        .find_map(|l| l.strip_prefix("veil_entry_decode_rounds_total "))
        .and_then(|v| v.trim().parse::<u64>().ok());
    assert!(rounds.is_some_and(|r| r > 0), "{metrics}");
}

/// The public API over TLS (a second relay in front of the same entry, with
/// a certificate from a test CA): the SDK connects over https:// when it
/// trusts the CA and refuses the host's certificate when it does not.
fn sealed_chat_over_https(dir: &std::path::Path, gateway: SocketAddr) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name.push(rcgen::DnType::CommonName, "Veil test CA");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let host_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    let issuer = rcgen::Issuer::from_params(&ca, &ca_key);
    let leaf = leaf.signed_by(&host_key, &issuer).unwrap();
    std::fs::write(dir.join("host.crt"), leaf.pem()).unwrap();
    std::fs::write(dir.join("host.key"), host_key.serialize_pem()).unwrap();
    std::fs::write(dir.join("ca.crt"), ca_cert.pem()).unwrap();
    let tls = veil_host::relay::tls_server_config(&dir.join("host.crt"), &dir.join("host.key")).unwrap();
    let policy_text = std::fs::read_to_string(dir.join("sim/policy.dev.toml")).unwrap();
    let policy = veil_attestation::Policy::from_toml(&policy_text).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(port()).await.unwrap();
        let url = format!("https://localhost:{}", listener.local_addr().unwrap().port());
        let relay = veil_host::relay::Relay::new(veil_host::relay::RelayConfig {
            tls: Some(tls),
            ..veil_host::relay::RelayConfig::new(gateway)
        });
        let served = tokio::spawn(relay.serve(listener));
        let untrusted = veil_client::sdk::Client::connect(&url, &policy).await;
        let err = untrusted.expect_err("a certificate from an unknown CA was accepted").to_string();
        assert!(err.contains("certificate") || err.contains("UnknownIssuer"), "{err}");
        let options = veil_client::sdk::ConnectOptions::default().with_ca_file(&dir.join("ca.crt")).unwrap();
        let client = veil_client::sdk::Client::connect_with(&url, &policy, &options).await.unwrap();
        let body =
            serde_json::json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0});
        let resp = client.call("POST", "/v1/chat/completions", &body).await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&resp.collect().await.unwrap()).unwrap();
        assert!(v["choices"][0]["message"]["content"].is_string(), "{v}");
        // The SDK's connections negotiated the hybrid post-quantum group (the
        // relay counts them; the metrics request is one more), and a client
        // without it still connects, on X25519.
        let ca = dir.join("ca.crt");
        let hybrid = veil_tls_pq::client_provider();
        let (metrics, group) = https_get(hybrid.clone(), &ca, &url, "/metrics").await;
        assert_eq!(group, Some(rustls::NamedGroup::X25519MLKEM768));
        let sdk = handshakes(&metrics, "X25519MLKEM768");
        assert!(sdk >= 2 && handshakes(&metrics, "classical") == 0, "{metrics}");
        let classical = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let (_, group) = https_get(classical, &ca, &url, "/metrics").await;
        assert_eq!(group, Some(rustls::NamedGroup::X25519));
        let (metrics, _) = https_get(hybrid, &ca, &url, "/metrics").await;
        assert_eq!((handshakes(&metrics, "X25519MLKEM768"), handshakes(&metrics, "classical")), (sdk + 1, 1));
        // http:// against the TLS host: the error says to try https://.
        let plain = url.replacen("https://", "http://", 1);
        let err = veil_client::sdk::Client::connect(&plain, &policy).await.unwrap_err().to_string();
        assert!(err.contains("try https://"), "{err}");
        served.abort();
        // A self-signed certificate made the usual way (`openssl req -x509`:
        // CA:TRUE, used as the server's own), trusted with --ca: accepted.
        let self_key = rcgen::KeyPair::generate().unwrap();
        let mut own = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        own.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let own = own.self_signed(&self_key).unwrap();
        std::fs::write(dir.join("self.crt"), own.pem()).unwrap();
        std::fs::write(dir.join("self.key"), self_key.serialize_pem()).unwrap();
        let tls = veil_host::relay::tls_server_config(&dir.join("self.crt"), &dir.join("self.key")).unwrap();
        let listener = tokio::net::TcpListener::bind(port()).await.unwrap();
        let url = format!("https://localhost:{}", listener.local_addr().unwrap().port());
        let relay = veil_host::relay::Relay::new(veil_host::relay::RelayConfig {
            tls: Some(tls),
            ..veil_host::relay::RelayConfig::new(gateway)
        });
        let served = tokio::spawn(relay.serve(listener));
        let options = veil_client::sdk::ConnectOptions::default().with_ca_file(&dir.join("self.crt")).unwrap();
        veil_client::sdk::Client::connect_with(&url, &policy, &options).await.unwrap();
        // Without it: refused.
        assert!(veil_client::sdk::Client::connect(&url, &policy).await.is_err());
        served.abort();
    });
}

/// One HTTPS GET of `path` from the relay at `url` (trusting `ca`) with
/// `provider`'s key exchange groups: the response and the negotiated group.
async fn https_get(
    provider: std::sync::Arc<rustls::crypto::CryptoProvider>,
    ca: &std::path::Path,
    url: &str,
    path: &str,
) -> (String, Option<rustls::NamedGroup>) {
    use rustls_pki_types::pem::PemObject as _;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls_pki_types::CertificateDer::from_pem_file(ca).unwrap()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)).connect(name, tcp).await.unwrap();
    let group = tls.get_ref().1.negotiated_key_exchange_group().map(|g| g.name());
    tls.write_all(format!("GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = tls.read_to_end(&mut out).await;
    (String::from_utf8_lossy(&out).into_owned(), group)
}

/// The relay's count of TLS handshakes that negotiated `group`.
fn handshakes(metrics: &str, group: &str) -> u64 {
    let prefix = format!("veil_relay_tls_handshakes_total{{group=\"{group}\"}} ");
    metrics.lines().find_map(|l| l.strip_prefix(prefix.as_str())).and_then(|n| n.parse().ok()).unwrap()
}

/// `veil policy init` pins what the route presented, simulated roots
/// included; the pinned policy verifies the same route, and refuses it once
/// the pinned simulated root is another one.
fn policy_init_pins_what_it_saw(host: &std::path::Path, dir: &std::path::Path, public: SocketAddr) {
    let veil = host.with_file_name("veil");
    let url = format!("http://{public}");
    let pinned = dir.join("pinned.toml");
    let refused = Command::new(&veil).args(["policy", "init", &url, "--out"]).arg(&pinned).output().unwrap();
    assert_eq!(refused.status.code(), Some(1), "{}", String::from_utf8_lossy(&refused.stderr));
    let why = format!("{}{}", String::from_utf8_lossy(&refused.stdout), String::from_utf8_lossy(&refused.stderr));
    assert!(why.contains("--allow-simulated"), "{why}");
    let init =
        Command::new(&veil).args(["policy", "init", &url, "--allow-simulated", "--out"]).arg(&pinned).output().unwrap();
    assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));
    let text = std::fs::read_to_string(&pinned).unwrap();
    let policy = veil_attestation::Policy::from_toml(&text).unwrap();
    assert!(policy.allow_simulated && policy.simulated_roots.len() == 1, "{text}");
    // Every shard presented one (simulated) GPU: the policy requires it.
    assert!(policy.gpu.required && policy.gpu.count == Some(1), "{text}");
    assert_eq!(policy.manifest_roots.len(), 1, "one pinned manifest root: the model's, for every stage:\n{text}");
    let verify = |policy: &std::path::Path| Command::new(&veil).args(["verify", &url, "--policy"]).arg(policy).output();
    let ok = verify(&pinned).unwrap();
    let table = String::from_utf8_lossy(&ok.stdout);
    assert!(ok.status.success(), "{table}");
    // A GPU table per shard, its evidence bound to the shard's claims.
    assert_eq!(table.matches("gpu_evidence_binding").count(), 2, "{table}");
    // The route checks: the peer policy pinned by digest, the layer count
    // pinned, every shard fresh through the entry's commitment.
    assert_eq!(policy.peer_policies.len(), 1, "{text}");
    assert_eq!(policy.model_layers, Some(30), "{text}");
    for check in ["route_shape", "route_links", "peer_policy_binding", "coverage"] {
        assert!(table.lines().any(|l| l.contains(check) && l.contains("PASS")), "{check}:\n{table}");
    }
    assert!(table.contains("pinned in your policy") && table.contains("layer count pinned"), "{table}");
    // The cluster's development policy pins what `policy init` pins (the
    // product and its TCB): nothing weaker to warn about on the happy path.
    assert!(!table.contains("weaker than your policy"), "{table}");
    assert_eq!(table.matches("live link").count(), 1, "shard freshness not established:\n{table}");
    // Issue 23: a reviewer sees what was simulated — in the verdict line and
    // row by row — and scripts get the whole table as JSON.
    let last = table.lines().last().unwrap_or_default();
    assert!(last.starts_with("ACCEPTED (SIMULATED: 2 of 2 shard process(es)"), "{last}");
    assert!(table.lines().any(|l| l.contains("measurement") && l.contains("PASS(SIM)")), "{table}");
    let json = Command::new(&veil).args(["verify", &url, "--json", "--policy"]).arg(&pinned).output().unwrap();
    assert!(json.status.success(), "{}", String::from_utf8_lossy(&json.stderr));
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!((v["accepted"].as_bool(), v["simulated"].as_bool()), (Some(true), Some(true)), "{v}");
    assert!(v["verdict"].as_str().unwrap_or_default().contains("SIMULATED"), "{v}");
    let shards = v["shards"].as_array().unwrap();
    assert_eq!(shards.len(), 2, "{v}");
    for s in shards {
        assert_eq!(s["simulated"], true, "{s}");
        let rows = s["checks"]["results"].as_array().unwrap();
        assert_eq!(rows.len(), 20, "every SNP check is in the JSON: {s}");
        assert!(rows.iter().any(|r| r["check"] == "measurement" && r["simulated"] == true), "{s}");
    }
    assert_eq!(v["route_checks"]["results"].as_array().map(Vec::len), Some(10), "{v}");
    assert_eq!(v["drafter"]["digest"].as_str().map(str::len), Some(64), "{v}");
    // Without the pin, a client policy stricter than the cluster's (here a
    // HOST_DATA pin the shards meet but do not demand of their peers) is
    // refused, the gaps listed by name; the same policy without the extra
    // pin passes as at least as strict.
    let unpinned = dir.join("unpinned.toml");
    let digest = policy.peer_policies[0].to_string();
    let unpinned_text =
        text.lines().filter(|l| !l.contains(&digest) && !l.starts_with("peer_policies")).collect::<Vec<_>>().join("\n");
    std::fs::write(&unpinned, &unpinned_text).unwrap();
    let ok = verify(&unpinned).unwrap();
    let table = String::from_utf8_lossy(&ok.stdout);
    assert!(ok.status.success() && table.contains("at least as strict as your policy"), "{table}");
    std::fs::write(&unpinned, format!("host_data = \"{}\"\n{unpinned_text}", "00".repeat(32))).unwrap();
    let no = verify(&unpinned).unwrap();
    let why = format!("{}{}", String::from_utf8_lossy(&no.stdout), String::from_utf8_lossy(&no.stderr));
    assert_eq!(no.status.code(), Some(1), "{why}");
    assert!(why.contains("peer_policy") && why.contains("weaker on 1 setting(s): host_data"), "{why}");
    // Another layer count pinned: refused by name.
    let layers = dir.join("layers.toml");
    std::fs::write(&layers, text.replace("model_layers = 30", "model_layers = 32")).unwrap();
    let no = verify(&layers).unwrap();
    let why = format!("{}{}", String::from_utf8_lossy(&no.stdout), String::from_utf8_lossy(&no.stderr));
    assert_eq!(no.status.code(), Some(1), "{why}");
    assert!(why.contains("route_shape") && why.contains("32 layers"), "{why}");
    let other = dir.join("other-root.toml");
    let root = hex::encode(policy.simulated_roots[0].0);
    std::fs::write(&other, text.replace(&root, &"ab".repeat(32))).unwrap();
    let no = verify(&other).unwrap();
    let why = format!("{}{}", String::from_utf8_lossy(&no.stdout), String::from_utf8_lossy(&no.stderr));
    assert_eq!(no.status.code(), Some(1), "{why}");
    assert!(why.contains("a simulated root pinned in policy simulated_roots"), "{why}");
    canary_answers_match_a_local_reference(host, dir, &url, &pinned);
}

/// SECURITY-CASES G6 through the CLIs: `veil-shard canary` records greedy
/// answers on a local copy of the model; `veil canary` finds the route's
/// answers identical (exit 0) and a reference that differs in one answer
/// (a substituted model) reported by prompt (exit 1).
fn canary_answers_match_a_local_reference(
    host: &std::path::Path,
    dir: &std::path::Path,
    url: &str,
    policy: &std::path::Path,
) {
    let model = model().unwrap();
    let reference = dir.join("canary.json");
    let rec = Command::new(host.with_file_name("veil-shard"))
        .args(["canary", "--model"])
        .arg(&model)
        .arg("--out")
        .arg(&reference)
        .output()
        .unwrap();
    assert!(rec.status.success(), "{}", String::from_utf8_lossy(&rec.stderr));
    let run = |reference: &std::path::Path| {
        Command::new(host.with_file_name("veil"))
            .args(["canary", url, "--policy"])
            .arg(policy)
            .arg("--reference")
            .arg(reference)
            .output()
            .unwrap()
    };
    let ok = run(&reference);
    let out = String::from_utf8_lossy(&ok.stdout);
    assert!(ok.status.success(), "{out}{}", String::from_utf8_lossy(&ok.stderr));
    assert_eq!(out.matches("  match ").count(), 4, "{out}");
    let mut set: serde_json::Value = serde_json::from_slice(&std::fs::read(&reference).unwrap()).unwrap();
    let text = set["cases"][1]["text"].as_str().unwrap().to_owned();
    let half: String = text.chars().take(text.chars().count() / 2).collect();
    set["cases"][1]["text"] = format!("{half}X").into();
    let other = dir.join("canary-other.json");
    std::fs::write(&other, serde_json::to_vec(&set).unwrap()).unwrap();
    let no = run(&other);
    let out = String::from_utf8_lossy(&no.stdout);
    assert_eq!(no.status.code(), Some(1), "{out}");
    assert!(out.contains("DIFFERS") && out.contains("def fibonacci"), "{out}");
}

fn generate_metrics(public: SocketAddr) -> String {
    let mut tcp = TcpStream::connect(public).unwrap();
    tcp.write_all(format!("GET /metrics HTTP/1.1\r\nHost: {public}\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
    let mut out = String::new();
    std::io::Read::read_to_string(&mut tcp, &mut out).unwrap();
    out
}

/// The official `openai` Python package, unmodified, pointed at `veil proxy`
/// (`scripts/openai_client_check.py`): chat (plain and streamed),
/// completions (text and token ids), models.list, logprobs, logit_bias,
/// penalties, n = 3 seeded choices and 50 structured outputs validated
/// against their schema. CI installs the package (and `jsonschema`) and
/// sets `VEIL_REQUIRE_OPENAI=1`; elsewhere a missing package prints SKIP.
fn openai_python_client_through_veil_proxy(
    host: &std::path::Path,
    dir: &std::path::Path,
    public: SocketAddr,
    log: &std::path::Path,
) {
    let have = Command::new("python3").args(["-c", "import openai"]).status().is_ok_and(|s| s.success());
    if !have {
        assert!(
            std::env::var("VEIL_REQUIRE_OPENAI").as_deref() != Ok("1"),
            "VEIL_REQUIRE_OPENAI=1 but `import openai` fails"
        );
        veil_tests::skip("the openai Python package is not installed");
        return;
    }
    let veil = host.with_file_name("veil");
    assert!(veil.exists(), "veil is not built next to veil-host");
    let listen = port();
    let out = dir.join("proxy.out");
    let proxy = Stopped(
        Command::new(&veil)
            .args(["proxy", &format!("http://{public}"), "--listen", &listen.to_string(), "--policy"])
            .arg(dir.join("sim/policy.dev.toml"))
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(dir.join("proxy.err")).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_for(&out, "listening on", 1);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/openai_client_check.py");
    let run = Command::new("python3").arg(script).arg(format!("http://{listen}/v1")).output().unwrap();
    // The entry restarts with a new sealing key: the proxy notices, verifies
    // the route again and keeps serving.
    let text = std::fs::read_to_string(log).unwrap();
    let entry_pid = text
        .lines()
        .filter(|l| l.contains("shard started") && l.contains("stage=0 "))
        .filter_map(|l| l.rsplit("pid=").next()?.trim().parse::<u32>().ok())
        .next_back()
        .unwrap();
    let count = |needle: &str| text.matches(needle).count();
    let (exits, readies) = (count("shard exited; restarting"), count("every stage has a verified shard: ready"));
    Command::new("kill").args(["-KILL", &entry_pid.to_string()]).status().unwrap();
    wait_for(log, "shard exited; restarting", exits + 1);
    wait_for(log, "every stage has a verified shard: ready", readies + 1);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let models = loop {
        let mut tcp = TcpStream::connect(listen).unwrap();
        tcp.write_all(format!("GET /v1/models HTTP/1.1\r\nHost: {listen}\r\nConnection: close\r\n\r\n").as_bytes())
            .unwrap();
        let mut answer = String::new();
        std::io::Read::read_to_string(&mut tcp, &mut answer).unwrap();
        if answer.starts_with("HTTP/1.1 200") || std::time::Instant::now() > deadline {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let proxy_log = std::fs::read_to_string(dir.join("proxy.err")).unwrap_or_default();
    drop(proxy);
    assert!(models.starts_with("HTTP/1.1 200"), "after the entry's key changed:\n{models}\n{proxy_log}");
    assert!(proxy_log.contains("verified again"), "{proxy_log}");
    assert!(
        run.status.success(),
        "openai client failed:\n{}\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let seen: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    assert!(!seen["chat"].as_str().unwrap_or_default().is_empty(), "{seen}");
    assert_eq!(seen["choices"].as_array().map(Vec::len), Some(3), "{seen}");
    assert_eq!(seen["valid"], 50, "{seen}");
}

/// A configuration error (a typo in the policy, an address already in use)
/// does not heal by restarting: the supervisor stops at once, naming the
/// shard, instead of restarting it forever.
#[test]
fn a_configuration_error_stops_the_supervisor_instead_of_a_restart_loop() {
    let Some(model) = model() else { return };
    let host = PathBuf::from(env!("CARGO_BIN_EXE_veil-host"));
    if !host.with_file_name("veil-shard").exists() {
        veil_tests::skip("veil-shard is not built next to veil-host");
        return;
    }
    for case in ["policy typo", "address in use"] {
        let dir = std::env::temp_dir().join(format!("veil-config-error-{}-{}", std::process::id(), case.len()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sim")).unwrap();
        // Occupied for the whole case when the case is "address in use". Taken
        // through `port()`, so no other test in this process is handed it.
        let squatter = TcpListener::bind(port()).unwrap();
        let shard_addr = if case == "address in use" { squatter.local_addr().unwrap() } else { port() };
        let policy = if case == "policy typo" { "sim/typo.toml" } else { "sim/policy.dev.toml" };
        std::fs::write(dir.join("sim/typo.toml"), "alow_debug = true\n").unwrap();
        let config = format!(
            "model = {:?}\npolicy = \"{policy}\"\nsimulated_root = \"sim\"\n\
             [entry]\ngenerate_listen = \"{}\"\n\
             [[stage]]\nlayers = [0, 15]\nreplicas = [\"{}\"]\n\
             [[stage]]\nlayers = [15, 30]\nreplicas = [\"{shard_addr}\"]\n",
            model.display().to_string(),
            port(),
            port()
        );
        std::fs::write(dir.join("cluster.toml"), config).unwrap();
        let log = dir.join("cluster.log");
        let mut sup = Stopped(
            Command::new(&host)
                .args(["cluster", "--listen", &port().to_string(), "--config"])
                .arg(dir.join("cluster.toml"))
                .env("RUST_LOG", "info")
                .stdout(std::process::Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap(),
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = sup.0.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "{case}: the supervisor kept going:\n{}",
                std::fs::read_to_string(&log).unwrap()
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(!status.success(), "{case}: {text}");
        assert!(text.contains("cannot start (configuration error"), "{case}: {text}");
        assert!(!text.contains("shard exited; restarting"), "{case}: restarted:\n{text}");
        drop(squatter);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A second supervisor started on the same route (its shards' addresses
/// taken by the first cluster) must not relay to the first cluster's entry:
/// it stops with its shards' error and never says it is listening.
fn a_second_cluster_on_the_same_route_does_not_relay_the_first(host: &std::path::Path, dir: &std::path::Path) {
    let out = dir.join("second.out");
    let second_dir = dir.join("second-run");
    let mut second = Stopped(
        Command::new(host)
            .args(["cluster", "--listen", &port().to_string(), "--run-dir"])
            .arg(&second_dir)
            .arg("--config")
            .arg(dir.join("cluster.toml"))
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(dir.join("second.err")).unwrap())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = second.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the second cluster kept running");
        std::thread::sleep(Duration::from_millis(100));
    };
    let said = std::fs::read_to_string(&out).unwrap();
    let err = std::fs::read_to_string(dir.join("second.err")).unwrap();
    assert!(!status.success(), "{err}");
    assert!(!said.contains("listening on"), "the second cluster relayed the first one's entry:\n{said}");
    assert!(err.contains("configuration error"), "{err}");
}

/// Starts `veil-host cluster` on the config `make_config` writes in `dir`;
/// returns it (stopped on drop), its public address once the entry is ready,
/// and the config it ran. The ports in a config are free when chosen but not
/// held, so another process may take one before its shard binds it: a
/// cluster that stops because an address is in use is started again on a
/// fresh config (at most three times). Any other early exit fails the test
/// at once, with the supervisor's log.
fn start_cluster(
    host: &std::path::Path,
    dir: &std::path::Path,
    name: &str,
    make_config: impl Fn() -> String,
) -> (Stopped, SocketAddr, String) {
    for attempt in 1..=3 {
        let public = port();
        let config = make_config();
        let file = dir.join(format!("{name}.toml"));
        std::fs::write(&file, &config).unwrap();
        let log = dir.join(format!("{name}.log"));
        let stdout = dir.join(format!("{name}.out"));
        let mut sup = Stopped(
            Command::new(host)
                .args(["cluster", "--listen", &public.to_string(), "--config"])
                .arg(&file)
                .env("RUST_LOG", "info")
                .stdout(std::fs::File::create(&stdout).unwrap())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap(),
        );
        let listening = format!("listening on http://{public}");
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            if std::fs::read_to_string(&stdout).unwrap_or_default().contains(&listening) {
                return (sup, public, config);
            }
            let exited = sup.0.try_wait().unwrap();
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(status) = exited {
                if text.contains("in use") && attempt < 3 {
                    println!("{name}: a chosen port was taken before its shard bound it; starting again");
                    break;
                }
                panic!("{name}: the cluster stopped ({status}) before listening:\n{text}");
            }
            assert!(Instant::now() < deadline, "{name}: timed out waiting for {listening:?}:\n{text}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    unreachable!("the third attempt returns or panics")
}

/// ISSUE 17: a reviewer builds the client's policy only from values
/// reproduced from the launch inputs and the published files (`veil measure`,
/// `veil-shard manifest`, the route's policy file), never from what the
/// cluster presents. It accepts a (simulated) cluster started from those
/// inputs, and refuses the same cluster started again with one stage's weights
/// changed, or with another route policy on its links.
#[test]
fn a_policy_from_reproduced_values_accepts_the_cluster_and_refuses_changed_weights_or_route_policy() {
    let Some(model) = model() else { return };
    let host = PathBuf::from(env!("CARGO_BIN_EXE_veil-host"));
    let (shard, veil) = (host.with_file_name("veil-shard"), host.with_file_name("veil"));
    if !shard.exists() || !veil.exists() {
        veil_tests::skip("veil-shard or veil is not built next to veil-host");
        return;
    }
    let dir = std::env::temp_dir().join(format!("veil-reproduced-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let run = |cmd: &std::path::Path, args: &[&str]| {
        let o = Command::new(cmd).args(args).output().unwrap();
        assert!(o.status.success(), "{} {args:?}: {}", cmd.display(), String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let path = |p: &std::path::Path| p.to_str().unwrap().to_owned();

    // The launch inputs the (simulated) guests stand for, and their measurement.
    std::fs::write(dir.join("OVMF.fd"), veil_tests::firmware::ovmf(true)).unwrap();
    std::fs::write(dir.join("vmlinuz"), veil_tests::firmware::bytes("veil/test/kernel", 200_000)).unwrap();
    let launch = [
        "measure",
        "--ovmf",
        &path(&dir.join("OVMF.fd")),
        "--kernel",
        &path(&dir.join("vmlinuz")),
        "--append",
        "console=ttyS0 veil.role=shard",
        "--vcpus",
        "4",
        "--vcpu-type",
        "EPYC-Genoa",
    ]
    .map(str::to_owned);
    let measurement = run(&veil, &launch.iter().map(String::as_str).collect::<Vec<_>>()).trim().to_owned();
    // The simulated root reports that measurement (what an SNP guest launched from those inputs reports).
    run(&veil, &["attest", "sim-init", &path(&dir.join("sim")), "--seed", "17", "--measurement", &measurement]);
    let route_policy = dir.join("sim/policy.dev.toml");

    // The client's policy, from reproduced values only.
    let client = dir.join("client.toml");
    let c = path(&client);
    run(&veil, &["policy", "new", "--out", &c, "--allow-simulated"]);
    let mut with_policy = launch.to_vec();
    with_policy.extend(["--add-to".to_owned(), c.clone()]);
    run(&veil, &with_policy.iter().map(String::as_str).collect::<Vec<_>>());
    // One root per model, whatever the stage.
    let root_of = |model: &std::path::Path| -> String {
        let out = run(&shard, &["manifest", &path(model)]);
        out.split_whitespace().next().unwrap().to_owned()
    };
    run(&veil, &["policy", "add-manifest", &c, "--root", &root_of(&model)]);
    run(&veil, &["policy", "add-peer-policy", &c, "--peer", &path(&route_policy)]);
    run(&veil, &["policy", "set-layers", &c, "30"]);
    // The simulated platform's TCB (a real reviewer takes AMD's published minimums).
    let tcb = ["--bootloader", "9", "--tee", "0", "--snp", "23", "--microcode", "72"];
    run(&veil, &[&["policy", "set-tcb", &c, "--product", "Genoa"][..], &tcb[..]].concat());

    let config = |model: &std::path::Path, policy: &std::path::Path| {
        format!(
            "model = {:?}\npolicy = {:?}\nsimulated_root = \"sim\"\nheartbeat_ms = 100\n\
             [entry]\ngenerate_listen = \"{}\"\nsealed_listen = \"{}\"\n\
             [[stage]]\nlayers = [0, 12]\nreplicas = [\"{}\"]\n\
             [[stage]]\nlayers = [12, 30]\nreplicas = [\"{}\"]\n",
            path(model),
            path(policy),
            port(),
            port(),
            port(),
            port()
        )
    };
    let verify = |public: SocketAddr| {
        let o = Command::new(&veil).args(["verify", &format!("http://{public}"), "--policy", &c]).output().unwrap();
        (o.status.code(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
    };

    // Started from the same inputs: accepted, every check named.
    {
        let (_cluster, public, text) = start_cluster(&host, &dir, "same", || config(&model, &route_policy));
        let (code, table) = verify(public);
        assert_eq!(code, Some(0), "{table}");
        for check in ["measurement", "manifest", "peer_policy", "route_shape", "tcb"] {
            assert!(table.lines().any(|l| l.contains(check) && l.contains("PASS")), "{check}:\n{table}");
        }
        // The relay alone (`veil-host relay`), as a separate deployment in front of the entry.
        let gateway =
            text.lines().find_map(|l| l.strip_prefix("sealed_listen = ")).unwrap().trim_matches('"').to_owned();
        let listen = port();
        let relay = Stopped(
            Command::new(&host)
                .args(["relay", "--entry", &gateway, "--listen", &listen.to_string()])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(listen).is_err() {
            assert!(Instant::now() < deadline, "veil-host relay did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        let (code, table) = verify(listen);
        assert_eq!(code, Some(0), "through veil-host relay:\n{table}");
        drop(relay);
    }
    // One stage's weights changed (one byte near the end of the file).
    {
        let mut bytes = std::fs::read(&model).unwrap();
        let at = bytes.len() - 100;
        bytes[at] ^= 0x11;
        let changed = dir.join("changed.gguf");
        std::fs::write(&changed, bytes).unwrap();
        let theirs = root_of(&changed);
        assert_ne!(root_of(&model), theirs, "one changed byte is another model");
        let (_cluster, public, _) = start_cluster(&host, &dir, "weights", || config(&changed, &route_policy));
        let (code, why) = verify(public);
        assert_eq!(code, Some(1), "{why}");
        assert!(why.contains("rejected by check `route_manifests`") && why.contains(&theirs), "{why}");
    }
    // Another route policy on the links (debug guests allowed).
    {
        let weak = dir.join("weak-policy.toml");
        let text = std::fs::read_to_string(&route_policy).unwrap();
        std::fs::write(&weak, text.replace("allow_debug = false", "allow_debug = true")).unwrap();
        assert_ne!(std::fs::read_to_string(&weak).unwrap(), text);
        let (_cluster, public, _) = start_cluster(&host, &dir, "policy", || config(&model, &weak));
        let (code, why) = verify(public);
        assert_eq!(code, Some(1), "{why}");
        assert!(why.contains("rejected by check `peer_policy`") && why.contains("allow_debug"), "{why}");
    }

    // The route and peer policy bound through HOST_DATA: the VMM launched the
    // guests with the digest of the reviewed route and policy (here: a
    // simulated root of the same seed reporting it), clients pin it, and every
    // shard refuses to start on any other route or policy.
    let root = root_of(&model);
    let ports: Vec<SocketAddr> = (0..4).map(|_| port()).collect();
    let bound = |policy: &std::path::Path| {
        format!(
            "model = {:?}\npolicy = {:?}\nsimulated_root = \"sim2\"\nheartbeat_ms = 100\n\
             [entry]\ngenerate_listen = \"{}\"\nsealed_listen = \"{}\"\n\
             [[stage]]\nlayers = [0, 12]\nmanifest_root = \"{}\"\nreplicas = [\"{}\"]\n\
             [[stage]]\nlayers = [12, 30]\nmanifest_root = \"{}\"\nreplicas = [\"{}\"]\n",
            path(&model),
            path(policy),
            ports[0],
            ports[1],
            root,
            ports[2],
            root,
            ports[3]
        )
    };
    let text = bound(&route_policy);
    std::fs::write(dir.join("bound.toml"), &text).unwrap();
    let digest = run(&shard, &["config-digest", "--config", &path(&dir.join("bound.toml"))]).trim().to_owned();
    assert_eq!(digest.len(), 64);
    // The same route elsewhere (another directory, other paths) has the same digest.
    std::fs::create_dir_all(dir.join("elsewhere")).unwrap();
    std::fs::copy(&route_policy, dir.join("elsewhere/p.toml")).unwrap();
    std::fs::write(
        dir.join("elsewhere/r.toml"),
        bound(&dir.join("elsewhere/p.toml")).replace(&path(&model), "/m.gguf"),
    )
    .unwrap();
    let elsewhere = run(&shard, &["config-digest", "--config", &path(&dir.join("elsewhere/r.toml"))]);
    assert_eq!(elsewhere.trim(), digest);
    run(
        &veil,
        &[
            "attest",
            "sim-init",
            &path(&dir.join("sim2")),
            "--seed",
            "17",
            "--measurement",
            &measurement,
            "--host-data",
            &digest,
        ],
    );
    run(&veil, &["policy", "set-host-data", &c, &digest]);
    let start_bound = |name: &str, route: &str| {
        let file = dir.join(format!("{name}.toml"));
        std::fs::write(&file, route).unwrap();
        let log = dir.join(format!("{name}.log"));
        let public = port();
        let sup = Stopped(
            Command::new(&host)
                .args(["cluster", "--bind-config", "--listen", &public.to_string(), "--config"])
                .arg(&file)
                .env("RUST_LOG", "info")
                .stdout(std::fs::File::create(dir.join(format!("{name}.out"))).unwrap())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap(),
        );
        (sup, public, log)
    };
    {
        let (_cluster, public, log) = start_bound("bound-run", &bound(&route_policy));
        wait_for(&log, "every stage has a verified shard: ready", 1);
        assert_eq!(wait_for(&log, "HOST_DATA commits to this route", 2).matches("HOST_DATA commits").count(), 2);
        wait_for(&dir.join("bound-run.out"), "listening on", 1);
        let (code, table) = verify(public);
        assert_eq!(code, Some(0), "{table}");
        assert!(table.lines().any(|l| l.contains("host_data") && l.contains("PASS")), "{table}");
    }
    {
        // A stage behind a forwarded address (a Kubernetes Service IP): it
        // listens on --listen, not on its address in the route.
        let listen = port();
        let log = dir.join("listen.log");
        let _shard = Stopped(
            Command::new(&shard)
                .args(["serve", "--config", &path(&dir.join("bound.toml")), "--stage", "1", "--listen"])
                .arg(listen.to_string())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap(),
        );
        let text = wait_for(&log, "shard listening", 1);
        assert!(text.contains(&listen.to_string()), "{text}");
        assert!(TcpStream::connect(listen).is_ok());
        assert!(TcpStream::connect(ports[3]).is_err(), "the route's address is not bound");
    }
    {
        // The host hands the shards another peer policy: they refuse to start.
        let weak = dir.join("weak-policy.toml");
        let (mut cluster, _, log) = start_bound("bound-weak", &bound(&weak));
        let status = cluster.0.wait().unwrap();
        assert!(!status.success(), "the supervisor should stop on a configuration error");
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.contains("does not commit to this route and peer policy"), "{text}");
        assert!(!text.contains("ready"), "{text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
