//! OCSP (RFC 6960) status of the GPU device chain, from responses the
//! relying party supplies (fetching them is a separate, explicit step).
//!
//! Every certificate below the root must be covered by a `good`, current
//! response (`thisUpdate ≤ now ≤ nextUpdate`) signed by its issuer, or by a
//! responder certificate its issuer signed for OCSP signing
//! (id-kp-OCSPSigning). CertIDs with SHA-256 or SHA-384 are understood.

use std::time::SystemTime;

use const_oid::ObjectIdentifier;
use der::{Decode, Encode};
use sha2::{Digest, Sha256, Sha384};
use x509_ocsp::{BasicOcspResponse, CertStatus, OcspResponse, OcspResponseStatus};

use super::GpuError;
use crate::x509::{fmt_time, ParsedCert};

/// Largest OCSP response accepted.
pub const MAX_OCSP_BYTES: usize = 32 * 1024;
/// Most responses looked at for one GPU's chain: a shard carries the
/// responses for all its GPUs in one list, so the bundle's limit.
pub const MAX_RESPONSES: usize = 4 * super::evidence::MAX_GPUS;
const ID_PKIX_OCSP_BASIC: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.48.1.1");
const OCSP_SIGNING: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.3.9");
const EXT_KEY_USAGE: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.37");
const SHA256: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.1");
const SHA384: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.2");

/// A failed revocation check: typed reason, expected, actual.
pub type OcspFailure = Box<(GpuError, String, String)>;

fn failure(error: GpuError, expected: impl Into<String>, actual: impl Into<String>) -> OcspFailure {
    Box::new((error, expected.into(), actual.into()))
}

fn invalid(reason: impl Into<String>) -> OcspFailure {
    let r = reason.into();
    failure(GpuError::RevocationUnavailable, "a usable OCSP response", r)
}

/// The raw bytes of the first element inside a DER SEQUENCE (the signed part).
fn first_child(der: &[u8]) -> Option<&[u8]> {
    let mut reader = der::SliceReader::new(der).ok()?;
    let outer = der::Header::decode(&mut reader).ok()?;
    if outer.tag != der::Tag::Sequence {
        return None;
    }
    let start = usize::try_from(der::Reader::position(&reader)).ok()?;
    let inner = der::Header::decode(&mut reader).ok()?;
    let len = usize::try_from((inner.encoded_len().ok()? + inner.length).ok()?).ok()?;
    der.get(start..start.checked_add(len)?)
}

fn hash(alg: &ObjectIdentifier, data: &[u8]) -> Option<Vec<u8>> {
    match *alg {
        SHA256 => Some(Sha256::digest(data).to_vec()),
        SHA384 => Some(Sha384::digest(data).to_vec()),
        _ => None,
    }
}

fn may_sign_ocsp(responder: &ParsedCert) -> bool {
    use x509_cert::ext::pkix::ExtendedKeyUsage;
    match responder.extension(EXT_KEY_USAGE) {
        Ok(Some(v)) => ExtendedKeyUsage::from_der(v).is_ok_and(|eku| eku.0.contains(&OCSP_SIGNING)),
        _ => false,
    }
}

struct Parsed {
    basic: BasicOcspResponse,
    tbs: Vec<u8>,
    certs: Vec<ParsedCert>,
}

fn parse(der: &[u8]) -> Result<Parsed, OcspFailure> {
    if der.len() > MAX_OCSP_BYTES {
        return Err(invalid(format!("OCSP response of {} bytes exceeds {MAX_OCSP_BYTES}", der.len())));
    }
    let resp = OcspResponse::from_der(der).map_err(|e| invalid(format!("not an OCSP response: {e}")))?;
    if resp.response_status != OcspResponseStatus::Successful {
        return Err(invalid(format!("OCSP response status {:?}", resp.response_status)));
    }
    let bytes = resp.response_bytes.ok_or_else(|| invalid("successful OCSP response without a body"))?;
    if bytes.response_type != ID_PKIX_OCSP_BASIC {
        return Err(invalid(format!("OCSP response type {}", bytes.response_type)));
    }
    let body = bytes.response.as_bytes();
    let basic = BasicOcspResponse::from_der(body).map_err(|e| invalid(format!("basic OCSP response: {e}")))?;
    let tbs = first_child(body).ok_or_else(|| invalid("basic OCSP response framing"))?.to_vec();
    let certs = basic
        .certs
        .iter()
        .flatten()
        .map(|c| c.to_der().ok().and_then(|d| ParsedCert::from_der(&d).ok()))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| invalid("a certificate in the OCSP response does not parse"))?;
    Ok(Parsed { basic, tbs, certs })
}

