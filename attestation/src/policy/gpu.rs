//! `[gpu]`: reference values for NVIDIA GPU evidence.

use serde::{Deserialize, Serialize};

use super::PolicyError;

/// Reference values for NVIDIA GPU evidence (`[gpu]`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuPolicy {
    /// Evidence without GPU evidence is refused.
    #[serde(default)]
    pub required: bool,
    /// Exact number of GPUs each shard must present, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    /// Lowest driver version (dotted decimal, e.g. `550.54.14`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_driver_version: Option<String>,
    /// Lowest VBIOS version (dotted hex, e.g. `96.00.5E.00.01`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_vbios_version: Option<String>,
    /// The protected-PCIe status must be on.
    #[serde(default)]
    pub require_protected_pcie: bool,
    /// Golden measurements (driver and VBIOS RIMs) must be supplied, and every active index must match.
    #[serde(default)]
    pub require_rim: bool,
    /// Every RIM must carry an XML signature (signed RIMs are always verified, to the NVIDIA RIM root).
    #[serde(default)]
    pub require_rim_signature: bool,
    /// PEM of a RIM signing root replacing the compiled-in NVIDIA CoRIM signing Root CA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rim_root_pem: Option<String>,
    /// OCSP responses covering the device chain must be supplied (and say good).
    #[serde(default)]
    pub require_revocation: bool,
    /// The collector's report of CC and DevTools mode must be present (DevTools is not in the signed evidence).
    #[serde(default)]
    pub require_cc_settings: bool,
    /// PEM of a device root replacing the compiled-in NVIDIA Device Identity CA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_pem: Option<String>,
}

impl GpuPolicy {
    pub(super) fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Checks the version strings and the root override.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if let Some(v) = &self.min_driver_version {
            crate::gpu::Version::driver(v)
                .map_err(|e| PolicyError::Inconsistent(format!("gpu.min_driver_version: {e}")))?;
        }
        if let Some(v) = &self.min_vbios_version {
            crate::gpu::Version::vbios(v)
                .map_err(|e| PolicyError::Inconsistent(format!("gpu.min_vbios_version: {e}")))?;
        }
        if let Some(pem) = &self.root_pem {
            crate::x509::ParsedCert::from_pem(pem.as_bytes())
                .map_err(|e| PolicyError::Inconsistent(format!("gpu.root_pem: {e}")))?;
        }
        if let Some(pem) = &self.rim_root_pem {
            crate::x509::ParsedCert::from_pem(pem.as_bytes())
                .map_err(|e| PolicyError::Inconsistent(format!("gpu.rim_root_pem: {e}")))?;
        }
        if self.count == Some(0) {
            return Err(PolicyError::Inconsistent("gpu.count = 0: use required = false instead".into()));
        }
        Ok(())
    }
}
