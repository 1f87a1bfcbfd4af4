//! The leaf of the crate's module graph: the names of the checks (SNP,
//! GPU, TDX and Azure), what happened to each ([`Outcome`]), and the one check table every
//! verifier fills ([`CheckTable`]: SNP, each GPU, the route). Errors, the SNP and GPU checkers and the
//! composite verifier build on these; nothing here depends on them.
//!
//! ```text
//!  check (CheckId, GpuCheckId, Outcome, CheckTable)
//!    └─▶ error (Rejection names any CheckId)  ─▶ snp::, gpu:: checkers ─▶ verify (composite)
//! ```

use std::convert::Infallible;
use std::fmt;

use serde::Serialize;

/// The checks the verifier runs, in the order it runs them.
///
/// This order is fixed (it is the order of the appraisal, not alphabetical):
/// structure, then endorsements, then the signature, then what the signed
/// report says, then its binding to the caller's context.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
    /// A check on one GPU's evidence (the GPU tables; not in [`CheckId::ALL`]).
    Gpu(GpuCheckId),
    /// The set of GPUs: present when required, as many as required, none twice.
    GpuSet,
    /// A check on a TDX quote and its collateral (the TDX table; not in [`CheckId::ALL`]).
    Tdx(TdxCheckId),
    /// A check on an Azure HCL report or vTPM quote (the Azure table; not in [`CheckId::ALL`]).
    Azure(AzureCheckId),
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
            Self::Gpu(c) => c.name(),
            Self::GpuSet => "gpu_set",
            Self::Tdx(c) => c.name(),
            Self::Azure(c) => c.name(),
        }
    }
}

impl fmt::Display for CheckId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for CheckId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// The checks run on each GPU's evidence, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GpuCheckId {
    /// SPDM 1.1 `GET_MEASUREMENTS` transcript parses by its length fields.
    EvidenceFormat,
    /// Five certificates, leaf → … → pinned NVIDIA Device Identity CA; validity at the verification time.
    DeviceChain,
    /// OCSP status of the device chain.
    Revocation,
    /// ECDSA P-384 over SHA-384(request ‖ response without signature), leaf key.
    ReportSignature,
    /// Opaque FWID equals the leaf certificate's DICE TcbInfo FWID.
    Fwid,
    /// Request nonce equals the expected (or claims-derived) nonce.
    Nonce,
    /// The shard's signed claims commit to the digest of all its GPU evidence.
    EvidenceBinding,
    /// Confidential-computing mode on.
    CcMode,
    /// Not in CC DevTools mode.
    DevTools,
    /// Protected-PCIe status, when the policy asks.
    ProtectedPcie,
    /// Driver at least the policy minimum.
    DriverVersion,
    /// VBIOS at least the policy minimum.
    VbiosVersion,
    /// Every active RIM index matches a golden value.
    RimMeasurements,
    /// RIM XML-DSig to the NVIDIA RIM root.
    RimSignature,
}

impl GpuCheckId {
    /// Every check, in verification order.
    pub const ALL: [GpuCheckId; 14] = [
        Self::EvidenceFormat,
        Self::DeviceChain,
        Self::Revocation,
        Self::ReportSignature,
        Self::Fwid,
        Self::Nonce,
        Self::EvidenceBinding,
        Self::CcMode,
        Self::DevTools,
        Self::ProtectedPcie,
        Self::DriverVersion,
        Self::VbiosVersion,
        Self::RimMeasurements,
        Self::RimSignature,
    ];

    /// Stable snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            Self::EvidenceFormat => "gpu_evidence_format",
            Self::DeviceChain => "gpu_device_chain",
            Self::Revocation => "gpu_revocation",
            Self::ReportSignature => "gpu_report_signature",
            Self::Fwid => "gpu_fwid",
            Self::Nonce => "gpu_nonce",
            Self::EvidenceBinding => "gpu_evidence_binding",
            Self::CcMode => "gpu_cc_mode",
            Self::DevTools => "gpu_devtools",
            Self::ProtectedPcie => "gpu_protected_pcie",
            Self::DriverVersion => "gpu_driver_version",
            Self::VbiosVersion => "gpu_vbios_version",
            Self::RimMeasurements => "gpu_rim_measurements",
            Self::RimSignature => "gpu_rim_signature",
        }
    }
}

