//! `veil measure`: the SEV-SNP launch measurement a guest started from the
//! given inputs reports, reproduced locally (see `veil_attestation::measure`),
//! optionally added to a policy's allowed measurements, with the deployment's
//! HOST_DATA and peer policy in the same edit (`--host-data`, `--peer-policy`).

use veil_attestation::measure::{launch_digest, LaunchInputs};

use super::{policy_edit, Exit, MeasureArgs};

/// Runs the command.
pub fn run(args: &MeasureArgs) -> Exit {
    let guest_features = match u64::from_str_radix(args.guest_features.trim_start_matches("0x"), 16) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("veil measure: --guest-features {:?}: {e}", args.guest_features);
            return Exit::Unreadable;
        }
    };
    let inputs = LaunchInputs {
        ovmf: args.ovmf.clone(),
        kernel: args.kernel.clone(),
        initrd: args.initrd.clone(),
        append: args.append.clone(),
        vcpus: args.vcpus,
        vcpu_type: args.vcpu_type.clone(),
        vmm: args.vmm,
        guest_features,
    };
    let m = match launch_digest(&inputs) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("veil measure: {e}");
            return Exit::Unreadable;
        }
    };
    println!("{m}");
    if args.kernel.is_none() {
        // A reviewer must not read this as "the guest's code is pinned".
        eprintln!(
            "veil measure: NOTE: this measurement covers the firmware alone (no --kernel): it says nothing about \
             the kernel, initrd or command line the firmware boots, which a host can choose freely. Pin a measured \
             direct boot (--kernel, --initrd, --append) for a guest whose code the measurement fixes."
        );
    }
    if let Some(policy) = &args.add_to {
        return policy_edit::edit(policy, "measure", |p| {
            if !p.measurements.contains(&m) {
                p.measurements.push(m);
            }
            if let Some(h) = &args.host_data {
                let h = h.parse().map_err(super::error::CliError::flag("--host-data"))?;
                p.host_data = Some(veil_attestation::policy::HostData(h));
            }
            if let Some(peer) = &args.peer_policy {
                let d = super::policy_bundle::read_toml(peer)?.digest();
                if !p.peer_policies.contains(&d) {
                    p.peer_policies.push(d);
                }
            }
            Ok(())
        });
    }
    Exit::Accepted
}
