//! `veil attest sim-init`: a simulated root for development clusters.

use veil_attestation::claims::KeyHash;
use veil_attestation::simulated::{SimulatedAttester, SimulatedConfig};
use veil_attestation::x509::ParsedCert;

use super::error::CliError;
use super::{Exit, SimInitArgs};

/// Runs the command.
pub fn run(args: &SimInitArgs) -> Exit {
    match init(args) {
        Ok(()) => Exit::Accepted,
        Err(e) => {
            eprintln!("veil attest sim-init: {e}");
            Exit::Unreadable
        }
    }
}

fn init(args: &SimInitArgs) -> Result<(), CliError> {
    if args.dir.join("ark.key.pem").exists() && !args.force {
        return Err(CliError::Usage(format!(
            "{} already holds a simulated root (use --force to replace it)",
            args.dir.display()
        )));
    }
    let seed = match &args.seed {
        Some(h) => hex::decode(h).map_err(CliError::flag("--seed"))?,
        None => veil_attestation::Nonce::random().as_bytes().to_vec(),
    };
    let mut config = SimulatedConfig::new(args.product, &seed);
    if let Some(m) = &args.measurement {
        config.measurement = m.parse().map_err(CliError::flag("--measurement"))?;
    }
    if let Some(h) = &args.host_data {
        let h: veil_attestation::KeyHash = h.parse().map_err(CliError::flag("--host-data"))?;
        config.host_data = h.0;
    }
    let sim = SimulatedAttester::from_seed(&seed, config).map_err(CliError::failed)?;
    sim.save(&args.dir).map_err(CliError::failed)?;
    let ark = ParsedCert::from_der(sim.ark_der()).map_err(CliError::failed)?;
    let text = sim.dev_policy_toml().map_err(CliError::failed)?;
    std::fs::write(args.dir.join("policy.dev.toml"), text).map_err(CliError::failed)?;
    eprintln!("WARNING: created a SIMULATED attestation root (not AMD hardware) in {}", args.dir.display());
    println!("product:          {}", args.product);
    println!("simulated ARK:    {}", KeyHash(ark.spki_sha256()));
    println!("measurement:      {}", sim.config().measurement);
    println!("dev policy:       {}", args.dir.join("policy.dev.toml").display());
    Ok(())
}
