//! `veil attest verify --tdx QUOTE --collateral FILE`: the TDX check table
//! and an exit code (0 accepted, 1 refused, 2 unreadable input).

use std::time::SystemTime;

use veil_attestation::tdx::{appraise_tdx, policy::Register, TdxExpected, TdxPolicy};
use veil_attestation::ReportData;

use super::error::CliError;
use super::{Exit, VerifyArgs};
use crate::input;

/// The quote, its collateral, the effective `[tdx]` policy, the expectation and the time.
struct Prepared {
    quote: Vec<u8>,
    collateral: Vec<u8>,
    policy: TdxPolicy,
    expected: TdxExpected,
    now: SystemTime,
}

fn prepare(args: &VerifyArgs) -> Result<Prepared, CliError> {
    let (Some(quote), Some(collateral)) = (&args.tdx, &args.collateral) else {
        return Err(CliError::Usage("--tdx QUOTE needs --collateral FILE".into()));
    };
    let policy = super::verify::policy_file(args)?;
    // The policy's top-level allow_simulated covers simulated TDX evidence too.
    let allow_simulated = policy.allow_simulated;
    let mut policy = policy.tdx;
    policy.allow_simulated |= allow_simulated;
    for m in &args.mrtds {
        let r: Register = m.parse().map_err(CliError::flag("--mrtd"))?;
        if !policy.mrtd.contains(&r) {
            policy.mrtd.push(r);
        }
    }
    if args.any_measurement {
        policy.any_measurement = true;
    }
    policy.validate().map_err(CliError::failed)?;
    let report_data = args
        .report_data
        .as_deref()
        .map(ReportData::from_hex_padded)
        .transpose()
        .map_err(CliError::flag("--report-data"))?
        .map(|r| r.0);
    let now = super::verify::verification_time(args)?;
    Ok(Prepared {
        quote: input::read(quote).map_err(CliError::failed)?,
        collateral: input::read(collateral).map_err(CliError::failed)?,
        policy,
        expected: TdxExpected { report_data },
        now,
    })
}

/// Runs the command.
pub fn run(args: &VerifyArgs) -> Exit {
    let p = match prepare(args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("veil attest verify: unreadable input: {e}");
            return Exit::Unreadable;
        }
    };
    let a = appraise_tdx(&p.quote, &p.collateral, &p.policy, &p.expected, p.now);
    let accepted = a.table.accepted();
    if args.json {
        let out = serde_json::json!({
            "accepted": accepted,
            "platform": "tdx",
            "verdict": a.table.verdict(),
            "tcb_status": a.tcb.as_ref().map(|t| t.status.name()),
            "advisories": a.tcb.as_ref().map(|t| t.advisories.clone()).unwrap_or_default(),
            "checks": a.table.results,
        });
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    } else {
        println!("Intel TDX quote");
        println!("{}", a.table);
    }
    if accepted {
        Exit::Accepted
    } else {
        Exit::Rejected
    }
}