impl Serialize for GpuCheckId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl fmt::Display for GpuCheckId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The checks run on a TDX quote and its collateral, in the order they run:
/// structure, Intel's chains and collateral, the quoting enclave, the
/// quote's own signature, the platform's TCB, then what the TD report says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TdxCheckId {
    /// Quote v4/v5, ECDSA P-256, TEE type TDX, Intel's QE vendor ID; collateral JSON.
    QuoteFormat,
    /// PCK leaf → PCK CA → pinned Intel SGX Root CA; names, signatures, CA bits, validity.
    PckChain,
    /// Root CA CRL and PCK CRL: signed by their issuers, current, not listing the chain.
    Revocation,
    /// TCB info: its issuer chain to the pinned root, its signature, its window, its FMSPC and PCE ID.
    TcbInfo,
    /// QE identity: its issuer chain to the pinned root, its signature, its window.
    QeIdentity,
    /// The PCK key signed the QE report.
    QeReportSignature,
    /// The QE report commits to the attestation key and the QE auth data.
    QeReportData,
    /// The QE report matches the QE identity (signer, product, masked attributes, SVN level).
    QeIdentityMatch,
    /// The attestation key signed the header and the TD report.
    QuoteSignature,
    /// The TDX module's signer and attributes match the TCB info's module identity.
    TdxModule,
    /// The platform, module and QE TCB levels, and their advisories, are accepted by policy.
    TcbStatus,
    /// TD attributes: not debuggable, SEPT_VE_DISABLE and the rest as policy requires.
    TdAttributes,
    /// No service TD bound (TD 1.5), unless policy allows.
    ServiceTd,
    /// MRTD on the allowlist; RTMRs and owner fields as pinned.
    Measurements,
    /// `REPORTDATA` equals what the relying party expects.
    ReportDataBinding,
}

impl TdxCheckId {
    /// Every check, in verification order.
    pub const ALL: [TdxCheckId; 15] = [
        Self::QuoteFormat,
        Self::PckChain,
        Self::Revocation,
        Self::TcbInfo,
        Self::QeIdentity,
        Self::QeReportSignature,
        Self::QeReportData,
        Self::QeIdentityMatch,
        Self::QuoteSignature,
        Self::TdxModule,
        Self::TcbStatus,
        Self::TdAttributes,
        Self::ServiceTd,
        Self::Measurements,
        Self::ReportDataBinding,
    ];

    /// Stable snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            Self::QuoteFormat => "tdx_quote_format",
            Self::PckChain => "tdx_pck_chain",
            Self::Revocation => "tdx_revocation",
            Self::TcbInfo => "tdx_tcb_info",
            Self::QeIdentity => "tdx_qe_identity",
            Self::QeReportSignature => "tdx_qe_report_signature",
            Self::QeReportData => "tdx_qe_report_data",
            Self::QeIdentityMatch => "tdx_qe_identity_match",
            Self::QuoteSignature => "tdx_quote_signature",
            Self::TdxModule => "tdx_module",
            Self::TcbStatus => "tdx_tcb_status",
            Self::TdAttributes => "tdx_td_attributes",
            Self::ServiceTd => "tdx_service_td",
            Self::Measurements => "tdx_measurements",
            Self::ReportDataBinding => "tdx_report_data_binding",
        }
    }
}

impl fmt::Display for TdxCheckId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for TdxCheckId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// The checks run on an Azure confidential VM's evidence (an HCL report
/// from Microsoft's paravisor, and a vTPM quote), in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AzureCheckId {
    /// The HCL report parses: header, an SNP report, the request data, runtime-claims JSON.
    HclFormat,
    /// The SNP report inside it passes the SNP checks (its own table).
    SnpReport,
    /// `REPORT_DATA` = hash of the runtime claims, zero-padded.
    RuntimeClaims,
    /// The runtime claims carry an RSA attestation key (`HCLAkPub`) of at least 2048 bits.
    AttestationKey,
    /// `vm-configuration`: secure boot, vTPM, serial console as policy requires.
    VmConfiguration,
    /// The TPM quote parses (`TPMS_ATTEST`, a quote, PCR values).
    TpmQuoteFormat,
    /// The key the quote is checked with is the HCL report's attestation key.
    TpmAkBinding,
    /// RSASSA-PKCS1-v1_5 SHA-256 over `TPMS_ATTEST` by that key.
    TpmSignature,
    /// The quote's qualifying data is the verifier's nonce.
    TpmNonce,
    /// `pcrDigest` = SHA-256 of the selected PCR values.
    TpmPcrDigest,
    /// The PCRs the policy pins are selected and equal.
    TpmPcrs,
}

