//! Why an Azure check failed: shared by the crate's error, the Azure table
//! and its checker; depends only on the HCL and TPM parsers.

use super::hcl::HclError;
use super::tpm::TpmError;
use crate::check::{AzureCheckId, CheckRow, CheckTable};

/// Why an Azure check failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AzureError {
    /// The HCL report does not parse.
    #[error("malformed HCL report: {0}")]
    Hcl(#[from] HclError),
    /// The TPM quote does not parse.
    #[error("malformed TPM quote: {0}")]
    Tpm(#[from] TpmError),
    /// The SNP report inside the HCL report was refused by an SNP check.
    #[error("the SNP report inside the HCL report is refused by `{0}`")]
    SnpRejected(String),
    /// An HCL report came without the VCEK that endorses its SNP report.
    #[error("no endorsement (VCEK) for the SNP report inside the HCL report")]
    NoEndorsement,
    /// REPORT_DATA does not commit to the runtime claims.
    #[error("REPORT_DATA does not commit to the runtime claims")]
    ClaimsNotBound,
    /// The runtime claims carry no usable attestation key.
    #[error("no usable attestation key: {0}")]
    NoAttestationKey(String),
    /// `vm-configuration` is not as policy requires.
    #[error("vm-configuration: {0}")]
    VmConfiguration(&'static str),
    /// The key given for the quote is not the HCL report's attestation key.
    #[error("the TPM quote's key is not the HCL report's attestation key")]
    AkMismatch,
    /// The quote's signature does not verify.
    #[error("the TPM quote's signature does not verify")]
    SignatureInvalid,
    /// The qualifying data is not the expected nonce.
    #[error("the TPM quote's qualifying data is not the expected nonce")]
    NonceMismatch,
    /// `pcrDigest` is not the digest of the PCR values given.
    #[error("pcrDigest does not match the PCR values")]
    PcrDigestMismatch,
    /// A pinned PCR is not selected or differs.
    #[error("PCR {0} is not as policy pins it")]
    Pcr(u8),
    /// The `[azure]` policy cannot be applied (a policy built in code that
    /// skipped [`crate::Policy::validate`]); refused, never skipped.
    #[error("the [azure] policy is invalid: {0}")]
    InvalidPolicy(String),
}

/// A row of the Azure table.
pub type AzureCheckResult = CheckRow<AzureCheckId, AzureError>;
/// The Azure table.
pub type AzureCheckReport = CheckTable<AzureCheckId, AzureError>;
