//! NVIDIA GPU confidential-computing evidence (Hopper): parsing,
//! verification as an ordered list of named checks, binding to the CPU
//! report, simulated and (feature `hw`) real collection.
//!
//! ```text
//!  shard (composite attester)                         verifier (per GPU i)
//!  claims ──gpu_nonce(i)──▶ SPDM GET_MEASUREMENTS        1 gpu_evidence_format   8 gpu_cc_mode
//!         (32-byte nonce)   signed by the GPU leaf key   2 gpu_device_chain      9 gpu_devtools
//!  GpuEvidence[i] = request ‖ response ‖ 5-cert chain    3 gpu_revocation       10 gpu_protected_pcie
//!  claims.gpu_evidence_hash = digest(all GpuEvidence)     4 gpu_report_signature 11 gpu_driver_version
//!  REPORT_DATA = SHA-512(claims)  (SNP report)            5 gpu_fwid             12 gpu_vbios_version
//!                                                         6 gpu_nonce            13 gpu_rim_measurements
//!                                                         7 gpu_evidence_binding 14 gpu_rim_signature
//! ```
//!
//! The GPU evidence is bound both ways: its SPDM nonce is derived from the
//! shard's claims (so it cannot be replayed into another session), and the
//! claims REPORT_DATA commits to carry the digest of all GPU evidence (so the
//! host cannot swap in another GPU's evidence).

pub mod chain;
pub mod evidence;
#[cfg(feature = "hw")]
pub mod hw;
pub mod ocsp;
pub mod rim;
pub mod simulated;
pub mod spdm;
mod verify;
pub mod xmldsig;

use std::cmp::Ordering;
use std::fmt;

pub use evidence::{gpu_evidence_digest, CcSettings, GpuEvidence, GpuInputError};
pub use rim::{Rim, RimError};
pub use spdm::{SpdmError, SpdmMeasurements};
pub use verify::{
    appraise_gpus, verify_composite, verify_gpus, GpuAppraisal, GpuCheckId, GpuCheckReport, GpuCheckResult,
    GpuExpectations, GpuRejection, VerifiedGpus,
};

/// Why a GPU check failed: SECURITY-CASES §3 `GpuError` plus the chain,
/// signature, binding and input failures that apply to GPU evidence.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GpuError {
    /// The evidence bytes do not parse.
    #[error("malformed GPU evidence: {0}")]
    Malformed(#[from] SpdmError),
    /// The device certificate chain is not acceptable.
    #[error("GPU device chain: {0}")]
    ChainInvalid(#[from] chain::ChainError),
    /// Revocation data was required and is not available (or not usable).
    #[error("revocation data (OCSP) for the GPU device chain is unavailable")]
    RevocationUnavailable,
    /// An OCSP response says a chain certificate is revoked.
    #[error("OCSP: {cert} is revoked ({reason})")]
    OcspRevoked {
        /// Certificate common name.
        cert: String,
        /// Revocation reason.
        reason: String,
    },
    /// An OCSP response is not current.
    #[error("OCSP response for {cert} is not current")]
    OcspStale {
        /// Certificate common name.
        cert: String,
    },
    /// The SPDM signature does not verify under the leaf key.
    #[error("GPU report signature does not verify")]
    GpuReportSignatureInvalid,
    /// The opaque FWID differs from the leaf certificate's FWID.
    #[error("FWID in the report differs from the leaf certificate's DICE FWID")]
    FwidMismatch,
    /// The SPDM request nonce is not the expected one.
    #[error("GPU request nonce differs from the expected nonce")]
    NonceMismatch,
    /// The CPU evidence does not commit to this GPU evidence.
    #[error("GPU evidence is not bound to the shard's signed claims")]
    GpuNotBoundToSession,
    /// The GPU is not in confidential-computing mode (or no GPU evidence).
    #[error("GPU is not in confidential-computing mode")]
    NotCcMode,
    /// The GPU is in CC DevTools mode.
    #[error("GPU is in CC DevTools mode")]
    DevToolsMode,
    /// Protected PCIe was required and is off.
    #[error("protected PCIe is off")]
    ProtectedPcieOff,
    /// Driver older than the policy minimum.
    #[error("driver {got} is older than the minimum {min}")]
    DriverTooOld {
        /// Reported.
        got: String,
        /// Policy minimum.
        min: String,
    },
    /// VBIOS older than the policy minimum.
    #[error("VBIOS {got} is older than the minimum {min}")]
    VbiosTooOld {
        /// Reported.
        got: String,
        /// Policy minimum.
        min: String,
    },
    /// No reference values (RIM) for this GPU's driver or VBIOS.
    #[error("no RIM available for this GPU's driver and VBIOS")]
    RimUnavailable,
    /// A RIM is for another driver or VBIOS version.
    #[error("RIM {rim_version} matches neither driver {driver} nor VBIOS {vbios}")]
    RimNotForThisGpu {
        /// RIM colloquial version.
        rim_version: String,
        /// Reported driver version.
        driver: String,
        /// Reported VBIOS version.
        vbios: String,
    },
    /// Driver and VBIOS RIMs both claim an index.
    #[error("driver and VBIOS RIMs both claim index {index}")]
    RimConflict {
        /// RIM index.
        index: u32,
    },
    /// A measurement differs from every golden alternative.
    #[error("measurement at RIM index {index} matches no golden value")]
    RimMismatch {
        /// RIM index (SPDM block index − 1).
        index: u32,
    },
    /// The policy requires signed RIMs and a RIM is unsigned (or none was supplied).
    #[error("RIM signature required but absent")]
    RimSignatureNotVerified,
    /// A RIM's XML signature or its signer chain does not verify, or its contents differ from the signed document.
    #[error("RIM signature invalid: {0}")]
    RimSignatureInvalid(String),
    /// Wrong number of GPUs, or one GPU presented twice.
    #[error("GPU topology: expected {expected}, got {got}")]
    TopologyMismatch {
        /// What the policy requires.
        expected: String,
        /// What the evidence shows.
        got: String,
    },
    /// An architecture this verifier does not know (only Hopper).
    #[error("GPU architecture {0:?} is not supported (HOPPER only)")]
    UnsupportedArchitecture(String),
    /// The device chain ends at a simulated root.
    #[error("simulated GPU evidence is refused (policy allow_simulated = false)")]
    SimulatedRefused,
}

/// A driver or VBIOS version, compared component by component.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    parts: Vec<u32>,
    text: String,
}

