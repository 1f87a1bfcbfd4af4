//! What a relying party accepts from a TDX shard: TCB statuses and
//! advisories, TD attributes, and the measurement registers it pins.
//!
//! ```toml
//! [tdx]
//! accept_tcb_status = ["UpToDate"]     # the default; add "SWHardeningNeeded" / "OutOfDate" deliberately
//! accept_advisories = []               # INTEL-SA-… IDs tolerated below UpToDate (each one named)
//! allow_debug = false
//! require_sept_ve_disable = true       # the host cannot inject #VE on pending pages
//! allow_perfmon = true
//! allow_migratable = false
//! refuse_unknown_attributes = false    # attribute bits this verifier cannot name: WARN (true: FAIL)
//! allow_service_td = false
//! mrtd = ["…96 hex…"]                  # allowlist; or any_measurement = true
//! rtmr0 = ["…96 hex…"]                 # each RTMR allowlist optional
//! # mr_config_id / mr_owner / mr_owner_config = "…96 hex…"
//! ```

use serde::{Deserialize, Serialize};

use crate::invalid::{InvalidValue, PolicyError, ValueKind};

use super::collateral::TcbStatus;

/// A 48-byte register value, as hex in TOML.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Register(pub [u8; 48]);

impl std::fmt::Debug for Register {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl std::str::FromStr for Register {
    type Err = InvalidValue;
    fn from_str(s: &str) -> Result<Self, InvalidValue> {
        let bad = |reason: String| InvalidValue::new(ValueKind::TdxRegister, reason);
        let v = hex::decode(s.trim()).map_err(|e| bad(format!("not hex: {e}")))?;
        Ok(Self(v.try_into().map_err(|v: Vec<u8>| bad(format!("{} bytes, expected 48", v.len())))?))
    }
}

impl Serialize for Register {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(self.0))
    }
}

impl<'de> Deserialize<'de> for Register {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The TDX section of a policy. Unknown keys are an error.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TdxPolicy {
    /// TCB statuses accepted (the combined platform, module and QE status).
    pub accept_tcb_status: Vec<TcbStatus>,
    /// Advisories tolerated when the status is below UpToDate; any other
    /// advisory the matched levels list refuses the quote.
    pub accept_advisories: Vec<String>,
    /// Accept a debuggable TD (its memory is readable by the host).
    pub allow_debug: bool,
    /// Require SEPT_VE_DISABLE.
    pub require_sept_ve_disable: bool,
    /// Accept PERFMON.
    pub allow_perfmon: bool,
    /// Accept a migratable TD (TDX 1.5 bit 29: a migration TD may export it).
    pub allow_migratable: bool,
    /// Refuse attribute bits this verifier cannot name (default: warn).
    pub refuse_unknown_attributes: bool,
    /// Accept a bound service TD (TD 1.5 `MRSERVICETD` non-zero).
    pub allow_service_td: bool,
    /// Accept quotes from Veil's simulated TDX hierarchy (development only;
    /// every row is flagged SIMULATED).
    pub allow_simulated: bool,
    /// Allowed MRTD values.
    pub mrtd: Vec<Register>,
    /// Accept any MRTD. Must be said in so many words.
    pub any_measurement: bool,
    /// Allowed RTMR0 values (empty: not pinned).
    pub rtmr0: Vec<Register>,
    /// Allowed RTMR1 values (empty: not pinned).
    pub rtmr1: Vec<Register>,
    /// Allowed RTMR2 values (empty: not pinned).
    pub rtmr2: Vec<Register>,
    /// Allowed RTMR3 values (empty: not pinned).
    pub rtmr3: Vec<Register>,
    /// `MRCONFIGID`, when pinned.
    pub mr_config_id: Option<Register>,
    /// `MROWNER`, when pinned.
    pub mr_owner: Option<Register>,
    /// `MROWNERCONFIG`, when pinned.
    pub mr_owner_config: Option<Register>,
}

impl Default for TdxPolicy {
    fn default() -> Self {
        Self {
            accept_tcb_status: vec![TcbStatus::UpToDate],
            accept_advisories: Vec::new(),
            allow_debug: false,
            require_sept_ve_disable: true,
            allow_perfmon: true,
            allow_migratable: false,
            refuse_unknown_attributes: false,
            allow_service_td: false,
            allow_simulated: false,
            mrtd: Vec::new(),
            any_measurement: false,
            rtmr0: Vec::new(),
            rtmr1: Vec::new(),
            rtmr2: Vec::new(),
            rtmr3: Vec::new(),
            mr_config_id: None,
            mr_owner: None,
            mr_owner_config: None,
        }
    }
}

impl TdxPolicy {
    /// Whether every setting is the default (a policy that says nothing about TDX).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Parses the TOML form (the `[tdx]` table's body).
    pub fn from_toml(s: &str) -> Result<Self, PolicyError> {
        let p: Self = toml::from_str(s).map_err(|e| PolicyError::Parse(e.to_string()))?;
        p.validate()?;
        Ok(p)
    }

