//! The real SEV-SNP attester: asks the AMD Secure Processor for a report
//! through the guest device (`/dev/sev-guest`, via the `sev` crate).
//!
//! Compiles everywhere with the `hw` feature; works only inside an SEV-SNP
//! guest. The endorsement (VCEK or VLEK) comes from the certificate table
//! the host attaches to the extended report. When the host supplies none, the
//! VCEK must be fetched from AMD's Key Distribution Service for this chip id
//! and TCB: that is a separate, explicit step, not done here.

use sev::firmware::guest::Firmware;
use sev::firmware::host::CertType;

use crate::claims::Claims;
use crate::error::Error;
use crate::evidence::EvidenceBundle;
use crate::simulated::Attester;

/// Produces evidence from the SEV-SNP guest device.
#[derive(Debug, Clone, Copy)]
pub struct HardwareAttester {
    vmpl: u32,
}

impl HardwareAttester {
    /// An attester requesting reports at `vmpl` (0 for a guest without a paravisor).
    pub fn new(vmpl: u32) -> Self {
        Self { vmpl }
    }
}

fn device_error(e: impl std::fmt::Display) -> Error {
    Error::Io(std::io::Error::other(format!("SEV-SNP guest device: {e}")))
}

impl Attester for HardwareAttester {
    fn evidence(&self, claims: &Claims) -> Result<EvidenceBundle, Error> {
        let report_data = claims.report_data().map_err(Error::ApiMisuse)?;
        let mut firmware = Firmware::open()?;
        let (report, certs) =
            firmware.get_ext_report(None, Some(report_data.0), Some(self.vmpl)).map_err(device_error)?;
        let certs = certs.unwrap_or_default();
        let find = |kind: CertType| certs.iter().find(|c| c.cert_type == kind).map(|c| c.data.clone());
        let endorsement = find(CertType::VCEK).or_else(|| find(CertType::VLEK)).ok_or_else(|| {
            Error::ApiMisuse(
                "the host attached no VCEK/VLEK to the extended report; fetch the VCEK for this chip id and TCB from AMD KDS".into(),
            )
        })?;
        let chain = [CertType::ASK, CertType::ARK].into_iter().filter_map(find).collect();
        Ok(EvidenceBundle {
            report,
            endorsement,
            chain,
            crl: find(CertType::CRL),
            claims: Some(claims.clone()),
            gpus: Vec::new(),
        })
    }
}
