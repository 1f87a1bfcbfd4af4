//! The relay serves a copy of the policy transparency log under `/v1/log`,
//! and a client requires a signed bundle to be in it through the relay. The
//! host is untrusted: what it serves is checked (signature, proofs); a relay
//! that serves a log with an entry edited on its disk is caught.

use veil_attestation::policy_bundle::{key_hash, PolicySigner};
use veil_attestation::tlog::store::LogDir;
use veil_client::cli::LogTrustArgs;

#[test]
fn clients_fetch_checkpoints_and_proofs_through_the_relay() {
    let dir = std::env::temp_dir().join(format!("veil-relay-log-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (log, vkey) = LogDir::create(&dir.join("log"), "policy.example.org/log").unwrap();
    std::fs::write(dir.join("log.vkey"), format!("{vkey}\n")).unwrap();
    let publisher = PolicySigner::generate();
    let bundle = publisher.sign("allow_smt = false\n", 3).unwrap();
    log.append(b"an earlier entry").unwrap();
    log.append(&bundle).unwrap();
    let signer = key_hash(&publisher.public_key()).to_string();

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    rt.block_on(async {
        // No entry behind this relay: the log needs none.
        let unused = "127.0.0.1:9".parse().unwrap();
        let serve = |log: Option<std::path::PathBuf>| async {
            let listener = tokio::net::TcpListener::bind(veil_tests::free_loopback_port()).await.unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            let relay = veil_host::relay::Relay::new(veil_host::relay::RelayConfig {
                log,
                ..veil_host::relay::RelayConfig::new(unused)
            });
            (url, tokio::spawn(relay.serve(listener)))
        };
        let (url, served) = serve(Some(dir.join("log"))).await;
        let require = |state: &'static str| {
            let args = LogTrustArgs {
                source: Some(format!("{url}/v1/log")),
                log_key: Some(dir.join("log.vkey")),
                ..LogTrustArgs::default()
            };
            let (bundle, signer, state) = (bundle.clone(), signer.clone(), dir.join(state));
            tokio::task::spawn_blocking(move || {
                veil_client::cli::log::require_logged(&bundle, &signer, 3, &args, &state)
            })
        };
        let found = require("state").await.unwrap().unwrap();
        assert_eq!((found.index, found.size), (1, 2));
        // The host edits an entry on its disk and re-signs nothing: the
        // inclusion proof it serves is computed from stored hashes and still
        // verifies for the bundle, but an audit through the relay recomputes
        // the root and refuses the log.
        std::fs::write(dir.join("log/entries/000000000000"), b"edited").unwrap();
        let trust = veil_attestation::tlog::LogTrust { log: vkey.clone(), witnesses: vec![], required: 0 };
        let audit = {
            let url = format!("{url}/v1/log");
            tokio::task::spawn_blocking(move || veil_client::cli::log::audit(&url, &trust, &[]))
        };
        let err = audit.await.unwrap().unwrap_err().to_string();
        assert!(err.contains("inclusion proof does not verify"), "{err}");
        served.abort();
        // A relay without a log says so.
        let (url, served) = serve(None).await;
        let resp = reqwest_like_get(&format!("{url}/v1/log/checkpoint")).await;
        assert!(resp.starts_with("HTTP/1.1 404") && resp.contains("serves no transparency log"), "{resp}");
        served.abort();
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// A bare HTTP/1.1 GET: the whole response as text.
async fn reqwest_like_get(url: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let rest = url.strip_prefix("http://").unwrap();
    let (addr, path) = rest.split_at(rest.find('/').unwrap());
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = String::new();
    tcp.read_to_string(&mut out).await.unwrap();
    out
}
