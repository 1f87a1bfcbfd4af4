//! `veil policy init URL --out P [--allow-simulated]`: trust on first use.
//! Verifies the route's evidence (signatures, chains, claims bound, the
//! entry's freshness) with any measurement allowed, then writes a policy
//! pinning what it saw — launch measurements, the manifest root per layer
//! range, the TCB as minimums, the digest of the peer policy the shards
//! enforce on their links and the model's layer count — for a reviewer to
//! read and edit.

use veil_attestation::policy::TcbMinimum;
use veil_attestation::Policy;

use super::{Exit, PolicyInitArgs};
use crate::sdk::{Client, VerifiedShard};

/// Runs the command.
pub fn run(args: &PolicyInitArgs) -> Exit {
    if args.out.exists() && !args.force {
        eprintln!("veil policy init: {} exists (use --force to replace it)", args.out.display());
        return Exit::Unreadable;
    }
    let seen_policy = Policy { any_measurement: true, allow_simulated: args.allow_simulated, ..Policy::default() };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("veil policy init: {e}");
            return Exit::Unreadable;
        }
    };
    let options = match super::connect_options(args.ca.as_deref()) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("veil policy init: {e}");
            return Exit::Unreadable;
        }
    };
    let client = match rt.block_on(Client::connect_with(&args.url, &seen_policy, &options)) {
        Ok(c) => c,
        Err(e) => {
            if let Some(t) = e.check_table() {
                eprintln!("{t}");
            }
            if !args.allow_simulated && e.to_string().contains("simulated") {
                eprintln!(
                    "veil policy init: the route presents SIMULATED evidence; pin it only with --allow-simulated"
                );
            }
            eprintln!("veil policy init: {e}");
            return Exit::Rejected;
        }
    };
    let route = client.route();
    let all: Vec<&VerifiedShard> = std::iter::once(route.entry()).chain(route.shards()).collect();
    let mut policy = Policy {
        allow_simulated: all.iter().any(|s| s.evidence().is_simulated()),
        // The peer policy the route's shards enforce on their links (its
        // digest is in their claims) and the model's layer count.
        peer_policies: vec![route.peer_policy_digest()],
        model_layers: Some(route.shape().model_layers()),
        ..Policy::default()
    };
    for s in &all {
        // Simulated evidence is pinned to the roots seen: another simulated
        // root (anyone can make one) does not pass this policy.
        if let Some(root) = s.evidence().simulated_root() {
            if !policy.simulated_roots.contains(&root) {
                policy.simulated_roots.push(root);
            }
        }
        // GPUs seen: require them, as many as each shard presented.
        if let Some(g) = s.evidence().gpus() {
            let n = u32::try_from(g.reports().len()).unwrap_or(u32::MAX);
            policy.gpu.required = true;
            policy.gpu.count = Some(policy.gpu.count.map_or(n, |c| c.min(n)));
        }
        // A CRL came with the evidence: require one from now on.
        if matches!(
            s.evidence().checks().outcome(veil_attestation::CheckId::Revocation),
            Some(veil_attestation::Outcome::Passed { .. })
        ) {
            policy.require_crl = true;
        }
        let m = veil_attestation::Measurement(s.evidence().report().measurement());
        if !policy.measurements.contains(&m) {
            policy.measurements.push(m);
        }
        if let Some(claims) = s.evidence().claims() {
            if let Some(root) = claims.manifest_root {
                if !policy.manifest_roots.contains(&root) {
                    policy.manifest_roots.push(root);
                }
            }
        }
        let tcb = s.evidence().reported_tcb();
        let min = policy.min_tcb.entry(s.evidence().product()).or_insert(TcbMinimum {
            fmc: tcb.fmc,
            bootloader: Some(tcb.bootloader),
            tee: Some(tcb.tee),
            snp: Some(tcb.snp),
            microcode: Some(tcb.microcode),
        });
        let lower = |a: Option<u8>, b: u8| Some(a.map_or(b, |a| a.min(b)));
        min.bootloader = lower(min.bootloader, tcb.bootloader);
        min.tee = lower(min.tee, tcb.tee);
        min.snp = lower(min.snp, tcb.snp);
        min.microcode = lower(min.microcode, tcb.microcode);
    }
    policy.products = policy.min_tcb.keys().copied().collect();
    let header = format!(
        "# Written by `veil policy init {}` (trust on first use): it pins what that route\n\
         # presented. Review every line before relying on it.{}\n",
        args.url,
        if policy.allow_simulated {
            "\n# SIMULATED evidence was pinned (--allow-simulated): this policy proves nothing about hardware."
        } else {
            ""
        }
    );
    if let Err(e) = policy.validate() {
        eprintln!("veil policy init: the pinned policy is inconsistent: {e}");
        return Exit::Rejected;
    }
    match std::fs::write(&args.out, format!("{header}{}", policy.to_toml())) {
        Ok(()) => {
            println!(
                "wrote {}: {} measurement(s), {} model manifest root(s), TCB minimums for {} product(s), \
                 peer policy {}, {} layers",
                args.out.display(),
                policy.measurements.len(),
                policy.manifest_roots.len(),
                policy.min_tcb.len(),
                route.peer_policy_digest(),
                route.shape().model_layers()
            );
            Exit::Accepted
        }
        Err(e) => {
            eprintln!("veil policy init: cannot write {}: {e}", args.out.display());
            Exit::Unreadable
        }
    }
}