impl AzureCheckId {
    /// Every check, in verification order.
    pub const ALL: [AzureCheckId; 11] = [
        Self::HclFormat,
        Self::SnpReport,
        Self::RuntimeClaims,
        Self::AttestationKey,
        Self::VmConfiguration,
        Self::TpmQuoteFormat,
        Self::TpmAkBinding,
        Self::TpmSignature,
        Self::TpmNonce,
        Self::TpmPcrDigest,
        Self::TpmPcrs,
    ];

    /// Stable snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            Self::HclFormat => "azure_hcl_format",
            Self::SnpReport => "azure_snp_report",
            Self::RuntimeClaims => "azure_runtime_claims",
            Self::AttestationKey => "azure_attestation_key",
            Self::VmConfiguration => "azure_vm_configuration",
            Self::TpmQuoteFormat => "azure_tpm_quote_format",
            Self::TpmAkBinding => "azure_tpm_ak_binding",
            Self::TpmSignature => "azure_tpm_signature",
            Self::TpmNonce => "azure_tpm_nonce",
            Self::TpmPcrDigest => "azure_tpm_pcr_digest",
            Self::TpmPcrs => "azure_tpm_pcrs",
        }
    }
}

impl fmt::Display for AzureCheckId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for AzureCheckId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl CheckName for AzureCheckId {
    fn check_name(self) -> &'static str {
        self.name()
    }
    const COLUMN: usize = 24;
    const NOT_RUN_NOTE: &'static str = " (no input to check them against)";
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
    /// The check ran and passed, with something a reviewer must see: a
    /// value this verifier cannot judge (an unknown `PLATFORM_INFO` bit), or
    /// a comparison accepted only because of a pin (a weaker peer policy).
    Warned {
        /// What was established.
        detail: String,
        /// What the reviewer must know.
        warning: String,
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
    /// The table's word for it.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Passed { .. } => "PASS",
            Self::Failed { .. } => "FAIL",
            Self::Warned { .. } => "WARN",
            Self::Skipped { .. } => "SKIP",
            Self::NotRun { .. } => "NOT RUN",
        }
    }
}

/// What a check id must offer to head a table.
pub trait CheckName: Copy + Eq + fmt::Display + Serialize {
    /// Its stable name.
    fn check_name(self) -> &'static str;
    /// Width of the check column.
    const COLUMN: usize;
    /// Appended to the names of checks that did not run, in the verdict.
    const NOT_RUN_NOTE: &'static str;
}

impl CheckName for CheckId {
    fn check_name(self) -> &'static str {
        self.name()
    }
    const COLUMN: usize = 20;
    const NOT_RUN_NOTE: &'static str = " (no input to check them against)";
}

impl CheckName for TdxCheckId {
    fn check_name(self) -> &'static str {
        self.name()
    }
    const COLUMN: usize = 24;
    const NOT_RUN_NOTE: &'static str = " (no input to check them against)";
}

impl CheckName for GpuCheckId {
    fn check_name(self) -> &'static str {
        self.name()
    }
    const COLUMN: usize = 22;
    const NOT_RUN_NOTE: &'static str = "";
}

/// One row of a table: the check, its outcome, and the typed reason when it
/// failed (`E`; [`Infallible`] for tables whose failures carry none).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(bound(serialize = "C: Serialize"))]
pub struct CheckRow<C: CheckName, E: fmt::Display = Infallible> {
    /// Which check.
    pub check: C,
    /// Its outcome.
    #[serde(flatten)]
    pub outcome: Outcome,
    /// The typed reason, when the check failed.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "display_opt")]
    pub error: Option<E>,
    /// The values this row judged were chosen by a simulated root (software
    /// keys, not hardware): the row says nothing about real hardware.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub simulated: bool,
}

