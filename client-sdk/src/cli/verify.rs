//! `veil attest verify`: the check table (SNP, and one per GPU) and an exit code.

use std::time::SystemTime;

use veil_attestation::gpu::{evidence as gpu_evidence, GpuAppraisal, GpuEvidence, Rim};
use veil_attestation::verify::{appraise_gpus, GpuExpectations};
use veil_attestation::x509::parse_time;
use veil_attestation::{appraise, EvidenceBundle, ExpectedClaims, Measurement, Nonce, Policy, ReportData};

use super::error::CliError;
use super::{Exit, VerifyArgs};
use crate::input;

/// Everything `verify` needs, resolved from files and flags.
#[derive(Debug)]
pub struct Prepared {
    /// The SNP evidence, when given.
    pub bundle: Option<EvidenceBundle>,
    /// GPU evidence, when given (`gpu_given` tells an empty file from no flag).
    pub gpus: Vec<GpuEvidence>,
    /// Whether `--gpu-evidence` was given.
    pub gpu_given: bool,
    /// Reference values for the GPUs.
    pub rims: Vec<Rim>,
    /// Expected SPDM nonce of every GPU.
    pub gpu_nonce: Option<[u8; 32]>,
    /// OCSP responses for the GPU device chains.
    pub gpu_ocsp: Vec<Vec<u8>>,
    /// The effective policy.
    pub policy: Policy,
    /// What the caller expects.
    pub expected: ExpectedClaims,
    /// Time of verification.
    pub now: SystemTime,
}

/// The policy file (`--policy`, a signed bundle with `--policy-key`) or the
/// strict default.
pub(super) fn policy_file(args: &VerifyArgs) -> Result<Policy, CliError> {
    match &args.policy {
        Some(path) => super::policy_bundle::load_policy(path, args.policy_key.as_deref(), &args.log),
        None if args.policy_key.is_some() => Err(CliError::Usage("--policy-key needs --policy".into())),
        None => Ok(Policy::default()),
    }
}

/// The policy file with `--measurement` added to its allowlist and
/// `--any-measurement` applied (not yet validated).
pub(super) fn snp_policy(args: &VerifyArgs) -> Result<Policy, CliError> {
    let mut policy = policy_file(args)?;
    for m in &args.measurements {
        let m: Measurement = m.parse().map_err(CliError::flag("--measurement"))?;
        if !policy.measurements.contains(&m) {
            policy.measurements.push(m);
        }
    }
    if args.any_measurement {
        policy.any_measurement = true;
    }
    Ok(policy)
}

/// `--at`, or now.
pub(super) fn verification_time(args: &VerifyArgs) -> Result<SystemTime, CliError> {
    match &args.at {
        Some(t) => parse_time(t).ok_or_else(|| {
            CliError::flag("--at")(format!("cannot parse {t:?} (use YYYY-MM-DD or YYYY-MM-DDTHH:MM:SSZ)"))
        }),
        None => Ok(SystemTime::now()),
    }
}

