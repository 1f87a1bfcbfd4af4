//! `veil measure` against `sev-snp-measure` (PyPI), byte for byte, on
//! fabricated firmware, kernel and initrd: several vCPU counts and types and
//! guest features, with and without measured direct boot (QEMU; EC2 is
//! refused, see `veil_attestation::measure`). `VEIL_REQUIRE_SNP_MEASURE=1`
//! (CI) turns a missing `sev-snp-measure` into a failure instead of a SKIP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use veil_tests::firmware;

fn veil(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_veil")).args(args).output().unwrap()
}

/// `sev-snp-measure`, when installed.
fn reference() -> Option<PathBuf> {
    let found = Command::new("sev-snp-measure").arg("--version").output().is_ok_and(|o| o.status.success());
    if found {
        return Some(PathBuf::from("sev-snp-measure"));
    }
    if std::env::var("VEIL_REQUIRE_SNP_MEASURE").as_deref() == Ok("1") {
        panic!(
            "sev-snp-measure is required (VEIL_REQUIRE_SNP_MEASURE=1) but not installed: pip install sev-snp-measure"
        );
    }
    veil_tests::skip("sev-snp-measure not installed: veil measure not compared with it");
    None
}

struct Inputs {
    dir: PathBuf,
}

impl Inputs {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("veil-measure-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("plain.fd"), firmware::ovmf(false)).unwrap();
        std::fs::write(dir.join("hashes.fd"), firmware::ovmf(true)).unwrap();
        std::fs::write(dir.join("vmlinuz"), firmware::bytes("veil/test/kernel", 300_000)).unwrap();
        std::fs::write(dir.join("initrd"), firmware::bytes("veil/test/initrd", 123_457)).unwrap();
        Self { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

impl Drop for Inputs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn hex_line(out: &std::process::Output, who: &str) -> String {
    assert!(out.status.success(), "{who} failed: {}", String::from_utf8_lossy(&out.stderr));
    let s = String::from_utf8(out.stdout.clone()).unwrap().trim().to_owned();
    assert_eq!(s.len(), 96, "{who} printed {s:?}");
    s
}

#[test]
fn veil_measure_equals_sev_snp_measure_on_every_combination() {
    let Some(reference) = reference() else { return };
    let inp = Inputs::new("cmp");
    let boot: Vec<Vec<String>> = vec![
        vec![],
        vec!["--kernel".into(), inp.path("vmlinuz")],
        vec!["--kernel".into(), inp.path("vmlinuz"), "--initrd".into(), inp.path("initrd")],
        vec![
            "--kernel".into(),
            inp.path("vmlinuz"),
            "--initrd".into(),
            inp.path("initrd"),
            "--append".into(),
            "console=ttyS0 root=/dev/vda1 ro veil.route=sha256:0123".into(),
        ],
    ];
    let mut seen = std::collections::BTreeSet::new();
    let mut compared = 0;
    for (vcpus, vcpu_type, vmm, features) in [
        ("1", "EPYC-v4", "QEMU", "0x1"),
        ("4", "EPYC-Milan", "QEMU", "0x1"),
        ("16", "EPYC-Genoa", "QEMU", "0x21"),
        ("2", "EPYC-Turin", "QEMU", "0x1"),
        ("64", "EPYC-Milan-v2", "QEMU", "0x1"),
    ] {
        for b in &boot {
            let ovmf = if b.is_empty() { inp.path("plain.fd") } else { inp.path("hashes.fd") };
            let mut common: Vec<String> =
                vec!["--ovmf".into(), ovmf, "--vcpus".into(), vcpus.into(), "--vcpu-type".into(), vcpu_type.into()];
            common.extend(b.iter().cloned());
            common.extend(["--guest-features".into(), features.into()]);
            let mut ours: Vec<String> = vec!["measure".into()];
            ours.extend(common.iter().cloned());
            ours.extend(["--vmm".into(), vmm.to_ascii_lowercase()]);
            let ours = hex_line(&veil(&ours.iter().map(String::as_str).collect::<Vec<_>>()), "veil measure");
            let theirs = Command::new(&reference)
                .args(["--mode", "snp", "--vmm-type", vmm, "--output-format", "hex"])
                .args(&common)
                .output()
                .unwrap();
            let theirs = hex_line(&theirs, "sev-snp-measure");
            assert_eq!(ours, theirs, "vcpus {vcpus} {vcpu_type} {vmm} features {features} boot {b:?}");
            seen.insert(ours);
            compared += 1;
        }
    }
    assert_eq!(seen.len(), compared, "every combination has its own measurement");
}

#[test]
fn measure_refuses_bad_inputs_with_a_reason_and_adds_to_a_policy() {
    let inp = Inputs::new("bad");
    let base = |ovmf: &str| {
        vec!["measure", "--vcpus", "1", "--vcpu-type", "EPYC-v4", "--ovmf"]
            .into_iter()
            .map(str::to_owned)
            .chain([ovmf.to_owned()])
            .collect::<Vec<_>>()
    };
    let run = |args: Vec<String>| veil(&args.iter().map(String::as_str).collect::<Vec<_>>());
    // A kernel on firmware without the kernel hashes section.
    let mut a = base(&inp.path("plain.fd"));
    a.extend(["--kernel".into(), inp.path("vmlinuz")]);
    let o = run(a);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("kernel hashes"), "{}", String::from_utf8_lossy(&o.stderr));
    // Truncated, garbage and non-page-sized images: an error, never a panic.
    let image = firmware::ovmf(true);
    for (name, bytes) in [
        ("garbage.fd", firmware::bytes("garbage", 1 << 16)),
        ("truncated.fd", image[..image.len() - 4096].to_vec()),
        ("odd.fd", image[..image.len() - 7].to_vec()),
        ("empty.fd", Vec::new()),
    ] {
        std::fs::write(inp.dir.join(name), bytes).unwrap();
        let o = run(base(&inp.path(name)));
        assert_eq!(o.status.code(), Some(2), "{name}: {}", String::from_utf8_lossy(&o.stderr));
        assert!(String::from_utf8_lossy(&o.stderr).contains("firmware"), "{name}");
    }
    // EC2: the references disagree (see veil_attestation::measure), so it is refused.
    let mut a = base(&inp.path("plain.fd"));
    a.extend(["--vmm".into(), "ec2".into()]);
    let o = run(a);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("disagree"));
    // Unknown vCPU type, SNPActive cleared.
    let mut a = base(&inp.path("plain.fd"));
    a[4] = "EPYC-Zen9".into();
    assert_eq!(run(a).status.code(), Some(2));
    let mut a = base(&inp.path("plain.fd"));
    a.extend(["--guest-features".into(), "0x2".into()]);
    assert_eq!(run(a).status.code(), Some(2));

    // --add-to puts it in a policy, once.
    let policy = inp.dir.join("policy.toml");
    assert!(veil(&["policy", "new", "--out", policy.to_str().unwrap()]).status.success());
    let mut a = base(&inp.path("plain.fd"));
    a.extend(["--add-to".into(), policy.display().to_string()]);
    let o = run(a.clone());
    let m = hex_line(&o, "veil measure");
    run(a);
    let p = veil_attestation::Policy::from_toml(&std::fs::read_to_string(&policy).unwrap()).unwrap();
    assert_eq!(p.measurements.iter().map(|x| x.to_string()).collect::<Vec<_>>(), std::slice::from_ref(&m));
    assert!(Path::new(&policy).exists());

    // One step for a deployment: the measurement, the HOST_DATA of its config
    // and the shards' peer policy, in one edit; a bad HOST_DATA changes nothing.
    let peer = inp.dir.join("peer.toml");
    assert!(veil(&["policy", "new", "--out", peer.to_str().unwrap()]).status.success());
    let client = inp.dir.join("client.toml");
    assert!(veil(&["policy", "new", "--out", client.to_str().unwrap()]).status.success());
    let before = std::fs::read_to_string(&client).unwrap();
    let mut a = base(&inp.path("plain.fd"));
    a.extend(["--add-to".into(), client.display().to_string(), "--host-data".into(), "zz".into()]);
    assert_ne!(run(a).status.code(), Some(0));
    assert_eq!(std::fs::read_to_string(&client).unwrap(), before, "a refused edit leaves the policy as it was");
    let host_data = "7f".repeat(32);
    let mut a = base(&inp.path("plain.fd"));
    a.extend([
        "--add-to".into(),
        client.display().to_string(),
        "--host-data".into(),
        host_data.clone(),
        "--peer-policy".into(),
        peer.display().to_string(),
    ]);
    let o = run(a);
    assert_eq!(hex_line(&o, "veil measure"), m);
    let c = veil_attestation::Policy::from_toml(&std::fs::read_to_string(&client).unwrap()).unwrap();
    let peer_digest = veil_attestation::Policy::from_toml(&std::fs::read_to_string(&peer).unwrap()).unwrap().digest();
    assert_eq!(c.measurements.iter().map(|x| x.to_string()).collect::<Vec<_>>(), [m]);
    assert_eq!(c.host_data.map(|h| h.0.to_string()), Some(host_data));
    assert_eq!(c.peer_policies, [peer_digest]);
}

#[test]
fn debian_ovmf_measures_the_same_and_refuses_a_kernel() {
    let ovmf = Path::new("/usr/share/ovmf/OVMF.fd");
    if !ovmf.exists() {
        veil_tests::skip("Debian's ovmf package is not installed: real firmware not measured");
        return;
    }
    let Some(reference) = reference() else { return };
    let ovmf = ovmf.to_str().unwrap();
    for (vcpus, t) in [("1", "EPYC-v4"), ("4", "EPYC-Genoa")] {
        let ours = hex_line(&veil(&["measure", "--ovmf", ovmf, "--vcpus", vcpus, "--vcpu-type", t]), "veil measure");
        let theirs = Command::new(&reference)
            .args(["--mode", "snp", "--ovmf", ovmf, "--vcpus", vcpus, "--vcpu-type", t])
            .output()
            .unwrap();
        assert_eq!(ours, hex_line(&theirs, "sev-snp-measure"), "{vcpus} × {t}");
    }
    // Its image has no SNP_KERNEL_HASHES section: measured direct boot is refused.
    let inp = Inputs::new("debian");
    let o =
        veil(&["measure", "--ovmf", ovmf, "--vcpus", "1", "--vcpu-type", "EPYC-v4", "--kernel", &inp.path("vmlinuz")]);
    assert_eq!(o.status.code(), Some(2));
}