impl<C: CheckName, E: fmt::Display> CheckRow<C, E> {
    /// The table's word for the row: the outcome's, marked `(SIM)` where a
    /// simulated root chose the values.
    pub fn label(&self) -> String {
        if self.simulated {
            format!("{}(SIM)", self.outcome.label())
        } else {
            self.outcome.label().to_owned()
        }
    }
}

fn display_opt<E: fmt::Display, S: serde::Serializer>(e: &Option<E>, s: S) -> Result<S::Ok, S::Error> {
    match e {
        Some(e) => s.serialize_str(&e.to_string()),
        None => s.serialize_none(),
    }
}

/// Every check with its outcome, in verification order, plus loud warnings
/// (simulated evidence): the SNP table and each GPU's table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(bound(serialize = "C: Serialize"))]
pub struct CheckTable<C: CheckName, E: fmt::Display = Infallible> {
    /// Rows in verification order.
    pub results: Vec<CheckRow<C, E>>,
    /// Warnings a reviewer must see (for example: simulated evidence accepted).
    pub warnings: Vec<String>,
}

impl<C: CheckName, E: fmt::Display> Default for CheckTable<C, E> {
    fn default() -> Self {
        Self { results: Vec::new(), warnings: Vec::new() }
    }
}

impl<C: CheckName, E: fmt::Display> CheckTable<C, E> {
    pub(crate) fn record(&mut self, check: C, outcome: Outcome) {
        self.results.push(CheckRow { check, outcome, error: None, simulated: false });
    }

    pub(crate) fn record_failure(&mut self, check: C, error: E, expected: String, actual: String) {
        self.results.push(CheckRow {
            check,
            outcome: Outcome::Failed { expected, actual },
            error: Some(error),
            simulated: false,
        });
    }

    /// Marks every row but `except` as judging values a simulated root chose.
    pub(crate) fn mark_simulated(&mut self, except: &[C]) {
        for r in &mut self.results {
            r.simulated = !except.contains(&r.check);
        }
    }

    /// Marks `check`'s row as judging values a simulated root chose.
    pub(crate) fn mark_row_simulated(&mut self, check: C) {
        if let Some(r) = self.results.iter_mut().find(|r| r.check == check) {
            r.simulated = true;
        }
    }

    /// Whether any row judged values a simulated root chose.
    pub fn any_simulated(&self) -> bool {
        self.results.iter().any(|r| r.simulated)
    }

    /// Rows that passed with a warning.
    pub fn warned(&self) -> Vec<C> {
        self.results.iter().filter(|r| matches!(r.outcome, Outcome::Warned { .. })).map(|r| r.check).collect()
    }

    /// Replaces the outcome of `check` (or records it).
    pub(crate) fn set(&mut self, check: C, outcome: Outcome) {
        match self.results.iter_mut().find(|r| r.check == check) {
            Some(r) => r.outcome = outcome,
            None => self.record(check, outcome),
        }
    }

    /// Outcome of `check`, if it was recorded.
    pub fn outcome(&self, check: C) -> Option<&Outcome> {
        self.results.iter().find(|r| r.check == check).map(|r| &r.outcome)
    }

    /// Typed reason of `check`, if it failed with one.
    pub fn error(&self, check: C) -> Option<&E> {
        self.results.iter().find(|r| r.check == check).and_then(|r| r.error.as_ref())
    }

    /// The first failed row in verification order.
    pub fn first_failed(&self) -> Option<&CheckRow<C, E>> {
        self.results.iter().find(|r| matches!(r.outcome, Outcome::Failed { .. }))
    }

    /// The first failed check in verification order, with what was expected and shown.
    pub fn first_failure(&self) -> Option<(C, &str, &str)> {
        self.results.iter().find_map(|r| match &r.outcome {
            Outcome::Failed { expected, actual } => Some((r.check, expected.as_str(), actual.as_str())),
            _ => None,
        })
    }