/// Resolves flags into inputs; any error here is "unreadable input".
pub fn prepare(args: &VerifyArgs) -> Result<Prepared, CliError> {
    let mut policy = snp_policy(args)?;
    if args.require_rim {
        policy.gpu.require_rim = true;
    }
    policy.validate().map_err(CliError::failed)?;

    let bundle = match (&args.evidence, &args.report, &args.vcek) {
        (Some(path), _, _) => Some(input::load_bundle(path).map_err(CliError::failed)?),
        (None, Some(report), Some(vcek)) => {
            let report = match input::load_evidence(report).map_err(CliError::failed)? {
                input::Evidence::Report(bytes) => bytes,
                input::Evidence::Bundle(_) => {
                    return Err(CliError::Usage("--report got a bundle; use --evidence".into()))
                }
            };
            Some(EvidenceBundle {
                report,
                endorsement: input::load_cert(vcek).map_err(CliError::failed)?,
                chain: match &args.chain {
                    Some(p) => input::load_chain(p).map_err(CliError::failed)?,
                    None => vec![],
                },
                crl: args.crl.as_deref().map(input::load_crl).transpose().map_err(CliError::failed)?,
                claims: None,
                gpus: Vec::new(),
                gpu_rims: Vec::new(),
                gpu_ocsp: Vec::new(),
            })
        }
        (None, None, None) if args.gpu_evidence.is_some() => None,
        _ => {
            return Err(CliError::Usage(
                "give --evidence BUNDLE, or --report REPORT with --vcek CERT, and/or --gpu-evidence FILE".into(),
            ))
        }
    };
    let gpus = match &args.gpu_evidence {
        None => Vec::new(),
        Some(path) => {
            let bytes = input::read(path).map_err(CliError::failed)?;
            let certs = args.gpu_certs.as_deref().map(input::read).transpose().map_err(CliError::failed)?;
            gpu_evidence::load_any(&bytes, certs.as_deref()).map_err(CliError::malformed(path))?
        }
    };
    let rims = args
        .rims
        .iter()
        .map(|p| {
            let bytes = input::read(p).map_err(CliError::failed)?;
            Rim::parse(&bytes).map_err(CliError::malformed(p))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let gpu_nonce = args
        .gpu_nonce
        .as_deref()
        .map(|h| {
            hex::decode(h.trim())
                .ok()
                .and_then(|v| <[u8; 32]>::try_from(v).ok())
                .ok_or_else(|| CliError::flag("--gpu-nonce")(format!("expected 64 hex digits, got {h:?}")))
        })
        .transpose()?;

    let expected = ExpectedClaims {
        report_data: args
            .report_data
            .as_deref()
            .map(ReportData::from_hex_padded)
            .transpose()
            .map_err(CliError::flag("--report-data"))?,
        nonce: args.nonce.as_deref().map(str::parse::<Nonce>).transpose().map_err(CliError::flag("--nonce"))?,
        ..ExpectedClaims::default()
    };
    let now = verification_time(args)?;
    let gpu_ocsp = args.gpu_ocsp.iter().map(|p| input::read(p).map_err(CliError::failed)).collect::<Result<_, _>>()?;
    Ok(Prepared {
        bundle,
        gpus,
        gpu_given: args.gpu_evidence.is_some(),
        rims,
        gpu_nonce,
        gpu_ocsp,
        policy,
        expected,
        now,
    })
}

/// Runs the command.
pub fn run(args: &VerifyArgs) -> Exit {
    let prepared = match prepare(args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("veil attest verify: unreadable input: {e}");
            return Exit::Unreadable;
        }
    };
    let snp = prepared.bundle.as_ref().map(|b| appraise(b, &prepared.policy, &prepared.expected, prepared.now).checks);
    // The same composite verification as the serving path: a bundle's own
    // GPUs are appraised whenever it carries any, its claims commit to GPU
    // evidence, or the policy requires GPUs (`--gpu-evidence` replaces them).
    let composite = prepared.bundle.as_ref().is_some_and(|b| {
        !b.gpus.is_empty()
            || prepared.policy.gpu.required
            || b.claims.as_ref().is_some_and(|c| c.gpu_evidence_hash.is_some())
    });
    let gpu: Option<GpuAppraisal> = (prepared.gpu_given || composite).then(|| {
        let gpus: &[GpuEvidence] = match (&prepared.bundle, prepared.gpu_given) {
            (Some(b), false) => &b.gpus,
            _ => &prepared.gpus,
        };
        let expect = GpuExpectations {
            rims: &prepared.rims,
            claims: prepared.bundle.as_ref().and_then(|b| b.claims.as_ref()),
            nonce: prepared.gpu_nonce,
            ocsp: &prepared.gpu_ocsp,
        };
        appraise_gpus(gpus, &expect, &prepared.policy, prepared.now)
    });
    let warnings: Vec<&String> = snp
        .iter()
        .flat_map(|c| c.warnings.iter())
        .chain(gpu.iter().flat_map(|g| g.gpus.iter().flat_map(|t| t.warnings.iter())))
        .collect();
    for w in &warnings {
        eprintln!("WARNING: {w}");
    }
    let accepted = snp.as_ref().is_none_or(|c| c.accepted()) && gpu.as_ref().is_none_or(GpuAppraisal::accepted);
    if args.json {
        let simulated = snp.as_ref().is_some_and(|c| c.any_simulated());
        let mut out = serde_json::json!({ "accepted": accepted, "simulated": simulated, "warnings": warnings });
        if let Some(checks) = &snp {
            out["verdict"] = serde_json::json!(checks.verdict());
            out["checks"] = serde_json::json!(checks.results);
        }
        if let Some(g) = &gpu {
            out["gpu_topology"] = serde_json::json!(g.topology);
            out["gpus"] = serde_json::json!(g
                .gpus
                .iter()
                .map(|t| serde_json::json!({
                    "gpu_index": t.gpu_index,
                    "accepted": t.accepted(),
                    "verdict": t.verdict(),
                    "checks": t.results,
                }))
                .collect::<Vec<_>>());
        }
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    } else {
        if let Some(checks) = &snp {
            println!("{checks}");
        }
        if let Some(g) = &gpu {
            if snp.is_some() {
                println!();
            }
            print!("{g}");
            if g.gpus.is_empty() && g.topology.is_none() {
                println!("GPU evidence: none in the file");
            }
        }
        if snp.is_some() && gpu.is_some() {
            let simulated = if snp.as_ref().is_some_and(|c| c.any_simulated()) { " — SIMULATED" } else { "" };
            println!("overall: {}{simulated}", if accepted { "ACCEPTED" } else { "REJECTED" });
        }
    }
    if accepted {
        Exit::Accepted
    } else {
        Exit::Rejected
    }
}