impl Version {
    fn parse(text: &str, radix: u32) -> Result<Self, String> {
        let t = text.trim();
        if t.is_empty() || t.len() > 32 {
            return Err(format!("{text:?} is not a version"));
        }
        let parts = t
            .split('.')
            .map(|p| {
                if p.is_empty() || p.len() > 6 {
                    return Err(format!("{text:?} is not a version"));
                }
                u32::from_str_radix(p, radix).map_err(|_| format!("{text:?} is not a version"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { parts, text: t.to_owned() })
    }

    /// Dotted decimal (driver, e.g. `550.90.07`).
    pub fn driver(text: &str) -> Result<Self, String> {
        Self::parse(text, 10)
    }

    /// Dotted hex (VBIOS, e.g. `96.00.9F.00.01`).
    pub fn vbios(text: &str) -> Result<Self, String> {
        Self::parse(text, 16)
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        let n = self.parts.len().max(other.parts.len());
        let at = |v: &Self, i: usize| v.parts.get(i).copied().unwrap_or(0);
        (0..n).map(|i| at(self, i).cmp(&at(other, i))).find(|o| o.is_ne()).unwrap_or(Ordering::Equal)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_numerically() {
        assert!(Version::driver("550.90.07").unwrap() < Version::driver("550.127.05").unwrap());
        assert!(Version::driver("560.00").unwrap() > Version::driver("550.90.07").unwrap());
        assert_eq!(Version::driver("550.90").unwrap().cmp(&Version::driver("550.90.0").unwrap()), Ordering::Equal);
        assert!(Version::vbios("96.00.9F.00.01").unwrap() > Version::vbios("96.00.5E.00.01").unwrap());
        assert!(Version::vbios("96.00.A5.00.01").unwrap() > Version::vbios("96.00.9F.00.01").unwrap());
        assert!(Version::driver("5x0").is_err());
        assert!(Version::driver("").is_err());
        assert!(Version::driver("1..2").is_err());
    }
}

/// Where a composite attester's GPU evidence comes from.
#[derive(Debug)]
pub enum GpuSource {
    /// Software GPUs (development; accepted only under `allow_simulated`).
    Simulated(Vec<simulated::SimulatedGpu>),
    /// Every GPU NVML sees, in confidential-computing mode.
    #[cfg(feature = "hw")]
    Nvml(hw::NvmlGpuAttester),
}

/// A CVM and its GPUs as one attester (RFC 9334 composite attester): GPU
/// `i` signs the nonce derived from the claims, the claims then commit to
/// the digest of all GPU evidence, the CPU report commits to the claims, and
/// one bundle carries both. [`crate::verify()`] checks them together.
pub struct CompositeAttester {
    cpu: Box<dyn crate::Attester>,
    gpus: GpuSource,
}

impl fmt::Debug for CompositeAttester {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompositeAttester").field("gpus", &self.gpus).finish_non_exhaustive()
    }
}

impl CompositeAttester {
    /// `cpu`'s reports, with `gpus`' evidence bound in.
    pub fn new(cpu: Box<dyn crate::Attester>, gpus: GpuSource) -> Self {
        Self { cpu, gpus }
    }
}

impl crate::Attester for CompositeAttester {
    fn evidence(&self, claims: &crate::Claims) -> Result<crate::EvidenceBundle, crate::Error> {
        let (bound, gpus) = match &self.gpus {
            GpuSource::Simulated(g) => simulated::composite(g, claims)?,
            #[cfg(feature = "hw")]
            GpuSource::Nvml(n) => {
                let evidence = n.collect(claims)?;
                let mut bound = claims.clone();
                bound.gpu_evidence_hash = Some(gpu_evidence_digest(&evidence));
                (bound, evidence)
            }
        };
        let bundle = self.cpu.evidence(&bound)?;
        Ok(crate::EvidenceBundle { gpus, ..bundle })
    }
}
