//! Minimal X.509 handling for endorsement chains: parse once, keep the raw
//! DER, verify signatures over the *received* TBS bytes (never re-encoded),
//! read validity periods and extensions.

use std::fmt;
use std::time::{Duration, SystemTime};

use const_oid::ObjectIdentifier;
use der::{Decode, Encode, Reader};
use sha2::{Digest, Sha256};
use x509_cert::crl::CertificateList;
use x509_cert::Certificate;

/// `sha384WithRSAEncryption` under RSASSA-PSS (RFC 4055).
pub const RSASSA_PSS: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.10");
/// `ecdsa-with-SHA384` (RFC 5758).
pub const ECDSA_WITH_SHA384: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.4.3.3");
/// `ecdsa-with-SHA256` (RFC 5758).
pub const ECDSA_WITH_SHA256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.4.3.2");
const COMMON_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.3");

/// Largest certificate we parse.
pub const MAX_CERT_BYTES: usize = 16 * 1024;

/// Why a certificate or CRL could not be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CertError {
    /// Not DER, or not an X.509 certificate/CRL.
    #[error("not a valid X.509 structure: {0}")]
    Malformed(String),
    /// Larger than [`MAX_CERT_BYTES`].
    #[error("certificate of {0} bytes exceeds the {MAX_CERT_BYTES}-byte limit")]
    TooLarge(usize),
    /// Larger than the limit of its kind (RA-TLS certificates carry evidence).
    #[error("certificate of {actual} bytes exceeds the {limit}-byte limit")]
    ExceedsLimit {
        /// Size.
        actual: usize,
        /// Limit.
        limit: usize,
    },
    /// Signature algorithm we do not accept.
    #[error("unsupported signature algorithm {0}")]
    UnsupportedAlgorithm(String),
    /// Issuer key type does not match the signature algorithm.
    #[error("issuer key is not usable for {0}")]
    WrongKeyType(String),
    /// The signature does not verify.
    #[error("signature does not verify")]
    BadSignature,
    /// Checked before the certificate's `notBefore`.
    #[error("not valid before {}", fmt_time(*not_before))]
    NotYetValid {
        /// `notBefore`.
        not_before: SystemTime,
    },
    /// Checked after the certificate's `notAfter`.
    #[error("expired at {}", fmt_time(*not_after))]
    Expired {
        /// `notAfter`.
        not_after: SystemTime,
    },
}

/// A parsed certificate that remembers its exact DER bytes.
#[derive(Clone)]
pub struct ParsedCert {
    der: Vec<u8>,
    tbs_range: std::ops::Range<usize>,
    cert: Certificate,
}

impl fmt::Debug for ParsedCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ParsedCert")
            .field("subject", &self.cert.tbs_certificate.subject.to_string())
            .field("issuer", &self.cert.tbs_certificate.issuer.to_string())
            .finish()
    }
}

/// Byte range of the first element inside the outer SEQUENCE (the TBS part).
fn inner_first_tlv(der: &[u8]) -> Result<std::ops::Range<usize>, der::Error> {
    let mut reader = der::SliceReader::new(der)?;
    let outer = der::Header::decode(&mut reader)?;
    if outer.tag != der::Tag::Sequence {
        return Err(der::ErrorKind::TagUnexpected { expected: Some(der::Tag::Sequence), actual: outer.tag }.into());
    }
    let start = usize::try_from(reader.position())?;
    let inner = der::Header::decode(&mut reader)?;
    let len = usize::try_from((inner.encoded_len()? + inner.length)?)?;
    let end = start.checked_add(len).ok_or(der::ErrorKind::Overflow)?;
    if end > der.len() {
        return Err(
            der::ErrorKind::Incomplete { expected_len: end.try_into()?, actual_len: der.len().try_into()? }.into()
        );
    }
    Ok(start..end)
}

impl ParsedCert {
    /// Parses a DER certificate (no trailing bytes).
    pub fn from_der(der: &[u8]) -> Result<Self, CertError> {
        if der.len() > MAX_CERT_BYTES {
            return Err(CertError::TooLarge(der.len()));
        }
        Self::from_der_limited(der, MAX_CERT_BYTES)
    }

