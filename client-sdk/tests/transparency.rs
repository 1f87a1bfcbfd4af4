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

/// A client's world for the tests below: a simulated chip's evidence, the
/// policy that accepts it, a publisher, and a log holding versions 1 to
/// `versions` of that policy (`v1.json` …), in a fresh directory.
struct World {
    dir: PathBuf,
    state: PathBuf,
}

impl World {
    fn new(name: &str, versions: u64) -> Self {
        let dir = std::env::temp_dir().join(format!("veil-transparency-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let w = World { state: dir.join("client-state"), dir };
        assert_eq!(w.run(&["attest", "sim-init", s(&w.p("sim")), "--product", "Genoa", "--seed", "7a11"]).0, 0);
        let sim = SimulatedAttester::load(&w.p("sim")).unwrap();
        std::fs::write(w.p("evidence.json"), sim.evidence(&Claims::default()).unwrap().to_json()).unwrap();
        assert_eq!(w.run(&["policy", "keygen", "--out", s(&w.p("publisher.key"))]).0, 0);
        let (c, _, err) = w.run(&["log", "init", s(&w.p("log")), "--origin", "policy.example.org/log"]);
        assert_eq!(c, 0, "{err}");
        for n in 1..=versions {
            assert_eq!(w.sign(n, true).0, 0);
        }
        w
    }

    fn p(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn run(&self, args: &[&str]) -> (i32, String, String) {
        veil(&self.state, args)
    }

    /// Signs version `n` of the simulated policy into `v{n}.json`, appending it to the log if `log`.
    fn sign(&self, n: u64, log: bool) -> (i32, String, String) {
        let text = std::fs::read_to_string(self.p("sim").join("policy.dev.toml")).unwrap();
        let toml = self.p(&format!("policy-v{n}.toml"));
        std::fs::write(&toml, format!("{text}\n# version {n}\n")).unwrap();
        let out = self.p(&format!("v{n}.json"));
        let n = n.to_string();
        let mut args = vec!["policy", "sign", s(&toml), "--key", s(&self.p("publisher.key"))];
        args.extend(["--version", &n, "--out", s(&out)]);
        if log {
            args.extend(["--log", s(&self.p("log"))]);
        }
        let r = self.run(&args);
        assert_eq!(r.0, 0, "{}", r.2);
        r
    }

    /// `veil attest verify` of the evidence with bundle `v{n}.json`, logged in the log directory.
    fn verify(&self, n: u64, extra: &[&str]) -> (i32, String, String) {
        let bundle = self.p(&format!("v{n}.json"));
        let mut args = vec!["attest", "verify", "--policy", s(&bundle), "--policy-key", s(&self.p("publisher.pub"))];
        args.extend(["--evidence", s(&self.p("evidence.json"))]);
        args.extend(["--log", s(&self.p("log")), "--log-key", s(&self.p("log").join("log.vkey"))]);
        args.extend(extra);
        self.run(&args)
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Writes witness key `from` (`veil log keygen`'s FILE and FILE.vkey) again
/// under another name as `to` and `to.vkey`: the same Ed25519 key, another
/// key id, as a log operator running one witness would publish a "second".
fn rename_witness(from: &Path, to: &Path, name: &str) {
    use base64::Engine as _;
    use sha2::Digest as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let private = std::fs::read_to_string(from).unwrap();
    let vkey = std::fs::read_to_string(from.with_extension("vkey")).unwrap();
    // NAME+ID+KEY: names and ids hold no '+', base64 may.
    let seed = private.trim().strip_prefix("PRIVATE+KEY+").unwrap().splitn(3, '+').nth(2).unwrap().to_owned();
    let public = vkey.trim().splitn(3, '+').nth(2).unwrap().to_owned();
    let key = b64.decode(&public).unwrap();
    assert_eq!(key[0], 0x04, "a witness key");
    let id = sha2::Sha256::new().chain_update(name).chain_update(b"\n").chain_update(&key).finalize();
    let id = hex::encode(&id[..4]);
    std::fs::write(to, format!("PRIVATE+KEY+{name}+{id}+{seed}\n")).unwrap();
    std::fs::write(to.with_extension("vkey"), format!("{name}+{id}+{public}\n")).unwrap();
}

#[test]
fn one_witness_key_under_two_names_meets_one_required_witness_but_not_two() {
    let w = World::new("one-key-two-names", 1);
    let (c, _, err) = w.run(&["log", "keygen", "--name", "witness-a.example", "--out", s(&w.p("wa"))]);
    assert_eq!(c, 0, "{err}");
    rename_witness(&w.p("wa"), &w.p("wb"), "witness-b.example");
    // Both "witnesses" cosign the log's checkpoint, each under its own name.
    for key in ["wa", "wb"] {
        let vkey = w.p("log").join("log.vkey");
        let state = w.p(&format!("{key}-state"));
        let args = ["log", "cosign", "--log", s(&w.p("log")), "--log-key", s(&vkey), "--key", s(&w.p(key))];
        let (c, out, err) = w.run(&[&args[..], &["--state", s(&state)]].concat());
        assert_eq!(c, 0, "{err}");
        assert!(out.contains(&format!("as witness-{}.example", &key[1..])), "{out}");
    }
    let checkpoint = std::fs::read_to_string(w.p("log").join("checkpoint")).unwrap();
    assert!(checkpoint.contains("witness-a.example") && checkpoint.contains("witness-b.example"), "{checkpoint}");
    let witnessed =
        |n: &'static str| ["--witness", s(&w.p("wa.vkey")), "--witness", s(&w.p("wb.vkey")), "--witnesses-required", n];
    // Two names, two valid cosignatures, one key: one witness.
    let (c, _, err) = w.verify(1, &witnessed("2"));
    assert_eq!(c, 2, "{err}");
    assert!(err.contains("--witnesses-required 2 but only 1 distinct witness key(s) given"), "{err}");
    assert!(err.contains("one public key under two names counts once"), "{err}");
    assert!(err.contains("wa.vkey and ") && err.contains("wb.vkey"), "{err}");
    let (c, _, err) = w.verify(1, &witnessed("1"));
    assert_eq!(c, 0, "{err}");
    assert!(err.contains("the same public key under two names, counted as one witness"), "{err}");
    // A real second witness that did not cosign still leaves it at 1 of 2.
    let (c, _, err) = w.run(&["log", "keygen", "--name", "witness-c.example", "--out", s(&w.p("wc"))]);
    assert_eq!(c, 0, "{err}");
    let (c, _, err) = w.verify(1, &[&witnessed("2")[..], &["--witness", s(&w.p("wc.vkey"))]].concat());
    assert_eq!(c, 2, "{err}");
    assert!(err.contains("1 of the 2 required witness cosignatures"), "{err}");
}

#[test]
fn a_corrupt_rollback_floor_file_is_refused_not_reset() {
    let w = World::new("corrupt-floors", 3);
    let (c, _, err) = w.verify(3, &[]);
    assert_eq!(c, 0, "{err}");
    let floors = w.state.join("policy-versions.json");
    assert!(std::fs::read_to_string(&floors).unwrap().contains(": 3"));
    // The floor holds: version 2 after version 3 is a rollback.
    let (c, _, err) = w.verify(2, &[]);
    assert_eq!(c, 2);
    assert!(err.contains("older than version 3 already accepted from this publisher (rollback)"), "{err}");
    // Garbage, then JSON of the wrong shape: every bundle refused, the file named.
    for corrupt in ["\u{0}garbage{", "[3]", r#"{"publisher": "three"}"#] {
        std::fs::write(&floors, corrupt).unwrap();
        for n in [2, 3] {
            let (c, _, err) = w.verify(n, &[]);
            assert_eq!(c, 2, "version {n} with {corrupt:?}: {err}");
            assert!(err.contains(&format!("{}: corrupt rollback-floor state", floors.display())), "{err}");
            assert_eq!(std::fs::read_to_string(&floors).unwrap(), corrupt, "not re-seeded");
        }
    }
    // A missing file is a first use: the newest version is accepted and the floor kept again.
    std::fs::remove_file(&floors).unwrap();
    let (c, _, err) = w.verify(3, &[]);
    assert_eq!(c, 0, "{err}");
    assert!(std::fs::read_to_string(&floors).unwrap().contains(": 3"));
}

#[test]
fn policy_check_with_a_log_refuses_a_bundle_older_than_the_newest_logged_version() {
    let w = World::new("newest", 3);
    let old_copy = w.p("log-at-3");
    copy_dir(&w.p("log"), &old_copy);
    // Another publisher's later bundle in the same log does not count against this one.
    assert_eq!(w.run(&["policy", "keygen", "--out", s(&w.p("other.key"))]).0, 0);
    let text = std::fs::read_to_string(w.p("sim").join("policy.dev.toml")).unwrap();
    std::fs::write(w.p("other.toml"), text).unwrap();
    let other = ["policy", "sign", s(&w.p("other.toml")), "--key", s(&w.p("other.key")), "--version", "9"];
    let (c, _, err) = w.run(&[&other[..], &["--out", s(&w.p("other.json")), "--log", s(&w.p("log"))]].concat());
    assert_eq!(c, 0, "{err}");
    let served = serve(&w.p("log"));
    let vkey = w.p("log").join("log.vkey");
    let check = |n: u64, log: &str| {
        let bundle = w.p(&format!("v{n}.json"));
        let args = ["policy", "check", s(&bundle), "--policy-key", s(&w.p("publisher.pub"))];
        w.run(&[&args[..], &["--log", log, "--log-key", s(&vkey)]].concat())
    };

    // A first-use client takes version 1: it is signed and logged.
    let (c, _, err) = w.verify(1, &[]);
    assert_eq!(c, 0, "{err}");
    // Asked, the log says version 3 is the newest: version 1 and 2 are refused, exit 1.
    for n in [1, 2] {
        let (c, out, err) = check(n, &served.1);
        assert_eq!(c, 1, "{err}");
        assert!(err.contains("REFUSED"), "{err}");
        assert!(err.contains(&format!("logged version 3 (entry 2); this bundle is the older version {n}")), "{err}");
        assert!(!out.contains("policy bundle version"), "{out}");
    }
    // Version 3 is the newest: explained as usual (the dev policy's weak settings still warn).
    let (_, out, err) = check(3, &served.1);
    assert!(
        out.contains("policy bundle version 3 from publisher")
            && out.contains("the newest it has in log policy.example.org/log (entry 2 of 4)"),
        "{out}{err}"
    );
    assert!(out.contains("allow_simulated"), "{out}");
    assert!(!err.contains("REFUSED"), "{err}");
    // A version signed but never logged is refused as not in the log.
    w.sign(4, false);
    let (c, _, err) = check(4, &served.1);
    assert_eq!(c, 1, "{err}");
    assert!(err.contains("not in the log"), "{err}");
    // The check compares the log with the last checkpoint this client accepted
    // (size 4): the operator's copy from before the fourth entry is a rollback.
    let (c, _, err) = w.verify(3, &[]);
    assert_eq!(c, 0, "{err}");
    let (c, _, err) = check(3, s(&old_copy));
    assert_eq!(c, 1, "{err}");
    assert!(err.contains("checkpoint size 3 is below size 4 already accepted (rollback)"), "{err}");
    // Without --log it verifies the signature only, and says so; a TOML file with --log is a usage error.
    let args = ["policy", "check", s(&w.p("v1.json")), "--policy-key", s(&w.p("publisher.pub"))];
    let (_, out, _) = w.run(&args);
    assert!(out.contains("not compared with a log"), "{out}");
    let (c, _, err) = w.run(&["policy", "check", s(&w.p("other.toml")), "--log", &served.1, "--log-key", s(&vkey)]);
    assert_eq!(c, 2, "{err}");
    assert!(err.contains("not a signed bundle"), "{err}");
    // A log that cannot be read is exit 2, not a verdict.
    let (c, _, err) = check(3, s(&w.p("no-log-here")));
    assert_eq!(c, 2, "{err}");
}