    /// Every failed check.
    pub fn failures(&self) -> Vec<C> {
        self.results.iter().filter(|r| matches!(r.outcome, Outcome::Failed { .. })).map(|r| r.check).collect()
    }

    /// Whether no check failed.
    pub fn accepted(&self) -> bool {
        self.first_failure().is_none()
    }

    /// Checks that did not run for lack of input (not because of a failure).
    pub fn not_run(&self) -> Vec<C> {
        self.results.iter().filter(|r| matches!(r.outcome, Outcome::NotRun { .. })).map(|r| r.check).collect()
    }

    /// One-line verdict: every failure counted, the first named; what did
    /// not run; warnings; and SIMULATED when a simulated root chose values.
    pub fn verdict(&self) -> String {
        let mut v = match self.first_failure() {
            Some((check, _, _)) => {
                let n = self.failures().len();
                let more = if n > 1 { format!(", {} failed in all", n) } else { String::new() };
                format!("REJECTED (first failed check: {check}{more})")
            }
            None => {
                let missing = self.not_run();
                let mut v = String::from("ACCEPTED");
                if !missing.is_empty() {
                    let names: Vec<_> = missing.iter().map(|c| c.check_name()).collect();
                    v.push_str(&format!(" — not run: {}{}", names.join(", "), C::NOT_RUN_NOTE));
                }
                let warned = self.warned();
                if !warned.is_empty() {
                    let names: Vec<_> = warned.iter().map(|c| c.check_name()).collect();
                    v.push_str(&format!(" — WARN: {}", names.join(", ")));
                }
                if !self.warnings.is_empty() {
                    v.push_str(" — WITH WARNINGS");
                }
                v
            }
        };
        if self.any_simulated() {
            v.push_str(" — SIMULATED (software root, no hardware guarantee)");
        }
        v
    }
}

impl<C: CheckName, E: fmt::Display> fmt::Display for CheckTable<C, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for w in &self.warnings {
            writeln!(f, "WARNING: {w}")?;
        }
        let width = C::COLUMN;
        writeln!(f, "{:<3} {:<width$} {:<9} detail", "#", "check", "result")?;
        for (i, r) in self.results.iter().enumerate() {
            let detail = match &r.outcome {
                Outcome::Passed { detail } => detail.clone(),
                Outcome::Failed { expected, actual } => format!("expected {expected}; got {actual}"),
                Outcome::Warned { detail, warning } => format!("{detail}; WARNING: {warning}"),
                Outcome::Skipped { reason } | Outcome::NotRun { reason } => reason.clone(),
            };
            writeln!(f, "{:<3} {:<width$} {:<9} {}", i + 1, r.check.check_name(), r.label(), detail)?;
        }
        write!(f, "verdict: {}", self.verdict())
    }
}

/// What one check concluded, before it goes into a table (the TDX and Azure
/// checkers' return type).
pub(crate) enum Row<E> {
    /// Passed, with what was established.
    Pass(String),
    /// Passed, with what was established and what a reviewer must see.
    Warn(String, String),
    /// Failed: the typed reason, what was required, what the evidence showed.
    Fail(Box<(E, String, String)>),
    /// Could not run, and why.
    NotRun(String),
}

/// A failed row.
pub(crate) fn fail<E>(error: E, expected: impl Into<String>, actual: impl Into<String>) -> Row<E> {
    Row::Fail(Box::new((error, expected.into(), actual.into())))
}

impl<C: CheckName, E: fmt::Display> CheckTable<C, E> {
    /// Records `check`'s row.
    pub(crate) fn put(&mut self, check: C, row: Row<E>) {
        match row {
            Row::Pass(detail) => self.record(check, Outcome::Passed { detail }),
            Row::Warn(detail, warning) => self.record(check, Outcome::Warned { detail, warning }),
            Row::Fail(b) => {
                let (e, expected, actual) = *b;
                self.record_failure(check, e, expected, actual)
            }
            Row::NotRun(reason) => self.record(check, Outcome::NotRun { reason }),
        }
    }
}

/// A row of the SNP table.
pub type CheckResult = CheckRow<CheckId>;
/// The SNP table.
pub type CheckReport = CheckTable<CheckId>;
