//! Why a TDX check failed: shared by the crate's error, the TDX table and
//! its checker; depends only on the quote and collateral parsers.

use super::collateral::{CollateralError, TcbStatus};
use super::quote::QuoteError;
use crate::check::{CheckRow, CheckTable, TdxCheckId};

/// Why a TDX check failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TdxError {
    /// The quote does not parse.
    #[error("malformed TDX quote: {0}")]
    Quote(#[from] QuoteError),
    /// The collateral does not parse.
    #[error("malformed TDX collateral: {0}")]
    Collateral(#[from] CollateralError),
    /// A certificate chain (PCK, TCB signing, QE identity signing) is not acceptable.
    #[error("{which} chain: {reason}")]
    Chain {
        /// Which chain.
        which: &'static str,
        /// Why.
        reason: String,
    },
    /// A CRL is unusable (wrong issuer, bad signature, not current).
    #[error("{which}: {reason}")]
    CrlUnusable {
        /// Which CRL.
        which: &'static str,
        /// Why.
        reason: String,
    },
    /// A CRL lists a certificate of the PCK chain.
    #[error("{cert} is revoked by the {which}")]
    Revoked {
        /// Certificate common name.
        cert: String,
        /// Which CRL.
        which: &'static str,
    },
    /// A signature does not verify.
    #[error("the {0} signature does not verify")]
    BadSignature(&'static str),
    /// A signed collateral document is not current at the verification time.
    #[error("the {what} is not current: {reason}")]
    Stale {
        /// Which document.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// A signed collateral document is for something else (other FMSPC, PCE ID, id, version).
    #[error("the {what} does not apply to this quote: {reason}")]
    WrongCollateral {
        /// Which document.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// The QE report does not commit to the attestation key.
    #[error("the QE report does not commit to the attestation key and QE auth data")]
    QeReportDataMismatch,
    /// The QE report differs from the QE identity.
    #[error("the quoting enclave is not Intel's TD QE: {0}")]
    QeIdentityMismatch(String),
    /// The TDX module is not the one the TCB info names.
    #[error("the TDX module differs from the TCB info's identity: {0}")]
    ModuleMismatch(String),
    /// No TCB level matches: the platform is behind every level.
    #[error("no TCB level matches: {0}")]
    NoTcbLevel(String),
    /// The TCB status or an advisory is not accepted by policy.
    #[error("TCB status {status} is not accepted{}", advisories_note(.advisories))]
    TcbStatusRefused {
        /// The combined status.
        status: TcbStatus,
        /// Advisories the policy does not accept.
        advisories: Vec<String>,
    },
    /// The TD is debuggable.
    #[error("the TD is debuggable (TDATTRIBUTES.DEBUG)")]
    Debug,
    /// A TD attribute is not as policy requires.
    #[error("TD attribute {0} is not as policy requires")]
    Attribute(&'static str),
    /// A service TD is bound to this TD.
    #[error("a service TD is bound (MRSERVICETD is not zero)")]
    ServiceTd,
    /// A measurement register differs from policy.
    #[error("{0} is not allowed by policy")]
    Measurement(&'static str),
    /// `REPORTDATA` differs from what the relying party expects.
    #[error("REPORTDATA differs from the expected value")]
    ReportDataMismatch,
}

fn advisories_note(a: &[String]) -> String {
    if a.is_empty() {
        String::new()
    } else {
        format!(" (advisories not accepted: {})", a.join(", "))
    }
}

/// A row of a TDX table.
pub type TdxCheckResult = CheckRow<TdxCheckId, TdxError>;
/// A TDX table.
pub type TdxCheckReport = CheckTable<TdxCheckId, TdxError>;
