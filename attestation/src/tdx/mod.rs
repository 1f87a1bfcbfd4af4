//! Intel TDX evidence: a quote (v4 or v5) and the collateral Intel
//! publishes for its platform, verified offline against the pinned Intel
//! SGX Root CA and the caller's `now`, in the same shape as SNP: named
//! checks, every one evaluated, one table, and on failure one
//! [`crate::Rejection`] naming the first failed check.
//!
//! ```text
//!  quote ── header ‖ TD report ── signed by ─▶ attestation key
//!                                               │ hashed into
//!                                               ▼
//!           QE report (Intel's TD quoting enclave) ── signed by ─▶ PCK key
//!                                                                   │ certified by
//!                                                                   ▼
//!           PCK → PCK CA → Intel SGX Root CA (pinned) ◀── CRLs (root, PCK CA)
//!  collateral: TCB info (platform levels by FMSPC, module identities)  ─┐ signed by TCB signing
//!              QE identity (the TD QE's signer, product, levels)       ─┘ cert → pinned root
//! ```
//!
//! Module graph: `quote`, `collateral` and `pck` parse; `policy` is what
//! the relying party accepts; `error` names why a check failed (the check
//! names are [`crate::check::TdxCheckId`]); `verify` runs the checks into a
//! table. [`crate::verify::verify_tdx`] turns a table into a
//! [`crate::verify::VerifiedTdx`] or a [`crate::Rejection`].

pub mod collateral;
pub mod error;
pub mod pck;
pub mod policy;
pub mod quote;
pub mod simulated;
mod verify;

pub use self::collateral::{Collateral, CollateralError, TcbStatus};
pub use self::error::{TdxCheckReport, TdxCheckResult, TdxError};
pub use self::policy::TdxPolicy;
pub use self::quote::{Quote, QuoteError, TdAttributes, TdReport};
pub use self::verify::{appraise_tdx, intel_root, TcbVerdict, TdxAppraisal, TdxExpected, INTEL_SGX_ROOT_CA_PEM};
pub use crate::check::TdxCheckId;
