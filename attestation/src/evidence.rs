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
//!   "claims": { "tls_key_hash": "…", "nonce": "…", … },
//!   "gpus": [ … ],
//!   "gpu_rims": ["<base64: an NVIDIA RIM, SWID XML as signed>"],
//!   "gpu_ocsp": ["<base64 DER: an OCSP response for a GPU certificate>"]
//! }
//! ```
//!
//! `chain`, `crl`, `claims` and the GPU fields are optional. The ARK is never
//! taken from the bundle on trust: it is compared with the pinned AMD root of
//! the product. `gpu_rims` and `gpu_ocsp` are reference material the shard
//! carries for its GPUs' verifier (the host fetched them from NVIDIA); the
//! report does not commit to them and need not: a RIM counts only if its
//! XML signature chains to NVIDIA's RIM root (when the policy requires
//! signatures) and an OCSP response only if its issuer signed it, so any
//! carrier may bring them, and one that edits or drops them can make a
//! verification fail but never pass.

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
/// Most RIMs accepted in `gpu_rims` (a driver and a VBIOS RIM per GPU model).
pub const MAX_CARRIED_RIMS: usize = 8;
/// Largest RIM accepted in `gpu_rims` (NVIDIA's are 20–100 KiB).
pub const MAX_CARRIED_RIM_BYTES: usize = 160 * 1024;
/// Most OCSP responses accepted in `gpu_ocsp`: four per GPU chain (one per
/// certificate below the root), for the most GPUs a bundle holds.
pub const MAX_CARRIED_OCSP: usize = crate::gpu::ocsp::MAX_RESPONSES;
/// Largest OCSP response accepted in `gpu_ocsp`.
pub const MAX_OCSP_BYTES: usize = 8 * 1024;

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
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    gpu_rims: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    gpu_ocsp: Vec<String>,
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
    /// NVIDIA RIMs (driver and VBIOS reference measurements, SWID XML as
    /// NVIDIA signed it) for the GPUs, carried for the verifier; not
    /// committed to by the report (see the module documentation).
    pub gpu_rims: Vec<Vec<u8>>,
    /// OCSP responses (DER) for the GPUs' device certificates, carried as
    /// `gpu_rims` are.
    pub gpu_ocsp: Vec<Vec<u8>>,
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
        if wire.gpu_rims.len() > MAX_CARRIED_RIMS {
            return Err(Malformed::FieldTooLarge { field: "gpu_rims", limit: MAX_CARRIED_RIMS });
        }
        if wire.gpu_ocsp.len() > MAX_CARRIED_OCSP {
            return Err(Malformed::FieldTooLarge { field: "gpu_ocsp", limit: MAX_CARRIED_OCSP });
        }
        let gpu_rims = wire
            .gpu_rims
            .iter()
            .map(|r| decode_field("gpu_rims", r, MAX_CARRIED_RIM_BYTES))
            .collect::<Result<_, _>>()?;
        let gpu_ocsp =
            wire.gpu_ocsp.iter().map(|r| decode_field("gpu_ocsp", r, MAX_OCSP_BYTES)).collect::<Result<_, _>>()?;
        Ok(Self { report, endorsement, chain, crl, claims: wire.claims, gpus, gpu_rims, gpu_ocsp })
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
            gpu_rims: self.gpu_rims.iter().map(|r| b64().encode(r)).collect(),
            gpu_ocsp: self.gpu_ocsp.iter().map(|r| b64().encode(r)).collect(),
        }
    }

    /// SHA-256 of the canonical JSON (what other evidence refers to, and
    /// what an entry's route-links commitment covers).
    pub fn digest(&self) -> [u8; 32] {
        use sha2::Digest;
        sha2::Sha256::digest(self.to_json().as_bytes()).into()
    }
}

/// What a shard sends after the RA-TLS handshake (its certificate stays
/// small): its GPU evidence and the reference material it carries, in the
/// bundle's wire form and limits.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PostHandshake {
    gpus: serde_json::Value,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    gpu_rims: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    gpu_ocsp: Vec<String>,
}

