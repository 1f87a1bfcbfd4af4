//! The report Azure's paravisor (the HCL) writes to vTPM NV index
//! 0x01400001 for a confidential VM: a 32-byte header, the hardware report
//! (an SEV-SNP report here), and the IGVM request data whose variable part
//! is the runtime-claims JSON that REPORT_DATA commits to by hash. The
//! claims carry the vTPM's attestation key (`HCLAkPub`), which signs TPM
//! quotes; that is how a TPM quote is bound to the hardware report.
//!
//! ```text
//!  0      "HCLA", version, report size, request type, status, reserved (32)
//!  32     SNP report (1184)                 REPORT_DATA = H(runtime claims) ‖ 0…
//!  1216   data size, version, report type (2 = SNP), hash type (1/2/3 = SHA-256/384/512),
//!         variable size (20)
//!  1236   runtime claims (JSON): keys[HCLAkPub, HCLEkPub], vm-configuration, user-data
//! ```

use serde::Deserialize;
use sha2::Digest;

use crate::invalid::{InvalidValue, ValueKind};

/// The SNP report's length.
pub const SNP_REPORT_LEN: usize = 1184;
/// The header's length.
pub const HEADER_LEN: usize = 32;
/// The IGVM request data header's length.
const REQUEST_HEADER_LEN: usize = 20;
/// Largest HCL report parsed (the NV index holds a few KB).
pub const MAX_HCL_BYTES: usize = 16 * 1024;
/// The report type of an SEV-SNP hardware report.
pub const REPORT_TYPE_SNP: u32 = 2;
/// The report type of a TDX hardware report (not verified here yet).
pub const REPORT_TYPE_TDX: u32 = 4;

/// Why HCL report bytes do not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HclError {
    /// Fewer bytes than a field needs, or more than the limit.
    #[error("HCL report: {0}")]
    Length(String),
    /// A field holds a value this verifier does not speak.
    #[error("HCL report: {field} is {actual}, expected {expected}")]
    Unsupported {
        /// Which field.
        field: &'static str,
        /// What was there.
        actual: String,
        /// What this verifier speaks.
        expected: &'static str,
    },
    /// The runtime claims are not JSON of the expected shape.
    #[error("HCL runtime claims: {0}")]
    Claims(String),
}

/// The hash the runtime claims are committed with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimsHash {
    /// SHA-256 (type 1).
    Sha256,
    /// SHA-384 (type 2).
    Sha384,
    /// SHA-512 (type 3).
    Sha512,
}

impl ClaimsHash {
    /// The 64-byte REPORT_DATA this hash of `data` makes (zero-padded).
    pub fn report_data(self, data: &[u8]) -> [u8; 64] {
        let mut out = [0u8; 64];
        match self {
            Self::Sha256 => out[..32].copy_from_slice(&sha2::Sha256::digest(data)),
            Self::Sha384 => out[..48].copy_from_slice(&sha2::Sha384::digest(data)),
            Self::Sha512 => out.copy_from_slice(&sha2::Sha512::digest(data)),
        }
        out
    }
    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sha256 => "SHA-256",
            Self::Sha384 => "SHA-384",
            Self::Sha512 => "SHA-512",
        }
    }
}

/// A parsed HCL report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HclReport {
    /// The header's version.
    pub version: u32,
    /// The SNP report bytes.
    pub snp_report: Vec<u8>,
    /// How the claims are hashed into REPORT_DATA.
    pub hash: ClaimsHash,
    /// The runtime claims, the exact bytes hashed.
    pub claims_bytes: Vec<u8>,
    /// The runtime claims, parsed.
    pub claims: RuntimeClaims,
}

/// The runtime claims the paravisor reports.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct RuntimeClaims {
    /// JWKs: `HCLAkPub` (the attestation key) and `HCLEkPub`.
    pub keys: Vec<Jwk>,
    /// The VM's configuration as Azure set it.
    #[serde(rename = "vm-configuration", default)]
    pub vm_configuration: Option<VmConfiguration>,
    /// Data the guest asked to be reported (hex).
    #[serde(rename = "user-data", default)]
    pub user_data: Option<String>,
}

