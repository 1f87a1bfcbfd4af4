//! NVIDIA's reference material that a shard carries in its evidence bundles
//! ([`crate::EvidenceBundle::gpu_rims`], [`crate::EvidenceBundle::gpu_ocsp`]):
//! the driver and VBIOS RIMs and OCSP responses for the GPUs' device
//! certificates. NVIDIA signs both, so the host that supplies the files is no
//! more trusted for them than the relay that carries them; what matters is
//! that they reach the verifier, and that OCSP responses stay current.
//!
//! OCSP responses expire (`nextUpdate`), so a serving shard must be able to
//! take fresh ones without a restart: [`CarriedReference`] is a shared handle
//! whose contents the next bundle carries, replaced only by material that
//! passes the limits every verifier applies.

use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use super::simulated::SimulatedGpu;
use crate::evidence::{MAX_CARRIED_OCSP, MAX_CARRIED_RIMS, MAX_CARRIED_RIM_BYTES, MAX_OCSP_BYTES};
use crate::gpu::rim::Rim;
use crate::{Error, Malformed};

/// How long a simulated GPU's OCSP responses are valid (their `nextUpdate`
/// is this far after they are made).
pub const SIMULATED_OCSP_VALIDITY: Duration = Duration::from_secs(7 * 86_400);
/// How old a simulated GPU's OCSP responses may grow before the attester
/// makes new ones for its next bundle.
pub const SIMULATED_OCSP_REFRESH: Duration = Duration::from_secs(86_400);

/// RIMs and OCSP responses for a shard's GPUs, as NVIDIA signed them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuReference {
    /// Driver and VBIOS RIMs, SWID XML.
    pub rims: Vec<Vec<u8>>,
    /// OCSP responses (DER) for the GPUs' device certificates.
    pub ocsp: Vec<Vec<u8>>,
}

impl GpuReference {
    /// Checks `self` against [`crate::EvidenceBundle::from_json`]'s limits,
    /// and that every RIM parses: a shard refuses what every verifier would.
    pub fn check(&self) -> Result<(), Error> {
        let (rims, ocsp) = (&self.rims, &self.ocsp);
        if rims.len() > MAX_CARRIED_RIMS || rims.iter().any(|r| r.len() > MAX_CARRIED_RIM_BYTES) {
            let limit = if rims.len() > MAX_CARRIED_RIMS { MAX_CARRIED_RIMS } else { MAX_CARRIED_RIM_BYTES };
            return Err(Malformed::FieldTooLarge { field: "gpu_rims", limit }.into());
        }
        if ocsp.len() > MAX_CARRIED_OCSP || ocsp.iter().any(|r| r.len() > MAX_OCSP_BYTES) {
            let limit = if ocsp.len() > MAX_CARRIED_OCSP { MAX_CARRIED_OCSP } else { MAX_OCSP_BYTES };
            return Err(Malformed::FieldTooLarge { field: "gpu_ocsp", limit }.into());
        }
        for (index, raw) in rims.iter().enumerate() {
            Rim::parse(raw).map_err(|e| Malformed::CarriedRim { index, reason: e.to_string() })?;
        }
        Ok(())
    }

    /// What simulated GPUs carry: their own (unsigned) RIMs, each once, and
    /// OCSP responses from their simulated issuers, good from `now` (less a
    /// minute of clock skew) for [`SIMULATED_OCSP_VALIDITY`].
    pub fn simulated(gpus: &[SimulatedGpu], now: SystemTime) -> Result<Self, Error> {
        let mut rims: Vec<Vec<u8>> = Vec::new();
        for xml in gpus.iter().flat_map(|g| [g.rim_xml(true), g.rim_xml(false)]) {
            if !rims.iter().any(|r| r == xml.as_bytes()) {
                rims.push(xml.into_bytes());
            }
        }
        let mut ocsp = Vec::new();
        let from = now.checked_sub(Duration::from_secs(60)).unwrap_or(now);
        for g in gpus {
            ocsp.extend(g.ocsp_responses(None, from, Some(now + SIMULATED_OCSP_VALIDITY))?);
        }
        let reference = Self { rims, ocsp };
        reference.check()?;
        Ok(reference)
    }
}

/// A shared, replaceable [`GpuReference`]: the attester reads it for every
/// bundle; whoever holds a clone (the shard's refresher) may replace it.
#[derive(Clone, Debug, Default)]
pub struct CarriedReference(Arc<RwLock<GpuReference>>);

impl CarriedReference {
    /// A handle carrying `reference`, once it passes [`GpuReference::check`].
    pub fn new(reference: GpuReference) -> Result<Self, Error> {
        reference.check()?;
        Ok(Self(Arc::new(RwLock::new(reference))))
    }

    /// What the next bundle carries.
    pub fn current(&self) -> GpuReference {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Carries `reference` from the next bundle on, once it passes
    /// [`GpuReference::check`]; on failure what was carried stays. Returns
    /// whether anything changed.
    pub fn replace(&self, reference: GpuReference) -> Result<bool, Error> {
        reference.check()?;
        let mut held = self.0.write().unwrap_or_else(|p| p.into_inner());
        if *held == reference {
            return Ok(false);
        }
        *held = reference;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attester::gpu::simulated::SimulatedGpuConfig;

    fn gpu() -> SimulatedGpu {
        SimulatedGpu::from_seed(b"carried", SimulatedGpuConfig::default()).unwrap()
    }

    #[test]
    fn simulated_material_covers_the_whole_chain_and_is_current() {
        let g = gpu();
        let now = SystemTime::now();
        let r = GpuReference::simulated(std::slice::from_ref(&g), now).unwrap();
        assert_eq!(r.rims.len(), 2, "driver and VBIOS RIM");
        let chain = crate::gpu::chain::parse_chain_der(g.chain_der()).unwrap();
        crate::gpu::ocsp::check_chain(&chain, &r.ocsp, now).unwrap();
        // ... and no longer once SIMULATED_OCSP_VALIDITY has passed.
        let later = now + SIMULATED_OCSP_VALIDITY + Duration::from_secs(1);
        assert!(crate::gpu::ocsp::check_chain(&chain, &r.ocsp, later).is_err());
    }

    #[test]
    fn a_replacement_over_the_limits_is_refused_and_the_old_material_stays() {
        let first = GpuReference { rims: Vec::new(), ocsp: vec![vec![1; 10]] };
        let handle = CarriedReference::new(first.clone()).unwrap();
        let too_many = GpuReference { rims: Vec::new(), ocsp: vec![vec![2; 10]; MAX_CARRIED_OCSP + 1] };
        assert!(handle.replace(too_many).is_err());
        let bad_rim = GpuReference { rims: vec![b"<not a rim/>".to_vec()], ocsp: Vec::new() };
        assert!(handle.replace(bad_rim).is_err());
        assert_eq!(handle.current(), first);
        let second = GpuReference { rims: Vec::new(), ocsp: vec![vec![3; 10]] };
        assert!(handle.replace(second.clone()).unwrap());
        assert!(!handle.replace(second.clone()).unwrap(), "the same material again changes nothing");
        assert_eq!(handle.clone().current(), second, "clones share one reference");
    }
}
