//! NVIDIA GPU confidential-computing evidence (Hopper): parsing,
//! verification as an ordered list of named checks, binding to the CPU
//! report. Collection (simulated, and real through NVML with feature `hw`)
//! is the attester's: [`crate::attester::gpu`].
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
pub(crate) mod error;
pub mod evidence;
pub mod ocsp;
pub(crate) mod report;
pub mod rim;
pub mod spdm;
mod version;
pub mod xmldsig;

pub use evidence::{gpu_evidence_digest, CcSettings, GpuEvidence, GpuInputError};
pub use rim::{Rim, RimError};
pub use spdm::{SpdmError, SpdmMeasurements};

pub use crate::check::GpuCheckId;
pub use error::GpuError;
pub use report::{GpuAppraisal, GpuCheckReport, GpuCheckResult};
pub use version::Version;

#[cfg(test)]
mod tests {
    use std::cmp::Ordering;

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
