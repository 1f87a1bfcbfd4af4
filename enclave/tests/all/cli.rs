//! `veil-shard generate` and `manifest` as users run them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;

fn model() -> Option<PathBuf> {
    let p = std::env::var_os("VEIL_MODEL").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/veil/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    });
    if p.exists() {
        return Some(p);
    }
    assert_ne!(std::env::var("VEIL_REQUIRE_MODEL").as_deref(), Ok("1"), "model missing");
    veil_tests::skip("reference model not found (run scripts/fetch-model.sh)");
    None
}

fn shard(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_veil-shard")).args(args).env("RUST_LOG", "warn").output().unwrap()
}

#[test]
fn generate_json_is_the_same_split_or_whole() {
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    let base = ["generate", "--model", m, "--prompt", "The capital of France is", "--max-tokens", "12", "--json"];
    let whole = shard(&base);
    assert!(whole.status.success(), "{}", String::from_utf8_lossy(&whole.stderr));
    let j: serde_json::Value = serde_json::from_slice(&whole.stdout).unwrap();
    assert_eq!(j["prompt_ids"], serde_json::json!([504, 3575, 282, 4649, 314]));
    assert_eq!(j["ids"][0], 7042);
    assert!(j["text"].as_str().unwrap().starts_with(" Paris"));
    let split = shard(&[&base[..], &["--split", "10,20"]].concat());
    assert_eq!(split.stdout, whole.stdout);
    let ids =
        shard(&["generate", "--model", m, "--prompt-ids", "504,3575,282,4649,314", "--max-tokens", "12", "--json"]);
    assert_eq!(ids.stdout, whole.stdout);
}

