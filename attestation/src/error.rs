//! One public error type, sorted by who is to blame.

use std::fmt;

use crate::azure::error::{AzureCheckReport, AzureError};
use crate::check::{CheckId, CheckReport};
use crate::gpu::error::GpuError;
use crate::gpu::report::GpuAppraisal;
use crate::tdx::error::{TdxCheckReport, TdxError};

/// Errors of `veil-attestation`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Bytes that do not parse (bundle JSON, base64, sizes).
    #[error("malformed evidence: {0}")]
    Malformed(#[from] Malformed),
    /// A named verification check failed (SNP, a GPU's, or the GPU set):
    /// the evidence is refused.
    #[error("{0}")]
    Rejected(Box<Rejection>),
    /// The peer did something only an attacker or a broken peer does
    /// (for example a channel-binding signature that does not verify).
    #[error("peer misbehaved: {0}")]
    PeerMisbehaved(String),
    /// The caller used the API wrongly (bad policy, bad arguments).
    #[error("API misuse: {0}")]
    ApiMisuse(String),
    /// Hardware or OS failure while collecting evidence.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// A copy of this error (I/O errors keep their kind and message).
    pub fn duplicate(&self) -> Self {
        match self {
            Self::Malformed(m) => Self::Malformed(m.clone()),
            Self::Rejected(r) => Self::Rejected(r.clone()),
            Self::PeerMisbehaved(s) => Self::PeerMisbehaved(s.clone()),
            Self::ApiMisuse(s) => Self::ApiMisuse(s.clone()),
            Self::Io(e) => Self::Io(std::io::Error::new(e.kind(), e.to_string())),
        }
    }

    /// The failed check, if this is a rejection (GPU checks are
    /// [`CheckId::Gpu`], the GPU set [`CheckId::GpuSet`]).
    pub fn check(&self) -> Option<CheckId> {
        match self {
            Self::Rejected(r) => Some(r.check),
            _ => None,
        }
    }
}

/// A failed check with the values compared, plus the full tables: one shape
/// for SNP checks, GPU checks and the GPU set.
#[derive(Clone, Debug)]
pub struct Rejection {
    /// The first check that failed, in verification order.
    pub check: CheckId,
    /// What the policy or the binding required.
    pub expected: String,
    /// What the evidence showed.
    pub actual: String,
    /// The SNP table (empty when only GPU evidence was verified).
    pub report: CheckReport,
    /// For a GPU check or the GPU set: which GPU, the typed reason, every GPU table.
    pub gpu: Option<GpuFailure>,
    /// For a TDX check: the typed reason and the TDX table.
    pub tdx: Option<TdxFailure>,
    /// For an Azure check: the typed reason and the Azure table (the SNP
    /// table of the report inside is `report`).
    pub azure: Option<AzureFailure>,
}

/// The Azure side of a [`Rejection`].
#[derive(Clone, Debug)]
pub struct AzureFailure {
    /// Typed reason.
    pub error: AzureError,
    /// The Azure table.
    pub table: AzureCheckReport,
}

/// The TDX side of a [`Rejection`].
#[derive(Clone, Debug)]
pub struct TdxFailure {
    /// Typed reason.
    pub error: TdxError,
    /// The TDX table.
    pub table: TdxCheckReport,
}

/// The GPU side of a [`Rejection`].
#[derive(Clone, Debug)]
pub struct GpuFailure {
    /// The GPU's index in the shard's evidence (`None` for the set).
    pub index: Option<u32>,
    /// Typed reason.
    pub error: GpuError,
    /// Every GPU table.
    pub appraisal: GpuAppraisal,
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let (Some(t), CheckId::Tdx(c)) = (&self.tdx, self.check) {
            return write!(
                f,
                "TDX quote rejected by check `{c}` ({}): expected {}, got {}",
                t.error, self.expected, self.actual
            );
        }
        if let (Some(a), CheckId::Azure(c)) = (&self.azure, self.check) {
            return write!(
                f,
                "Azure evidence rejected by check `{c}` ({}): expected {}, got {}",
                a.error, self.expected, self.actual
            );
        }
        match (&self.gpu, self.check) {
            (Some(GpuFailure { index: Some(i), error, .. }), CheckId::Gpu(c)) => {
                write!(f, "GPU {i} rejected by check `{c}` ({error}): expected {}, got {}", self.expected, self.actual)
            }
            (Some(g), _) => {
                write!(f, "GPU evidence rejected ({}): expected {}, got {}", g.error, self.expected, self.actual)
            }
            (None, check) => {
                write!(f, "attestation rejected by check `{check}`: expected {}, got {}", self.expected, self.actual)
            }
        }
    }
}

/// Evidence bytes that do not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Malformed {
    /// Bundle larger than its limit.
    #[error("bundle of {actual} bytes exceeds the {limit}-byte limit")]
    TooLarge {
        /// Size received.
        actual: usize,
        /// Limit.
        limit: usize,
    },
    /// A field larger than its limit.
    #[error("field `{field}` exceeds its limit of {limit}")]
    FieldTooLarge {
        /// Field name.
        field: &'static str,
        /// Limit (bytes, or entries for lists).
        limit: usize,
    },
    /// Not JSON, or not the bundle schema.
    #[error("bundle is not valid JSON of the expected shape: {0}")]
    Json(String),
    /// Bundle version we do not speak.
    #[error("bundle version {actual} is not supported (this verifier speaks {supported})")]
    UnsupportedVersion {
        /// Version in the bundle.
        actual: u32,
        /// Version we speak.
        supported: u32,
    },
    /// A base64 field does not decode.
    #[error("field `{field}` is not base64: {reason}")]
    Base64 {
        /// Field name.
        field: &'static str,
        /// Decoder message.
        reason: String,
    },
    /// A certificate extension carrying evidence is malformed.
    #[error("RA-TLS certificate: {0}")]
    Certificate(String),
    /// A RIM the bundle carries (`gpu_rims`) is not a RIM.
    #[error("gpu_rims[{index}] is not a RIM: {reason}")]
    CarriedRim {
        /// Position in `gpu_rims`.
        index: usize,
        /// The parser's message.
        reason: String,
    },
}
