//! The GPU device certificate chain: five certificates, leaf first, ending
//! at the NVIDIA Device Identity CA, and the FWID in the leaf's DICE
//! TcbInfo extension (TCG DICE Attestation Architecture, OID 2.23.133.5.4.1).

use std::time::SystemTime;

use const_oid::ObjectIdentifier;

use crate::invalid::{InvalidValue, ValueKind};
use crate::x509::{fmt_time, CertError, ParsedCert};

/// The NVIDIA Device Identity CA (self-signed, ECDSA P-384), as pinned by
/// NVIDIA's own verifiers (nvtrust `verifier_device_root.pem`). A public certificate.
pub const NVIDIA_DEVICE_IDENTITY_CA_PEM: &str = include_str!("roots/nvidia_device_identity_ca.pem");
/// Number of certificates in a Hopper device chain.
pub const CHAIN_LEN: usize = 5;
/// Most certificates accepted before refusing the chain.
pub const MAX_CHAIN_CERTS: usize = 8;
/// TCG DICE TcbInfo extension.
pub const DICE_TCB_INFO: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.23.133.5.4.1");
/// `id-sha384` (NIST).
const SHA384_OID: &[u8] = &[0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x02];

/// The pinned NVIDIA device root.
pub fn nvidia_device_root() -> Result<ParsedCert, CertError> {
    ParsedCert::from_pem(NVIDIA_DEVICE_IDENTITY_CA_PEM.as_bytes())
}

/// Why the device chain is not acceptable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChainError {
    /// A certificate does not parse.
    #[error("certificate #{index} does not parse: {reason}")]
    Malformed {
        /// Position (0 = leaf).
        index: usize,
        /// Parser message.
        reason: String,
    },
    /// Not the expected number of certificates.
    #[error("chain has {got} certificates, expected {expected} (leaf → … → NVIDIA Device Identity CA)")]
    WrongLength {
        /// Certificates supplied.
        got: usize,
        /// Expected.
        expected: usize,
    },
    /// A certificate is not issued by the next one (out of order or foreign).
    #[error("certificate #{index} ({subject}) is not issued by certificate #{next} ({issuer}): {reason}")]
    NotIssuedByNext {
        /// Position of the child.
        index: usize,
        /// Position of the supposed issuer.
        next: usize,
        /// Child subject.
        subject: String,
        /// Supposed issuer subject.
        issuer: String,
        /// Name mismatch or signature failure.
        reason: String,
    },
    /// The last certificate is not the pinned root.
    #[error("chain ends at {got:?}, not the pinned root {pinned:?}")]
    UntrustedRoot {
        /// Subject of the chain's top.
        got: String,
        /// Subject of the pinned root.
        pinned: String,
    },
    /// A certificate is outside its validity period.
    #[error("certificate #{index} ({subject}) is not valid at {at}: {reason}")]
    Validity {
        /// Position.
        index: usize,
        /// Subject.
        subject: String,
        /// Verification time.
        at: String,
        /// Expired / not yet valid.
        reason: String,
    },
    /// An intermediate is not a CA.
    #[error("certificate #{index} ({subject}) issues certificates but is not a CA")]
    NotCa {
        /// Position.
        index: usize,
        /// Subject.
        subject: String,
    },
}

/// Parses a PEM bundle (leaf first) into certificates.
pub fn parse_chain_pem(pem: &[u8]) -> Result<Vec<ParsedCert>, ChainError> {
    let certs =
        ParsedCert::chain_from_pem(pem).map_err(|e| ChainError::Malformed { index: 0, reason: e.to_string() })?;
    if certs.len() > MAX_CHAIN_CERTS {
        return Err(ChainError::WrongLength { got: certs.len(), expected: CHAIN_LEN });
    }
    Ok(certs)
}

/// Parses DER certificates (leaf first).
pub fn parse_chain_der(ders: &[Vec<u8>]) -> Result<Vec<ParsedCert>, ChainError> {
    if ders.len() > MAX_CHAIN_CERTS {
        return Err(ChainError::WrongLength { got: ders.len(), expected: CHAIN_LEN });
    }
    ders.iter()
        .enumerate()
        .map(|(index, d)| ParsedCert::from_der(d).map_err(|e| ChainError::Malformed { index, reason: e.to_string() }))
        .collect()
}

fn is_ca(cert: &ParsedCert) -> bool {
    use der::Decode;
    let bc = ObjectIdentifier::new_unwrap("2.5.29.19");
    match cert.extension(bc) {
        Ok(Some(v)) => x509_cert::ext::pkix::BasicConstraints::from_der(v).map(|b| b.ca).unwrap_or(false),
        _ => false,
    }
}

