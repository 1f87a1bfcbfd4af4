//! The evidence bundle: what a shard hands a verifier, as versioned JSON.
//!
//! ```json
//! {
//!   "version": 1,
//!   "kind": "sev-snp",
//!   "report": "<base64: 1184-byte ATTESTATION_REPORT>",
//!   "endorsement": "<base64: VCEK or VLEK certificate, DER>",
//!   "chain": ["<base64 DER: ASK or ASVK>", "<base64 DER: ARK>"],
//!   "crl": "<base64 DER: CRL signed by the ARK>",
//!   "claims": { "tls_key_hash": "…", "nonce": "…", … }
//! }
//! ```
//!
//! `chain`, `crl` and `claims` are optional. The ARK is never taken from the
//! bundle on trust: it is compared with the pinned AMD root of the product.

use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::claims::Claims;
use crate::error::Malformed;
use crate::snp::REPORT_LEN;
use crate::x509::{ParsedCrl, MAX_CERT_BYTES};

/// Current bundle format version.
pub const BUNDLE_VERSION: u32 = 1;
/// Largest bundle accepted, in bytes of JSON.
pub const MAX_BUNDLE_BYTES: usize = 384 * 1024;
/// Most certificates accepted in `chain`.
pub const MAX_CHAIN_CERTS: usize = 4;

/// Kind of evidence in a bundle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EvidenceKind {
    /// AMD SEV-SNP report with its endorsement.
    #[serde(rename = "sev-snp")]
    SevSnp,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    version: u32,
    kind: EvidenceKind,
    report: String,
    endorsement: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    chain: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    crl: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    claims: Option<Claims>,
    /// The shard's GPUs (composite attester), as Veil GPU evidence JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gpus: Option<serde_json::Value>,
}

/// Decoded evidence bundle (not yet verified).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvidenceBundle {
    /// Raw report bytes (length is judged by the verifier).
    pub report: Vec<u8>,
    /// VCEK or VLEK certificate, DER.
    pub endorsement: Vec<u8>,
    /// Intermediate (ASK/ASVK) and optionally ARK, DER.
    pub chain: Vec<Vec<u8>>,
    /// CRL signed by the ARK, DER.
    pub crl: Option<Vec<u8>>,
    /// The claims REPORT_DATA commits to.
    pub claims: Option<Claims>,
    /// Evidence of the CVM's GPUs, in GPU index order (composite attester:
    /// the claims commit to its digest, each GPU signed a nonce derived
    /// from the claims). Empty for a CPU-only shard.
    pub gpus: Vec<crate::gpu::GpuEvidence>,
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

fn decode_field(name: &'static str, value: &str, limit: usize) -> Result<Vec<u8>, Malformed> {
    // Base64 expands by 4/3; refuse oversize before decoding.
    if value.len() > limit.div_ceil(3) * 4 + 4 {
        return Err(Malformed::FieldTooLarge { field: name, limit });
    }
    let bytes = b64().decode(value).map_err(|e| Malformed::Base64 { field: name, reason: e.to_string() })?;
    if bytes.len() > limit {
        return Err(Malformed::FieldTooLarge { field: name, limit });
    }
    Ok(bytes)
}

impl EvidenceBundle {
    /// Parses bundle JSON, enforcing size limits before and after decoding.
    pub fn from_json(bytes: &[u8]) -> Result<Self, Malformed> {
        if bytes.len() > MAX_BUNDLE_BYTES {
            return Err(Malformed::TooLarge { actual: bytes.len(), limit: MAX_BUNDLE_BYTES });
        }
        let wire: Wire = serde_json::from_slice(bytes).map_err(|e| Malformed::Json(e.to_string()))?;
        Self::from_wire(wire)
    }