/// Whether `p` is signed by `issuer` itself or by a delegated responder `issuer` certified.
fn signed_for(p: &Parsed, issuer: &ParsedCert, now: SystemTime) -> bool {
    let sig = p.basic.signature.as_bytes();
    let alg = &p.basic.signature_algorithm.oid;
    let by = |c: &ParsedCert| {
        crate::x509::verify_signature(alg, &p.tbs, sig, &c.inner().tbs_certificate.subject_public_key_info).is_ok()
    };
    if by(issuer) {
        return true;
    }
    p.certs.iter().any(|r| {
        r.issued_by_name(issuer)
            && r.verify_signed_by(issuer).is_ok()
            && may_sign_ocsp(r)
            && r.check_validity(now).is_ok()
            && by(r)
    })
}

/// Checks that every non-root certificate of `chain` (leaf first) is `good` at `now`.
pub fn check_chain(chain: &[ParsedCert], responses: &[Vec<u8>], now: SystemTime) -> Result<String, OcspFailure> {
    if responses.len() > MAX_RESPONSES {
        return Err(invalid(format!("{} OCSP responses (at most {MAX_RESPONSES})", responses.len())));
    }
    let parsed = responses.iter().map(|r| parse(r)).collect::<Result<Vec<_>, _>>()?;
    let mut covered = Vec::new();
    for (i, pair) in chain.windows(2).enumerate() {
        let (cert, issuer) = (&pair[0], &pair[1]);
        let name = cert.common_name().unwrap_or_default();
        let issuer_name = issuer.inner().tbs_certificate.subject.to_der().map_err(|e| invalid(e.to_string()))?;
        let issuer_key = issuer.inner().tbs_certificate.subject_public_key_info.subject_public_key.raw_bytes();
        let mut status = None;
        for p in &parsed {
            for single in &p.basic.tbs_response_data.responses {
                let id = &single.cert_id;
                let alg = &id.hash_algorithm.oid;
                let (Some(name_hash), Some(key_hash)) = (hash(alg, &issuer_name), hash(alg, issuer_key)) else {
                    continue;
                };
                if id.serial_number.as_bytes() != cert.serial()
                    || id.issuer_name_hash.as_bytes() != name_hash.as_slice()
                    || id.issuer_key_hash.as_bytes() != key_hash.as_slice()
                {
                    continue;
                }
                if !signed_for(p, issuer, now) {
                    return Err(failure(
                        GpuError::RevocationUnavailable,
                        format!("an OCSP response for {name} signed by its issuer or a delegated responder"),
                        "the response signature does not verify under an authorised key",
                    ));
                }
                status = Some(single);
            }
        }
        let Some(single) = status else {
            return Err(failure(
                GpuError::RevocationUnavailable,
                format!("an OCSP response covering certificate #{i} ({name})"),
                "none supplied",
            ));
        };
        let this_update = SystemTime::UNIX_EPOCH + single.this_update.0.to_unix_duration();
        let next_update = single.next_update.map(|n| SystemTime::UNIX_EPOCH + n.0.to_unix_duration());
        if this_update > now {
            return Err(failure(
                GpuError::OcspStale { cert: name.clone() },
                format!("an OCSP response for {name} issued before {}", fmt_time(now)),
                format!("thisUpdate {}", fmt_time(this_update)),
            ));
        }
        match next_update {
            Some(n) if n >= now => {}
            other => {
                return Err(failure(
                    GpuError::OcspStale { cert: name.clone() },
                    format!("a current OCSP response for {name} at {}", fmt_time(now)),
                    other.map_or("no nextUpdate".to_owned(), |n| format!("stale: nextUpdate {}", fmt_time(n))),
                ))
            }
        }
        match &single.cert_status {
            CertStatus::Good(_) => covered.push(name),
            CertStatus::Revoked(info) => {
                let reason = info.revocation_reason.map_or("unspecified".to_owned(), |r| format!("{r:?}"));
                return Err(failure(
                    GpuError::OcspRevoked { cert: name.clone(), reason: reason.clone() },
                    format!("{name} not revoked"),
                    format!(
                        "revoked at {} (reason {reason})",
                        fmt_time(SystemTime::UNIX_EPOCH + info.revocation_time.0.to_unix_duration())
                    ),
                ));
            }
            CertStatus::Unknown(_) => {
                return Err(failure(
                    GpuError::RevocationUnavailable,
                    format!("OCSP status good for {name}"),
                    "status unknown",
                ))
            }
        }
    }
    Ok(format!("OCSP status good and current for {}", covered.join(", ")))
}
