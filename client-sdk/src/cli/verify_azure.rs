//! `veil attest verify --azure HCL_REPORT [--vcek CERT] [--tpm-quote FILE
//! [--ak-pub PEM] --nonce TEXT]`: the SNP table of the report inside, the
//! Azure table, and an exit code (0 accepted, 1 refused, 2 unreadable input).

use std::time::SystemTime;

use veil_attestation::azure::{AzureEvidence, AzureExpected};
use veil_attestation::{appraise_azure, Policy, SnpEndorsement};

use super::error::CliError;
use super::{Exit, VerifyArgs};
use crate::input;

struct Prepared {
    hcl: Option<Vec<u8>>,
    quote: Option<Vec<u8>>,
    ak_pub: Option<Vec<u8>>,
    endorsement: Option<SnpEndorsement>,
    policy: Policy,
    expected: AzureExpected,
    now: SystemTime,
}

fn prepare(args: &VerifyArgs) -> Result<Prepared, CliError> {
    let policy = super::verify::snp_policy(args)?;
    policy.validate().map_err(CliError::failed)?;
    let read = |p: &Option<std::path::PathBuf>| p.as_deref().map(input::read).transpose().map_err(CliError::failed);
    let endorsement = match &args.vcek {
        None => None,
        Some(vcek) => Some(SnpEndorsement {
            endorsement: input::load_cert(vcek).map_err(CliError::failed)?,
            chain: match &args.chain {
                Some(p) => input::load_chain(p).map_err(CliError::failed)?,
                None => vec![],
            },
            crl: args.crl.as_deref().map(input::load_crl).transpose().map_err(CliError::failed)?,
        }),
    };
    if endorsement.is_some() && args.azure.is_none() {
        return Err(CliError::Usage("--vcek with --tpm-quote needs --azure HCL_REPORT".into()));
    }
    let now = super::verify::verification_time(args)?;
    Ok(Prepared {
        hcl: read(&args.azure)?,
        quote: read(&args.tpm_quote)?,
        ak_pub: read(&args.ak_pub)?,
        endorsement,
        policy,
        expected: AzureExpected { nonce: args.nonce.as_ref().map(|n| n.as_bytes().to_vec()) },
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
    let ev = AzureEvidence { hcl: p.hcl.as_deref(), quote: p.quote.as_deref(), ak_pub: p.ak_pub.as_deref() };
    let a = appraise_azure(&ev, p.endorsement.as_ref(), &p.policy, &p.expected, p.now);
    let accepted = a.accepted();
    if args.json {
        let mut out = serde_json::json!({
            "accepted": accepted,
            "platform": "azure",
            "verdict": a.azure.verdict(),
            "checks": a.azure.results,
        });
        if let Some(snp) = &a.snp {
            out["snp"] = serde_json::json!({ "verdict": snp.verdict(), "checks": snp.results });
        }
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    } else {
        if let Some(snp) = &a.snp {
            println!("SNP report inside the HCL report");
            println!("{snp}\n");
        }
        println!("Azure (HCL report, vTPM quote)");
        println!("{}", a.azure);
        if a.snp.is_some() {
            println!("overall: {}", if accepted { "ACCEPTED" } else { "REJECTED" });
        }
    }
    if accepted {
        Exit::Accepted
    } else {
        Exit::Rejected
    }
}
