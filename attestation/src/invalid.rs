//! The errors of value parsers, constructors and policy files: a leaf
//! module (it imports nothing from this crate), so claims, routes,
//! receipts, versions and each platform's policy section use them without
//! an edge back to [`crate::error`] or [`crate::policy`].

use std::fmt;

/// A value that the API refuses, named by kind, with the reason for people.
/// The parsers and constructors of claims, route shapes and documents,
/// receipt keys, nonce batches, endorsement keys and GPU version strings
/// return it; match on [`InvalidValue::what`], never on the text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what}: {reason}")]
pub struct InvalidValue {
    /// Which value.
    pub what: ValueKind,
    /// Why, in words.
    pub reason: String,
}

impl InvalidValue {
    /// `what` refused for `reason`.
    pub fn new(what: ValueKind, reason: impl Into<String>) -> Self {
        Self { what, reason: reason.into() }
    }
}

/// The kinds of value [`InvalidValue`] names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ValueKind {
    /// `REPORT_DATA` typed by a reviewer (hex, 1..=64 bytes).
    ReportData,
    /// A digest or key field of the claims (the type's name).
    Digest(&'static str),
    /// A verifier's nonce (1..=64 bytes).
    Nonce,
    /// A layer range `[start, end)`.
    LayerRange,
    /// The claims as a whole (their canonical encoding).
    Claims,
    /// A route's shape (stages, layers, activation encoding).
    RouteShape,
    /// An entry's attestation document.
    AttestationDocument,
    /// A receipt-signing key.
    ReceiptKey,
    /// A batch nonce's membership proof.
    NonceBatch,
    /// A VCEK or VLEK endorsement certificate.
    Endorsement,
    /// A GPU driver or VBIOS version string.
    GpuVersion,
    /// An SEV-SNP ABI version (`MAJOR.MINOR`).
    AbiVersion,
    /// A TDX measurement register (48 bytes, hex).
    TdxRegister,
    /// The SGX extension of an Intel PCK certificate (FMSPC, PCE ID, TCB).
    PckExtension,
    /// An RSA attestation key (the vTPM's AK, as a JWK or an SPKI).
    AttestationKey,
    /// The DICE TcbInfo extension of a GPU certificate (its SHA-384 FWID).
    DiceTcbInfo,
}

impl fmt::Display for ValueKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ReportData => f.write_str("report data"),
            Self::Digest(name) => write!(f, "{name}"),
            Self::Nonce => f.write_str("nonce"),
            Self::LayerRange => f.write_str("layer range"),
            Self::Claims => f.write_str("claims"),
            Self::RouteShape => f.write_str("route shape"),
            Self::AttestationDocument => f.write_str("attestation document"),
            Self::ReceiptKey => f.write_str("receipt key"),
            Self::NonceBatch => f.write_str("nonce batch"),
            Self::Endorsement => f.write_str("endorsement"),
            Self::GpuVersion => f.write_str("GPU version"),
            Self::AbiVersion => f.write_str("ABI version"),
            Self::TdxRegister => f.write_str("TDX register"),
            Self::PckExtension => f.write_str("PCK SGX extension"),
            Self::AttestationKey => f.write_str("attestation key"),
            Self::DiceTcbInfo => f.write_str("DICE TcbInfo"),
        }
    }
}

/// Why a policy file (or one platform's section of it) was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// Not valid TOML or not the policy schema.
    #[error("policy is not valid: {0}")]
    Parse(String),
    /// Values contradict each other.
    #[error("policy is inconsistent: {0}")]
    Inconsistent(String),
}

impl PolicyError {
    /// The same refusal, naming the section (`[tdx]`) it came from.
    pub fn within(self, section: &str) -> Self {
        match self {
            Self::Parse(why) => Self::Parse(format!("{section} {why}")),
            Self::Inconsistent(why) => Self::Inconsistent(format!("{section} {why}")),
        }
    }
}