    /// [`from_der`](Self::from_der) with a larger size limit (RA-TLS
    /// certificates, whose extension carries a whole evidence bundle).
    pub fn from_der_limited(der: &[u8], limit: usize) -> Result<Self, CertError> {
        if der.len() > limit {
            return Err(CertError::ExceedsLimit { actual: der.len(), limit });
        }
        let cert = Certificate::from_der(der).map_err(|e| CertError::Malformed(e.to_string()))?;
        let tbs_range = inner_first_tlv(der).map_err(|e| CertError::Malformed(e.to_string()))?;
        Ok(Self { der: der.to_vec(), tbs_range, cert })
    }

    /// Parses one PEM certificate.
    pub fn from_pem(pem: &[u8]) -> Result<Self, CertError> {
        let mut all = Self::chain_from_pem(pem)?;
        match all.len() {
            1 => Ok(all.remove(0)),
            n => Err(CertError::Malformed(format!("expected one PEM certificate, found {n}"))),
        }
    }

    /// Parses every certificate in a PEM bundle, in file order.
    pub fn chain_from_pem(pem: &[u8]) -> Result<Vec<Self>, CertError> {
        let text = std::str::from_utf8(pem).map_err(|_| CertError::Malformed("PEM is not UTF-8".into()))?;
        let mut out = Vec::new();
        let mut rest = text;
        while let Some(begin) = rest.find("-----BEGIN CERTIFICATE-----") {
            let after = &rest[begin..];
            let end_marker = "-----END CERTIFICATE-----";
            let end = after.find(end_marker).ok_or_else(|| CertError::Malformed("unterminated PEM block".into()))?;
            let block = &after[..end + end_marker.len()];
            let (label, der) = pem_rfc7468_decode(block)?;
            if label != "CERTIFICATE" {
                return Err(CertError::Malformed(format!("unexpected PEM label {label}")));
            }
            out.push(Self::from_der(&der)?);
            rest = &after[end + end_marker.len()..];
        }
        if out.is_empty() {
            return Err(CertError::Malformed("no PEM certificate found".into()));
        }
        Ok(out)
    }

    /// DER or PEM, whichever the bytes are.
    pub fn from_der_or_pem(bytes: &[u8]) -> Result<Self, CertError> {
        if bytes.windows(10).any(|w| w == b"-----BEGIN") {
            Self::from_pem(bytes)
        } else {
            Self::from_der(bytes)
        }
    }

    /// The exact DER bytes.
    pub fn der(&self) -> &[u8] {
        &self.der
    }

    /// The decoded certificate.
    pub fn inner(&self) -> &Certificate {
        &self.cert
    }

    /// The signed TBS bytes exactly as received.
    pub fn tbs_bytes(&self) -> &[u8] {
        &self.der[self.tbs_range.clone()]
    }

    /// Subject common name, if any.
    pub fn common_name(&self) -> Option<String> {
        common_name(&self.cert.tbs_certificate.subject)
    }

    /// Issuer common name, if any.
    pub fn issuer_common_name(&self) -> Option<String> {
        common_name(&self.cert.tbs_certificate.issuer)
    }

    /// Subject as an RFC 4514 string.
    pub fn subject_string(&self) -> String {
        self.cert.tbs_certificate.subject.to_string()
    }

    /// Whether this certificate's issuer name equals `issuer`'s subject name.
    pub fn issued_by_name(&self, issuer: &ParsedCert) -> bool {
        self.cert.tbs_certificate.issuer == issuer.cert.tbs_certificate.subject
    }

    /// DER of the SubjectPublicKeyInfo.
    pub fn spki_der(&self) -> Vec<u8> {
        // Invariant: the SPKI was decoded from DER, so it re-encodes.
        self.cert.tbs_certificate.subject_public_key_info.to_der().unwrap_or_default()
    }

    /// SHA-256 of the SubjectPublicKeyInfo DER (key fingerprint).
    pub fn spki_sha256(&self) -> [u8; 32] {
        Sha256::digest(self.spki_der()).into()
    }

