//! The `veil attest` contract reviewers and scripts rely on: flags, output
//! and exit codes (0 accept, 1 reject, 2 unreadable input).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use veil_attestation::{Claims, Nonce, SimulatedAttester};
use veil_tests::vectors_dir;

fn veil(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_veil")).args(args).output().unwrap()
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn set(name: &str) -> Option<PathBuf> {
    vectors_dir().map(|v| v.join(name))
}

/// Path as a `'static` argument (tests only; a few bytes leaked per call).
fn s(p: &Path) -> &'static str {
    Box::leak(p.to_str().unwrap().to_owned().into_boxed_str())
}

const MILAN_MEASUREMENT: &str =
    "7a1e5c266c0108dbc9bb94fa926951320940915d0aafb42464bd88b579ea158d3e1a0dc39b2c60bd95b9c480cd81841f";

#[test]
fn verify_accepts_pinned_real_report_exit_0() {
    let Some(d) = set("snp-milan-virtee") else { return };
    let o = veil(&[
        "attest",
        "verify",
        "--report",
        s(&d.join("report.bin")),
        "--vcek",
        s(&d.join("vcek.der")),
        "--measurement",
        MILAN_MEASUREMENT,
    ]);
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("report_signature     PASS"), "{out}");
    // A bare report with neither claims nor --report-data: binding and freshness are not run, and the verdict says so.
    assert!(out.contains("report_data_binding  NOT RUN"), "{out}");
    assert!(out.contains("not run: report_data_binding, freshness"), "{out}");
}

#[test]
fn verify_strict_default_requires_a_measurement_exit_1() {
    let Some(d) = set("snp-milan-virtee") else { return };
    let o = veil(&["attest", "verify", "--report", s(&d.join("report_milan.hex")), "--vcek", s(&d.join("vcek.der"))]);
    assert_eq!(code(&o), 1);
    assert!(stdout(&o).contains("REJECTED (first failed check: measurement)"), "{}", stdout(&o));
    let o = veil(&[
        "attest",
        "verify",
        "--report",
        s(&d.join("report.bin")),
        "--vcek",
        s(&d.join("vcek.der")),
        "--any-measurement",
    ]);
    assert_eq!(code(&o), 0);
    assert!(stdout(&o).contains("ANY launch measurement"));
}

#[test]
fn verify_report_data_flag_binds() {
    let Some(d) = set("snp-milan-dstack") else { return };
    let base = [
        "attest",
        "verify",
        "--report",
        s(&d.join("report.bin")),
        "--vcek",
        s(&d.join("vcek.pem")),
        "--any-measurement",
    ];
    let rd = hex::encode(b"attest-test-fixture-2026");
    let o = veil(&[&base[..], &["--report-data", &rd]].concat());
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    let o = veil(&[&base[..], &["--report-data", "00"]].concat());
    assert_eq!(code(&o), 1);
    assert!(stdout(&o).contains("first failed check: report_data_binding"));
}

#[test]
fn verify_debug_report_is_rejected_for_debug() {
    let Some(d) = set("snp-milan-debug-gosev") else { return };
    let o = veil(&[
        "attest",
        "verify",
        "--report",
        s(&d.join("report.bin")),
        "--vcek",
        s(&d.join("vcek.der")),
        "--any-measurement",
        "--json",
    ]);
    assert_eq!(code(&o), 1);
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(j["accepted"], false);
    let checks = j["checks"].as_array().unwrap();
    assert_eq!(checks.len(), veil_attestation::CheckId::ALL.len());
    let failed: Vec<_> =
        checks.iter().filter(|c| c["status"] == "failed").map(|c| c["check"].as_str().unwrap()).collect();
    assert_eq!(failed, vec!["debug"]);
}