/// Verifies `chain` (leaf first) up to `root`: exact length, each certificate
/// issued (name and signature) by the next, intermediates are CAs, the top
/// equals the pinned root byte for byte, every certificate valid at `now`.
pub fn verify_chain(chain: &[ParsedCert], root: &ParsedCert, now: SystemTime) -> Result<String, ChainError> {
    if chain.len() != CHAIN_LEN {
        return Err(ChainError::WrongLength { got: chain.len(), expected: CHAIN_LEN });
    }
    for (index, pair) in chain.windows(2).enumerate() {
        let (child, parent) = (&pair[0], &pair[1]);
        let err = |reason: String| ChainError::NotIssuedByNext {
            index,
            next: index + 1,
            subject: child.subject_string(),
            issuer: parent.subject_string(),
            reason,
        };
        if !child.issued_by_name(parent) {
            return Err(err("issuer name differs".into()));
        }
        child.verify_signed_by(parent).map_err(|e| err(e.to_string()))?;
        if !is_ca(parent) {
            return Err(ChainError::NotCa { index: index + 1, subject: parent.subject_string() });
        }
    }
    let top = &chain[CHAIN_LEN - 1];
    if top.der() != root.der() {
        return Err(ChainError::UntrustedRoot { got: top.subject_string(), pinned: root.subject_string() });
    }
    top.verify_signed_by(root).map_err(|e| ChainError::NotIssuedByNext {
        index: CHAIN_LEN - 1,
        next: CHAIN_LEN - 1,
        subject: top.subject_string(),
        issuer: root.subject_string(),
        reason: format!("root self-signature: {e}"),
    })?;
    for (index, cert) in chain.iter().enumerate() {
        cert.check_validity(now).map_err(|reason| ChainError::Validity {
            index,
            subject: cert.subject_string(),
            at: fmt_time(now),
            reason: reason.to_string(),
        })?;
    }
    let names: Vec<String> = chain.iter().map(|c| c.common_name().unwrap_or_default()).collect();
    Ok(names.join(" → "))
}

/// Collects every `SEQUENCE { OID sha384, OCTET STRING (48) }` (an FWID)
/// anywhere in the DER tree, to a bounded depth.
fn collect_fwids<'a>(content: &'a [u8], depth: usize, out: &mut Vec<&'a [u8]>) {
    if depth > 8 {
        return;
    }
    let Some(kids) = crate::x509::der_children(content) else { return };
    if let [(0x06, oid), (0x04, digest)] = kids.as_slice() {
        if *oid == SHA384_OID && digest.len() == 48 {
            out.push(digest);
            return;
        }
    }
    for (tag, value) in kids {
        // Constructed elements (SEQUENCE, SET, context-specific constructed).
        if tag & 0x20 != 0 {
            collect_fwids(value, depth + 1, out);
        }
    }
}

/// The SHA-384 FWID in a certificate's DICE TcbInfo extension.
pub fn leaf_fwid(cert: &ParsedCert) -> Result<Vec<u8>, InvalidValue> {
    let bad = |reason: String| InvalidValue::new(ValueKind::DiceTcbInfo, reason);
    let ext = cert
        .extension(DICE_TCB_INFO)
        .map_err(|e| bad(e.to_string()))?
        .ok_or_else(|| bad("no DICE TcbInfo extension (2.23.133.5.4.1)".into()))?;
    let (tag, content, used) = crate::x509::der_tlv(ext).ok_or_else(|| bad("TcbInfo is not DER".into()))?;
    if tag != 0x30 || used != ext.len() {
        return Err(bad("TcbInfo is not one DER SEQUENCE".into()));
    }
    let mut found = Vec::new();
    collect_fwids(content, 0, &mut found);
    found.dedup();
    match found.as_slice() {
        [one] => Ok(one.to_vec()),
        [] => Err(bad("TcbInfo carries no SHA-384 FWID".into())),
        many => Err(bad(format!("TcbInfo carries {} different SHA-384 FWIDs", many.len()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_root_parses_and_is_self_signed() {
        let root = nvidia_device_root().unwrap();
        assert_eq!(root.common_name().as_deref(), Some("NVIDIA Device Identity CA"));
        root.verify_signed_by(&root).unwrap();
        assert!(is_ca(&root));
    }

    #[test]
    fn tlv_refuses_overruns() {
        assert!(crate::x509::der_tlv(&[0x30, 0x05, 1, 2]).is_none());
        assert!(crate::x509::der_tlv(&[0x30, 0x84, 0, 0, 0, 1]).is_none());
        assert!(crate::x509::der_tlv(&[0x30]).is_none());
        assert_eq!(crate::x509::der_tlv(&[0x04, 0x01, 9]).map(|t| t.2), Some(3));
    }
}
