//! GPUs in a composite attester: where their evidence comes from
//! (simulated GPUs, or NVML with feature `hw`), the reference values a shard
//! carries for them, and the CVM and its GPUs as one attester.

use std::fmt;

pub mod carried;
#[cfg(feature = "hw")]
pub mod hw;
pub mod simulated;

pub use carried::{CarriedReference, GpuReference};

use crate::gpu::gpu_evidence_digest;

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
