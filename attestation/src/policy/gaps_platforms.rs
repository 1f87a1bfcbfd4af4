//! Where a peer policy's `[tdx]` and `[azure]` sections are weaker than the
//! relying party's (part of [`super::Policy::gaps_in`]): every TCB status,
//! advisory, attribute allowance and register value the peer accepts and we
//! do not.

use crate::azure::AzurePolicy;
use crate::tdx::policy::Register;
use crate::tdx::TdxPolicy;

fn list(v: &[String]) -> String {
    if v.is_empty() {
        "none".to_owned()
    } else {
        v.join(", ")
    }
}

/// What `peer` allows beyond `mine` in one allowlist of values; an empty
/// `mine` pins nothing and so has no gap.
fn allowlist_gap<T: PartialEq>(
    setting: &str,
    mine: &[T],
    peer: &[T],
    show: impl Fn(&T) -> String,
    gap: &mut impl FnMut(&str, String, String),
) {
    if mine.is_empty() {
        return;
    }
    if peer.is_empty() {
        gap(setting, format!("{} pinned", mine.len()), "not pinned".into());
        return;
    }
    let extra: Vec<String> = peer.iter().filter(|v| !mine.contains(v)).map(show).collect();
    if !extra.is_empty() {
        gap(setting, format!("{} pinned", mine.len()), format!("also {}", list(&extra)));
    }
}

fn register(r: &Register) -> String {
    hex::encode(r.0)
}

impl TdxPolicy {
    pub(super) fn gaps(&self, peer: &Self, gap: &mut impl FnMut(&str, String, String)) {
        let extra: Vec<String> = peer
            .accept_tcb_status
            .iter()
            .filter(|s| !self.accept_tcb_status.contains(s))
            .map(|s| s.to_string())
            .collect();
        if !extra.is_empty() {
            let mine: Vec<String> = self.accept_tcb_status.iter().map(|s| s.to_string()).collect();
            gap("tdx.accept_tcb_status", list(&mine), format!("also {}", list(&extra)));
        }
        let extra: Vec<String> =
            peer.accept_advisories.iter().filter(|a| !self.accept_advisories.contains(a)).cloned().collect();
        if !extra.is_empty() {
            gap("tdx.accept_advisories", list(&self.accept_advisories), format!("also {}", list(&extra)));
        }
        for (setting, mine, theirs) in [
            ("tdx.allow_debug", self.allow_debug, peer.allow_debug),
            ("tdx.allow_perfmon", self.allow_perfmon, peer.allow_perfmon),
            ("tdx.allow_migratable", self.allow_migratable, peer.allow_migratable),
            ("tdx.allow_service_td", self.allow_service_td, peer.allow_service_td),
            ("tdx.allow_simulated", self.allow_simulated, peer.allow_simulated),
        ] {
            if theirs && !mine {
                gap(setting, "false".into(), "true".into());
            }
        }
        for (setting, mine, theirs) in [
            ("tdx.require_sept_ve_disable", self.require_sept_ve_disable, peer.require_sept_ve_disable),
            ("tdx.refuse_unknown_attributes", self.refuse_unknown_attributes, peer.refuse_unknown_attributes),
        ] {
            if mine && !theirs {
                gap(setting, "true".into(), "false".into());
            }
        }
        if !self.any_measurement {
            if peer.any_measurement {
                gap("tdx.mrtd", format!("{} pinned", self.mrtd.len()), "any_measurement = true".into());
            } else {
                let extra: Vec<String> = peer.mrtd.iter().filter(|m| !self.mrtd.contains(m)).map(register).collect();
                if !extra.is_empty() {
                    gap("tdx.mrtd", format!("{} pinned", self.mrtd.len()), format!("also {}", list(&extra)));
                }
            }
        }
        for (setting, mine, theirs) in [
            ("tdx.rtmr0", &self.rtmr0, &peer.rtmr0),
            ("tdx.rtmr1", &self.rtmr1, &peer.rtmr1),
            ("tdx.rtmr2", &self.rtmr2, &peer.rtmr2),
            ("tdx.rtmr3", &self.rtmr3, &peer.rtmr3),
        ] {
            allowlist_gap(setting, mine, theirs, register, gap);
        }
        for (setting, mine, theirs) in [
            ("tdx.mr_config_id", self.mr_config_id, peer.mr_config_id),
            ("tdx.mr_owner", self.mr_owner, peer.mr_owner),
            ("tdx.mr_owner_config", self.mr_owner_config, peer.mr_owner_config),
        ] {
            if let Some(m) = mine {
                if theirs != Some(m) {
                    gap(setting, register(&m), theirs.as_ref().map_or("not pinned".into(), register));
                }
            }
        }
    }
}

