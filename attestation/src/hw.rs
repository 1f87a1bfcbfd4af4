//! The real SEV-SNP attester: asks the AMD Secure Processor for a report
//! through the kernel's configfs-tsm interface
//! (`/sys/kernel/config/tsm/report`, Linux 6.7 and later): `inblob` takes the
//! 64 bytes of REPORT_DATA, `outblob` returns the report and `auxblob` the
//! certificate table the host attached.
//!
//! The table is the host's bytes and is parsed by [`crate::snp::certs`] with
//! every bound checked (SECURITY-CASES A9); the `sev` crate's extended-report
//! call is not used, because its table parser follows host-written offsets
//! with raw pointers. When the host attaches no VCEK or VLEK, the
//! endorsement must be fetched from AMD's Key Distribution Service for this
//! chip id and TCB: that is a separate, explicit step, not done here.
//!
//! [`TdxHardwareAttester`] asks an Intel TDX guest's quoting path for a
//! quote through the same interface (provider `tdx_guest`; the kernel
//! forwards the TD report to the host's quoting service and returns the
//! quote). The collateral comes from the host's PCCS or an operator's cache,
//! a separate step.
//!
//! Compiles everywhere with the `hw` feature; works only inside an SEV-SNP
//! guest (or a TDX guest, for the TDX attester); neither has run on
//! hardware in this project's CI.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::attester::Attester;
use crate::claims::Claims;
use crate::error::Error;
use crate::evidence::EvidenceBundle;
use crate::snp::certs::{self, CertKind};

/// Where configfs-tsm report objects are created.
pub const TSM_REPORT_DIR: &str = "/sys/kernel/config/tsm/report";

/// Produces evidence from the SEV-SNP guest through configfs-tsm.
#[derive(Debug, Clone)]
pub struct HardwareAttester {
    vmpl: u32,
    root: PathBuf,
}

impl HardwareAttester {
    /// An attester requesting reports at `vmpl` (0 for a guest without a paravisor).
    pub fn new(vmpl: u32) -> Self {
        Self { vmpl, root: PathBuf::from(TSM_REPORT_DIR) }
    }
}

fn device_error(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::Io(std::io::Error::new(e.kind(), format!("configfs-tsm {what} {}: {e}", path.display())))
}

/// One report request: a fresh report object, REPORT_DATA in, report and
/// certificate table out, the object removed. The generation counter is read
/// before and after, so a concurrent writer to the same object is detected.
/// `provider` is the kernel's name for the TEE (`sev_guest`, `tdx_guest`);
/// `privlevel` is written when given (SNP's VMPL).
fn tsm_report(
    root: &Path,
    provider_name: &str,
    privlevel: Option<u32>,
    report_data: &[u8; 64],
) -> Result<(Vec<u8>, Vec<u8>), Error> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = root.join(format!("veil-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
    std::fs::create_dir(&dir).map_err(|e| device_error("create", &dir, e))?;
    let result = (|| {
        let read = |name: &str| std::fs::read(dir.join(name)).map_err(|e| device_error("read", &dir.join(name), e));
        let provider = String::from_utf8_lossy(&read("provider")?).trim().to_owned();
        if provider != provider_name {
            return Err(Error::ApiMisuse(format!("configfs-tsm provider is {provider:?}, not {provider_name}")));
        }
        if let Some(level) = privlevel {
            std::fs::write(dir.join("privlevel"), level.to_string())
                .map_err(|e| device_error("write", &dir.join("privlevel"), e))?;
        }
        std::fs::write(dir.join("inblob"), report_data).map_err(|e| device_error("write", &dir.join("inblob"), e))?;
        let before = read("generation")?;
        let report = read("outblob")?;
        let table = read("auxblob").unwrap_or_default();
        if read("generation")? != before {
            return Err(Error::ApiMisuse("configfs-tsm report object changed while read (concurrent writer)".into()));
        }
        Ok((report, table))
    })();
    let _ = std::fs::remove_dir(&dir);
    result
}

impl Attester for HardwareAttester {
    fn evidence(&self, claims: &Claims) -> Result<EvidenceBundle, Error> {
        let report_data = claims.report_data().map_err(|e| Error::ApiMisuse(e.to_string()))?;
        if !self.root.is_dir() {
            return Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!(
                    "not an SEV-SNP guest: {} does not exist (configfs-tsm reports need an SNP guest running \
                     Linux 6.7 or later with the sev-guest module loaded and configfs mounted)",
                    self.root.display()
                ),
            )));
        }
        let (report, table) = tsm_report(&self.root, "sev_guest", Some(self.vmpl), &report_data.0)?;
        let table =
            certs::parse(&table).map_err(|e| Error::PeerMisbehaved(format!("host's certificate table: {e}")))?;
        let endorsement = table.get(CertKind::Vcek).or_else(|| table.get(CertKind::Vlek)).ok_or_else(|| {
            Error::ApiMisuse(
                "the host attached no VCEK/VLEK to the extended report; fetch the VCEK for this chip id and TCB from AMD KDS"
                    .into(),
            )
        })?;
        let chain =
            [CertKind::Ask, CertKind::Ark].into_iter().filter_map(|k| table.get(k)).map(<[u8]>::to_vec).collect();
        Ok(EvidenceBundle {
            report,
            endorsement: endorsement.to_vec(),
            chain,
            crl: table.get(CertKind::Crl).map(<[u8]>::to_vec),
            claims: Some(claims.clone()),
            gpus: Vec::new(),
            gpu_rims: Vec::new(),
            gpu_ocsp: Vec::new(),
        })
    }
}

/// Produces TDX quotes from an Intel TDX guest through configfs-tsm.
#[derive(Debug, Clone)]
pub struct TdxHardwareAttester {
    root: PathBuf,
}

impl Default for TdxHardwareAttester {
    fn default() -> Self {
        Self { root: PathBuf::from(TSM_REPORT_DIR) }
    }
}

impl TdxHardwareAttester {
    /// A quote whose REPORTDATA is the claims' digest (as for SNP), checked
    /// to parse as a TDX quote before it is returned.
    pub fn quote(&self, claims: &Claims) -> Result<Vec<u8>, Error> {
        let report_data = claims.report_data().map_err(|e| Error::ApiMisuse(e.to_string()))?;
        if !self.root.is_dir() {
            return Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!(
                    "not a TDX guest: {} does not exist (configfs-tsm quotes need a TDX guest running Linux 6.7 \
                     or later with the tdx-guest module loaded, configfs mounted and a quoting service on the host)",
                    self.root.display()
                ),
            )));
        }
        let (quote, _) = tsm_report(&self.root, "tdx_guest", None, &report_data.0)?;
        let parsed = crate::tdx::Quote::parse(&quote)
            .map_err(|e| Error::PeerMisbehaved(format!("the quote the host's quoting service returned: {e}")))?;
        if parsed.report.report_data != report_data.0 {
            return Err(Error::PeerMisbehaved("the returned quote carries another REPORTDATA".into()));
        }
        Ok(quote)
    }
}