    fn from_wire(wire: Wire) -> Result<Self, Malformed> {
        if wire.version != BUNDLE_VERSION {
            return Err(Malformed::UnsupportedVersion { actual: wire.version, supported: BUNDLE_VERSION });
        }
        if wire.chain.len() > MAX_CHAIN_CERTS {
            return Err(Malformed::FieldTooLarge { field: "chain", limit: MAX_CHAIN_CERTS });
        }
        // A report is judged by length in the verifier; allow one page of slack
        // here so a wrong length is reported by the named check.
        let report = decode_field("report", &wire.report, REPORT_LEN * 4)?;
        let endorsement = decode_field("endorsement", &wire.endorsement, MAX_CERT_BYTES)?;
        let chain = wire.chain.iter().map(|c| decode_field("chain", c, MAX_CERT_BYTES)).collect::<Result<_, _>>()?;
        let crl = wire.crl.as_deref().map(|c| decode_field("crl", c, ParsedCrl::MAX_BYTES)).transpose()?;
        let gpus = match wire.gpus {
            None => Vec::new(),
            Some(v) => crate::gpu::evidence::from_value(v).map_err(|e| Malformed::Json(format!("gpus: {e}")))?,
        };
        Ok(Self { report, endorsement, chain, crl, claims: wire.claims, gpus })
    }

    /// Serialises to bundle JSON.
    pub fn to_json(&self) -> String {
        // Invariant: the wire struct holds only strings, numbers and maps.
        serde_json::to_string_pretty(&self.wire()).unwrap_or_default()
    }

    /// Bundle JSON without whitespace (inside certificates).
    pub fn to_compact_json(&self) -> String {
        // Invariant: as for `to_json`.
        serde_json::to_string(&self.wire()).unwrap_or_default()
    }

    fn wire(&self) -> Wire {
        Wire {
            version: BUNDLE_VERSION,
            kind: EvidenceKind::SevSnp,
            report: b64().encode(&self.report),
            endorsement: b64().encode(&self.endorsement),
            chain: self.chain.iter().map(|c| b64().encode(c)).collect(),
            crl: self.crl.as_ref().map(|c| b64().encode(c)),
            claims: self.claims.clone(),
            gpus: (!self.gpus.is_empty()).then(|| crate::gpu::evidence::to_value(&self.gpus)),
        }
    }

    /// SHA-256 of the canonical JSON (what other evidence refers to, and
    /// what an entry's route-links commitment covers).
    pub fn digest(&self) -> [u8; 32] {
        use sha2::Digest;
        sha2::Sha256::digest(self.to_json().as_bytes()).into()
    }
}

/// A bundle inside another JSON document (the route's attestation
/// document): the same wire form and limits as [`EvidenceBundle::from_json`].
impl Serialize for EvidenceBundle {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.wire().serialize(s)
    }
}

impl<'de> Deserialize<'de> for EvidenceBundle {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::from_wire(Wire::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> EvidenceBundle {
        EvidenceBundle {
            report: vec![0; REPORT_LEN],
            endorsement: vec![1, 2, 3],
            chain: vec![vec![4]],
            crl: None,
            claims: Some(Claims::default()),
            gpus: Vec::new(),
        }
    }

    #[test]
    fn round_trips() {
        let b = sample();
        assert_eq!(EvidenceBundle::from_json(b.to_json().as_bytes()).unwrap(), b);
    }

    #[test]
    fn refuses_bad_json_versions_and_sizes() {
        assert!(matches!(EvidenceBundle::from_json(b"{"), Err(Malformed::Json(_))));
        let j = sample().to_json().replace("\"version\": 1", "\"version\": 9");
        assert!(matches!(
            EvidenceBundle::from_json(j.as_bytes()),
            Err(Malformed::UnsupportedVersion { actual: 9, .. })
        ));
        let big = vec![b' '; MAX_BUNDLE_BYTES + 1];
        assert!(matches!(EvidenceBundle::from_json(&big), Err(Malformed::TooLarge { .. })));
        let j = sample().to_json().replace("\"report\": \"", "\"report\": \"!!");
        assert!(matches!(EvidenceBundle::from_json(j.as_bytes()), Err(Malformed::Base64 { field: "report", .. })));
    }
}
