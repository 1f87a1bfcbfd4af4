//! The check table: every check with its outcome, for reviewers and tools.

use std::fmt;

use serde::Serialize;

/// The checks the verifier runs, in the order it runs them.
///
/// This order is fixed (it is the order of the appraisal, not alphabetical):
/// structure, then endorsements, then the signature, then what the signed
/// report says, then its binding to the caller's context.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckId {
    /// 1184 bytes, known version within policy, ECDSA P-384, reserved policy bit.
    ReportFormat,
    /// Product from CPUID (v3+) and from the endorsement agree, and are allowed.
    Product,
    /// VCEK → ASK → ARK (or VLEK → ASVK → ARK) with the ARK pinned per product; validity.
    EndorsementChain,
    /// CRL signed by the ARK, current, not listing the chain.
    Revocation,
    /// ECDSA P-384 signature over the raw bytes `[0, 0x2A0)`.
    ReportSignature,
    /// `CHIP_ID` equals the VCEK's hwID.
    ChipId,
    /// `REPORTED_TCB` equals the TCB in the endorsement's extensions.
    ReportedTcb,
    /// Guest policy DEBUG bit.
    Debug,
    /// Guest policy MIGRATE_MA bit.
    MigrationAgent,
    /// Guest-policy hardening bits, CXL, ABI minimum, reserved bits zero.
    GuestPolicy,
    /// SMT on the platform.
    Smt,
    /// `PLATFORM_INFO` bits required by policy; unknown bits refused.
    PlatformInfo,
    /// VMPL of the report.
    Vmpl,
    /// TCB minimums per component, on `REPORTED_TCB`.
    TcbMinimum,
    /// Required mitigation bits in both mitigation vectors (report v5+).
    MitigationVector,
    /// Launch measurement on the allowlist.
    Measurement,
    /// `HOST_DATA` when pinned.
    HostData,
    /// `ID_KEY_DIGEST` when pinned.
    IdKeyDigest,
    /// `REPORT_DATA` = SHA-512(canonical claims), and pinned claims match.
    ReportDataBinding,
    /// The nonce the verifier asked for is in the claims.
    Freshness,
}

impl CheckId {
    /// Every check, in verification order.
    pub const ALL: [CheckId; 20] = [
        Self::ReportFormat,
        Self::Product,
        Self::EndorsementChain,
        Self::Revocation,
        Self::ReportSignature,
        Self::ChipId,
        Self::ReportedTcb,
        Self::Debug,
        Self::MigrationAgent,
        Self::GuestPolicy,
        Self::Smt,
        Self::PlatformInfo,
        Self::Vmpl,
        Self::TcbMinimum,
        Self::MitigationVector,
        Self::Measurement,
        Self::HostData,
        Self::IdKeyDigest,
        Self::ReportDataBinding,
        Self::Freshness,
    ];

    /// Stable snake_case name (used in JSON and by scripts).
    pub fn name(self) -> &'static str {
        match self {
            Self::ReportFormat => "report_format",
            Self::Product => "product",
            Self::EndorsementChain => "endorsement_chain",
            Self::Revocation => "revocation",
            Self::ReportSignature => "report_signature",
            Self::ChipId => "chip_id",
            Self::ReportedTcb => "reported_tcb",
            Self::Debug => "debug",
            Self::MigrationAgent => "migration_agent",
            Self::GuestPolicy => "guest_policy",
            Self::Smt => "smt",
            Self::PlatformInfo => "platform_info",
            Self::MitigationVector => "mitigation_vector",
            Self::Vmpl => "vmpl",
            Self::TcbMinimum => "tcb_minimum",
            Self::Measurement => "measurement",
            Self::HostData => "host_data",
            Self::IdKeyDigest => "id_key_digest",
            Self::ReportDataBinding => "report_data_binding",
            Self::Freshness => "freshness",
        }
    }
}

