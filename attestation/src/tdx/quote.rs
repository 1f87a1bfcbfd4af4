//! The Intel TDX quote, versions 4 and 5 (Intel's "TDX DCAP Quote Generation
//! Library and Quote Verification Library" layout), parsed with every length
//! checked: a header, a TD report (TD 1.0, or TD 1.5 in a v5 body), the
//! attestation key's ECDSA signature over both, and the certification data
//! that chains that key to Intel (the QE report, its PCK signature, the QE
//! authentication data and the PCK certificate chain).
//!
//! ```text
//!  0     header (48)             version, key type 2 (ECDSA P-256), TEE 0x81, QE vendor
//!  48    [v5: type u16, size u32] TD report 1.0 (584) | 1.5 (648)
//!  …     u32 signature data length
//!        signature (64) ‖ attestation key (64)
//!        u16 type 6, u32 size:  QE report (384) ‖ its signature (64)
//!                               u16 size ‖ QE auth data
//!                               u16 type 5, u32 size ‖ PCK chain (PEM)
//! ```
//!
//! Nothing here judges anything: [`super::verify`] does.

use std::fmt;

/// Largest quote this parser reads (real ones are about 5 KB).
pub const MAX_QUOTE_BYTES: usize = 64 * 1024;
/// Largest PCK chain (PEM) inside a quote.
pub const MAX_PCK_CHAIN_BYTES: usize = 16 * 1024;
/// The header's length.
pub const HEADER_LEN: usize = 48;
/// A TD 1.0 report body's length.
pub const TD10_LEN: usize = 584;
/// A TD 1.5 report body's length.
pub const TD15_LEN: usize = 648;
/// An SGX report body's length (the QE report).
pub const QE_REPORT_LEN: usize = 384;
/// The attestation key type this verifier speaks: ECDSA-256 with P-256.
pub const ATT_KEY_ECDSA_P256: u16 = 2;
/// The TEE type of a TDX quote.
pub const TEE_TDX: u32 = 0x81;
/// Intel's QE vendor ID.
pub const INTEL_QE_VENDOR_ID: [u8; 16] =
    [0x93, 0x9a, 0x72, 0x33, 0xf7, 0x9c, 0x4c, 0xa9, 0x94, 0x0a, 0x0d, 0xb3, 0x95, 0x7f, 0x06, 0x07];
/// Certification data type: the QE report certification data.
const CERT_QE_REPORT: u16 = 6;
/// Certification data type: the PCK leaf, intermediate and root, PEM.
const CERT_PCK_CHAIN: u16 = 5;

/// Why quote bytes do not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuoteError {
    /// Fewer bytes than a field needs.
    #[error("quote truncated: {field} needs {needed} bytes at offset {offset}, {available} available")]
    Truncated {
        /// The field being read.
        field: &'static str,
        /// Its offset.
        offset: usize,
        /// Bytes it needs.
        needed: usize,
        /// Bytes there are.
        available: usize,
    },
    /// Larger than [`MAX_QUOTE_BYTES`] or a field's own limit.
    #[error("{field} of {actual} bytes exceeds its {limit}-byte limit")]
    TooLarge {
        /// Which.
        field: &'static str,
        /// Size.
        actual: usize,
        /// Limit.
        limit: usize,
    },
    /// A field holds a value this verifier does not speak.
    #[error("{field} is {actual}, expected {expected}")]
    Unsupported {
        /// Which field.
        field: &'static str,
        /// What was there.
        actual: String,
        /// What this verifier speaks.
        expected: &'static str,
    },
    /// Bytes after the last field of a length-delimited structure.
    #[error("{0} trailing bytes inside the signature data")]
    Trailing(usize),
}

/// The quote header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// 4 or 5.
    pub version: u16,
    /// [`ATT_KEY_ECDSA_P256`].
    pub att_key_type: u16,
    /// [`TEE_TDX`].
    pub tee_type: u32,
    /// The QE vendor ([`INTEL_QE_VENDOR_ID`]).
    pub qe_vendor_id: [u8; 16],
    /// Opaque to the verifier.
    pub user_data: [u8; 20],
}

