//! Where a peer policy is weaker than the relying party's ([`Policy::gaps_in`]).

use serde::Serialize;

use super::{GpuPolicy, PlatformPolicy, Policy, Product};

/// One setting on which a peer policy is weaker than the relying party's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PolicyGap {
    /// The policy key (`products`, `min_tcb.Genoa.snp`, `gpu.required`, …).
    pub setting: String,
    /// What the relying party's policy requires.
    pub yours: String,
    /// What the peer policy enforces.
    pub peer: String,
}

impl std::fmt::Display for PolicyGap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: yours {}, the route's {}", self.setting, self.yours, self.peer)
    }
}

impl Policy {
    /// Every setting on which `peer` (the policy a route's shards enforce on
    /// their links) would accept evidence this policy refuses. Empty means
    /// `peer` is at least as strict as `self` on every check.
    ///
    /// Manifests are not compared here: the route pins every stage's
    /// manifest root (one model's), which the route verifier compares with
    /// `manifest_roots`.
    pub fn gaps_in(&self, peer: &Policy) -> Vec<PolicyGap> {
        let mut gaps = Vec::new();
        let mut gap = |setting: &str, yours: String, theirs: String| {
            gaps.push(PolicyGap { setting: setting.to_owned(), yours, peer: theirs })
        };
        let list = |v: &[String]| if v.is_empty() { "none".to_owned() } else { v.join(", ") };
        let names = |v: &[Product]| list(&v.iter().map(|p| p.to_string()).collect::<Vec<_>>());
        let extra: Vec<Product> = peer.products.iter().filter(|p| !self.products.contains(p)).copied().collect();
        if !extra.is_empty() {
            gap("products", names(&self.products), format!("also {}", names(&extra)));
        }
        if peer.min_report_version < self.min_report_version {
            gap("min_report_version", self.min_report_version.to_string(), peer.min_report_version.to_string());
        }
        if peer.max_report_version > self.max_report_version {
            gap("max_report_version", self.max_report_version.to_string(), peer.max_report_version.to_string());
        }
        let flag = |b: bool| b.to_string();
        for (setting, mine, theirs) in [
            ("allow_vlek", self.allow_vlek, peer.allow_vlek),
            ("allow_debug", self.allow_debug, peer.allow_debug),
            ("allow_migration_agent", self.allow_migration_agent, peer.allow_migration_agent),
            ("allow_smt", self.allow_smt, peer.allow_smt),
            ("allow_simulated", self.allow_simulated, peer.allow_simulated),
        ] {
            // An allowance the peer grants and we do not.
            if theirs && !mine {
                gap(setting, flag(mine), flag(theirs));
            }
        }
        if self.require_crl && !peer.require_crl {
            gap("require_crl", "true".into(), "false".into());
        }
        if peer.vmpl != self.vmpl {
            gap("vmpl", self.vmpl.to_string(), peer.vmpl.to_string());
        }
        // TCB minimums: for every product the peer accepts (that we accept),
        // every component we bound must be bound at least as high.
        for product in peer.products.iter().filter(|p| self.products.contains(p)) {
            let Some(mine) = self.min_tcb.get(product) else { continue };
            let theirs = peer.min_tcb.get(product).copied().unwrap_or_default();
            for (component, m, t) in [
                ("fmc", mine.fmc, theirs.fmc),
                ("bootloader", mine.bootloader, theirs.bootloader),
                ("tee", mine.tee, theirs.tee),
                ("snp", mine.snp, theirs.snp),
                ("microcode", mine.microcode, theirs.microcode),
            ] {
                if let Some(m) = m {
                    if t.is_none_or(|t| t < m) {
                        let t = t.map_or("no minimum".to_owned(), |t| t.to_string());
                        gap(&format!("min_tcb.{product}.{component}"), m.to_string(), t);
                    }
                }
            }
        }
        if !self.any_measurement {
            if peer.any_measurement {
                gap("measurements", format!("{} pinned", self.measurements.len()), "any_measurement = true".into());
            } else {
                let extra: Vec<String> = peer
                    .measurements
                    .iter()
                    .filter(|m| !self.measurements.contains(m))
                    .map(|m| m.to_string())
                    .collect();
                if !extra.is_empty() {
                    gap(
                        "measurements",
                        format!("{} pinned", self.measurements.len()),
                        format!("also {}", list(&extra)),
                    );
                }
            }
        }
        for (setting, mine, theirs) in [
            ("host_data", self.host_data.map(|h| h.0.to_string()), peer.host_data.map(|h| h.0.to_string())),
            ("id_key_digest", self.id_key_digest.map(|h| h.to_string()), peer.id_key_digest.map(|h| h.to_string())),
        ] {
            if mine.is_some() && mine != theirs {
                gap(setting, mine.unwrap_or_default(), theirs.unwrap_or_else(|| "not pinned".into()));
            }
        }
        if self.allow_simulated && peer.allow_simulated && !self.simulated_roots.is_empty() {
            let extra: Vec<String> = peer
                .simulated_roots
                .iter()
                .filter(|r| !self.simulated_roots.contains(r))
                .map(|r| r.to_string())
                .collect();
            if peer.simulated_roots.is_empty() {
                gap(
                    "simulated_roots",
                    list(&self.simulated_roots.iter().map(|r| r.to_string()).collect::<Vec<_>>()),
                    "any simulated root".into(),
                );
            } else if !extra.is_empty() {
                gap(
                    "simulated_roots",
                    format!("{} pinned", self.simulated_roots.len()),
                    format!("also {}", list(&extra)),
                );
            }
        }
        self.platform.gaps(&peer.platform, &mut gap);
        self.gpu_gaps(&peer.gpu, &mut gap);
        self.tdx.gaps(&peer.tdx, &mut gap);
        self.azure.gaps(&peer.azure, &mut gap);
        gaps
    }

