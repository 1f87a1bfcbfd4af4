//! `veil attest verify`: the check table and an exit code.

use std::time::SystemTime;

use veil_attestation::x509::parse_time;
use veil_attestation::{appraise, EvidenceBundle, ExpectedClaims, Measurement, Nonce, Policy, ReportData};

use super::{Exit, VerifyArgs};
use crate::input;

/// Everything `verify` needs, resolved from files and flags.
#[derive(Debug)]
pub struct Prepared {
    /// The evidence.
    pub bundle: EvidenceBundle,
    /// The effective policy.
    pub policy: Policy,
    /// What the caller expects.
    pub expected: ExpectedClaims,
    /// Time of verification.
    pub now: SystemTime,
}

/// Resolves flags into inputs; any error here is "unreadable input".
pub fn prepare(args: &VerifyArgs) -> Result<Prepared, String> {
    let mut policy = match &args.policy {
        Some(path) => {
            let text = String::from_utf8(input::read(path).map_err(|e| e.to_string())?)
                .map_err(|_| format!("{}: policy is not UTF-8", path.display()))?;
            Policy::from_toml(&text).map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => Policy::default(),
    };
    for m in &args.measurements {
        let m: Measurement = m.parse().map_err(|e| format!("--measurement: {e}"))?;
        if !policy.measurements.contains(&m) {
            policy.measurements.push(m);
        }
    }
    if args.any_measurement {
        policy.any_measurement = true;
    }
    policy.validate().map_err(|e| e.to_string())?;

    let bundle = match (&args.evidence, &args.report, &args.vcek) {
        (Some(path), _, _) => input::load_bundle(path).map_err(|e| e.to_string())?,
        (None, Some(report), Some(vcek)) => {
            let report = match input::load_evidence(report).map_err(|e| e.to_string())? {
                input::Evidence::Report(bytes) => bytes,
                input::Evidence::Bundle(_) => return Err("--report got a bundle; use --evidence".into()),
            };
            EvidenceBundle {
                report,
                endorsement: input::load_cert(vcek).map_err(|e| e.to_string())?,
                chain: match &args.chain {
                    Some(p) => input::load_chain(p).map_err(|e| e.to_string())?,
                    None => vec![],
                },
                crl: args.crl.as_deref().map(input::load_crl).transpose().map_err(|e| e.to_string())?,
                claims: None,
            }
        }
        _ => return Err("give --evidence BUNDLE, or --report REPORT with --vcek CERT".into()),
    };

    let expected = ExpectedClaims {
        report_data: args
            .report_data
            .as_deref()
            .map(ReportData::from_hex_padded)
            .transpose()
            .map_err(|e| format!("--report-data: {e}"))?,
        nonce: args.nonce.as_deref().map(str::parse::<Nonce>).transpose().map_err(|e| format!("--nonce: {e}"))?,
        ..ExpectedClaims::default()
    };
    let now = match &args.at {
        Some(t) => {
            parse_time(t).ok_or_else(|| format!("--at: cannot parse {t:?} (use YYYY-MM-DD or YYYY-MM-DDTHH:MM:SSZ)"))?
        }
        None => SystemTime::now(),
    };
    Ok(Prepared { bundle, policy, expected, now })
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
    let appraisal = appraise(&prepared.bundle, &prepared.policy, &prepared.expected, prepared.now);
    let checks = &appraisal.checks;
    for w in &checks.warnings {
        eprintln!("WARNING: {w}");
    }
    if args.json {
        let out = serde_json::json!({
            "accepted": checks.accepted(),
            "verdict": checks.verdict(),
            "checks": checks.results,
            "warnings": checks.warnings,
        });
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    } else {
        println!("{checks}");
    }
    if checks.accepted() {
        Exit::Accepted
    } else {
        Exit::Rejected
    }
}
