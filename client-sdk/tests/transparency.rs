//! The policy transparency log from the command line: `veil log init`,
//! `veil policy sign --log`, `veil log serve`, `cosign`, `prove`, `verify`,
//! and every `--policy` flag requiring a signed bundle to be in the log
//! (SECURITY-CASES C7, THREAT_MODEL §4.12). The log operator is the
//! adversary here: it serves an old copy (rollback), logs a second bundle of
//! one version (a split view), or lacks the witnesses' cosignatures.

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use veil_attestation::{Claims, SimulatedAttester};

/// A path as an argument (leaked: a test's handful).
fn s(p: &Path) -> &'static str {
    Box::leak(p.to_str().unwrap().to_owned().into_boxed_str())
}

/// Runs `veil` with its own state directory.
fn veil(state: &Path, args: &[&str]) -> (i32, String, String) {
    let o: Output = Command::new(env!("CARGO_BIN_EXE_veil")).args(args).env("VEIL_STATE_DIR", state).output().unwrap();
    let (out, err) = (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned());
    assert!(!err.contains("panicked"), "{err}");
    (o.status.code().unwrap_or(-1), out, err)
}

/// `veil log serve DIR` on a free loopback port; killed on drop.
struct Served(Child, String);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(dir: &Path) -> Served {
    let mut child = Command::new(env!("CARGO_BIN_EXE_veil"))
        .args(["log", "serve", s(dir), "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let url = line.trim().rsplit(' ').next().unwrap().to_owned();
    assert!(url.starts_with("http://127.0.0.1:"), "{line}");
    Served(child, url)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.join("entries")).unwrap();
    for e in std::fs::read_dir(from).unwrap().chain(std::fs::read_dir(from.join("entries")).unwrap()) {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            let rel = e.path().strip_prefix(from).unwrap().to_owned();
            std::fs::copy(e.path(), to.join(rel)).unwrap();
        }
    }
}