/// A TD report body: TD 1.0, plus the two TD 1.5 fields when the quote has them.
#[derive(Clone, PartialEq, Eq)]
pub struct TdReport {
    /// `TEE_TCB_SVN`: the TDX module's SVN (byte 0), its major version
    /// (byte 1), then the components the TCB info's `tdxtcbcomponents` rate.
    pub tee_tcb_svn: [u8; 16],
    /// `MRSEAM`: the TDX module's measurement.
    pub mr_seam: [u8; 48],
    /// `MRSIGNERSEAM`: its signer (zero for Intel's).
    pub mr_signer_seam: [u8; 48],
    /// `SEAMATTRIBUTES`.
    pub seam_attributes: [u8; 8],
    /// `TDATTRIBUTES` (little-endian bits: 0 DEBUG, 28 SEPT_VE_DISABLE, 30 PKS, 31 KL, 63 PERFMON).
    pub td_attributes: [u8; 8],
    /// `XFAM`.
    pub xfam: [u8; 8],
    /// `MRTD`: the initial TD contents (firmware).
    pub mr_td: [u8; 48],
    /// `MRCONFIGID`.
    pub mr_config_id: [u8; 48],
    /// `MROWNER`.
    pub mr_owner: [u8; 48],
    /// `MROWNERCONFIG`.
    pub mr_owner_config: [u8; 48],
    /// `RTMR0`..`RTMR3`.
    pub rtmr: [[u8; 48]; 4],
    /// `REPORTDATA`: what the TD asked to be signed.
    pub report_data: [u8; 64],
    /// TD 1.5 only: `TEE_TCB_SVN2`.
    pub tee_tcb_svn2: Option<[u8; 16]>,
    /// TD 1.5 only: `MRSERVICETD`.
    pub mr_service_td: Option<[u8; 48]>,
}

impl fmt::Debug for TdReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TdReport")
            .field("tee_tcb_svn", &hex::encode(self.tee_tcb_svn))
            .field("mr_td", &hex::encode(self.mr_td))
            .field("td_attributes", &hex::encode(self.td_attributes))
            .finish_non_exhaustive()
    }
}

/// The QE's SGX report body (384 bytes), with the fields the verifier reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QeReport {
    /// The raw bytes the PCK key signed.
    pub raw: [u8; QE_REPORT_LEN],
    /// `MISCSELECT`.
    pub misc_select: u32,
    /// `ATTRIBUTES` (16 bytes; bit 1 of byte 0 is DEBUG).
    pub attributes: [u8; 16],
    /// `MRENCLAVE`.
    pub mr_enclave: [u8; 32],
    /// `MRSIGNER`.
    pub mr_signer: [u8; 32],
    /// `ISVPRODID`.
    pub isv_prod_id: u16,
    /// `ISVSVN`.
    pub isv_svn: u16,
    /// `REPORTDATA`: SHA-256(attestation key ‖ QE auth data) ‖ 32 zero bytes.
    pub report_data: [u8; 64],
}

/// A parsed TDX quote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quote {
    /// The header.
    pub header: Header,
    /// The v5 body type (2: TD 1.0, 3: TD 1.5); `None` in a v4 quote.
    pub body_type: Option<u16>,
    /// The TD report.
    pub report: TdReport,
    /// How many leading bytes the attestation key signed (header and body).
    pub signed_len: usize,
    /// ECDSA P-256 signature (R ‖ S) over the first `signed_len` bytes.
    pub signature: [u8; 64],
    /// The attestation key (X ‖ Y).
    pub attestation_key: [u8; 64],
    /// The QE report.
    pub qe_report: QeReport,
    /// The PCK key's signature (R ‖ S) over the QE report.
    pub qe_report_signature: [u8; 64],
    /// The QE authentication data.
    pub qe_auth_data: Vec<u8>,
    /// The PCK certificate chain, PEM (leaf, intermediate CA, root).
    pub pck_chain_pem: Vec<u8>,
    /// Bytes after the signature data (padding; signed by nothing).
    pub trailing: Vec<u8>,
}

