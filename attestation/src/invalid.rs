//! The error of value parsers and constructors: a leaf module (it imports
//! nothing from this crate), so claims, routes, receipts and versions use it
//! without an edge back to [`crate::error`].

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
        }
    }
}