/// `veil-shard manifest` prints the model's one root, the same every time;
/// `--out` writes the manifest file, whose records give that root; a stage
/// of any layer range attests the same root.
#[test]
fn the_manifest_command_prints_the_models_one_root_and_writes_its_file() {
    let Some(m) = model() else { return };
    let ms = m.to_str().unwrap();
    let a = shard(&["manifest", ms]);
    let b = shard(&["manifest", ms]);
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    assert_eq!(a.stdout, b.stdout);
    let text = String::from_utf8_lossy(&a.stdout).into_owned();
    let root = text.split(' ').next().unwrap().to_owned();
    assert_eq!(root.len(), 64, "{text}");
    assert!(text.contains("in 1 file(s)"), "{text}");
    let out = std::env::temp_dir().join(format!("veil-manifest-{}.json", std::process::id()));
    let w = shard(&["manifest", ms, "--out", out.to_str().unwrap()]);
    assert!(w.status.success());
    let file = veil_enclave::model::manifest::ModelManifest::read(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    assert_eq!(hex::encode(file.root()), root);
    let slice = veil_enclave::model::LayerSlice::load(&m, 10..20).unwrap();
    assert_eq!(hex::encode(slice.manifest().root()), root);
    assert!(slice.manifest().tensors.iter().all(|t| t.name.starts_with("blk.")));
}

/// A GPU asked of a build without CUDA (or, on a CUDA build, of a machine
/// without a usable driver) is one clear error at start, not a panic; an
/// unknown device name is refused by the argument parser.
#[test]
fn a_device_this_build_cannot_use_is_a_clear_error() {
    let Some(m) = model() else { return };
    let c = crate::cluster::Cluster::new("cli-device", &m, &[10, 20], &[1, 1, 1]);
    let route = c.route_path.to_str().unwrap();
    let o = shard(&["serve", "--config", route, "--stage", "1", "--device", "cuda:0"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    if cfg!(feature = "cuda") {
        assert!(err.contains("cannot open CUDA device 0"), "{err}");
    } else {
        assert!(err.contains("built without CUDA support") && err.contains("--features cuda"), "{err}");
    }
    let o = shard(&["serve", "--config", route, "--stage", "1", "--device", "gpu"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("expected cpu, cuda or cuda:N"));
}

#[test]
fn bad_input_is_a_clear_error_not_a_panic() {
    let missing = shard(&["generate", "--model", "/nonexistent/model.gguf", "--prompt", "hi"]);
    assert!(!missing.status.success());
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(err.contains("model file: /nonexistent/model.gguf") && !err.contains("panicked"), "{err}");
    assert_eq!(err.matches("No such file").count(), 1, "the cause is printed once: {err}");
    // A route given as a bare file name resolves against the current directory.
    let dir = std::env::temp_dir().join(format!("veil-cli-bare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("cluster.toml"),
        "model = \"m.gguf\"\npolicy = \"p.toml\"\n[entry]\ngenerate_listen = \"127.0.0.1:1\"\n[[stage]]\nlayers = [0, 30]\nreplicas = [\"127.0.0.1:2\"]\n",
    )
    .unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_veil-shard"))
        .args(["prepare", "--config", "cluster.toml", "--out", "out.toml"])
        .current_dir(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("empty path"), "{err}");
    assert!(err.contains("m.gguf"), "expected the missing model to be named: {err}");
    let _ = std::fs::remove_dir_all(&dir);
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    let reversed = shard(&["generate", "--model", m, "--prompt", "x", "--split", "20,10"]);
    let err = String::from_utf8_lossy(&reversed.stderr);
    assert!(err.contains("increasing") && !err.contains("outside"), "{err}");
    for args in [
        vec!["generate", "--model", m, "--prompt", ""],
        vec!["generate", "--model", m, "--prompt", "x", "--split", "40"],
        vec!["generate", "--model", m, "--prompt", "x", "--temperature", "-1"],
        vec!["manifest", m, "--layers", "5..50"],
    ] {
        let o = shard(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && !err.contains("panicked"), "{args:?}: {err}");
    }
}

/// The first model examples (docs/models.md) show the model at its best,
/// not a greedy loop: kept in step with the book by running them.
#[test]
fn the_readme_examples_answer_sensibly() {
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    let capital = shard(&[
        "generate",
        "--model",
        m,
        "--chat",
        "--repeat-penalty",
        "1.1",
        "--prompt",
        "What is the capital of France? Answer in one sentence.",
    ]);
    let text = String::from_utf8_lossy(&capital.stdout);
    assert!(capital.status.success() && text.contains("Paris"), "{text}");
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/models.md")).unwrap();
    assert!(readme.contains(
        "--chat --repeat-penalty 1.1 \\\n    --prompt \"What is the capital of France? Answer in one sentence.\""
    ));
    let sampled = |seed: &str| {
        shard(&[
            "generate",
            "--model",
            m,
            "--chat",
            "--temperature",
            "0.7",
            "--top-p",
            "0.9",
            "--seed",
            seed,
            "--max-tokens",
            "24",
            "--prompt",
            "Give me three tips for staying focused while studying.",
        ])
        .stdout
    };
    assert_eq!(sampled("42"), sampled("42"), "the same seed gave another text");
}

/// What an operator meets first, said once and with what to do: `serve
/// --hardware` on a build without SEV-SNP support names the rebuild, and a
/// peer policy that allows no measurement is refused by `config-digest`
/// (and by a shard at start-up) instead of passing without a word.
#[test]
fn operator_errors_name_the_cause_once() {
    let dir = std::env::temp_dir().join(format!("veil-cli-operator-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let empty = veil_attestation::Policy::default();
    assert!(empty.measurements.is_empty() && !empty.any_measurement);
    std::fs::write(dir.join("peer-policy.toml"), empty.to_toml()).unwrap();
    let root = "ab".repeat(32);
    std::fs::write(
        dir.join("route.toml"),
        format!(
            "model = \"m.gguf\"\npolicy = \"peer-policy.toml\"\n[entry]\ngenerate_listen = \"127.0.0.1:1\"\n\
             [[stage]]\nlayers = [0, 30]\nmanifest_root = \"{root}\"\nreplicas = [\"127.0.0.1:2\"]\n"
        ),
    )
    .unwrap();
    let route = dir.join("route.toml");
    let route = route.to_str().unwrap();

    let o = shard(&["config-digest", "--config", route]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "a policy allowing no measurement got a digest: {err}");
    assert_eq!(err.matches("measurements = []").count(), 1, "{err}");
    assert!(err.contains("veil measure"), "the fix is named: {err}");

    let o = shard(&["serve", "--config", route, "--stage", "0", "--hardware"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && !err.contains("panicked"), "{err}");
    if cfg!(feature = "hw") {
        // The hardware build gets as far as the peer policy, and refuses it.
        assert_eq!(err.matches("measurements = []").count(), 1, "{err}");
    } else {
        assert_eq!(err.matches("--features veil-enclave/hw").count(), 1, "{err}");
        assert!(!err.contains("API misuse"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