#[test]
fn verify_vlek_with_policy_and_time() {
    let Some(d) = set("snp-milan-vlek-aws-trustee") else { return };
    let dir = tempdir("vlek");
    let policy = dir.join("policy.toml");
    std::fs::write(&policy, "allow_vlek = true\nvmpl = 1\nany_measurement = true\n").unwrap();
    let args = [
        "attest",
        "verify",
        "--policy",
        s(&policy),
        "--report",
        s(&d.join("report.bin")),
        "--vcek",
        s(&d.join("vlek.der")),
        "--chain",
        s(&d.join("asvk_ark_milan.pem")),
    ];
    let o = veil(&[&args[..], &["--at", "2025-06-01"]].concat());
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    let o = veil(&args);
    assert_eq!(code(&o), 1);
    assert!(stdout(&o).contains("expired at 2025-12-10T22:14:21Z"), "{}", stdout(&o));
}

#[test]
fn unreadable_input_exits_2() {
    let dir = tempdir("bad");
    let garbage = dir.join("bundle.json");
    std::fs::write(&garbage, "{ not json").unwrap();
    let bad_policy = dir.join("policy.toml");
    std::fs::write(&bad_policy, "allow_simulatd = true").unwrap();
    for args in [
        vec!["attest", "verify", "--evidence", "/nonexistent/bundle.json"],
        vec!["attest", "verify", "--evidence", s(&garbage)],
        vec!["attest", "verify", "--policy", s(&bad_policy), "--evidence", s(&garbage)],
        vec!["attest", "verify", "--evidence", s(&garbage), "--at", "someday"],
        vec!["attest", "verify"],
        vec!["attest", "inspect", s(&garbage)],
    ] {
        let o = veil(&args);
        assert_eq!(code(&o), 2, "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn inspect_decodes_every_field() {
    let Some(d) = set("snp-genoa-azure-trustee") else { return };
    let o = veil(&["attest", "inspect", s(&d.join("report.bin"))]);
    assert_eq!(code(&o), 0);
    let out = stdout(&o);
    for needle in [
        "measurement",
        "f57dc09a507c6ecd",
        "debug_allowed",
        "reported_tcb",
        "microcode",
        "84",
        "Genoa",
        "signing_key",
        "VCEK",
        "1.55.40",
    ] {
        assert!(out.contains(needle), "missing {needle}: {out}");
    }
    let o = veil(&["attest", "inspect", "--json", s(&d.join("report.bin"))]);
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(j["version"], 3);
    assert_eq!(j["reported_tcb"]["snp"], 23);
    assert_eq!(j["cpuid"]["product"], "Genoa");
    assert_eq!(j["policy"]["debug_allowed"], "no");
}

#[test]
fn simulated_flow_is_loud_and_needs_allow_simulated() {
    let dir = tempdir("sim");
    let simdir = dir.join("sim");
    let o = veil(&["attest", "sim-init", s(&simdir), "--product", "Milan", "--seed", "00ff"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stderr(&o).contains("SIMULATED"));
    // A second init refuses to overwrite.
    assert_eq!(code(&veil(&["attest", "sim-init", s(&simdir)])), 2);
    let sim = SimulatedAttester::load(&simdir).unwrap();
    let nonce: Nonce = "a1b2c3".parse().unwrap();
    let bundle = sim.evidence(&Claims { nonce: Some(nonce), ..Default::default() }).unwrap();
    let ev = dir.join("evidence.json");
    std::fs::write(&ev, bundle.to_json()).unwrap();
    let policy = simdir.join("policy.dev.toml");
    let o = veil(&["attest", "verify", "--policy", s(&policy), "--evidence", s(&ev), "--nonce", "a1b2c3"]);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    assert!(stderr(&o).contains("WARNING: SIMULATED"), "{}", stderr(&o));
    assert!(stdout(&o).contains("SIMULATED root"));
    let o = veil(&["attest", "verify", "--policy", s(&policy), "--evidence", s(&ev), "--nonce", "a1b2c4"]);
    assert_eq!(code(&o), 1);
    assert!(stdout(&o).contains("first failed check: freshness"));
    // Strict default: simulated evidence refused.
    let o = veil(&["attest", "verify", "--evidence", s(&ev), "--any-measurement"]);
    assert_eq!(code(&o), 1);
    assert!(stdout(&o).contains("first failed check: endorsement_chain"));
    // inspect shows the bundle's endorsement as simulated.
    let o = veil(&["attest", "inspect", "--json", s(&ev)]);
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(j["endorsement"]["simulated"], true);
    assert_eq!(j["claims"]["nonce"], "a1b2c3");
}

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("veil-cli-{tag}-{}-{}", std::process::id(), rand_suffix()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn rand_suffix() -> String {
    veil_attestation::Nonce::random().to_string()[..8].to_owned()
}

// ---- NVIDIA GPU evidence ----

const NVTRUST_NONCE: &str = "931d8dd0add203ac3d8b4fbde75e115278eefcdceac5b87671a748f32364dfcb";

#[test]
fn verify_gpu_hex_evidence_alone_exit_0_and_nonce_mismatch_exit_1() {
    let Some(d) = set("nvidia-h100-nvtrust") else { return };
    let base = [
        "attest",
        "verify",
        "--gpu-evidence",
        s(&d.join("attestation_report.hex")),
        "--gpu-certs",
        s(&d.join("cert_chain.pem")),
    ];
    let o = veil(&[&base[..], &["--gpu-nonce", NVTRUST_NONCE]].concat());
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    for needle in [
        "GPU 0",
        "gpu_device_chain       PASS",
        "gpu_report_signature   PASS",
        "gpu_fwid               PASS",
        "gpu_nonce              PASS",
        "gpu_cc_mode            PASS",
        "gpu_rim_measurements   NOT RUN",
        "gpu_rim_signature      NOT RUN",
    ] {
        assert!(out.contains(needle), "missing {needle}: {out}");
    }
    // Without --gpu-nonce the nonce is not checked, and says so.
    let o = veil(&base);
    assert_eq!(code(&o), 0);
    assert!(stdout(&o).contains("gpu_nonce              NOT RUN"), "{}", stdout(&o));
    let wrong = format!("{}00", &NVTRUST_NONCE[..62]);
    let o = veil(&[&base[..], &["--gpu-nonce", wrong.as_str(), "--json"]].concat());
    assert_eq!(code(&o), 1);
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(j["accepted"], false);
    let failed: Vec<_> = j["gpus"][0]["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "failed")
        .map(|c| c["check"].as_str().unwrap())
        .collect();
    assert_eq!(failed, vec!["gpu_nonce"]);
}

#[test]
fn verify_gpu_rim_mismatch_and_require_rim_exit_1() {
    let Some(d) = set("nvidia-h100-coco-trustee") else { return };
    let base = [
        "attest",
        "verify",
        "--gpu-evidence",
        s(&d.join("attestation_report.hex")),
        "--gpu-certs",
        s(&d.join("cert_chain.pem")),
        "--at",
        "2025-01-01",
    ];
    let o = veil(&base);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    assert!(stdout(&o).contains("1 unsigned trailing byte"), "{}", stdout(&o));
    let o = veil(&[&base[..], &["--require-rim"]].concat());
    assert_eq!(code(&o), 1);
    assert!(stdout(&o).contains("first failed check: gpu_rim_measurements"), "{}", stdout(&o));
    let rim = d.join("rim/NV_GPU_VBIOS_1010_0200_882_960074001A_PROD.swidtag");
    let o = veil(&[&base[..], &["--rim", s(&rim)]].concat());
    assert_eq!(code(&o), 1);
    let out = stdout(&o);
    assert!(out.contains("VBIOS RIM index 9 (SPDM block 10)"), "{out}");
    assert!(out.contains("gpu_rim_signature      PASS"), "{out}");
    // Verified now, the RIM signer has expired.
    let o = veil(&["attest", "verify", "--gpu-evidence", base[3], "--gpu-certs", base[5], "--rim", s(&rim)]);
    assert_eq!(code(&o), 1);
    assert!(stdout(&o).contains("gpu_rim_signature      FAIL"), "{}", stdout(&o));
}

#[test]
fn verify_gpu_sdk_json_and_bad_signature() {
    let Some(d) = set("nvidia-hopper-negative-nvsdk") else { return };
    let o = veil(&[
        "attest",
        "verify",
        "--gpu-evidence",
        s(&d.join("cert_hold_evidence.json")),
        "--gpu-nonce",
        NVTRUST_NONCE,
    ]);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    let o = veil(&[
        "attest",
        "verify",
        "--gpu-evidence",
        s(&d.join("invalid_signature_report.hex")),
        "--gpu-certs",
        s(&d.join("invalid_signature_cert_chain.pem")),
    ]);
    assert_eq!(code(&o), 1);
    assert!(stdout(&o).contains("first failed check: gpu_report_signature"), "{}", stdout(&o));
}

#[test]
fn gpu_unreadable_input_exits_2() {
    let dir = tempdir("gpu-bad");
    let junk = dir.join("junk.hex");
    std::fs::write(&junk, "11e0zz").unwrap();
    let bad_rim = dir.join("rim.xml");
    std::fs::write(&bad_rim, "<SoftwareIdentity").unwrap();
    let json = dir.join("gpu.json");
    std::fs::write(&json, "{\"version\":1,\"gpus\":[]}").unwrap();
    for args in [
        vec!["attest", "verify", "--gpu-evidence", s(&junk)],
        vec!["attest", "verify", "--gpu-evidence", s(&junk), "--gpu-certs", s(&junk)],
        vec!["attest", "verify", "--gpu-evidence", s(&json), "--rim", s(&bad_rim)],
        vec!["attest", "verify", "--gpu-evidence", s(&json), "--gpu-nonce", "abcd"],
        vec!["attest", "inspect", "--gpu-evidence", s(&junk)],
    ] {
        let o = veil(&args);
        assert_eq!(code(&o), 2, "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn inspect_gpu_evidence_decodes_fields() {
    let Some(d) = set("nvidia-h100-coco-trustee") else { return };
    let o = veil(&[
        "attest",
        "inspect",
        "--gpu-evidence",
        s(&d.join("attestation_report.hex")),
        "--gpu-certs",
        s(&d.join("cert_chain.pem")),
        "--json",
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let g = &j["gpus"][0];
    assert_eq!(g["opaque"]["driver_version"], "580.95.05");
    assert_eq!(g["opaque"]["vbios_version"], "96.00.74.00.1A");
    assert_eq!(g["spdm"]["trailing_bytes"], 1);
    assert_eq!(g["spdm"]["measurement_blocks"], 64);
    assert_eq!(g["leaf_dice_fwid"], g["opaque"]["fwid"]);
    let o = veil(&[
        "attest",
        "inspect",
        "--gpu-evidence",
        s(&d.join("attestation_report.hex")),
        "--gpu-certs",
        s(&d.join("cert_chain.pem")),
    ]);
    assert!(stdout(&o).contains("UNVERIFIED"), "{}", stdout(&o));
}

#[test]
fn verify_composite_simulated_cpu_and_gpu_binding() {
    use veil_attestation::attester::gpu::simulated::{composite, SimulatedGpu, SimulatedGpuConfig};
    let dir = tempdir("composite");
    let snp = veil_tests::sim(veil_attestation::snp::Product::Genoa);
    let gpu = SimulatedGpu::from_seed(b"cli composite", SimulatedGpuConfig::default()).unwrap();
    let claims = Claims { nonce: Some(Nonce::new(vec![5; 32]).unwrap()), ..Default::default() };
    let (bound, gpus) = composite(std::slice::from_ref(&gpu), &claims).unwrap();
    let bundle = veil_attestation::Attester::evidence(&snp, &bound).unwrap();
    let policy = dir.join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            "allow_simulated = true\nmeasurements = [\"{}\"]\n[gpu]\nrequired = true\n",
            veil_attestation::simulated::default_measurement()
        ),
    )
    .unwrap();
    let b = dir.join("bundle.json");
    std::fs::write(&b, bundle.to_json()).unwrap();
    let g = dir.join("gpu.json");
    std::fs::write(&g, veil_attestation::gpu::evidence::to_json(&gpus)).unwrap();
    let o = veil(&["attest", "verify", "--policy", s(&policy), "--evidence", s(&b), "--gpu-evidence", s(&g)]);
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("gpu_evidence_binding   PASS") && out.contains("overall: ACCEPTED"), "{out}");
    assert!(stderr(&o).contains("SIMULATED GPU evidence"), "{}", stderr(&o));
    // Rows judging values the simulated device chain chose are flagged;
    // the format row is not.
    assert!(out.contains("gpu_nonce              PASS(SIM)"), "{out}");
    assert!(out.lines().any(|l| l.contains("gpu_evidence_format") && !l.contains("(SIM)")), "{out}");
    assert!(out.contains("gpu_revocation         SKIP"), "{out}");
    // OCSP responses for the device chain: good and current → PASS; one revoked → exit 1.
    let now = std::time::SystemTime::now();
    let day = std::time::Duration::from_secs(86_400);
    for (revoked, want_code, want) in
        [(None, 0, "gpu_revocation         PASS"), (Some(0), 1, "gpu_revocation         FAIL")]
    {
        let responses = gpu.ocsp_responses(revoked, now - day, Some(now + day)).unwrap();
        let mut args = vec!["attest", "verify", "--policy", s(&policy), "--evidence", s(&b), "--gpu-evidence", s(&g)];
        for (i, r) in responses.iter().enumerate() {
            let f = dir.join(format!("ocsp-{i}.der"));
            std::fs::write(&f, r).unwrap();
            args.extend(["--gpu-ocsp", s(&f)]);
        }
        let o = veil(&args);
        assert_eq!(code(&o), want_code, "{}", stdout(&o));
        assert!(stdout(&o).contains(want), "{}", stdout(&o));
    }
    // GPU evidence from another session (another client nonce) spliced into this bundle.
    let other = Claims { nonce: Some(Nonce::new(vec![6; 32]).unwrap()), ..Default::default() };
    let (_, spliced) = composite(&[gpu], &other).unwrap();
    std::fs::write(&g, veil_attestation::gpu::evidence::to_json(&spliced)).unwrap();
    let o = veil(&["attest", "verify", "--policy", s(&policy), "--evidence", s(&b), "--gpu-evidence", s(&g)]);
    assert_eq!(code(&o), 1);
    let out = stdout(&o);
    assert!(out.contains("gpu_nonce              FAIL") && out.contains("gpu_evidence_binding   FAIL"), "{out}");
    assert!(out.contains("overall: REJECTED"), "{out}");
}

/// `--evidence BUNDLE` alone runs the serving path's composite verification:
/// the bundle's own GPUs are checked, a `gpu.required` policy refuses a
/// CPU-only bundle, and a bundle whose claims commit to GPU evidence that
/// was stripped is refused.
#[test]
fn verify_evidence_alone_checks_the_bundles_gpus_and_the_gpu_policy() {
    use veil_attestation::attester::gpu::simulated::{composite, SimulatedGpu, SimulatedGpuConfig};
    let dir = tempdir("composite-alone");
    let snp = veil_tests::sim(veil_attestation::snp::Product::Genoa);
    let gpu = SimulatedGpu::from_seed(b"cli composite alone", SimulatedGpuConfig::default()).unwrap();
    let claims = Claims { nonce: Some(Nonce::new(vec![5; 32]).unwrap()), ..Default::default() };
    let (bound, gpus) = composite(std::slice::from_ref(&gpu), &claims).unwrap();
    let mut bundle = veil_attestation::Attester::evidence(&snp, &bound).unwrap();
    bundle.gpus = gpus;
    let policy = dir.join("policy.toml");
    let measurement = veil_attestation::simulated::default_measurement();
    std::fs::write(
        &policy,
        format!("allow_simulated = true\nmeasurements = [\"{measurement}\"]\n[gpu]\nrequired = true\n"),
    )
    .unwrap();
    let b = dir.join("bundle.json");
    std::fs::write(&b, bundle.to_json()).unwrap();
    let o = veil(&["attest", "verify", "--policy", s(&policy), "--evidence", s(&b)]);
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("gpu_evidence_binding   PASS"), "{}", stdout(&o));
    // Stripped: the claims still commit to the GPU evidence digest.
    let mut stripped = bundle.clone();
    stripped.gpus.clear();
    std::fs::write(&b, stripped.to_json()).unwrap();
    let o = veil(&["attest", "verify", "--policy", s(&policy), "--evidence", s(&b)]);
    assert_eq!(code(&o), 1, "a stripped bundle was accepted:\n{}", stdout(&o));
    let lax = dir.join("lax.toml");
    std::fs::write(&lax, format!("allow_simulated = true\nmeasurements = [\"{measurement}\"]\n")).unwrap();
    let o = veil(&["attest", "verify", "--policy", s(&lax), "--evidence", s(&b)]);
    assert_eq!(code(&o), 1, "stripped GPU evidence passed a policy without [gpu]:\n{}", stdout(&o));
    // CPU-only evidence under `gpu.required = true`.
    let cpu_only = veil_attestation::Attester::evidence(&snp, &claims).unwrap();
    std::fs::write(&b, cpu_only.to_json()).unwrap();
    let o = veil(&["attest", "verify", "--policy", s(&policy), "--evidence", s(&b)]);
    assert_eq!(code(&o), 1, "gpu.required passed without GPUs:\n{}", stdout(&o));
    let o = veil(&["attest", "verify", "--policy", s(&lax), "--evidence", s(&b)]);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
}

/// `veil policy check`: every setting explained, a warning per weak one
/// (exit 1), none for a production-shaped policy (exit 0), 2 when invalid.
#[test]
fn policy_check_explains_and_warns_about_weak_settings() {
    let dir = tempdir("policy-check");
    let weak = dir.join("weak.toml");
    std::fs::write(&weak, "allow_simulated = true\nany_measurement = true\nallow_debug = true\n").unwrap();
    let o = veil(&["policy", "check", s(&weak)]);
    assert_eq!(code(&o), 1, "{}", stdout(&o));
    let out = stdout(&o);
    for w in ["allow_simulated", "any_measurement", "allow_debug", "min_tcb", "gpu.required", "require_crl"] {
        assert!(out.contains(&format!("WARNING: {w}:")), "{w}:\n{out}");
    }
    assert!(out.contains("launch measurements (the CVM image) allowed"), "{out}");
    let strict = dir.join("strict.toml");
    std::fs::write(
        &strict,
        format!(
            r#"products = ["Genoa"]
require_crl = true
measurements = ["{}"]
manifest_roots = ["{}"]
[min_tcb.Genoa]
bootloader = 9
tee = 0
snp = 23
microcode = 72
[gpu]
required = true
require_rim = true
"#,
            "ab".repeat(48),
            "cd".repeat(32)
        ),
    )
    .unwrap();
    let o = veil(&["policy", "check", s(&strict)]);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    assert!(stdout(&o).contains("no weak settings"), "{}", stdout(&o));
    std::fs::write(&weak, "alow_debug = true\n").unwrap();
    assert_eq!(code(&veil(&["policy", "check", s(&weak)])), 2);
}

/// `veil attest inspect FILE | head` (the reader closes early) ends quietly,
/// not with a panic (exit 101).
#[test]
fn a_closed_stdout_is_not_a_panic() {
    let dir = tempdir("pipe");
    let snp = veil_tests::sim(veil_attestation::snp::Product::Genoa);
    let bundle = veil_attestation::Attester::evidence(&snp, &Claims::default()).unwrap();
    let b = dir.join("bundle.json");
    std::fs::write(&b, bundle.to_json()).unwrap();
    for _ in 0..5 {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_veil"))
            .args(["attest", "inspect", s(&b)])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(101), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// SECURITY-CASES C7: a policy signed by its publisher as a versioned
/// bundle. `veil policy keygen` and `sign` make it; every `--policy` flag
/// takes it with `--policy-key`; an edited bundle, another publisher's key,
/// a bundle without its key, and an older version once a newer one was
/// accepted (rollback) are refused with exit 2.
#[test]
fn signed_policy_bundles_verify_and_refuse_rollback() {
    let dir = tempdir("bundle");
    let simdir = dir.join("sim");
    assert_eq!(code(&veil(&["attest", "sim-init", s(&simdir), "--product", "Genoa", "--seed", "0c07"])), 0);
    let sim = SimulatedAttester::load(&simdir).unwrap();
    let ev = dir.join("evidence.json");
    std::fs::write(&ev, sim.evidence(&Claims::default()).unwrap().to_json()).unwrap();
    let policy = simdir.join("policy.dev.toml");
    let key = dir.join("publisher.key");
    let o = veil(&["policy", "keygen", "--out", s(&key)]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let public = dir.join("publisher.pub");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
    }
    let sign = |version: &str, out: &Path| {
        let o = veil(&["policy", "sign", s(&policy), "--key", s(&key), "--version", version, "--out", s(out)]);
        assert_eq!(code(&o), 0, "{}", stderr(&o));
    };
    let (v1, v2) = (dir.join("policy.v1.json"), dir.join("policy.v2.json"));
    sign("1", &v1);
    sign("2", &v2);
    let state = dir.join("state");
    let verify = |bundle: &Path, key: Option<&Path>| {
        let mut args = vec!["attest", "verify", "--policy", s(bundle), "--evidence", s(&ev)];
        if let Some(k) = key {
            // No transparency log here (tests/transparency.rs has it).
            args.extend(["--policy-key", s(k), "--unlogged"]);
        }
        let o = Command::new(env!("CARGO_BIN_EXE_veil")).args(&args).env("VEIL_STATE_DIR", &state).output().unwrap();
        (code(&o), stderr(&o))
    };
    let (c, err) = verify(&v1, Some(&public));
    assert_eq!(c, 0, "{err}");
    assert!(err.contains("policy bundle version 1"), "{err}");
    assert!(err.contains("without a transparency log (--unlogged)"), "{err}");
    assert_eq!(verify(&v2, Some(&public)).0, 0);
    // Version 1 again, after version 2 was accepted: a rollback.
    let (c, err) = verify(&v1, Some(&public));
    assert_eq!(c, 2);
    assert!(err.contains("rollback"), "{err}");
    // Without the key; with another publisher's key; edited.
    let (c, err) = verify(&v2, None);
    assert_eq!(c, 2);
    assert!(err.contains("--policy-key"), "{err}");
    let other = dir.join("other.key");
    assert_eq!(code(&veil(&["policy", "keygen", "--out", s(&other)])), 0);
    assert_eq!(verify(&v2, Some(&dir.join("other.pub"))).0, 2);
    let edited = dir.join("edited.json");
    let text = std::fs::read_to_string(&v2)
        .unwrap()
        .replace("allow_simulated = true", "allow_simulated = true\\nallow_debug = true");
    assert_ne!(text, std::fs::read_to_string(&v2).unwrap(), "the edit must change the bundle");
    std::fs::write(&edited, text).unwrap();
    let (c, err) = verify(&edited, Some(&public));
    assert_eq!(c, 2);
    assert!(err.contains("signature"), "{err}");
    // A plain TOML policy with --policy-key is a mistake, said so.
    let (c, err) = verify(&policy, Some(&public));
    assert_eq!(c, 2);
    assert!(err.contains("not a signed bundle"), "{err}");
}

// ---- wrong endpoints: the error says what to do ----

/// A plain-HTTP server on loopback that answers every request with 404
/// (as a Veil host does for an unknown path, or `veil proxy` for the
/// attestation path); returns its address.
fn plain_http_404() -> std::net::SocketAddr {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind(veil_tests::free_loopback_port()).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten().take(8) {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ =
                conn.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot found");
        }
    });
    addr
}

#[test]
fn wrong_endpoints_get_a_hint_not_a_bare_error() {
    let dir = tempdir("endpoints");
    let simdir = dir.join("sim");
    assert_eq!(code(&veil(&["attest", "sim-init", s(&simdir), "--seed", "00ff"])), 0);
    let policy = simdir.join("policy.dev.toml");
    let addr = plain_http_404();
    // A path (…/v1) or another server's address: a 404 for the attestation document.
    let o = veil(&["verify", &format!("http://{addr}/v1"), "--policy", s(&policy)]);
    assert_ne!(code(&o), 0);
    let err = stderr(&o) + &stdout(&o);
    assert!(err.contains("404") && err.contains("root URL") && err.contains("veil proxy"), "{err}");
    // https:// against a plain-HTTP host.
    let o = veil(&["verify", &format!("https://{addr}"), "--policy", s(&policy)]);
    assert_ne!(code(&o), 0);
    let err = stderr(&o) + &stdout(&o);
    assert!(err.contains(&format!("try http://{addr}")), "{err}");
}

/// `veil web` refuses to start, with exit 2 and the reason, when it would
/// serve beyond this machine, when the WebAssembly client is missing (it
/// never serves a page without its verifier), or when the policy is bad.
#[test]
fn veil_web_refuses_to_start_without_what_the_page_needs() {
    let d = tempdir("web");
    let policy = d.join("policy.toml");
    std::fs::write(&policy, "").unwrap();
    let empty = d.join("no-package");
    std::fs::create_dir_all(&empty).unwrap();
    let o = veil(&["web", "http://127.0.0.1:9", "--policy", s(&policy), "--listen", "0.0.0.0:0", "--pkg", s(&empty)]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("loopback"), "{}", stderr(&o));
    let o = veil(&["web", "http://127.0.0.1:9", "--policy", s(&policy), "--listen", "127.0.0.1:0", "--pkg", s(&empty)]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("veil.js") && stderr(&o).contains("build-wasm.sh"), "{}", stderr(&o));
    std::fs::write(&policy, "no_such_setting = 1\n").unwrap();
    let o = veil(&["web", "http://127.0.0.1:9", "--policy", s(&policy), "--listen", "127.0.0.1:0", "--pkg", s(&empty)]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("policy"), "{}", stderr(&o));
    std::fs::write(&policy, "").unwrap();
    let o = veil(&["web", "ftp://127.0.0.1:9", "--policy", s(&policy), "--pkg", s(&empty)]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("http://"), "{}", stderr(&o));
    std::fs::remove_dir_all(&d).unwrap();
}

/// `inspect` names the IDs NVIDIA's RIM service serves this GPU's RIMs
/// under (what an operator fetches for `veil-shard serve --gpu-rim`), as the
/// vector's provenance records them.
#[test]
fn inspect_names_the_rim_ids_of_a_real_gpu() {
    let Some(d) = set("nvidia-h100-coco-trustee") else { return };
    let expected: serde_json::Value = serde_json::from_slice(&std::fs::read(d.join("expected.json")).unwrap()).unwrap();
    let o = veil(&[
        "attest",
        "inspect",
        "--json",
        "--gpu-evidence",
        s(&d.join("attestation_report.hex")),
        "--gpu-certs",
        s(&d.join("cert_chain.pem")),
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(j["gpus"][0]["rim_ids"]["driver"], expected["driver_rim_id"]);
    assert_eq!(j["gpus"][0]["rim_ids"]["vbios"], expected["vbios_rim_id"]);
}
