//! GPU evidence as collected and as transported, and the formats NVIDIA's
//! tools write.
//!
//! * Veil's own JSON (what a shard ships next to its SNP bundle):
//!   `{"version":1,"gpus":[{"arch":"HOPPER","report":"<b64>","cert_chain":["<b64 DER>",…],"settings":{…}}]}`
//! * NVIDIA attestation SDK JSON: `[{"arch":"HOPPER","certificate":"<b64 of the PEM chain>","evidence":"<b64>","nonce":"…"}]`
//! * nvtrust / trustee files: the report as hex text plus a PEM chain.

use base64::Engine;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::chain::MAX_CHAIN_CERTS;
use super::spdm::MAX_EVIDENCE_BYTES;
use crate::claims::GpuEvidenceHash;
use crate::x509::{ParsedCert, MAX_CERT_BYTES};

/// Format version of Veil's GPU evidence JSON.
pub const GPU_EVIDENCE_VERSION: u32 = 1;
/// Most GPUs accepted in one set.
pub const MAX_GPUS: usize = 16;
/// Domain separator of the GPU evidence digest.
pub const GPU_EVIDENCE_DOMAIN: &[u8] = b"veil/gpu-evidence/v1\0";

/// Confidential-computing settings as the collector (measured CVM code,
/// through NVML) read them. Not signed by the GPU: they are trusted only
/// through the CPU report that commits to the evidence digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CcSettings {
    /// CC mode on (`nvmlSystemGetConfComputeState`).
    pub cc_mode: bool,
    /// CC DevTools mode (`nvmlSystemGetConfComputeSettings().devToolsMode`).
    pub devtools_mode: bool,
}

/// One GPU's evidence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuEvidence {
    /// Architecture named by the collector (`HOPPER`).
    pub arch: String,
    /// SPDM `GET_MEASUREMENTS` request ‖ response (possibly with trailing bytes).
    pub report: Vec<u8>,
    /// Device certificate chain, DER, leaf first.
    pub cert_chain: Vec<Vec<u8>>,
    /// Collector-reported CC settings, when known.
    pub settings: Option<CcSettings>,
}

/// Why GPU evidence input is unreadable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GpuInputError {
    /// JSON of the wrong shape.
    #[error("GPU evidence JSON: {0}")]
    Json(String),
    /// Base64 or hex that does not decode.
    #[error("GPU evidence field `{field}`: {reason}")]
    Encoding {
        /// Field.
        field: &'static str,
        /// Decoder message.
        reason: String,
    },
    /// Too large.
    #[error("GPU evidence field `{field}` exceeds its limit of {limit}")]
    TooLarge {
        /// Field.
        field: &'static str,
        /// Limit.
        limit: usize,
    },
    /// Certificates that do not parse.
    #[error("GPU certificate chain: {0}")]
    Chain(String),
    /// A format version we do not speak.
    #[error("GPU evidence version {0} is not supported (this verifier speaks {GPU_EVIDENCE_VERSION})")]
    UnsupportedVersion(u32),
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