    /// Serial number bytes (big-endian, as encoded).
    pub fn serial(&self) -> &[u8] {
        self.cert.tbs_certificate.serial_number.as_bytes()
    }

    /// `notBefore` and `notAfter`.
    pub fn validity(&self) -> (SystemTime, SystemTime) {
        let v = &self.cert.tbs_certificate.validity;
        (
            SystemTime::UNIX_EPOCH + v.not_before.to_unix_duration(),
            SystemTime::UNIX_EPOCH + v.not_after.to_unix_duration(),
        )
    }

    /// Checks `notBefore <= now <= notAfter`.
    pub fn check_validity(&self, now: SystemTime) -> Result<(), CertError> {
        let (not_before, not_after) = self.validity();
        if now < not_before {
            return Err(CertError::NotYetValid { not_before });
        }
        if now > not_after {
            return Err(CertError::Expired { not_after });
        }
        Ok(())
    }

    /// The raw `extnValue` octets of an extension, if present. Duplicate
    /// extensions are refused (RFC 5280 §4.2).
    pub fn extension(&self, oid: ObjectIdentifier) -> Result<Option<&[u8]>, CertError> {
        let mut found = None;
        for ext in self.cert.tbs_certificate.extensions.iter().flatten() {
            if ext.extn_id == oid {
                if found.is_some() {
                    return Err(CertError::Malformed(format!("duplicate extension {oid}")));
                }
                found = Some(ext.extn_value.as_bytes());
            }
        }
        Ok(found)
    }

    /// Verifies this certificate's signature with `issuer`'s public key.
    pub fn verify_signed_by(&self, issuer: &ParsedCert) -> Result<(), CertError> {
        verify_signature(
            &self.cert.signature_algorithm.oid,
            self.tbs_bytes(),
            self.cert.signature.as_bytes(),
            &issuer.cert.tbs_certificate.subject_public_key_info,
        )
    }

    /// Verifies a fixed-width (R ‖ S, big-endian) ECDSA P-384/SHA-384
    /// signature over `message` with this certificate's key.
    pub fn verify_p384_fixed(&self, message: &[u8], signature: &[u8; 96]) -> Result<(), CertError> {
        use ring::signature::{UnparsedPublicKey, ECDSA_P384_SHA384_FIXED};
        let point = p384_point(&self.cert.tbs_certificate.subject_public_key_info)?;
        UnparsedPublicKey::new(&ECDSA_P384_SHA384_FIXED, point)
            .verify(message, signature)
            .map_err(|_| CertError::BadSignature)
    }
}

impl ParsedCert {
    /// Verifies a fixed-width (R ‖ S, big-endian) ECDSA P-256/SHA-256
    /// signature over `message` with this certificate's key (Intel's QE
    /// report, TCB info and QE identity signatures).
    pub fn verify_p256_fixed(&self, message: &[u8], signature: &[u8; 64]) -> Result<(), CertError> {
        use ring::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_FIXED};
        let point = p256_point(&self.cert.tbs_certificate.subject_public_key_info)?;
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, point)
            .verify(message, signature)
            .map_err(|_| CertError::BadSignature)
    }
}

/// A parsed CRL that remembers its exact DER bytes.
#[derive(Clone)]
pub struct ParsedCrl {
    der: Vec<u8>,
    tbs_range: std::ops::Range<usize>,
    crl: CertificateList,
}

impl fmt::Debug for ParsedCrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ParsedCrl").field("issuer", &self.crl.tbs_cert_list.issuer.to_string()).finish()
    }
}

impl ParsedCrl {
    /// Largest CRL we parse.
    pub const MAX_BYTES: usize = 64 * 1024;

    /// Parses a DER CRL.
    pub fn from_der(der: &[u8]) -> Result<Self, CertError> {
        if der.len() > Self::MAX_BYTES {
            return Err(CertError::TooLarge(der.len()));
        }
        let crl = CertificateList::from_der(der).map_err(|e| CertError::Malformed(e.to_string()))?;
        let tbs_range = inner_first_tlv(der).map_err(|e| CertError::Malformed(e.to_string()))?;
        Ok(Self { der: der.to_vec(), tbs_range, crl })
    }