#[test]
fn a_policy_bundle_must_be_in_the_log_and_rollbacks_split_views_and_missing_cosignatures_are_refused() {
    let dir = std::env::temp_dir().join(format!("veil-transparency-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let p = |name: &str| -> PathBuf { dir.join(name) };
    let state = p("client-state");
    let run = |args: &[&str]| veil(&state, args);

    // A simulated chip's evidence, the policy that accepts it, a publisher, a log.
    assert_eq!(run(&["attest", "sim-init", s(&p("sim")), "--product", "Genoa", "--seed", "7a11"]).0, 0);
    let sim = SimulatedAttester::load(&p("sim")).unwrap();
    std::fs::write(p("evidence.json"), sim.evidence(&Claims::default()).unwrap().to_json()).unwrap();
    let policy = p("sim").join("policy.dev.toml");
    assert_eq!(run(&["policy", "keygen", "--out", s(&p("publisher.key"))]).0, 0);
    let (c, out, err) = run(&["log", "init", s(&p("log")), "--origin", "policy.example.org/log"]);
    assert_eq!(c, 0, "{err}");
    let vkey = p("log").join("log.vkey");
    assert_eq!(std::fs::read_to_string(&vkey).unwrap(), out, "the verifier key printed is the one written");

    // `veil policy sign --log` signs and appends in one step.
    let sign = |text: &str, version: &str, out: &Path, log: bool| {
        std::fs::write(p("policy.toml"), text).unwrap();
        let mut args = vec!["policy", "sign", s(&p("policy.toml")), "--key", s(&p("publisher.key"))];
        args.extend(["--version", version, "--out", s(out)]);
        if log {
            args.extend(["--log", s(&p("log"))]);
        }
        run(&args)
    };
    let text = std::fs::read_to_string(&policy).unwrap();
    let (c, out, err) = sign(&text, "1", &p("v1.json"), true);
    assert_eq!(c, 0, "{err}");
    assert!(out.contains("appended to the log as entry 0 (checkpoint size 1)"), "{out}");
    let old_copy = p("log-at-1");
    copy_dir(&p("log"), &old_copy);

    let served = serve(&p("log"));
    let verify = |bundle: &Path, extra: &[&str]| {
        let mut args = vec!["attest", "verify", "--policy", s(bundle), "--policy-key", s(&p("publisher.pub"))];
        args.extend(["--evidence", s(&p("evidence.json"))]);
        args.extend(extra);
        run(&args)
    };
    let log_flags = ["--log", served.1.as_str(), "--log-key", s(&vkey)];

    // Found in the log over HTTP: accepted, and the log named.
    let (c, _, err) = verify(&p("v1.json"), &log_flags);
    assert_eq!(c, 0, "{err}");
    assert!(err.contains("in log policy.example.org/log at index 0 of 1"), "{err}");
    // A bundle needs a log, or an explicit --unlogged.
    let (c, _, err) = verify(&p("v1.json"), &[]);
    assert_eq!(c, 2);
    assert!(err.contains("must be in a transparency log"), "{err}");

    // A newer bundle signed but never logged: refused (not in the log).
    let (c, _, err) = sign(&text, "2", &p("v2-unlogged.json"), false);
    assert_eq!(c, 0, "{err}");
    let (c, _, err) = verify(&p("v2-unlogged.json"), &log_flags);
    assert_eq!(c, 2);
    assert!(err.contains("not in the log"), "{err}");

    // Version 2 logged; the client accepts it and remembers size 2.
    let v2_text = format!("{text}\n# version 2\n");
    let (c, _, err) = sign(&v2_text, "2", &p("v2.json"), true);
    assert_eq!(c, 0, "{err}");
    let (c, _, err) = verify(&p("v2.json"), &log_flags);
    assert_eq!(c, 0, "{err}");
    assert!(err.contains("at index 1 of 2"), "{err}");

    // The operator serves its old copy (size 1, validly signed): a rollback.
    let (c, _, err) = verify(&p("v2.json"), &["--log", s(&old_copy), "--log-key", s(&vkey)]);
    assert_eq!(c, 2);
    assert!(err.contains("checkpoint size 1 is below size 2 already accepted (rollback)"), "{err}");

    // A second, different bundle of version 2: the honest log refuses it ...
    let (c, _, err) = sign(&format!("{text}\n# another version 2\n"), "2", &p("v2-other.json"), true);
    assert_eq!(c, 2, "{err}");
    assert!(err.contains("split view"), "{err}");
    let other = std::fs::read(p("v2-other.json"));
    assert!(other.is_err(), "a bundle the log refused is not written either");
    // ... a dishonest one logs it anyway: the client that saw version 2 refuses it,
    // and an audit of the log names it.
    let (c, _, err) = sign(&format!("{text}\n# another version 2\n"), "2", &p("v2-other.json"), false);
    assert_eq!(c, 0, "{err}");
    veil_attestation::tlog::store::LogDir::open(&p("log"))
        .unwrap()
        .append(&std::fs::read(p("v2-other.json")).unwrap())
        .unwrap();
    let (c, _, err) = verify(&p("v2-other.json"), &log_flags);
    assert_eq!(c, 2);
    assert!(err.contains("two different bundles as version 2"), "{err}");
    let audit = ["log", "verify", "--log", served.1.as_str(), "--log-key", s(&vkey)];
    let (c, _, err) = run(&[&audit[..], &["--policy-key", s(&p("publisher.pub"))]].concat());
    assert_eq!(c, 1, "{err}");
    assert!(err.contains("split view"), "{err}");
    let (c, out, err) = run(&audit);
    assert_eq!(c, 0, "{err}");
    assert!(out.contains("3 entries, root recomputed"), "{out}");

    // `veil log prove`: the checkpoint, the index and the proofs, as JSON.
    let (c, out, err) =
        run(&["log", "prove", s(&p("v2.json")), "--log", &served.1, "--log-key", s(&vkey), "--since", "1"]);
    assert_eq!(c, 0, "{err}");
    let proof: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(proof["index"], 1);
    assert!(proof["checkpoint"].as_str().unwrap().starts_with("policy.example.org/log\n3\n"));
    assert!(!proof["inclusion"].as_array().unwrap().is_empty());
    assert!(!proof["consistency"].as_array().unwrap().is_empty());

    // Witnesses: 2 of 2 required; one cosigned, then both.
    for w in ["w1", "w2"] {
        let (c, _, err) = run(&["log", "keygen", "--name", &format!("witness-{w}.example"), "--out", s(&p(w))]);
        assert_eq!(c, 0, "{err}");
    }
    let witnessed = |n: &'static str| {
        [&log_flags[..], &["--witness", s(&p("w1.vkey")), "--witness", s(&p("w2.vkey")), "--witnesses-required", n]]
            .concat()
    };
    let cosign = |w: &str| {
        let ws = p(&format!("{w}-state"));
        run(&["log", "cosign", "--log", s(&p("log")), "--log-key", s(&vkey), "--key", s(&p(w)), "--state", s(&ws)])
    };
    let (c, _, err) = cosign("w1");
    assert_eq!(c, 0, "{err}");
    let (c, _, err) = verify(&p("v2.json"), &witnessed("2"));
    assert_eq!(c, 2);
    assert!(err.contains("1 of the 2 required witness cosignatures"), "{err}");
    assert_eq!(verify(&p("v2.json"), &witnessed("1")).0, 0);
    let (c, _, err) = cosign("w2");
    assert_eq!(c, 0, "{err}");
    let (c, _, err) = verify(&p("v2.json"), &witnessed("2"));
    assert_eq!(c, 0, "{err}");
    // A witness refuses to cosign a log that went back (its state says size 3).
    let (c, _, err) = run(&[
        "log",
        "cosign",
        "--log",
        s(&old_copy),
        "--log-key",
        s(&vkey),
        "--key",
        s(&p("w1")),
        "--state",
        s(&p("w1-state")),
        "--out",
        s(&p("cosigned")),
    ]);
    assert_eq!(c, 1, "{err}");
    assert!(err.contains("rollback"), "{err}");

    drop(served);
    let _ = std::fs::remove_dir_all(&dir);
}