/// An RSA JWK.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Jwk {
    /// Key ID (`HCLAkPub`, `HCLEkPub`).
    pub kid: String,
    /// Key type (`RSA`).
    pub kty: String,
    /// Modulus, base64url.
    #[serde(default)]
    pub n: Option<String>,
    /// Exponent, base64url.
    #[serde(default)]
    pub e: Option<String>,
}

/// `vm-configuration`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct VmConfiguration {
    /// The serial console is reachable from Azure's portal.
    #[serde(rename = "console-enabled", default)]
    pub console_enabled: Option<bool>,
    /// UEFI secure boot.
    #[serde(rename = "secure-boot", default)]
    pub secure_boot: Option<bool>,
    /// The vTPM is on.
    #[serde(rename = "tpm-enabled", default)]
    pub tpm_enabled: Option<bool>,
    /// The VM's unique ID.
    #[serde(rename = "vmUniqueId", default)]
    pub vm_unique_id: Option<String>,
}

/// An RSA public key as modulus and exponent (big-endian, no leading zeros).
#[derive(Clone, PartialEq, Eq)]
pub struct RsaKey {
    /// Modulus.
    pub n: Vec<u8>,
    /// Public exponent.
    pub e: Vec<u8>,
}

impl std::fmt::Debug for RsaKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RsaKey({} bits, n {}…)", self.bits(), hex::encode(&self.n[..self.n.len().min(8)]))
    }
}

impl RsaKey {
    /// The modulus length in bits.
    pub fn bits(&self) -> usize {
        self.n.first().map_or(0, |b| (self.n.len() - 1) * 8 + (8 - b.leading_zeros() as usize))
    }

    fn trimmed(n: &[u8], e: &[u8]) -> Self {
        let trim = |v: &[u8]| v.iter().position(|b| *b != 0).map_or(Vec::new(), |i| v[i..].to_vec());
        Self { n: trim(n), e: trim(e) }
    }

    /// From a JWK's base64url fields.
    pub fn from_jwk(k: &Jwk) -> Result<Self, InvalidValue> {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        if k.kty != "RSA" {
            return Err(bad_key(format!("{} is a {:?} key, expected RSA", k.kid, k.kty)));
        }
        let field = |v: &Option<String>, name: &str| -> Result<Vec<u8>, InvalidValue> {
            let v = v.as_deref().ok_or_else(|| bad_key(format!("{} has no {name}", k.kid)))?;
            b64.decode(v.trim_end_matches('=')).map_err(|e| bad_key(format!("{}.{name}: {e}", k.kid)))
        };
        Ok(Self::trimmed(&field(&k.n, "n")?, &field(&k.e, "e")?))
    }

    /// From a SubjectPublicKeyInfo, PEM or DER, holding an RSA key.
    pub fn from_spki(bytes: &[u8]) -> Result<Self, InvalidValue> {
        use der::Decode as _;
        let der = match std::str::from_utf8(bytes).ok().filter(|s| s.contains("-----BEGIN")) {
            Some(s) => {
                let body: String = s.lines().filter(|l| !l.starts_with("-----")).collect();
                use base64::Engine as _;
                let pem = base64::engine::general_purpose::STANDARD.decode(body.trim());
                pem.map_err(|e| bad_key(format!("PEM: {e}")))?
            }
            None => bytes.to_vec(),
        };
        let spki = spki::SubjectPublicKeyInfoRef::from_der(&der).map_err(|e| bad_key(format!("not an SPKI: {e}")))?;
        if spki.algorithm.oid != const_oid::ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1") {
            return Err(bad_key(format!("not an RSA key ({})", spki.algorithm.oid)));
        }
        let pkcs1 = spki.subject_public_key.as_bytes().ok_or_else(|| bad_key("the key bit string has unused bits"))?;
        let not_der = || bad_key("the RSA key is not DER");
        let (tag, content, used) = crate::x509::der_tlv(pkcs1).ok_or_else(not_der)?;
        let kids = crate::x509::der_children(content).ok_or_else(not_der)?;
        match (tag, used == pkcs1.len(), kids.as_slice()) {
            (0x30, true, [(0x02, n), (0x02, e)]) => Ok(Self::trimmed(n, e)),
            _ => Err(bad_key("the RSA key is not SEQUENCE { INTEGER n, INTEGER e }")),
        }
    }

    /// Verifies an RSASSA-PKCS1-v1_5 SHA-256 signature (the vTPM AK's scheme).
    pub fn verify_pkcs1_sha256(&self, message: &[u8], signature: &[u8]) -> bool {
        use ring::signature::{RsaPublicKeyComponents, RSA_PKCS1_2048_8192_SHA256};
        RsaPublicKeyComponents { n: &self.n, e: &self.e }
            .verify(&RSA_PKCS1_2048_8192_SHA256, message, signature)
            .is_ok()
    }
}

