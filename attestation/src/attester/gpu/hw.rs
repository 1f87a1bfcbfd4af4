//! Real GPU evidence collection through NVML's confidential-computing calls
//! (`nvmlDeviceGetConfComputeGpuAttestationReport`,
//! `nvmlDeviceGetConfComputeGpuCertificate`, `nvmlSystemGetConfComputeSettings`).
//!
//! Compiles everywhere with the `hw` feature (NVML is loaded at run time);
//! works only inside a CVM with NVIDIA GPUs in CC mode and their driver.
//! Not exercised by the test suite: there is no GPU here.

use nvml_wrapper::Nvml;

use super::simulated;
use crate::claims::Claims;
use crate::error::Error;
use crate::gpu::evidence::{CcSettings, GpuEvidence, MAX_GPUS};
use crate::x509::ParsedCert;

fn nvml_error(e: impl std::fmt::Display) -> Error {
    Error::Io(std::io::Error::other(format!("NVML: {e}")))
}

/// Collects evidence from every GPU NVML sees, in NVML index order.
#[derive(Debug, Default, Clone, Copy)]
pub struct NvmlGpuAttester;

/// SECURITY-CASES F8, the GPU "ready state" gate: before a shard puts any
/// weight on GPU `index`, that GPU must be one its evidence names (NVML index
/// `index` of the GPUs [`NvmlGpuAttester::collect`] attests), have
/// confidential-computing mode on and devtools mode off, and the system's CC
/// GPUs must be in the ready state (accepting client work). Returns the GPU's
/// UUID for the log. Any other answer, or NVML failing, refuses.
pub fn ready_gate(index: u32) -> Result<String, Error> {
    let nvml = Nvml::init().map_err(nvml_error)?;
    let count = nvml.device_count().map_err(nvml_error)?;
    if index >= count || usize::try_from(count).map_or(true, |c| c > MAX_GPUS) {
        return Err(nvml_error(format!("GPU {index} is not among the {count} GPUs this CVM's evidence names")));
    }
    let device = nvml.device_by_index(index).map_err(nvml_error)?;
    if !device.is_cc_enabled().map_err(nvml_error)? {
        return Err(nvml_error(format!("confidential-computing mode is off on GPU {index}")));
    }
    if device.is_cc_dev_mode_enabled().map_err(nvml_error)? {
        return Err(nvml_error(format!("GPU {index} is in CC devtools mode (its memory is readable by tools)")));
    }
    if !device.get_confidential_compute_state().map_err(nvml_error)? {
        return Err(nvml_error("the GPUs are not in the confidential-computing ready state"));
    }
    device.uuid().map_err(nvml_error)
}

/// Splits NVML's attestation certificate chain (PEM text or concatenated DER) into DER certificates.
fn split_chain(bytes: &[u8]) -> Result<Vec<Vec<u8>>, Error> {
    if bytes.windows(10).any(|w| w == b"-----BEGIN") {
        let certs = ParsedCert::chain_from_pem(bytes).map_err(|e| nvml_error(format!("certificate chain: {e}")))?;
        return Ok(certs.iter().map(|c| c.der().to_vec()).collect());
    }
    let mut out = Vec::new();
    let mut rest = bytes;
    // The NVML buffer may be zero-padded after the last certificate.
    while !rest.iter().all(|b| *b == 0) {
        // DER SEQUENCE with a long-form length of up to two bytes.
        let len = match rest {
            [0x30, 0x82, a, b, ..] => 4 + (usize::from(*a) << 8 | usize::from(*b)),
            [0x30, 0x81, a, ..] => 3 + usize::from(*a),
            _ => return Err(nvml_error("certificate chain is neither PEM nor concatenated DER")),
        };
        let cert = rest.get(..len).ok_or_else(|| nvml_error("certificate chain truncated"))?;
        out.push(cert.to_vec());
        rest = &rest[len..];
    }
    Ok(out)
}

impl NvmlGpuAttester {
    /// Evidence for every GPU: GPU `i` signs `claims.gpu_nonce(i)`. The caller
    /// then sets `claims.gpu_evidence_hash` to the digest of the result before
    /// requesting the CPU report.
    pub fn collect(&self, claims: &Claims) -> Result<Vec<GpuEvidence>, Error> {
        let nvml = Nvml::init().map_err(nvml_error)?;
        let count = nvml.device_count().map_err(nvml_error)?;
        if usize::try_from(count).map_or(true, |c| c > MAX_GPUS) {
            return Err(nvml_error(format!("{count} GPUs exceeds the limit of {MAX_GPUS}")));
        }
        let root = crate::gpu::chain::nvidia_device_root().map_err(|e| Error::ApiMisuse(e.to_string()))?;
        let mut out = Vec::new();
        for index in 0..count {
            let device = nvml.device_by_index(index).map_err(nvml_error)?;
            let settings = CcSettings {
                cc_mode: device.is_cc_enabled().map_err(nvml_error)?,
                devtools_mode: device.is_cc_dev_mode_enabled().map_err(nvml_error)?,
            };
            let nonce = claims.gpu_nonce(index).map_err(|e| Error::ApiMisuse(e.to_string()))?;
            let report = device.confidential_compute_gpu_attestation_report(nonce).map_err(nvml_error)?;
            let certs = device.confidential_compute_gpu_certificate().map_err(nvml_error)?;
            let mut chain = split_chain(&certs.attestation_cert_chain)?;
            // Some drivers omit the root; append the pinned one so the chain has its five certificates.
            if let Some(top) = chain.last().and_then(|d| ParsedCert::from_der(d).ok()) {
                if top.der() != root.der() && top.issued_by_name(&root) && !simulated::is_simulated_gpu_cert(&top) {
                    chain.push(root.der().to_vec());
                }
            }
            out.push(GpuEvidence {
                arch: "HOPPER".into(),
                report: report.attestation_report,
                cert_chain: chain,
                settings: Some(settings),
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_concatenated_der_and_refuses_garbage() {
        let root = crate::gpu::chain::nvidia_device_root().unwrap();
        let mut two = root.der().to_vec();
        two.extend_from_slice(root.der());
        two.extend_from_slice(&[0, 0, 0]);
        assert_eq!(split_chain(&two).unwrap().len(), 2);
        assert!(split_chain(&[0x31, 0x00]).is_err());
        assert!(split_chain(&root.der()[..100]).is_err());
    }
}