    /// Refuses settings that contradict each other ([`PolicyError::Inconsistent`]).
    pub fn validate(&self) -> Result<(), PolicyError> {
        let inconsistent = |why: &str| Err(PolicyError::Inconsistent(why.to_owned()));
        if self.any_measurement && !self.mrtd.is_empty() {
            return inconsistent("any_measurement = true makes the mrtd allowlist meaningless; choose one");
        }
        if self.accept_tcb_status.is_empty() {
            return inconsistent("accept_tcb_status = [] accepts no platform; list at least UpToDate");
        }
        Ok(())
    }

    /// What this policy waives, for a reviewer.
    pub fn weakenings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if self.allow_debug {
            w.push("allow_debug: a debuggable TD's memory is readable by the host".to_owned());
        }
        if !self.require_sept_ve_disable {
            w.push("require_sept_ve_disable = false: the host may inject #VE on pending pages".to_owned());
        }
        if self.allow_simulated {
            w.push("allow_simulated: quotes from Veil's software TDX hierarchy pass; they prove nothing".to_owned());
        }
        if self.any_measurement {
            w.push("any_measurement: any firmware (MRTD) passes".to_owned());
        }
        if let Some(s) = self.accept_tcb_status.iter().find(|s| **s != TcbStatus::UpToDate) {
            w.push(format!("accept_tcb_status includes {s}: platforms behind Intel's latest TCB pass"));
        }
        w
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_refuses_contradictions_and_typos() {
        let p = TdxPolicy::from_toml(&format!(
            "accept_tcb_status = [\"UpToDate\", \"SWHardeningNeeded\"]\nmrtd = [\"{}\"]\n",
            "ab".repeat(48)
        ))
        .unwrap();
        assert_eq!(p.mrtd[0].0, [0xab; 48]);
        assert!(p.require_sept_ve_disable && !p.allow_debug);
        let parse = |toml: &str| matches!(TdxPolicy::from_toml(toml), Err(PolicyError::Parse(_)));
        let inconsistent = |toml: &str| matches!(TdxPolicy::from_toml(toml), Err(PolicyError::Inconsistent(_)));
        assert!(parse("allow_debugg = true"));
        assert!(parse("mrtd = [\"abcd\"]"));
        match TdxPolicy::from_toml("mrtd = [\"abcd\"]") {
            Err(PolicyError::Parse(why)) => {
                assert!(why.contains("invalid TDX register: 2 bytes, expected 48"), "{why}")
            }
            other => panic!("{other:?}"),
        }
        assert!(inconsistent(&format!("any_measurement = true\nmrtd = [\"{}\"]", "00".repeat(48))));
        assert!(inconsistent("accept_tcb_status = []"));
        assert_eq!(
            "zz".parse::<Register>().unwrap_err().what,
            ValueKind::TdxRegister,
            "a register that is not hex is refused as one"
        );
    }
}
