//! What produces evidence: the simulated attester, the SEV-SNP guest
//! (`hw`), and composites with GPUs ([`gpu`]) implement it.

pub mod gpu;

use crate::claims::Claims;
use crate::error::Error;
use crate::evidence::EvidenceBundle;

/// Produces evidence for claims: the simulated attester, or real hardware.
pub trait Attester: Send + Sync {
    /// Evidence whose REPORT_DATA commits to `claims`.
    fn evidence(&self, claims: &Claims) -> Result<EvidenceBundle, Error>;
}