impl AzurePolicy {
    pub(super) fn gaps(&self, peer: &Self, gap: &mut impl FnMut(&str, String, String)) {
        for (setting, mine, theirs) in [
            ("azure.require_secure_boot", self.require_secure_boot, peer.require_secure_boot),
            ("azure.require_tpm", self.require_tpm, peer.require_tpm),
        ] {
            if mine && !theirs {
                gap(setting, "true".into(), "false".into());
            }
        }
        if peer.allow_console && !self.allow_console {
            gap("azure.allow_console", "false".into(), "true".into());
        }
        for (index, mine) in &self.pcrs {
            let theirs = peer.pcrs.get(index).map(Vec::as_slice).unwrap_or_default();
            allowlist_gap(&format!("azure.pcrs.{index}"), mine, theirs, |v| hex::encode(v.0), gap);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::azure::policy::PcrValue;
    use crate::tdx::collateral::TcbStatus;
    use crate::tdx::policy::Register;
    use crate::Policy;

    fn settings(mine: &Policy, peer: &Policy) -> Vec<String> {
        mine.gaps_in(peer).into_iter().map(|g| g.setting).collect()
    }

    #[test]
    fn a_peer_weaker_on_tdx_is_named_setting_by_setting() {
        let mut mine = Policy::default();
        mine.tdx.mrtd = vec![Register([1; 48])];
        mine.tdx.rtmr1 = vec![Register([2; 48])];
        mine.tdx.mr_owner = Some(Register([3; 48]));
        assert!(settings(&mine, &mine.clone()).is_empty(), "a policy is as strict as itself");

        let mut peer = mine.clone();
        peer.tdx.accept_tcb_status.push(TcbStatus::OutOfDate);
        peer.tdx.accept_advisories.push("INTEL-SA-00837".into());
        peer.tdx.allow_debug = true;
        peer.tdx.require_sept_ve_disable = false;
        peer.tdx.mrtd.push(Register([9; 48]));
        peer.tdx.rtmr1.clear();
        peer.tdx.mr_owner = None;
        let got = settings(&mine, &peer);
        for want in [
            "tdx.accept_tcb_status",
            "tdx.accept_advisories",
            "tdx.allow_debug",
            "tdx.require_sept_ve_disable",
            "tdx.mrtd",
            "tdx.rtmr1",
            "tdx.mr_owner",
        ] {
            assert!(got.iter().any(|g| g == want), "{want} missing from {got:?}");
        }
        assert_eq!(got.len(), 7, "{got:?}");

        // Stricter in every way is no gap; waiving the MRTD is one.
        let mut stricter = mine.clone();
        stricter.tdx.allow_perfmon = false;
        stricter.tdx.refuse_unknown_attributes = true;
        stricter.tdx.rtmr0 = vec![Register([4; 48])];
        assert!(settings(&mine, &stricter).is_empty());
        let mut waived = mine.clone();
        waived.tdx.any_measurement = true;
        assert_eq!(settings(&mine, &waived), vec!["tdx.mrtd"]);
    }

    #[test]
    fn a_peer_weaker_on_azure_is_named_setting_by_setting() {
        let mut mine = Policy::default();
        mine.azure.allow_console = false;
        mine.azure.pcrs.insert("7".into(), vec![PcrValue([7; 32])]);
        assert!(settings(&mine, &mine.clone()).is_empty());
        let mut peer = mine.clone();
        peer.azure.require_secure_boot = false;
        peer.azure.allow_console = true;
        peer.azure.pcrs.get_mut("7").unwrap().push(PcrValue([8; 32]));
        assert_eq!(settings(&mine, &peer), vec!["azure.require_secure_boot", "azure.allow_console", "azure.pcrs.7"]);
        peer.azure.pcrs.clear();
        let got = mine.gaps_in(&peer);
        let pcr = got.iter().find(|g| g.setting == "azure.pcrs.7").unwrap();
        assert_eq!(pcr.peer, "not pinned");
    }
}
