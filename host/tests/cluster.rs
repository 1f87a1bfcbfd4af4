//! `veil-host cluster` end to end: starts shards, restarts a killed one,
//! and on SIGTERM stops them all (no orphans). Needs the reference model
//! (`scripts/fetch-model.sh`) and the `veil-shard` binary next to
//! `veil-host` (a workspace build); prints SKIP otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::io::{BufRead, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
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
    println!("SKIP: reference model not found");
    None
}

fn port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
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

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

#[test]
fn supervises_restarts_and_stops_every_shard() {
    let Some(model) = model() else { return };
    let host = PathBuf::from(env!("CARGO_BIN_EXE_veil-host"));
    if !host.with_file_name("veil-shard").exists() {
        println!("SKIP: veil-shard is not built next to veil-host");
        return;
    }
    let dir = std::env::temp_dir().join(format!("veil-cluster-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let gen = port();
    let config = format!(
        "model = {:?}\npolicy = \"sim/policy.dev.toml\"\nsimulated_root = \"sim\"\nheartbeat_ms = 100\n\
         [entry]\ngenerate_listen = \"{gen}\"\n\
         [[stage]]\nlayers = [0, 12]\nreplicas = [\"{}\"]\n\
         [[stage]]\nlayers = [12, 30]\nreplicas = [\"{}\"]\n",
        model.display().to_string(),
        port(),
        port()
    );
    std::fs::write(dir.join("cluster.toml"), config).unwrap();
    let log = dir.join("cluster.log");
    let mut sup = Command::new(&host)
        .args(["cluster", "--config"])
        .arg(dir.join("cluster.toml"))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let text = wait_for(&log, "ready", 1);
    assert!(generate(gen).contains("\"done\""));
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
    let text = std::fs::read_to_string(&log).unwrap();
    let shards: Vec<u32> = pid_of(&text, 0).into_iter().chain(pid_of(&text, 1)).filter(|&p| p != victim).collect();
    assert_eq!(shards.len(), 2);
    Command::new("kill").args(["-TERM", &sup.id().to_string()]).status().unwrap();
    let status = sup.wait().unwrap();
    assert!(status.success(), "supervisor exited with {status}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while shards.iter().any(|&p| alive(p)) {
        assert!(Instant::now() < deadline, "shards outlived the supervisor: {shards:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(std::fs::read_to_string(&log).unwrap().contains("all shards stopped"));
    let _ = std::fs::remove_dir_all(&dir);
}
