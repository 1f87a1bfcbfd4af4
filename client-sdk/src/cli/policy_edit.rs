//! `veil policy new | add-measurement | add-manifest | add-peer-policy |
//! set-tcb | set-host-data | set-layers`: build a policy from values reproduced from source
//! (`veil measure`, `veil-shard manifest`, the route's own policy file), never
//! from what a running cluster presents. Each edit re-validates the policy
//! and rewrites the file in canonical TOML (comments are not kept).

use std::path::Path;

use veil_attestation::claims::{ManifestRoot, Measurement};
use veil_attestation::policy::TcbMinimum;
use veil_attestation::Policy;

use super::error::{CliError, UnknownProduct};
use super::{Exit, PolicyEdit, PolicyNewArgs};

/// Reads `path`, applies `change`, validates, writes it back.
pub(super) fn edit(path: &Path, cmd: &str, change: impl FnOnce(&mut Policy) -> Result<(), CliError>) -> Exit {
    let result = super::policy_bundle::read_toml(path).and_then(|mut p| {
        change(&mut p)?;
        p.validate().map_err(CliError::failed)?;
        std::fs::write(path, p.to_toml()).map_err(CliError::failed)?;
        Ok(p)
    });
    match result {
        Ok(p) => {
            eprintln!("veil {cmd}: {} updated (peer-policy digest {})", path.display(), p.digest());
            Exit::Accepted
        }
        Err(e) => {
            eprintln!("veil {cmd}: {e}");
            Exit::Unreadable
        }
    }
}

/// `veil policy new`: a strict starting point (no measurement accepted yet).
pub fn new(args: &PolicyNewArgs) -> Exit {
    if args.out.exists() && !args.force {
        eprintln!("veil policy new: {} exists (--force replaces it)", args.out.display());
        return Exit::Unreadable;
    }
    let p = Policy { allow_simulated: args.allow_simulated, ..Policy::default() };
    if let Err(e) = std::fs::write(&args.out, p.to_toml()) {
        eprintln!("veil policy new: {}: {e}", args.out.display());
        return Exit::Unreadable;
    }
    eprintln!(
        "veil policy new: wrote {}; add measurements (veil measure --add-to), manifest roots and TCB minimums",
        args.out.display()
    );
    Exit::Accepted
}

/// Runs one edit.
pub fn run(cmd: &PolicyEdit) -> Exit {
    match cmd {
        PolicyEdit::AddMeasurement { policy, measurement } => edit(policy, "policy add-measurement", |p| {
            let m: Measurement = measurement.parse().map_err(CliError::failed)?;
            if !p.measurements.contains(&m) {
                p.measurements.push(m);
            }
            Ok(())
        }),
        PolicyEdit::AddManifest { policy, root } => edit(policy, "policy add-manifest", |p| {
            let root: ManifestRoot = root.parse().map_err(CliError::failed)?;
            if !p.manifest_roots.contains(&root) {
                p.manifest_roots.push(root);
            }
            Ok(())
        }),
        PolicyEdit::AddPeerPolicy { policy, peer } => edit(policy, "policy add-peer-policy", |p| {
            let d = super::policy_bundle::read_toml(peer)?.digest();
            if !p.peer_policies.contains(&d) {
                p.peer_policies.push(d);
            }
            Ok(())
        }),
        PolicyEdit::SetTcb { policy, product, fmc, bootloader, tee, snp, microcode } => {
            edit(policy, "policy set-tcb", |p| {
                let product = veil_attestation::snp::Product::from_product_name(product)
                    .ok_or_else(|| UnknownProduct { name: product.clone() })?;
                let min =
                    TcbMinimum { fmc: *fmc, bootloader: *bootloader, tee: *tee, snp: *snp, microcode: *microcode };
                p.min_tcb.insert(product, min);
                Ok(())
            })
        }
        PolicyEdit::SetHostData { policy, host_data } => edit(policy, "policy set-host-data", |p| {
            p.host_data = Some(veil_attestation::policy::HostData(host_data.parse().map_err(CliError::failed)?));
            Ok(())
        }),
        PolicyEdit::SetLayers { policy, layers } => edit(policy, "policy set-layers", |p| {
            p.model_layers = Some(*layers);
            Ok(())
        }),
    }
}