impl RuntimeClaims {
    /// The attestation key (`HCLAkPub`).
    pub fn ak_pub(&self) -> Result<RsaKey, InvalidValue> {
        let k = self.keys.iter().find(|k| k.kid == "HCLAkPub");
        let k = k.ok_or_else(|| bad_key("the runtime claims carry no HCLAkPub"))?;
        RsaKey::from_jwk(k)
    }
}

fn bad_key(reason: impl Into<String>) -> InvalidValue {
    InvalidValue::new(ValueKind::AttestationKey, reason)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl HclReport {
    /// Parses an HCL report.
    pub fn parse(bytes: &[u8]) -> Result<Self, HclError> {
        if bytes.len() > MAX_HCL_BYTES {
            return Err(HclError::Length(format!("{} bytes, above the {MAX_HCL_BYTES}-byte limit", bytes.len())));
        }
        let request_at = HEADER_LEN + SNP_REPORT_LEN;
        if bytes.len() < request_at + REQUEST_HEADER_LEN {
            return Err(HclError::Length(format!(
                "{} bytes, shorter than the header, an SNP report and the request header",
                bytes.len()
            )));
        }
        if &bytes[..4] != b"HCLA" {
            return Err(HclError::Unsupported {
                field: "signature",
                actual: hex::encode(&bytes[..4]),
                expected: "\"HCLA\"",
            });
        }
        let version = u32_at(bytes, 4);
        let request_type = u32_at(bytes, 12);
        if request_type != 2 {
            return Err(HclError::Unsupported {
                field: "request type",
                actual: request_type.to_string(),
                expected: "2 (key release / attestation request)",
            });
        }
        let report_type = u32_at(bytes, request_at + 8);
        if report_type != REPORT_TYPE_SNP {
            return Err(HclError::Unsupported {
                field: "report type",
                actual: report_type.to_string(),
                expected: "2 (SEV-SNP; a TDX HCL report is not verified yet)",
            });
        }
        let hash = match u32_at(bytes, request_at + 12) {
            1 => ClaimsHash::Sha256,
            2 => ClaimsHash::Sha384,
            3 => ClaimsHash::Sha512,
            other => {
                return Err(HclError::Unsupported {
                    field: "hash type",
                    actual: other.to_string(),
                    expected: "1, 2 or 3 (SHA-256, SHA-384, SHA-512)",
                })
            }
        };
        let data_size = u32_at(bytes, request_at) as usize;
        let var_size = u32_at(bytes, request_at + 16) as usize;
        let var_at = request_at + REQUEST_HEADER_LEN;
        if data_size != REQUEST_HEADER_LEN + var_size {
            return Err(HclError::Length(format!(
                "request data size {data_size} is not its header (20) plus the variable size {var_size}"
            )));
        }
        let claims_bytes = bytes
            .get(var_at..var_at + var_size)
            .ok_or_else(|| HclError::Length(format!("the runtime claims ({var_size} bytes) run past the end")))?
            .to_vec();
        let claims: RuntimeClaims =
            serde_json::from_slice(&claims_bytes).map_err(|e| HclError::Claims(e.to_string()))?;
        Ok(Self { version, snp_report: bytes[HEADER_LEN..request_at].to_vec(), hash, claims_bytes, claims })
    }
}