    fn gpu_gaps(&self, peer: &GpuPolicy, gap: &mut impl FnMut(&str, String, String)) {
        let mine = &self.gpu;
        for (setting, m, t) in [
            ("gpu.required", mine.required, peer.required),
            ("gpu.require_protected_pcie", mine.require_protected_pcie, peer.require_protected_pcie),
            ("gpu.require_rim", mine.require_rim, peer.require_rim),
            ("gpu.require_rim_signature", mine.require_rim_signature, peer.require_rim_signature),
            ("gpu.require_revocation", mine.require_revocation, peer.require_revocation),
            ("gpu.require_cc_settings", mine.require_cc_settings, peer.require_cc_settings),
        ] {
            if m && !t {
                gap(setting, "true".into(), "false".into());
            }
        }
        if mine.count.is_some() && mine.count != peer.count {
            let show = |c: Option<u32>| c.map_or("any".to_owned(), |c| c.to_string());
            gap("gpu.count", show(mine.count), show(peer.count));
        }
        let lower = |m: &Option<String>,
                     t: &Option<String>,
                     parse: fn(&str) -> Result<crate::gpu::Version, crate::invalid::InvalidValue>| {
            let Some(m) = m else { return false };
            match (parse(m), t.as_deref().map(parse)) {
                (Ok(m), Some(Ok(t))) => t < m,
                _ => true,
            }
        };
        if lower(&mine.min_driver_version, &peer.min_driver_version, crate::gpu::Version::driver) {
            gap(
                "gpu.min_driver_version",
                mine.min_driver_version.clone().unwrap_or_default(),
                peer.min_driver_version.clone().unwrap_or_else(|| "no minimum".into()),
            );
        }
        if lower(&mine.min_vbios_version, &peer.min_vbios_version, crate::gpu::Version::vbios) {
            gap(
                "gpu.min_vbios_version",
                mine.min_vbios_version.clone().unwrap_or_default(),
                peer.min_vbios_version.clone().unwrap_or_else(|| "no minimum".into()),
            );
        }
        // A replaced root trusts other devices or RIM signers than ours.
        let pem = |p: &Option<String>| p.as_deref().map(str::trim).map(str::to_owned);
        if pem(&mine.root_pem) != pem(&peer.root_pem) {
            let show = |p: &Option<String>| if p.is_some() { "a replaced root" } else { "the NVIDIA root" }.to_owned();
            gap("gpu.root_pem", show(&mine.root_pem), show(&peer.root_pem));
        }
        if pem(&mine.rim_root_pem) != pem(&peer.rim_root_pem) {
            let show = |p: &Option<String>| if p.is_some() { "a replaced root" } else { "the NVIDIA root" }.to_owned();
            gap("gpu.rim_root_pem", show(&mine.rim_root_pem), show(&peer.rim_root_pem));
        }
    }
}

impl PlatformPolicy {
    fn gaps(&self, peer: &Self, gap: &mut impl FnMut(&str, String, String)) {
        let missing: Vec<&str> = self
            .require_guest_policy
            .iter()
            .filter(|f| !peer.require_guest_policy.contains(f))
            .map(|f| f.abi_name())
            .collect();
        if !missing.is_empty() {
            gap("platform.require_guest_policy", missing.join(", "), "not required".into());
        }
        if peer.allow_cxl && !self.allow_cxl {
            gap("platform.allow_cxl", "false".into(), "true".into());
        }
        if let Some(mine) = self.min_guest_abi {
            if peer.min_guest_abi.is_none_or(|t| t < mine) {
                gap(
                    "platform.min_guest_abi",
                    mine.to_string(),
                    peer.min_guest_abi.map_or("no minimum".into(), |t| t.to_string()),
                );
            }
        }
        let missing: Vec<&str> =
            self.require_platform.iter().filter(|f| !peer.require_platform.contains(f)).map(|f| f.abi_name()).collect();
        if !missing.is_empty() {
            gap("platform.require_platform", missing.join(", "), "not required".into());
        }
        if self.refuse_unknown_platform_bits && !peer.refuse_unknown_platform_bits {
            gap("platform.refuse_unknown_platform_bits", "true".into(), "false".into());
        }
        let missing = self.mitigation_mask() & !peer.mitigation_mask();
        if missing != 0 {
            gap("platform.required_mitigations", format!("{missing:#x}"), "not required".into());
        }
    }
}