    /// The exact DER bytes.
    pub fn der(&self) -> &[u8] {
        &self.der
    }

    /// Whether the CRL's issuer name equals `issuer`'s subject.
    pub fn issued_by_name(&self, issuer: &ParsedCert) -> bool {
        self.crl.tbs_cert_list.issuer == issuer.cert.tbs_certificate.subject
    }

    /// Verifies the CRL signature with `issuer`'s key.
    pub fn verify_signed_by(&self, issuer: &ParsedCert) -> Result<(), CertError> {
        verify_signature(
            &self.crl.signature_algorithm.oid,
            &self.der[self.tbs_range.clone()],
            self.crl.signature.as_bytes(),
            &issuer.cert.tbs_certificate.subject_public_key_info,
        )
    }

    /// `thisUpdate` and `nextUpdate`.
    pub fn window(&self) -> (SystemTime, Option<SystemTime>) {
        let t = &self.crl.tbs_cert_list;
        (
            SystemTime::UNIX_EPOCH + t.this_update.to_unix_duration(),
            t.next_update.map(|n| SystemTime::UNIX_EPOCH + n.to_unix_duration()),
        )
    }

    /// Whether `serial` is listed as revoked.
    pub fn revokes(&self, serial: &[u8]) -> bool {
        self.crl.tbs_cert_list.revoked_certificates.iter().flatten().any(|r| r.serial_number.as_bytes() == serial)
    }
}

/// `id-ecPublicKey` and `secp384r1` (RFC 5480).
const EC_PUBLIC_KEY: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
const SECP384R1: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.132.0.34");
const RSA_ENCRYPTION: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");

/// `prime256v1` (RFC 5480): Intel's SGX and TDX chains.
const PRIME256V1: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.3.1.7");

/// The uncompressed P-384 point of an SPKI, after checking its algorithm.
fn p384_point(spki: &spki::SubjectPublicKeyInfoOwned) -> Result<&[u8], CertError> {
    ec_point(spki, SECP384R1, "ECDSA P-384")
}

/// The uncompressed P-256 point of an SPKI, after checking its algorithm.
fn p256_point(spki: &spki::SubjectPublicKeyInfoOwned) -> Result<&[u8], CertError> {
    ec_point(spki, PRIME256V1, "ECDSA P-256")
}

fn ec_point<'a>(
    spki: &'a spki::SubjectPublicKeyInfoOwned,
    want: ObjectIdentifier,
    name: &str,
) -> Result<&'a [u8], CertError> {
    let curve = spki.algorithm.parameters.as_ref().and_then(|p| p.decode_as::<ObjectIdentifier>().ok());
    if spki.algorithm.oid != EC_PUBLIC_KEY || curve != Some(want) {
        return Err(CertError::WrongKeyType(name.into()));
    }
    spki.subject_public_key.as_bytes().ok_or_else(|| CertError::Malformed("public key bit string".into()))
}

/// Certificate and CRL signatures that verified, by the digest of exactly
/// what was verified (algorithm, signed bytes, signature, key). A route
/// repeats the same chains for every shard (AMD's ARK and ASK, 4096-bit
/// RSA; the upper NVIDIA chain and simulated roots, P-384), and in
/// WebAssembly each verification costs milliseconds. The same bytes always
/// verify the same way, so a success is remembered; a failure never is, and
/// validity times, revocation and every other check still run each time.
/// Bounded: cleared when full.
fn verified_signatures() -> &'static std::sync::Mutex<std::collections::HashSet<[u8; 32]>> {
    static SEEN: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<[u8; 32]>>> =
        std::sync::OnceLock::new();
    SEEN.get_or_init(Default::default)
}

const VERIFIED_SIGNATURES_MAX: usize = 1024;

/// SHA-256 over the length-prefixed algorithm, signed bytes, signature and key.
fn verified_digest(algorithm: &ObjectIdentifier, tbs: &[u8], signature: &[u8], key: &[u8]) -> [u8; 32] {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    for part in [algorithm.as_bytes(), tbs, signature, key] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    h.finalize().into()
}