impl fmt::Display for CheckId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What happened to one check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    /// The check ran and the evidence satisfied it.
    Passed {
        /// What was established.
        detail: String,
    },
    /// The check ran and the evidence violated it.
    Failed {
        /// What was required.
        expected: String,
        /// What the evidence showed.
        actual: String,
    },
    /// The policy chose not to check this.
    Skipped {
        /// Why (which policy setting).
        reason: String,
    },
    /// The check could not run (missing input or an earlier failure).
    NotRun {
        /// Why.
        reason: String,
    },
}

impl Outcome {
    fn label(&self) -> &'static str {
        match self {
            Self::Passed { .. } => "PASS",
            Self::Failed { .. } => "FAIL",
            Self::Skipped { .. } => "SKIP",
            Self::NotRun { .. } => "NOT RUN",
        }
    }
}

/// One row of the table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CheckResult {
    /// Which check.
    pub check: CheckId,
    /// Its outcome.
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// Every check with its outcome, plus loud warnings (simulated evidence).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CheckReport {
    /// Rows in verification order.
    pub results: Vec<CheckResult>,
    /// Warnings a reviewer must see (for example: simulated evidence accepted).
    pub warnings: Vec<String>,
}

impl CheckReport {
    pub(crate) fn record(&mut self, check: CheckId, outcome: Outcome) {
        self.results.push(CheckResult { check, outcome });
    }

    /// Replaces the outcome of `check` (or records it).
    pub(crate) fn set(&mut self, check: CheckId, outcome: Outcome) {
        match self.results.iter_mut().find(|r| r.check == check) {
            Some(r) => r.outcome = outcome,
            None => self.record(check, outcome),
        }
    }

    /// Outcome of `check`, if it was recorded.
    pub fn outcome(&self, check: CheckId) -> Option<&Outcome> {
        self.results.iter().find(|r| r.check == check).map(|r| &r.outcome)
    }

    /// The first failed check in verification order.
    pub fn first_failure(&self) -> Option<(CheckId, &str, &str)> {
        self.results.iter().find_map(|r| match &r.outcome {
            Outcome::Failed { expected, actual } => Some((r.check, expected.as_str(), actual.as_str())),
            _ => None,
        })
    }

    /// Every failed check.
    pub fn failures(&self) -> Vec<CheckId> {
        self.results.iter().filter(|r| matches!(r.outcome, Outcome::Failed { .. })).map(|r| r.check).collect()
    }

    /// Whether no check failed.
    pub fn accepted(&self) -> bool {
        self.first_failure().is_none()
    }

    /// Checks that did not run for lack of input (not because of a failure).
    pub fn not_run(&self) -> Vec<CheckId> {
        self.results.iter().filter(|r| matches!(r.outcome, Outcome::NotRun { .. })).map(|r| r.check).collect()
    }

    /// One-line verdict.
    pub fn verdict(&self) -> String {
        match self.first_failure() {
            Some((check, _, _)) => format!("REJECTED (first failed check: {check})"),
            None => {
                let missing = self.not_run();
                let mut v = String::from("ACCEPTED");
                if !missing.is_empty() {
                    let names: Vec<_> = missing.iter().map(|c| c.name()).collect();
                    v.push_str(&format!(" — not run: {} (no input to check them against)", names.join(", ")));
                }
                if !self.warnings.is_empty() {
                    v.push_str(" — WITH WARNINGS");
                }
                v
            }
        }
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for w in &self.warnings {
            writeln!(f, "WARNING: {w}")?;
        }
        writeln!(f, "{:<3} {:<20} {:<8} detail", "#", "check", "result")?;
        for (i, r) in self.results.iter().enumerate() {
            let detail = match &r.outcome {
                Outcome::Passed { detail } => detail.clone(),
                Outcome::Failed { expected, actual } => format!("expected {expected}; got {actual}"),
                Outcome::Skipped { reason } | Outcome::NotRun { reason } => reason.clone(),
            };
            writeln!(f, "{:<3} {:<20} {:<8} {}", i + 1, r.check.name(), r.outcome.label(), detail)?;
        }
        write!(f, "verdict: {}", self.verdict())
    }
}
