//! Claims a shard makes about itself, and their binding into `REPORT_DATA`.
//!
//! `REPORT_DATA = SHA-512(encode(claims))`, where `encode` is this module's
//! canonical, domain-separated encoding:
//!
//! ```text
//! "veil/claims/v2\0"
//! for each field in the fixed order below:
//!     u8 field id, u8 present (0|1), and if present: u32 big-endian length ‖ bytes
//! ```
//!
//! Field order and ids: 1 tls_key_hash, 2 hpke_config_hash, 3 manifest_root,
//! 4 layer_range (start u32 BE ‖ end u32 BE), 5 gpu_evidence_hash, 6 nonce,
//! 7 software_version (UTF-8), 8 peer_policy (digest of the policy the shard
//! enforces on its links), 9 route_shape (digest of the route's layer ranges,
//! manifest pins and the model's layer count), 10 route_links (the entry's
//! commitment to the shards it has verified and linked, in nonce-bound
//! evidence), 11 drafter (the entry's digest of the drafter it speculates
//! with: kind, draft model manifest root, k settings; see
//! `route::DrafterInfo`), 12 receipt_key (the entry's Ed25519 public key
//! that signs a receipt for every answer, `crate::receipt`). Every field has
//! a fixed id and a length, so two different claim sets never encode to the
//! same bytes.

use crate::invalid::{InvalidValue, ValueKind};
use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256, Sha512};

/// Domain separator of the canonical claims encoding.
pub const CLAIMS_DOMAIN: &[u8] = b"veil/claims/v2\0";
/// Domain separator of the GPU nonce derivation.
pub const GPU_NONCE_DOMAIN: &[u8] = b"veil/gpu-nonce/v1\0";
/// Longest nonce accepted.
pub const MAX_NONCE_BYTES: usize = 64;
/// Longest software version string accepted.
pub const MAX_VERSION_BYTES: usize = 64;

/// 64 bytes signed by the hardware together with the report.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReportData(pub [u8; 64]);

impl fmt::Debug for ReportData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ReportData({})", hex::encode(self.0))
    }
}

impl ReportData {
    /// Parses 1..=64 hex-encoded bytes, zero-padded to 64 (as reviewers type them).
    pub fn from_hex_padded(s: &str) -> Result<Self, InvalidValue> {
        let bytes =
            hex::decode(s.trim()).map_err(|e| InvalidValue::new(ValueKind::ReportData, format!("not hex: {e}")))?;
        if bytes.is_empty() || bytes.len() > 64 {
            return Err(InvalidValue::new(ValueKind::ReportData, format!("must be 1..=64 bytes, got {}", bytes.len())));
        }
        let mut out = [0u8; 64];
        out[..bytes.len()].copy_from_slice(&bytes);
        Ok(Self(out))
    }
}

macro_rules! digest_newtype {
    ($(#[$m:meta])* $name:ident, $len:expr) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub [u8; $len]);

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), hex::encode(self.0))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&hex::encode(self.0))
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&hex::encode(self.0))
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                let v = hex::decode(&s).map_err(serde::de::Error::custom)?;
                let arr: [u8; $len] = v.try_into().map_err(|v: Vec<u8>| {
                    serde::de::Error::custom(format!(
                        "{} must be {} bytes, got {}",
                        stringify!($name),
                        $len,
                        v.len()
                    ))
                })?;
                Ok(Self(arr))
            }
        }

        impl std::str::FromStr for $name {
            type Err = InvalidValue;
            fn from_str(s: &str) -> Result<Self, InvalidValue> {
                let kind = ValueKind::Digest(stringify!($name));
                let v = hex::decode(s.trim()).map_err(|e| InvalidValue::new(kind, format!("not hex: {e}")))?;
                let len = v.len();
                v.try_into()
                    .map(Self)
                    .map_err(|_| InvalidValue::new(kind, format!("must be {} bytes, got {len}", $len)))
            }
        }
    };
}