pub(crate) fn verify_signature(
    algorithm: &ObjectIdentifier,
    tbs: &[u8],
    signature: Option<&[u8]>,
    issuer_spki: &spki::SubjectPublicKeyInfoOwned,
) -> Result<(), CertError> {
    use ring::signature::{
        UnparsedPublicKey, VerificationAlgorithm, ECDSA_P256_SHA256_ASN1, ECDSA_P384_SHA384_ASN1,
        RSA_PSS_2048_8192_SHA384,
    };
    let signature = signature.ok_or_else(|| CertError::Malformed("signature bit string has unused bits".into()))?;
    let (scheme, key): (&'static dyn VerificationAlgorithm, &[u8]) = match *algorithm {
        RSASSA_PSS => {
            // AMD signs with RSASSA-PSS, SHA-384, MGF1-SHA-384, salt 48. We
            // verify with exactly those parameters; a certificate that
            // declares others fails here.
            if issuer_spki.algorithm.oid != RSA_ENCRYPTION {
                return Err(CertError::WrongKeyType("RSASSA-PSS".into()));
            }
            let key = issuer_spki
                .subject_public_key
                .as_bytes()
                .ok_or_else(|| CertError::Malformed("public key bit string".into()))?;
            (&RSA_PSS_2048_8192_SHA384, key)
        }
        ECDSA_WITH_SHA384 => (&ECDSA_P384_SHA384_ASN1, p384_point(issuer_spki)?),
        ECDSA_WITH_SHA256 => (&ECDSA_P256_SHA256_ASN1, p256_point(issuer_spki)?),
        other => return Err(CertError::UnsupportedAlgorithm(other.to_string())),
    };
    let seen = verified_digest(algorithm, tbs, signature, key);
    if verified_signatures().lock().is_ok_and(|s| s.contains(&seen)) {
        return Ok(());
    }
    UnparsedPublicKey::new(scheme, key).verify(tbs, signature).map_err(|_| CertError::BadSignature)?;
    if let Ok(mut s) = verified_signatures().lock() {
        if s.len() >= VERIFIED_SIGNATURES_MAX {
            s.clear();
        }
        s.insert(seen);
    }
    Ok(())
}

fn common_name(name: &x509_cert::name::Name) -> Option<String> {
    name.0.iter().flat_map(|rdn| rdn.0.iter()).find_map(|atv| {
        (atv.oid == COMMON_NAME).then(|| {
            der::asn1::Utf8StringRef::try_from(&atv.value)
                .map(|s| s.as_str().to_owned())
                .or_else(|_| der::asn1::PrintableStringRef::try_from(&atv.value).map(|s| s.as_str().to_owned()))
                .or_else(|_| der::asn1::Ia5StringRef::try_from(&atv.value).map(|s| s.as_str().to_owned()))
                .unwrap_or_default()
        })
    })
}

/// Decodes one RFC 7468 PEM block into (label, DER).
fn pem_rfc7468_decode(block: &str) -> Result<(String, Vec<u8>), CertError> {
    use base64::Engine;
    let mut lines = block.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or_default();
    let label = first
        .strip_prefix("-----BEGIN ")
        .and_then(|l| l.strip_suffix("-----"))
        .ok_or_else(|| CertError::Malformed("bad PEM header".into()))?
        .to_owned();
    let body: String = lines.take_while(|l| !l.starts_with("-----END")).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .map_err(|e| CertError::Malformed(format!("PEM base64: {e}")))?;
    Ok((label, der))
}

/// A DER TLV: (tag, content, total length).
pub(crate) fn der_tlv(bytes: &[u8]) -> Option<(u8, &[u8], usize)> {
    let tag = *bytes.first()?;
    let first = *bytes.get(1)?;
    let (len, header) = if first < 0x80 {
        (usize::from(first), 2)
    } else {
        let n = usize::from(first & 0x7F);
        if n == 0 || n > 3 {
            return None;
        }
        let mut len = 0usize;
        for i in 0..n {
            len = (len << 8) | usize::from(*bytes.get(2 + i)?);
        }
        (len, 2 + n)
    };
    let end = header.checked_add(len)?;
    Some((tag, bytes.get(header..end)?, end))
}

