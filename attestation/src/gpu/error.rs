//! Why a GPU check failed: shared by the error, report and checker modules;
//! depends only on the SPDM and chain parsers.

use super::chain;
use super::spdm::SpdmError;

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