digest_newtype!(
    /// SHA-256 of a public key (SubjectPublicKeyInfo DER) or key configuration.
    KeyHash,
    32
);
digest_newtype!(
    /// Root of the model manifest (SHA-256 tree over the loaded tensors).
    ManifestRoot,
    32
);
digest_newtype!(
    /// SHA-256 of the GPU evidence a shard collected.
    GpuEvidenceHash,
    32
);
digest_newtype!(
    /// SHA-256 of a policy's canonical encoding (`Policy::digest`): the peer
    /// policy a shard enforces on its links.
    PolicyDigest,
    32
);
digest_newtype!(
    /// SHA-256 of a route's canonical shape (`route::RouteShape::digest`).
    RouteDigest,
    32
);
digest_newtype!(
    /// SHA-256 commitment to the set of shards an entry has verified and
    /// linked (`route::links_commitment`).
    LinksCommitment,
    32
);
digest_newtype!(
    /// SHA-256 of the entry's drafter description (`route::DrafterInfo::digest`).
    DrafterDigest,
    32
);
digest_newtype!(
    /// The entry's receipt-signing public key (Ed25519, 32 bytes): generated
    /// inside the entry at start, never leaves it (`crate::receipt`).
    ReceiptKey,
    32
);
digest_newtype!(
    /// An SEV-SNP launch measurement (SHA-384 of the launch state).
    Measurement,
    48
);

impl KeyHash {
    /// SHA-256 of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }
}

/// A verifier-chosen freshness value (1..=64 bytes).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Nonce(Vec<u8>);

impl Nonce {
    /// Wraps 1..=64 bytes.
    pub fn new(bytes: Vec<u8>) -> Result<Self, InvalidValue> {
        if bytes.is_empty() || bytes.len() > MAX_NONCE_BYTES {
            return Err(InvalidValue::new(
                ValueKind::Nonce,
                format!("must be 1..={MAX_NONCE_BYTES} bytes, got {}", bytes.len()),
            ));
        }
        Ok(Self(bytes))
    }

    /// 32 fresh random bytes.
    pub fn random() -> Self {
        let mut b = vec![0u8; 32];
        rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut b);
        Self(b)
    }

    /// The nonce bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Nonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Nonce({})", hex::encode(&self.0))
    }
}

impl fmt::Display for Nonce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(&self.0))
    }
}

impl std::str::FromStr for Nonce {
    type Err = InvalidValue;
    fn from_str(s: &str) -> Result<Self, InvalidValue> {
        Self::new(hex::decode(s.trim()).map_err(|e| InvalidValue::new(ValueKind::Nonce, format!("not hex: {e}")))?)
    }
}

impl Serialize for Nonce {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for Nonce {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// A contiguous, non-empty range of transformer layers `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "(u32, u32)", into = "(u32, u32)")]
pub struct LayerRange {
    start: u32,
    end: u32,
}

impl LayerRange {
    /// `[start, end)`; empty or reversed ranges are refused.
    pub fn new(start: u32, end: u32) -> Result<Self, InvalidValue> {
        if start >= end {
            return Err(InvalidValue::new(ValueKind::LayerRange, format!("{start}..{end} is empty")));
        }
        Ok(Self { start, end })
    }
    /// First layer.
    pub fn start(self) -> u32 {
        self.start
    }
    /// One past the last layer.
    pub fn end(self) -> u32 {
        self.end
    }
}

impl TryFrom<(u32, u32)> for LayerRange {
    type Error = InvalidValue;
    fn try_from((s, e): (u32, u32)) -> Result<Self, InvalidValue> {
        Self::new(s, e)
    }
}

impl From<LayerRange> for (u32, u32) {
    fn from(r: LayerRange) -> Self {
        (r.start, r.end)
    }
}

impl fmt::Display for LayerRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..{}", self.start, self.end)
    }
}

/// What a shard asserts about itself; bound into `REPORT_DATA`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claims {
    /// SHA-256 of the TLS certificate's SubjectPublicKeyInfo.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_key_hash: Option<KeyHash>,
    /// SHA-256 of the entry's HPKE key configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hpke_config_hash: Option<KeyHash>,
    /// Root of the model manifest this shard loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_root: Option<ManifestRoot>,
    /// Layers this shard serves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_range: Option<LayerRange>,
    /// SHA-256 of the GPU evidence collected with the nonce derived from these claims.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_evidence_hash: Option<GpuEvidenceHash>,
    /// Client nonce, when the evidence was produced on request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<Nonce>,
    /// Version of the shard software.
    #[serde(default)]
    pub software_version: String,
    /// Digest of the policy this shard verifies its neighbours against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_policy: Option<PolicyDigest>,
    /// Digest of the route's shape (stages, manifest pins, layer count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_shape: Option<RouteDigest>,
    /// The entry's commitment to the shards it has linked (fresh evidence only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_links: Option<LinksCommitment>,
    /// The entry's drafter (what it speculates with), by digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drafter: Option<DrafterDigest>,
    /// The entry's receipt-signing public key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt_key: Option<ReceiptKey>,
}