impl EvidenceBundle {
    /// The GPU part of the bundle (`gpus`, `gpu_rims`, `gpu_ocsp`) as JSON,
    /// for sending after the handshake; empty without GPUs.
    pub(crate) fn post_handshake_json(&self) -> Vec<u8> {
        if self.gpus.is_empty() {
            return Vec::new();
        }
        let wire = self.wire();
        let part =
            PostHandshake { gpus: wire.gpus.unwrap_or_default(), gpu_rims: wire.gpu_rims, gpu_ocsp: wire.gpu_ocsp };
        // Invariant: plain strings and maps; serialising cannot fail.
        serde_json::to_vec(&part).unwrap_or_default()
    }

    /// Adds the GPU part a peer sent after the handshake to this bundle
    /// (from its certificate, which must carry none of it).
    pub(crate) fn add_post_handshake_json(&mut self, bytes: &[u8]) -> Result<(), Malformed> {
        let part: PostHandshake =
            serde_json::from_slice(bytes).map_err(|e| Malformed::Json(format!("post-handshake GPU evidence: {e}")))?;
        let mut wire = self.wire();
        wire.gpus = Some(part.gpus);
        wire.gpu_rims = part.gpu_rims;
        wire.gpu_ocsp = part.gpu_ocsp;
        *self = Self::from_wire(wire)?;
        Ok(())
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
            gpu_rims: Vec::new(),
            gpu_ocsp: Vec::new(),
        }
    }

    #[test]
    fn round_trips() {
        let b = sample();
        assert_eq!(EvidenceBundle::from_json(b.to_json().as_bytes()).unwrap(), b);
        // Carried reference material comes back byte for byte (a RIM's XML
        // signature covers its exact bytes).
        let carried = EvidenceBundle {
            gpu_rims: vec![b"<SoftwareIdentity>\r\n  \t</SoftwareIdentity>\n".to_vec(), vec![0xEF, 0xBB, 0xBF, b'<']],
            gpu_ocsp: vec![vec![0x30, 0x03, 0x0A, 0x01, 0x00]],
            ..sample()
        };
        assert_eq!(EvidenceBundle::from_json(carried.to_json().as_bytes()).unwrap(), carried);
        assert_ne!(carried.digest(), sample().digest());
    }

    #[test]
    fn refuses_too_much_carried_gpu_material_by_field() {
        let too_many = EvidenceBundle { gpu_rims: vec![vec![b'<']; MAX_CARRIED_RIMS + 1], ..sample() };
        assert_eq!(
            EvidenceBundle::from_json(too_many.to_json().as_bytes()),
            Err(Malformed::FieldTooLarge { field: "gpu_rims", limit: MAX_CARRIED_RIMS })
        );
        let too_large = EvidenceBundle { gpu_rims: vec![vec![b' '; MAX_CARRIED_RIM_BYTES + 1]], ..sample() };
        assert_eq!(
            EvidenceBundle::from_json(too_large.to_json().as_bytes()),
            Err(Malformed::FieldTooLarge { field: "gpu_rims", limit: MAX_CARRIED_RIM_BYTES })
        );
        let too_many = EvidenceBundle { gpu_ocsp: vec![vec![0x30]; MAX_CARRIED_OCSP + 1], ..sample() };
        assert_eq!(
            EvidenceBundle::from_json(too_many.to_json().as_bytes()),
            Err(Malformed::FieldTooLarge { field: "gpu_ocsp", limit: MAX_CARRIED_OCSP })
        );
        let j = EvidenceBundle { gpu_ocsp: vec![vec![0x30]], ..sample() }.to_json().replace("\"MA==\"", "\"M!==\"");
        assert!(matches!(EvidenceBundle::from_json(j.as_bytes()), Err(Malformed::Base64 { field: "gpu_ocsp", .. })));
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