fn decode_b64(field: &'static str, value: &str, limit: usize) -> Result<Vec<u8>, GpuInputError> {
    if value.len() > limit.div_ceil(3) * 4 + 4 {
        return Err(GpuInputError::TooLarge { field, limit });
    }
    b64().decode(value.trim()).map_err(|e| GpuInputError::Encoding { field, reason: e.to_string() })
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireGpu {
    arch: String,
    report: String,
    cert_chain: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    settings: Option<CcSettings>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireSet {
    version: u32,
    gpus: Vec<WireGpu>,
}

#[derive(Deserialize)]
struct SdkEntry {
    arch: String,
    certificate: String,
    evidence: String,
}

impl GpuEvidence {
    /// nvtrust/trustee style: report as hex text, chain as PEM (leaf first).
    pub fn from_hex_and_pem(report_hex: &[u8], chain_pem: &[u8]) -> Result<Self, GpuInputError> {
        let text: String = String::from_utf8_lossy(report_hex).chars().filter(|c| !c.is_whitespace()).collect();
        if text.len() > MAX_EVIDENCE_BYTES * 2 {
            return Err(GpuInputError::TooLarge { field: "report", limit: MAX_EVIDENCE_BYTES });
        }
        let report =
            hex::decode(&text).map_err(|e| GpuInputError::Encoding { field: "report", reason: e.to_string() })?;
        Ok(Self { arch: "HOPPER".into(), report, cert_chain: pem_chain(chain_pem)?, settings: None })
    }

    /// SHA-256 of this GPU's encoding (see [`gpu_evidence_digest`] for a set).
    fn encode_into(&self, out: &mut Vec<u8>) {
        let put = |out: &mut Vec<u8>, bytes: &[u8]| {
            // Lengths are bounded by the input limits (≤ 64 KiB).
            out.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes());
            out.extend_from_slice(bytes);
        };
        put(out, self.arch.as_bytes());
        put(out, &self.report);
        out.extend_from_slice(&u32::try_from(self.cert_chain.len()).unwrap_or(u32::MAX).to_be_bytes());
        for c in &self.cert_chain {
            put(out, c);
        }
        match self.settings {
            None => out.push(0),
            Some(s) => out.extend_from_slice(&[1, u8::from(s.cc_mode), u8::from(s.devtools_mode)]),
        }
    }
}

fn pem_chain(pem: &[u8]) -> Result<Vec<Vec<u8>>, GpuInputError> {
    if pem.len() > MAX_CERT_BYTES * MAX_CHAIN_CERTS * 2 {
        return Err(GpuInputError::TooLarge { field: "certificate", limit: MAX_CERT_BYTES * MAX_CHAIN_CERTS * 2 });
    }
    let certs = ParsedCert::chain_from_pem(pem).map_err(|e| GpuInputError::Chain(e.to_string()))?;
    if certs.len() > MAX_CHAIN_CERTS {
        return Err(GpuInputError::TooLarge { field: "certificate", limit: MAX_CHAIN_CERTS });
    }
    Ok(certs.iter().map(|c| c.der().to_vec()).collect())
}

/// The digest a shard's claims carry (`gpu_evidence_hash`): SHA-256 over
/// `"veil/gpu-evidence/v1\0" ‖ u32 count ‖ each GPU (arch, report, chain,
/// settings; every variable field length-prefixed)`, in GPU index order.
pub fn gpu_evidence_digest(gpus: &[GpuEvidence]) -> GpuEvidenceHash {
    let mut out = GPU_EVIDENCE_DOMAIN.to_vec();
    out.extend_from_slice(&u32::try_from(gpus.len()).unwrap_or(u32::MAX).to_be_bytes());
    for g in gpus {
        g.encode_into(&mut out);
    }
    GpuEvidenceHash(Sha256::digest(&out).into())
}

/// Parses Veil's GPU evidence JSON.
pub fn from_json(bytes: &[u8]) -> Result<Vec<GpuEvidence>, GpuInputError> {
    if bytes.len() > MAX_GPUS * (MAX_EVIDENCE_BYTES + MAX_CERT_BYTES * MAX_CHAIN_CERTS) * 2 {
        return Err(GpuInputError::TooLarge { field: "json", limit: MAX_GPUS });
    }
    let wire: WireSet = serde_json::from_slice(bytes).map_err(|e| GpuInputError::Json(e.to_string()))?;
    from_wire(wire)
}

/// Parses Veil's GPU evidence JSON already read as a value (the `gpus`
/// field of an evidence bundle, whose size the bundle parser bounded).
pub(crate) fn from_value(value: serde_json::Value) -> Result<Vec<GpuEvidence>, GpuInputError> {
    from_wire(serde_json::from_value(value).map_err(|e| GpuInputError::Json(e.to_string()))?)
}

fn from_wire(wire: WireSet) -> Result<Vec<GpuEvidence>, GpuInputError> {
    if wire.version != GPU_EVIDENCE_VERSION {
        return Err(GpuInputError::UnsupportedVersion(wire.version));
    }
    if wire.gpus.len() > MAX_GPUS {
        return Err(GpuInputError::TooLarge { field: "gpus", limit: MAX_GPUS });
    }
    wire.gpus
        .into_iter()
        .map(|g| {
            if g.cert_chain.len() > MAX_CHAIN_CERTS {
                return Err(GpuInputError::TooLarge { field: "cert_chain", limit: MAX_CHAIN_CERTS });
            }
            Ok(GpuEvidence {
                arch: g.arch,
                report: decode_b64("report", &g.report, MAX_EVIDENCE_BYTES)?,
                cert_chain: g
                    .cert_chain
                    .iter()
                    .map(|c| decode_b64("cert_chain", c, MAX_CERT_BYTES))
                    .collect::<Result<_, _>>()?,
                settings: g.settings,
            })
        })
        .collect()
}

/// Serialises a set to Veil's GPU evidence JSON.
pub fn to_json(gpus: &[GpuEvidence]) -> String {
    // Invariant: only strings, numbers and booleans.
    serde_json::to_string_pretty(&to_wire(gpus)).unwrap_or_default()
}

/// The set as a JSON value (embedded in an evidence bundle).
pub(crate) fn to_value(gpus: &[GpuEvidence]) -> serde_json::Value {
    // Invariant: only strings, numbers and booleans.
    serde_json::to_value(to_wire(gpus)).unwrap_or_default()
}

fn to_wire(gpus: &[GpuEvidence]) -> WireSet {
    WireSet {
        version: GPU_EVIDENCE_VERSION,
        gpus: gpus
            .iter()
            .map(|g| WireGpu {
                arch: g.arch.clone(),
                report: b64().encode(&g.report),
                cert_chain: g.cert_chain.iter().map(|c| b64().encode(c)).collect(),
                settings: g.settings,
            })
            .collect(),
    }
}

/// Parses the NVIDIA attestation SDK's evidence JSON list.
pub fn from_sdk_json(bytes: &[u8]) -> Result<Vec<GpuEvidence>, GpuInputError> {
    let entries: Vec<SdkEntry> = serde_json::from_slice(bytes).map_err(|e| GpuInputError::Json(e.to_string()))?;
    if entries.len() > MAX_GPUS {
        return Err(GpuInputError::TooLarge { field: "gpus", limit: MAX_GPUS });
    }
    entries
        .into_iter()
        .map(|e| {
            let pem = decode_b64("certificate", &e.certificate, MAX_CERT_BYTES * MAX_CHAIN_CERTS * 2)?;
            Ok(GpuEvidence {
                arch: e.arch,
                report: decode_b64("evidence", &e.evidence, MAX_EVIDENCE_BYTES)?,
                cert_chain: pem_chain(&pem)?,
                settings: None,
            })
        })
        .collect()
}

/// Reads any supported format: Veil JSON, SDK JSON, or hex text (which then
/// needs `chain_pem`).
pub fn load_any(bytes: &[u8], chain_pem: Option<&[u8]>) -> Result<Vec<GpuEvidence>, GpuInputError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace()).copied();
    match first {
        Some(b'{') => from_json(bytes),
        Some(b'[') => from_sdk_json(bytes),
        _ => {
            let pem = chain_pem.ok_or_else(|| {
                GpuInputError::Chain("a hex report needs its PEM certificate chain (--gpu-certs)".into())
            })?;
            Ok(vec![GpuEvidence::from_hex_and_pem(bytes, pem)?])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> GpuEvidence {
        GpuEvidence {
            arch: "HOPPER".into(),
            report: vec![1, 2, 3],
            cert_chain: vec![vec![4], vec![5]],
            settings: Some(CcSettings { cc_mode: true, devtools_mode: false }),
        }
    }

    #[test]
    fn json_round_trips_and_digest_covers_every_field() {
        let g = sample();
        let set = vec![g.clone()];
        assert_eq!(from_json(to_json(&set).as_bytes()).unwrap(), set);
        let base = gpu_evidence_digest(&set);
        let mut variants = vec![];
        let mut v = g.clone();
        v.report.push(0);
        variants.push(v);
        let mut v = g.clone();
        v.cert_chain.swap(0, 1);
        variants.push(v);
        let mut v = g.clone();
        v.settings = Some(CcSettings { cc_mode: true, devtools_mode: true });
        variants.push(v);
        let mut v = g.clone();
        v.settings = None;
        variants.push(v);
        for v in variants {
            assert_ne!(gpu_evidence_digest(&[v]), base);
        }
        assert_ne!(gpu_evidence_digest(&[g.clone(), g]), base);
    }

    #[test]
    fn refuses_bad_inputs() {
        assert!(matches!(from_json(b"{\"version\":2,\"gpus\":[]}"), Err(GpuInputError::UnsupportedVersion(2))));
        assert!(matches!(from_json(b"{"), Err(GpuInputError::Json(_))));
        assert!(matches!(load_any(b"11e0", None), Err(GpuInputError::Chain(_))));
        assert!(matches!(
            from_sdk_json(br#"[{"arch":"HOPPER","certificate":"!!","evidence":""}]"#),
            Err(GpuInputError::Encoding { field: "certificate", .. })
        ));
    }
}
