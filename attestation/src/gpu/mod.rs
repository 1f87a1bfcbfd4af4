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

pub mod carried;
pub mod chain;
pub(crate) mod error;
pub mod evidence;
#[cfg(feature = "hw")]
pub mod hw;
pub mod ocsp;
pub(crate) mod report;
pub mod rim;
pub mod simulated;
pub mod spdm;
mod version;
pub mod xmldsig;

pub use carried::{CarriedReference, GpuReference};
pub use evidence::{gpu_evidence_digest, CcSettings, GpuEvidence, GpuInputError};
pub use rim::{Rim, RimError};
pub use spdm::{SpdmError, SpdmMeasurements};
use std::fmt;

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
    carried: CarriedReference,
    /// When simulated GPUs' OCSP responses were last made.
    simulated_ocsp_made: std::sync::Mutex<std::time::SystemTime>,
}

impl fmt::Debug for CompositeAttester {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompositeAttester").field("gpus", &self.gpus).finish_non_exhaustive()
    }
}

impl CompositeAttester {
    /// `cpu`'s reports, with `gpus`' evidence bound in.
    ///
    /// Simulated GPUs carry their own (unsigned) RIMs and OCSP responses
    /// from their simulated issuers in every bundle (made again once a day,
    /// [`carried::SIMULATED_OCSP_REFRESH`]), as a hardware shard carries
    /// NVIDIA's when given them ([`Self::carrying`]).
    pub fn new(cpu: Box<dyn crate::Attester>, gpus: GpuSource) -> Result<Self, crate::Error> {
        let now = std::time::SystemTime::now();
        let reference = match &gpus {
            GpuSource::Simulated(g) => GpuReference::simulated(g, now)?,
            #[cfg(feature = "hw")]
            GpuSource::Nvml(_) => GpuReference::default(),
        };
        Ok(Self {
            cpu,
            gpus,
            carried: CarriedReference::new(reference)?,
            simulated_ocsp_made: std::sync::Mutex::new(now),
        })
    }

    /// Carries `reference` (NVIDIA's driver and VBIOS RIMs, as signed, and
    /// DER OCSP responses for the GPUs' certificates) in every bundle, in
    /// place of any carried before, so a client can compare the GPUs with
    /// NVIDIA's reference values and check revocation without reaching
    /// NVIDIA. Checked against [`crate::EvidenceBundle::from_json`]'s limits
    /// here, so a shard refuses at start what every verifier would refuse.
    pub fn carrying(self, reference: GpuReference) -> Result<Self, crate::Error> {
        self.carried.replace(reference)?;
        Ok(self)
    }

    /// The handle through which a serving shard replaces what its bundles
    /// carry (fresh OCSP responses, new RIMs after a driver update).
    pub fn carried(&self) -> CarriedReference {
        self.carried.clone()
    }

    /// Simulated GPUs: new OCSP responses once the carried ones are a day old.
    fn refresh_simulated(&self, gpus: &[simulated::SimulatedGpu]) -> Result<(), crate::Error> {
        let now = std::time::SystemTime::now();
        let mut made = self.simulated_ocsp_made.lock().unwrap_or_else(|p| p.into_inner());
        if now.duration_since(*made).unwrap_or_default() < carried::SIMULATED_OCSP_REFRESH {
            return Ok(());
        }
        self.carried.replace(GpuReference::simulated(gpus, now)?)?;
        *made = now;
        Ok(())
    }
}

impl crate::Attester for CompositeAttester {
    fn evidence(&self, claims: &crate::Claims) -> Result<crate::EvidenceBundle, crate::Error> {
        let (bound, gpus) = match &self.gpus {
            GpuSource::Simulated(g) => {
                self.refresh_simulated(g)?;
                simulated::composite(g, claims)?
            }
            #[cfg(feature = "hw")]
            GpuSource::Nvml(n) => {
                let evidence = n.collect(claims)?;
                let mut bound = claims.clone();
                bound.gpu_evidence_hash = Some(gpu_evidence_digest(&evidence));
                (bound, evidence)
            }
        };
        let bundle = self.cpu.evidence(&bound)?;
        let GpuReference { rims, ocsp } = self.carried.current();
        Ok(crate::EvidenceBundle { gpus, gpu_rims: rims, gpu_ocsp: ocsp, ..bundle })
    }
}