impl Claims {
    /// The canonical encoding (see the module documentation).
    pub fn encode(&self) -> Result<Vec<u8>, InvalidValue> {
        if self.software_version.len() > MAX_VERSION_BYTES {
            return Err(InvalidValue::new(
                ValueKind::Claims,
                format!("software version is {} bytes, limit {MAX_VERSION_BYTES}", self.software_version.len()),
            ));
        }
        let range = self.layer_range.map(|r| {
            let mut b = [0u8; 8];
            b[..4].copy_from_slice(&r.start.to_be_bytes());
            b[4..].copy_from_slice(&r.end.to_be_bytes());
            b
        });
        let fields: [(u8, Option<&[u8]>); 12] = [
            (1, self.tls_key_hash.as_ref().map(|h| &h.0[..])),
            (2, self.hpke_config_hash.as_ref().map(|h| &h.0[..])),
            (3, self.manifest_root.as_ref().map(|h| &h.0[..])),
            (4, range.as_ref().map(|r| &r[..])),
            (5, self.gpu_evidence_hash.as_ref().map(|h| &h.0[..])),
            (6, self.nonce.as_ref().map(Nonce::as_bytes)),
            (7, Some(self.software_version.as_bytes())),
            (8, self.peer_policy.as_ref().map(|h| &h.0[..])),
            (9, self.route_shape.as_ref().map(|h| &h.0[..])),
            (10, self.route_links.as_ref().map(|h| &h.0[..])),
            (11, self.drafter.as_ref().map(|h| &h.0[..])),
            (12, self.receipt_key.as_ref().map(|h| &h.0[..])),
        ];
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(CLAIMS_DOMAIN);
        for (id, value) in fields {
            out.push(id);
            match value {
                None => out.push(0),
                Some(v) => {
                    out.push(1);
                    // Lengths are bounded above (≤ 64 bytes per field).
                    out.extend_from_slice(&(v.len() as u32).to_be_bytes());
                    out.extend_from_slice(v);
                }
            }
        }
        Ok(out)
    }

    /// `REPORT_DATA` for these claims: SHA-512 of the canonical encoding.
    pub fn report_data(&self) -> Result<ReportData, InvalidValue> {
        Ok(ReportData(Sha512::digest(self.encode()?).into()))
    }

