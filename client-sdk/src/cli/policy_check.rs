//! `veil policy check POLICY`: what each setting of a policy means, and a
//! warning for each one weaker than a production policy should be. Exit 0
//! with no warnings, 1 with warnings, 2 when the file is not a valid policy.
//!
//! POLICY may be a signed bundle (with `--policy-key`). With `--log` too, the
//! bundle must be its publisher's newest version in that transparency log
//! ([`super::log::require_newest`]): a first-use client otherwise accepts
//! any logged version, however old. Exit 1 when the log refuses it (an
//! older version than the newest logged, not in the log, a log that went
//! back since this client last accepted it), 2 when the log cannot be read.

use veil_attestation::policy_bundle;
use veil_attestation::Policy;

use super::error::CliError;
use super::{Exit, PolicyCheckArgs};

/// The policy to explain: a TOML file, or a signed bundle (verified, and
/// with `--log` required to be the newest logged version).
fn load(args: &PolicyCheckArgs) -> Result<Policy, CliError> {
    let path = &args.policy;
    let bytes = std::fs::read(path).map_err(CliError::read(path))?;
    if args.log.unlogged {
        return Err(CliError::Usage("--unlogged: policy check reads a log only with --log; leave both out".into()));
    }
    if !policy_bundle::is_bundle(&bytes) {
        if args.policy_key.is_some() || args.log.source.is_some() {
            return Err(CliError::Usage(format!(
                "{}: --policy-key or --log was given but this policy is not a signed bundle",
                path.display()
            )));
        }
        return super::policy_bundle::read_toml(path);
    }
    let public = super::policy_bundle::publisher_key(path, args.policy_key.as_deref())?;
    let opened = policy_bundle::open(&bytes, &[public], |_| None).map_err(CliError::malformed(path))?;
    let publisher = opened.signer.to_string();
    let publisher = &publisher[..16];
    if args.log.source.is_none() {
        println!(
            "policy bundle version {} from publisher {publisher} (signature verified; not compared with a log: \
             --log refuses a version older than the newest logged)",
            opened.version
        );
        return Ok(opened.policy);
    }
    let dir = super::policy_bundle::state_dir();
    let newest = super::log::require_newest(&bytes, &public, &args.log, &dir)?;
    println!(
        "policy bundle version {} from publisher {publisher}: the newest it has in log {} (entry {} of {})",
        newest.version, newest.checkpoint.origin, newest.index, newest.checkpoint.size
    );
    Ok(opened.policy)
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// Runs the command.
pub fn run(args: &PolicyCheckArgs) -> Exit {
    let policy = match load(args) {
        Ok(p) => p,
        Err(e) if super::log::is_refusal(&e) => {
            eprintln!("veil policy check: {}: REFUSED: {e}", args.policy.display());
            return Exit::Rejected;
        }
        Err(e) => {
            eprintln!("veil policy check: {e}");
            return Exit::Unreadable;
        }
    };
    let p = &policy;
    let list = |v: Vec<String>| if v.is_empty() { "none".to_owned() } else { v.join(", ") };
    let lines: Vec<(&str, String, &str)> = vec![
        ("products", list(p.products.iter().map(|x| x.to_string()).collect()), "CPU generations whose reports pass"),
        (
            "report versions",
            format!("{}..={}", p.min_report_version, p.max_report_version),
            "SNP report layouts accepted",
        ),
        (
            "allow_vlek",
            yes(p.allow_vlek).into(),
            "reports signed by a cloud provider's VLEK instead of the chip's VCEK",
        ),
        ("require_crl", yes(p.require_crl).into(), "fail when no AMD CRL accompanies the evidence"),
        ("allow_debug", yes(p.allow_debug).into(), "guests launched debuggable (host can read their memory)"),
        ("allow_migration_agent", yes(p.allow_migration_agent).into(), "guests a migration agent may export"),
        ("allow_smt", yes(p.allow_smt).into(), "platforms with simultaneous multithreading on"),
        ("vmpl", p.vmpl.to_string(), "privilege level the report must come from"),
        (
            "min_tcb",
            list(
                p.min_tcb
                    .iter()
                    .map(|(k, m)| {
                        let v = |c: Option<u8>| c.map_or("-".to_owned(), |c| c.to_string());
                        let fmc = if *k == veil_attestation::snp::Product::Turin {
                            format!("fmc {} ", v(m.fmc))
                        } else {
                            String::new()
                        };
                        format!(
                            "{k}: {fmc}bootloader {} tee {} snp {} microcode {}",
                            v(m.bootloader),
                            v(m.tee),
                            v(m.snp),
                            v(m.microcode)
                        )
                    })
                    .collect(),
            ),
            "lowest firmware and microcode versions per product",
        ),
        (
            "measurements",
            if p.any_measurement { "ANY".into() } else { format!("{} pinned", p.measurements.len()) },
            "launch measurements (the CVM image) allowed",
        ),
        ("host_data", p.host_data.map_or("not pinned".into(), |h| h.0.to_string()), "HOST_DATA the launch must carry"),
        (
            "id_key_digest",
            p.id_key_digest.map_or("not pinned".into(), |h| h.to_string()),
            "ID key that must have signed the launch",
        ),
        (
            "allow_simulated",
            format!("{} ({} root(s) pinned)", yes(p.allow_simulated), p.simulated_roots.len()),
            "Veil's software attester (development only)",
        ),
        (
            "manifest_roots",
            format!("{} model(s)", p.manifest_roots.len()),
            "models allowed, by manifest root (weights + GGUF metadata); every stage of a route serves one",
        ),
        (
            "platform",
            {
                let pl = &p.platform;
                let mut v: Vec<String> = pl.require_guest_policy.iter().map(|f| f.abi_name().to_owned()).collect();
                v.extend(pl.require_platform.iter().map(|f| f.abi_name().to_owned()));
                if let Some(abi) = pl.min_guest_abi {
                    v.push(format!("ABI >= {abi}"));
                }
                if pl.mitigation_mask() != 0 {
                    v.push(format!("mitigations {:#x}", pl.mitigation_mask()));
                }
                if pl.allow_cxl {
                    v.push("CXL allowed".into());
                }
                list(v)
            },
            "guest-policy, PLATFORM_INFO and mitigation bits required",
        ),
        (
            "unknown PLATFORM_INFO",
            if p.platform.refuse_unknown_platform_bits { "refused".into() } else { "warned".into() },
            "bits the firmware ABI this verifier knows does not name (platform.refuse_unknown_platform_bits)",
        ),
        ("gpu.required", yes(p.gpu.required).into(), "every shard must present NVIDIA GPU evidence"),
        ("gpu.count", p.gpu.count.map_or("any".into(), |c| c.to_string()), "GPUs per shard"),
        ("gpu.require_rim", yes(p.gpu.require_rim).into(), "GPU measurements compared with NVIDIA's RIMs"),
        (
            "gpu.require_revocation",
            yes(p.gpu.require_revocation).into(),
            "GPU device certificates checked against current OCSP responses",
        ),
        (
            "peer_policies",
            format!("{} pinned", p.peer_policies.len()),
            "route peer policies accepted by digest even if weaker",
        ),
        ("model_layers", p.model_layers.map_or("not pinned".into(), |n| n.to_string()), "layers the route must cover"),
    ];
    println!("policy {} (digest {})", args.policy.display(), p.digest());
    for (setting, value, meaning) in &lines {
        println!("  {setting:<22} {value:<24} {meaning}");
    }
    if !p.measurements.is_empty() {
        println!(
            "NOTE: a measurement fixes the guest's code only when it covers a measured direct boot (`veil measure \
             --kernel --initrd --append`); one of the firmware alone says nothing about what the firmware boots. \
             A digest does not show which it is: reproduce each with `veil measure`."
        );
    }
    let weak = p.weaknesses();
    for (setting, why) in &weak {
        println!("WARNING: {setting}: {why}");
    }
    if weak.is_empty() {
        println!("no weak settings");
        Exit::Accepted
    } else {
        println!("{} weak setting(s)", weak.len());
        Exit::Rejected
    }
}
