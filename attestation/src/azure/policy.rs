//! What a relying party accepts from an Azure confidential VM beyond its SNP
//! report: the VM configuration Azure reports and the vTPM PCRs it pins.
//!
//! ```toml
//! [azure]
//! require_secure_boot = true
//! require_tpm = true
//! allow_console = true            # the serial console (reachable from Azure's portal): WARN when on
//! [azure.pcrs]
//! "4" = ["…64 hex…"]              # SHA-256 bank; any listed value passes
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::invalid::PolicyError;

/// A 32-byte PCR value, as hex in TOML.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PcrValue(pub [u8; 32]);

impl std::fmt::Debug for PcrValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl Serialize for PcrValue {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(self.0))
    }
}

impl<'de> Deserialize<'de> for PcrValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let v = hex::decode(s.trim()).map_err(serde::de::Error::custom)?;
        Ok(Self(v.try_into().map_err(|_| serde::de::Error::custom("a PCR value is 32 bytes (64 hex digits)"))?))
    }
}

/// The Azure section of a policy. Unknown keys are an error.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AzurePolicy {
    /// Require `secure-boot: true`.
    pub require_secure_boot: bool,
    /// Require `tpm-enabled: true`.
    pub require_tpm: bool,
    /// Accept a VM whose serial console is enabled (WARN).
    pub allow_console: bool,
    /// Pinned SHA-256 PCR values by index ("0".."23"): each listed value passes.
    pub pcrs: BTreeMap<String, Vec<PcrValue>>,
}

impl Default for AzurePolicy {
    fn default() -> Self {
        Self { require_secure_boot: true, require_tpm: true, allow_console: true, pcrs: BTreeMap::new() }
    }
}

impl AzurePolicy {
    /// Whether every setting is the default.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// The pinned PCRs by index; refuses indexes outside 0..=23.
    pub fn pinned(&self) -> Result<Vec<(u8, &[PcrValue])>, PolicyError> {
        self.pcrs
            .iter()
            .map(|(k, v)| match k.parse::<u8>() {
                Ok(i) if i < 24 && !v.is_empty() => Ok((i, v.as_slice())),
                Ok(i) if i < 24 => Err(PolicyError::Inconsistent(format!("pcrs.\"{i}\" lists no value"))),
                _ => Err(PolicyError::Inconsistent(format!("pcrs.\"{k}\" is not a PCR index (0 to 23)"))),
            })
            .collect()
    }

    /// Refuses settings that cannot mean anything ([`PolicyError::Inconsistent`]).
    pub fn validate(&self) -> Result<(), PolicyError> {
        self.pinned().map(|_| ())
    }
}