/// The TLVs one after another in `content`, as (tag, content).
pub(crate) fn der_children(mut content: &[u8]) -> Option<Vec<(u8, &[u8])>> {
    let mut out = Vec::new();
    while !content.is_empty() {
        let (tag, value, used) = der_tlv(content)?;
        out.push((tag, value));
        content = &content[used..];
    }
    Some(out)
}

/// Formats a time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn fmt_time(t: SystemTime) -> String {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or(Duration::ZERO).as_secs();
    match der::DateTime::from_unix_duration(Duration::from_secs(secs)) {
        Ok(dt) => format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            dt.year(),
            dt.month(),
            dt.day(),
            dt.hour(),
            dt.minutes(),
            dt.seconds()
        ),
        Err(_) => format!("unix:{secs}"),
    }
}

/// Parses `YYYY-MM-DDTHH:MM:SSZ` (or a date `YYYY-MM-DD`) into a time.
pub fn parse_time(s: &str) -> Option<SystemTime> {
    let s = s.trim();
    let (date, time) = match s.split_once('T') {
        Some((d, t)) => (d, t.trim_end_matches('Z')),
        None => (s, "00:00:00"),
    };
    let mut d = date.split('-').map(|p| p.parse::<u32>().ok());
    let (y, mo, da) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.split(':').map(|p| p.parse::<u32>().ok());
    let (h, mi, se) = (t.next()??, t.next()??, t.next().unwrap_or(Some(0))?);
    let dt = der::DateTime::new(
        u16::try_from(y).ok()?,
        u8::try_from(mo).ok()?,
        u8::try_from(da).ok()?,
        u8::try_from(h).ok()?,
        u8::try_from(mi).ok()?,
        u8::try_from(se).ok()?,
    )
    .ok()?;
    Some(SystemTime::UNIX_EPOCH + dt.unix_duration())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_round_trips() {
        let t = parse_time("2025-12-10T22:14:21Z").unwrap();
        assert_eq!(fmt_time(t), "2025-12-10T22:14:21Z");
        assert_eq!(fmt_time(parse_time("2025-06-01").unwrap()), "2025-06-01T00:00:00Z");
        assert!(parse_time("yesterday").is_none());
    }

    /// A remembered success answers only for exactly the same bytes: the
    /// same signature over other bytes, or another signature, still fails.
    #[test]
    fn a_remembered_signature_covers_only_the_same_bytes() {
        let ark = crate::snp::Product::Genoa.amd_ark();
        let ask = crate::snp::Product::Genoa.amd_ask();
        let tbs = ask.tbs_bytes().to_vec();
        let sig = ask.cert.signature.as_bytes().expect("the ASK is signed").to_vec();
        let (ark_key, ask_key) =
            (&ark.cert.tbs_certificate.subject_public_key_info, &ask.cert.tbs_certificate.subject_public_key_info);
        for _ in 0..2 {
            verify_signature(&RSASSA_PSS, &tbs, Some(&sig), ark_key).unwrap();
        }
        assert!(verified_signatures().lock().unwrap().contains(&verified_digest(
            &RSASSA_PSS,
            &tbs,
            &sig,
            ark_key.subject_public_key.as_bytes().unwrap()
        )));
        let mut other_tbs = tbs.clone();
        other_tbs[40] ^= 1;
        assert!(matches!(verify_signature(&RSASSA_PSS, &other_tbs, Some(&sig), ark_key), Err(CertError::BadSignature)));
        let mut other_sig = sig.clone();
        other_sig[10] ^= 1;
        assert!(matches!(verify_signature(&RSASSA_PSS, &tbs, Some(&other_sig), ark_key), Err(CertError::BadSignature)));
        // The ASK's signature under the ASK's own key (another key) fails.
        assert!(verify_signature(&RSASSA_PSS, &tbs, Some(&sig), ask_key).is_err());
    }

    #[test]
    fn refuses_garbage_der() {
        assert!(matches!(ParsedCert::from_der(&[0x30, 0x03, 1, 2, 3]), Err(CertError::Malformed(_))));
        assert!(matches!(ParsedCert::from_der(&vec![0u8; MAX_CERT_BYTES + 1]), Err(CertError::TooLarge(_))));
    }
}