/// A bounded little-endian reader that names what it failed to read.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, field: &'static str, n: usize) -> Result<&'a [u8], QuoteError> {
        let available = self.bytes.len().saturating_sub(self.at);
        if n > available {
            return Err(QuoteError::Truncated { field, offset: self.at, needed: n, available });
        }
        let out = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }
    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], QuoteError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(field, N)?);
        Ok(out)
    }
    fn u16(&mut self, field: &'static str) -> Result<u16, QuoteError> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }
    fn u32(&mut self, field: &'static str) -> Result<u32, QuoteError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }
    /// A sub-cursor over the next `n` bytes.
    fn sub(&mut self, field: &'static str, n: usize) -> Result<Cursor<'a>, QuoteError> {
        Ok(Cursor { bytes: self.take(field, n)?, at: 0 })
    }
    fn rest(&self) -> usize {
        self.bytes.len() - self.at
    }
}

impl Quote {
    /// Parses a quote's raw bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self, QuoteError> {
        if bytes.len() > MAX_QUOTE_BYTES {
            return Err(QuoteError::TooLarge { field: "quote", actual: bytes.len(), limit: MAX_QUOTE_BYTES });
        }
        let mut c = Cursor { bytes, at: 0 };
        let header = parse_header(&mut c)?;
        let (body_type, body_len) = match header.version {
            4 => (None, TD10_LEN),
            _ => {
                let ty = c.u16("body type")?;
                let size = c.u32("body size")? as usize;
                let want = match ty {
                    2 => TD10_LEN,
                    3 => TD15_LEN,
                    other => {
                        return Err(QuoteError::Unsupported {
                            field: "body type",
                            actual: other.to_string(),
                            expected: "2 (TD 1.0) or 3 (TD 1.5)",
                        })
                    }
                };
                if size != want {
                    return Err(QuoteError::Unsupported {
                        field: "body size",
                        actual: size.to_string(),
                        expected: "584 (TD 1.0) or 648 (TD 1.5), as its type says",
                    });
                }
                (Some(ty), want)
            }
        };
        let report = parse_td_report(&mut c.sub("TD report", body_len)?, body_len == TD15_LEN)?;
        let signed_len = c.at;
        let sig_len = c.u32("signature data length")? as usize;
        let mut s = c.sub("signature data", sig_len)?;
        // Quote buffers from the quoting service are often padded: bytes
        // after the signature data are outside every signature and ignored
        // (the format check reports them).
        let trailing = bytes[c.at..].to_vec();
        let signature = s.array("quote signature")?;
        let attestation_key = s.array("attestation key")?;
        let cert_type = s.u16("certification data type")?;
        if cert_type != CERT_QE_REPORT {
            return Err(QuoteError::Unsupported {
                field: "certification data type",
                actual: cert_type.to_string(),
                expected: "6 (QE report certification data)",
            });
        }
        let cert_len = s.u32("certification data size")? as usize;
        let mut q = s.sub("QE report certification data", cert_len)?;
        if s.rest() != 0 {
            return Err(QuoteError::Trailing(s.rest()));
        }
        let qe_report = parse_qe_report(q.array("QE report")?);
        let qe_report_signature = q.array("QE report signature")?;
        let auth_len = usize::from(q.u16("QE auth data size")?);
        let qe_auth_data = q.take("QE auth data", auth_len)?.to_vec();
        let inner_type = q.u16("PCK certification data type")?;
        if inner_type != CERT_PCK_CHAIN {
            return Err(QuoteError::Unsupported {
                field: "PCK certification data type",
                actual: inner_type.to_string(),
                expected: "5 (PCK certificate chain, PEM)",
            });
        }
        let chain_len = q.u32("PCK chain size")? as usize;
        if chain_len > MAX_PCK_CHAIN_BYTES {
            return Err(QuoteError::TooLarge { field: "PCK chain", actual: chain_len, limit: MAX_PCK_CHAIN_BYTES });
        }
        let pck_chain_pem = q.take("PCK chain", chain_len)?.to_vec();
        if q.rest() != 0 {
            return Err(QuoteError::Trailing(q.rest()));
        }
        Ok(Self {
            header,
            body_type,
            report,
            signed_len,
            signature,
            attestation_key,
            qe_report,
            qe_report_signature,
            qe_auth_data,
            pck_chain_pem,
            trailing,
        })
    }

    /// Whether the body is a TD 1.5 report.
    pub fn is_td15(&self) -> bool {
        self.report.mr_service_td.is_some()
    }
}

fn parse_header(c: &mut Cursor<'_>) -> Result<Header, QuoteError> {
    let version = c.u16("version")?;
    if !matches!(version, 4 | 5) {
        return Err(QuoteError::Unsupported { field: "version", actual: version.to_string(), expected: "4 or 5" });
    }
    let att_key_type = c.u16("attestation key type")?;
    if att_key_type != ATT_KEY_ECDSA_P256 {
        return Err(QuoteError::Unsupported {
            field: "attestation key type",
            actual: att_key_type.to_string(),
            expected: "2 (ECDSA-256 with P-256)",
        });
    }
    let tee_type = c.u32("TEE type")?;
    if tee_type != TEE_TDX {
        return Err(QuoteError::Unsupported {
            field: "TEE type",
            actual: format!("{tee_type:#x}"),
            expected: "0x81 (TDX)",
        });
    }
    c.take("reserved", 4)?;
    let qe_vendor_id = c.array("QE vendor ID")?;
    let user_data = c.array("user data")?;
    Ok(Header { version, att_key_type, tee_type, qe_vendor_id, user_data })
}

fn parse_td_report(c: &mut Cursor<'_>, td15: bool) -> Result<TdReport, QuoteError> {
    let mut r = TdReport {
        tee_tcb_svn: c.array("TEE_TCB_SVN")?,
        mr_seam: c.array("MRSEAM")?,
        mr_signer_seam: c.array("MRSIGNERSEAM")?,
        seam_attributes: c.array("SEAMATTRIBUTES")?,
        td_attributes: c.array("TDATTRIBUTES")?,
        xfam: c.array("XFAM")?,
        mr_td: c.array("MRTD")?,
        mr_config_id: c.array("MRCONFIGID")?,
        mr_owner: c.array("MROWNER")?,
        mr_owner_config: c.array("MROWNERCONFIG")?,
        rtmr: [c.array("RTMR0")?, c.array("RTMR1")?, c.array("RTMR2")?, c.array("RTMR3")?],
        report_data: c.array("REPORTDATA")?,
        tee_tcb_svn2: None,
        mr_service_td: None,
    };
    if td15 {
        r.tee_tcb_svn2 = Some(c.array("TEE_TCB_SVN2")?);
        r.mr_service_td = Some(c.array("MRSERVICETD")?);
    }
    Ok(r)
}

fn parse_qe_report(raw: [u8; QE_REPORT_LEN]) -> QeReport {
    let field = |at: usize, n: usize| &raw[at..at + n];
    let mut attributes = [0u8; 16];
    attributes.copy_from_slice(field(48, 16));
    let mut mr_enclave = [0u8; 32];
    mr_enclave.copy_from_slice(field(64, 32));
    let mut mr_signer = [0u8; 32];
    mr_signer.copy_from_slice(field(128, 32));
    let mut report_data = [0u8; 64];
    report_data.copy_from_slice(field(320, 64));
    QeReport {
        misc_select: u32::from_le_bytes([raw[16], raw[17], raw[18], raw[19]]),
        attributes,
        mr_enclave,
        mr_signer,
        isv_prod_id: u16::from_le_bytes([raw[256], raw[257]]),
        isv_svn: u16::from_le_bytes([raw[258], raw[259]]),
        report_data,
        raw,
    }
}

/// What a `TDATTRIBUTES` word says, bit by bit (Intel TDX module ABI).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TdAttributes(pub u64);

impl TdAttributes {
    /// Bit 0: the TD is debuggable (the host can read its memory).
    pub const DEBUG: u64 = 1;
    /// Bit 28: EPT violations on pending pages do not become #VE in the TD
    /// (clear, the host can inject them).
    pub const SEPT_VE_DISABLE: u64 = 1 << 28;
    /// Bit 29 (TDX 1.5): the TD may be migrated, and a migration TD may export it.
    pub const MIGRATABLE: u64 = 1 << 29;
    /// Bit 30: protection keys for supervisor pages.
    pub const PKS: u64 = 1 << 30;
    /// Bit 31: key locker.
    pub const KL: u64 = 1 << 31;
    /// Bit 63: the TD may use performance monitoring.
    pub const PERFMON: u64 = 1 << 63;
    /// Every bit this verifier does not name (reserved in TDX 1.0, or
    /// defined by a later module).
    pub const UNNAMED: u64 =
        !(Self::DEBUG | Self::SEPT_VE_DISABLE | Self::MIGRATABLE | Self::PKS | Self::KL | Self::PERFMON);

    /// From the report's little-endian bytes.
    pub fn from_bytes(b: [u8; 8]) -> Self {
        Self(u64::from_le_bytes(b))
    }
    /// Whether `bit` is set.
    pub fn has(self, bit: u64) -> bool {
        self.0 & bit != 0
    }
    /// The named bits that are set, for a check table.
    pub fn names(self) -> String {
        let named = [
            (Self::DEBUG, "DEBUG"),
            (Self::SEPT_VE_DISABLE, "SEPT_VE_DISABLE"),
            (Self::MIGRATABLE, "MIGRATABLE"),
            (Self::PKS, "PKS"),
            (Self::KL, "KL"),
            (Self::PERFMON, "PERFMON"),
        ];
        let set: Vec<&str> = named.iter().filter(|(b, _)| self.has(*b)).map(|(_, n)| *n).collect();
        let mut out = if set.is_empty() { "none".to_owned() } else { set.join("|") };
        let unnamed = self.0 & Self::UNNAMED;
        if unnamed != 0 {
            out.push_str(&format!(" + unnamed {unnamed:#018x}"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A synthetic v4 quote with the given PCK chain and auth data; every
    /// other field is a counter pattern, so offsets are checkable.
    pub(crate) fn synthetic_v4(chain: &[u8]) -> Vec<u8> {
        let mut q = Vec::new();
        q.extend_from_slice(&4u16.to_le_bytes());
        q.extend_from_slice(&ATT_KEY_ECDSA_P256.to_le_bytes());
        q.extend_from_slice(&TEE_TDX.to_le_bytes());
        q.extend_from_slice(&[0; 4]);
        q.extend_from_slice(&INTEL_QE_VENDOR_ID);
        q.extend_from_slice(&[0; 20]);
        q.extend((0..TD10_LEN).map(|i| i as u8));
        let mut cert = vec![0xAB; QE_REPORT_LEN + 64];
        cert.extend_from_slice(&32u16.to_le_bytes());
        cert.extend_from_slice(&[7; 32]);
        cert.extend_from_slice(&CERT_PCK_CHAIN.to_le_bytes());
        cert.extend_from_slice(&(chain.len() as u32).to_le_bytes());
        cert.extend_from_slice(chain);
        let mut sig = vec![1; 64];
        sig.extend_from_slice(&[2; 64]);
        sig.extend_from_slice(&CERT_QE_REPORT.to_le_bytes());
        sig.extend_from_slice(&(cert.len() as u32).to_le_bytes());
        sig.extend_from_slice(&cert);
        q.extend_from_slice(&(sig.len() as u32).to_le_bytes());
        q.extend_from_slice(&sig);
        q
    }

    #[test]
    fn parses_a_v4_quote_at_the_documented_offsets() {
        let q = Quote::parse(&synthetic_v4(b"chain")).unwrap();
        assert_eq!(q.header.version, 4);
        assert_eq!(q.signed_len, HEADER_LEN + TD10_LEN);
        assert_eq!(q.report.tee_tcb_svn[0], 0);
        // MRTD sits after 16 + 48 + 48 + 8 + 8 + 8 bytes of the body.
        assert_eq!(q.report.mr_td[0], 136);
        assert_eq!(q.report.report_data[0], (TD10_LEN - 64) as u8);
        assert_eq!(q.qe_auth_data, vec![7; 32]);
        assert_eq!(q.pck_chain_pem, b"chain");
        assert!(!q.is_td15());
    }

    /// Every truncation is a typed error naming a field, never a panic.
    #[test]
    fn every_truncation_is_refused_by_name() {
        let q = synthetic_v4(b"chain");
        for n in 0..q.len() {
            match Quote::parse(&q[..n]) {
                Err(QuoteError::Truncated { .. }) => {}
                other => panic!("prefix of {n} bytes: {other:?}"),
            }
        }
        let mut long = q.clone();
        long.extend_from_slice(&[0, 0, 9]);
        assert_eq!(Quote::parse(&long).unwrap().trailing, vec![0, 0, 9]);
    }

    #[test]
    fn refuses_what_it_does_not_speak() {
        let q = synthetic_v4(b"chain");
        let edit = |at: usize, v: u8| {
            let mut b = q.clone();
            b[at] = v;
            Quote::parse(&b)
        };
        assert!(matches!(edit(0, 3), Err(QuoteError::Unsupported { field: "version", .. })));
        assert!(matches!(edit(2, 3), Err(QuoteError::Unsupported { field: "attestation key type", .. })));
        assert!(matches!(edit(4, 0), Err(QuoteError::Unsupported { field: "TEE type", .. })));
        let big = vec![0; MAX_QUOTE_BYTES + 1];
        assert!(matches!(Quote::parse(&big), Err(QuoteError::TooLarge { .. })));
    }

    #[test]
    fn names_td_attribute_bits() {
        let a = TdAttributes::from_bytes([1, 0, 0, 0x10, 0, 0, 0, 0x80]);
        assert_eq!(a.names(), "DEBUG|SEPT_VE_DISABLE|PERFMON");
        assert!(TdAttributes(1 << 40).names().contains("unnamed"));
    }
}
