//! `veil attest verify --tdx` / `--azure` / `--tpm-quote` and `veil attest
//! inspect` on real TDX quotes and Azure evidence: the tables, the exit codes
//! (0 accept, 1 refuse, 2 unreadable input), the policy's `[tdx]` and
//! `[azure]` sections and the flags.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use veil_tests::vectors_dir;

fn veil(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_veil")).args(args).output().unwrap()
}

fn out(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn tdx() -> Option<PathBuf> {
    vectors_dir().map(|v| v.join("tdx-dcap-qvl"))
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_owned()
}

/// Inside the up-to-date sample's collateral (its later issue date plus an hour).
const AT: &str = "2025-06-19T11:32:27Z";

#[test]
fn the_up_to_date_quote_exits_0_and_a_wrong_mrtd_exits_1() {
    let Some(d) = tdx() else { return };
    let (q, c) = (s(&d.join("tdx_quote")), s(&d.join("tdx_quote_collateral.json")));
    let o = veil(&["attest", "verify", "--tdx", &q, "--collateral", &c, "--at", AT, "--any-measurement"]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    assert!(out(&o).contains("tdx_tcb_status           PASS      UpToDate"), "{}", out(&o));
    // The JSON form names the status.
    let o = veil(&["attest", "verify", "--tdx", &q, "--collateral", &c, "--at", AT, "--any-measurement", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["tcb_status"], "UpToDate");
    assert_eq!(v["accepted"], true);
    // Pinned to another MRTD: refused by the measurement check.
    let other = "00".repeat(48);
    let o = veil(&["attest", "verify", "--tdx", &q, "--collateral", &c, "--at", AT, "--mrtd", &other]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert!(out(&o).contains("first failed check: tdx_measurements"), "{}", out(&o));
    // The same MRTD from a policy file's [tdx] section.
    let mrtd = hex_of(&std::fs::read(d.join("tdx_quote")).unwrap()[48 + 136..48 + 184]);
    let dir = std::env::temp_dir().join(format!("veil-cli-tdx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let policy = dir.join("policy.toml");
    std::fs::write(&policy, format!("[tdx]\nmrtd = [\"{mrtd}\"]\n")).unwrap();
    let o = veil(&["attest", "verify", "--policy", &s(&policy), "--tdx", &q, "--collateral", &c, "--at", AT]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    // A typo in the section is an unreadable policy.
    std::fs::write(&policy, "[tdx]\nallow_debugg = true\n").unwrap();
    let o = veil(&["attest", "verify", "--policy", &s(&policy), "--tdx", &q, "--collateral", &c, "--at", AT]);
    assert_eq!(o.status.code(), Some(2), "{}", out(&o));
    std::fs::remove_dir_all(&dir).ok();
}

fn hex_of(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn the_outdated_quote_exits_1_naming_the_component() {
    let Some(d) = tdx() else { return };
    let o = veil(&[
        "attest",
        "verify",
        "--tdx",
        &s(&d.join("tdx_quote_outdated")),
        "--collateral",
        &s(&d.join("tdx_quote_outdated_collateral.json")),
        "--at",
        "2026-02-18T11:58:51Z",
        "--any-measurement",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert!(out(&o).contains("SEAMLDR ACM) 3 < 5"), "{}", out(&o));
}

#[test]
fn today_the_samples_collateral_has_expired_and_bad_input_exits_2() {
    let Some(d) = tdx() else { return };
    let (q, c) = (s(&d.join("tdx_quote")), s(&d.join("tdx_quote_collateral.json")));
    // Without --at, now is after the collateral's nextUpdate: refused, not accepted.
    let o = veil(&["attest", "verify", "--tdx", &q, "--collateral", &c, "--any-measurement"]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert!(out(&o).contains("tdx_tcb_info             FAIL"), "{}", out(&o));
    let o = veil(&["attest", "verify", "--tdx", &q, "--collateral", "/nonexistent/collateral.json"]);
    assert_eq!(o.status.code(), Some(2), "{}", out(&o));
    let o = veil(&["attest", "verify", "--tdx", &q]);
    assert_eq!(o.status.code(), Some(2), "--tdx without --collateral: {}", out(&o));
    let o = veil(&["attest", "verify", "--tdx", &q, "--collateral", &c, "--mrtd", "abcd"]);
    assert_eq!(o.status.code(), Some(2), "{}", out(&o));
}

#[test]
fn inspect_decodes_a_tdx_quote() {
    let Some(d) = tdx() else { return };
    let o = veil(&["attest", "inspect", &s(&d.join("tdx_quote_outdated"))]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    let text = out(&o);
    assert!(text.contains("Intel TDX quote (UNVERIFIED"), "{text}");
    assert!(text.contains("TD 1.5") && text.contains("SEPT_VE_DISABLE"), "{text}");
    let o = veil(&["attest", "inspect", "--json", &s(&d.join("tdx_quote"))]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["tdx_quote"]["version"], 4);
    assert_eq!(v["tdx_quote"]["trailing_bytes"], 70);
}

fn set(name: &str) -> Option<PathBuf> {
    vectors_dir().map(|v| v.join(name))
}

#[test]
fn azure_hcl_report_with_its_vcek_exits_0_and_without_it_1() {
    let Some(g) = set("snp-genoa-azure-trustee") else { return };
    let hcl = s(&g.join("azure_hcl_report.bin"));
    let (vcek, chain) = (s(&g.join("vcek.pem")), s(&g.join("ask_ark_genoa.pem")));
    let o = veil(&["attest", "verify", "--azure", &hcl, "--vcek", &vcek, "--chain", &chain, "--any-measurement"]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    assert!(out(&o).contains("azure_runtime_claims     PASS"), "{}", out(&o));
    assert!(out(&o).contains("overall: ACCEPTED"), "{}", out(&o));
    // Without the VCEK the hardware report is unverified: refused.
    let o = veil(&["attest", "verify", "--azure", &hcl, "--any-measurement"]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert!(out(&o).contains("first failed check: azure_snp_report"), "{}", out(&o));
    // A policy requiring no serial console refuses this VM (its console is on).
    let dir = std::env::temp_dir().join(format!("veil-cli-azure-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let policy = dir.join("policy.toml");
    std::fs::write(&policy, "any_measurement = true\n[azure]\nallow_console = false\n").unwrap();
    let o = veil(&["attest", "verify", "--policy", &s(&policy), "--azure", &hcl, "--vcek", &vcek, "--chain", &chain]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert!(out(&o).contains("first failed check: azure_vm_configuration"), "{}", out(&o));
    std::fs::remove_dir_all(&dir).ok();
    // inspect decodes the HCL report.
    let o = veil(&["attest", "inspect", "--json", &hcl]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["hcl_report"]["report_data_commits_to_claims"], true, "{}", out(&o));
}

#[test]
fn a_vtpm_quote_exits_0_under_its_ak_and_nonce_and_1_otherwise() {
    let Some(a) = set("azure-cvm-snp") else { return };
    let (quote, ak, hcl) = (s(&a.join("quote.bin")), s(&a.join("akpub.pem")), s(&a.join("hcl-report-snp.bin")));
    let o = veil(&["attest", "verify", "--tpm-quote", &quote, "--ak-pub", &ak, "--nonce", "challenge"]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    assert!(out(&o).contains("azure_tpm_signature      PASS"), "{}", out(&o));
    let o = veil(&["attest", "verify", "--tpm-quote", &quote, "--ak-pub", &ak, "--nonce", "other"]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert!(out(&o).contains("first failed check: azure_tpm_nonce"), "{}", out(&o));
    // The mixed pair: the HCL report's key is another VM's.
    let o =
        veil(&["attest", "verify", "--azure", &hcl, "--tpm-quote", &quote, "--ak-pub", &ak, "--nonce", "challenge"]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert!(out(&o).contains("azure_tpm_ak_binding     FAIL"), "{}", out(&o));
    // Not a quote, and a missing file.
    let o = veil(&["attest", "verify", "--tpm-quote", &hcl, "--ak-pub", &ak]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert!(out(&o).contains("azure_tpm_quote_format   FAIL"), "{}", out(&o));
    let o = veil(&["attest", "verify", "--tpm-quote", "/nonexistent/quote.bin"]);
    assert_eq!(o.status.code(), Some(2), "{}", out(&o));
}