    /// The 32-byte SPDM nonce GPU `gpu_index` must sign for this shard
    /// (SECURITY-CASES F6): the first 32 bytes of
    /// `SHA-512("veil/gpu-nonce/v1\0" ‖ encode(claims without the GPU evidence hash) ‖ u32 BE gpu_index)`.
    /// The encoding carries the client nonce and the session keys, so the GPU
    /// evidence is bound to them; the GPU evidence hash is left out because it
    /// depends on this nonce.
    pub fn gpu_nonce(&self, gpu_index: u32) -> Result<[u8; 32], InvalidValue> {
        let mut base = self.clone();
        base.gpu_evidence_hash = None;
        let mut h = Sha512::new();
        h.update(GPU_NONCE_DOMAIN);
        h.update(base.encode()?);
        h.update(gpu_index.to_be_bytes());
        let full = h.finalize();
        let mut out = [0u8; 32];
        out.copy_from_slice(&full[..32]);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Claims {
        Claims {
            tls_key_hash: Some(KeyHash([1; 32])),
            hpke_config_hash: None,
            manifest_root: Some(ManifestRoot([2; 32])),
            layer_range: Some(LayerRange::new(0, 10).unwrap()),
            gpu_evidence_hash: None,
            nonce: Some(Nonce::new(vec![9; 16]).unwrap()),
            software_version: "veil 0.1.0".into(),
            peer_policy: Some(PolicyDigest([4; 32])),
            route_shape: Some(RouteDigest([5; 32])),
            route_links: None,
            drafter: Some(DrafterDigest([8; 32])),
            receipt_key: Some(ReceiptKey([10; 32])),
        }
    }

    #[test]
    fn each_field_changes_report_data() {
        let base = sample().report_data().unwrap();
        let mut variants = vec![];
        let mut c = sample();
        c.tls_key_hash = None;
        variants.push(c);
        let mut c = sample();
        c.hpke_config_hash = Some(KeyHash([1; 32]));
        variants.push(c);
        let mut c = sample();
        c.layer_range = Some(LayerRange::new(0, 11).unwrap());
        variants.push(c);
        let mut c = sample();
        c.nonce = None;
        variants.push(c);
        let mut c = sample();
        c.software_version.push('x');
        variants.push(c);
        let mut c = sample();
        c.peer_policy = Some(PolicyDigest([6; 32]));
        variants.push(c);
        let mut c = sample();
        c.route_shape = None;
        variants.push(c);
        let mut c = sample();
        c.route_links = Some(LinksCommitment([7; 32]));
        variants.push(c);
        let mut c = sample();
        c.drafter = Some(DrafterDigest([9; 32]));
        variants.push(c);
        let mut c = sample();
        c.drafter = None;
        variants.push(c);
        let mut c = sample();
        c.receipt_key = Some(ReceiptKey([11; 32]));
        variants.push(c);
        let mut c = sample();
        c.receipt_key = None;
        variants.push(c);
        for v in variants {
            assert_ne!(v.report_data().unwrap(), base, "{v:?}");
        }
    }

    #[test]
    fn moving_a_hash_between_fields_changes_encoding() {
        // Same 32 bytes in a different slot must not collide.
        let a = Claims { tls_key_hash: Some(KeyHash([7; 32])), ..Default::default() };
        let b = Claims { hpke_config_hash: Some(KeyHash([7; 32])), ..Default::default() };
        assert_ne!(a.encode().unwrap(), b.encode().unwrap());
        let c = Claims { peer_policy: Some(PolicyDigest([7; 32])), ..Default::default() };
        let d = Claims { route_links: Some(LinksCommitment([7; 32])), ..Default::default() };
        assert_ne!(c.encode().unwrap(), d.encode().unwrap());
        let e = Claims { drafter: Some(DrafterDigest([7; 32])), ..Default::default() };
        assert_ne!(d.encode().unwrap(), e.encode().unwrap());
        assert_ne!(e.encode().unwrap(), Claims::default().encode().unwrap());
        let r = Claims { receipt_key: Some(ReceiptKey([7; 32])), ..Default::default() };
        assert_ne!(r.encode().unwrap(), e.encode().unwrap());
        assert_ne!(a.encode().unwrap(), c.encode().unwrap());
    }

    #[test]
    fn json_round_trip() {
        let c = sample();
        let j = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<Claims>(&j).unwrap(), c);
        assert!(serde_json::from_str::<Claims>(r#"{"layer_range":[5,5]}"#).is_err());
        assert!(serde_json::from_str::<Claims>(r#"{"surprise":1}"#).is_err());
    }

    #[test]
    fn gpu_nonce_ignores_gpu_hash_but_not_index_or_client_nonce() {
        let mut c = sample();
        let n = c.gpu_nonce(0).unwrap();
        c.gpu_evidence_hash = Some(GpuEvidenceHash([3; 32]));
        assert_eq!(c.gpu_nonce(0).unwrap(), n);
        assert_ne!(c.gpu_nonce(1).unwrap(), n);
        c.nonce = Some(Nonce::new(vec![8; 16]).unwrap());
        assert_ne!(c.gpu_nonce(0).unwrap(), n);
    }

    proptest::proptest! {
        #[test]
        fn encoding_is_injective_on_versions(a in "[ -~]{0,64}", b in "[ -~]{0,64}") {
            let ca = Claims { software_version: a.clone(), ..sample() };
            let cb = Claims { software_version: b.clone(), ..sample() };
            proptest::prop_assert_eq!(a == b, ca.encode().unwrap() == cb.encode().unwrap());
        }
    }
}
