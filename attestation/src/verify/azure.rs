//! Azure evidence into a verdict: the SNP checks on the report inside the
//! HCL report, then the Azure checks ([`crate::azure`]).

use std::time::SystemTime;

use crate::azure::{appraise_parts, AzureCheckReport, AzureEvidence, AzureExpected, HclReport};
use crate::check::{CheckId, CheckReport, Outcome};
use crate::error::{AzureFailure, Error, Rejection};
use crate::evidence::EvidenceBundle;
use crate::policy::Policy;
use crate::verify::{appraise, ExpectedClaims};

/// The VCEK (and chain) that endorse the SNP report inside an HCL report.
#[derive(Clone, Debug, Default)]
pub struct SnpEndorsement {
    /// VCEK or VLEK, DER or PEM.
    pub endorsement: Vec<u8>,
    /// Intermediate and root, DER each (may be empty: the pinned ones are used).
    pub chain: Vec<Vec<u8>>,
    /// A CRL signed by the ARK.
    pub crl: Option<Vec<u8>>,
}

/// Both tables.
#[derive(Clone, Debug)]
pub struct AzureAppraisal {
    /// The SNP table of the report inside the HCL report, when it was checked.
    pub snp: Option<CheckReport>,
    /// The Azure table.
    pub azure: AzureCheckReport,
}

impl AzureAppraisal {
    /// Whether no check of either table failed.
    pub fn accepted(&self) -> bool {
        self.azure.accepted() && self.snp.as_ref().is_none_or(CheckReport::accepted)
    }
}

/// Runs the SNP checks on the HCL report's SNP report (under `policy`; its
/// REPORT_DATA is judged by the Azure table's runtime-claims row) and the
/// Azure checks under `policy.azure`.
pub fn appraise_azure(
    ev: &AzureEvidence<'_>,
    endorsement: Option<&SnpEndorsement>,
    policy: &Policy,
    expected: &AzureExpected,
    now: SystemTime,
) -> AzureAppraisal {
    let hcl = ev.hcl.map(HclReport::parse);
    let snp = match (hcl.as_ref().and_then(|h| h.as_ref().ok()), endorsement) {
        (Some(h), Some(e)) => {
            let bundle = EvidenceBundle {
                report: h.snp_report.clone(),
                endorsement: e.endorsement.clone(),
                chain: e.chain.clone(),
                crl: e.crl.clone(),
                claims: None,
                gpus: Vec::new(),
                gpu_rims: Vec::new(),
                gpu_ocsp: Vec::new(),
            };
            Some(appraise(&bundle, policy, &ExpectedClaims::default(), now).checks)
        }
        _ => None,
    };
    let azure = appraise_parts(hcl.as_ref(), snp.as_ref(), ev, &policy.azure, expected);
    AzureAppraisal { snp, azure }
}

/// [`appraise_azure`], then `Ok` only when no check of either table failed.
pub fn verify_azure(
    ev: &AzureEvidence<'_>,
    endorsement: Option<&SnpEndorsement>,
    policy: &Policy,
    expected: &AzureExpected,
    now: SystemTime,
) -> Result<AzureAppraisal, Error> {
    let a = appraise_azure(ev, endorsement, policy, expected, now);
    let Some(row) = a.azure.first_failed() else { return Ok(a) };
    let (expected, actual) = match &row.outcome {
        Outcome::Failed { expected, actual } => (expected.clone(), actual.clone()),
        _ => (String::new(), String::new()),
    };
    let Some(error) = row.error.clone() else {
        return Err(Error::ApiMisuse(format!("Azure check {} failed without a typed reason", row.check)));
    };
    Err(Error::Rejected(Box::new(Rejection {
        check: CheckId::Azure(row.check),
        expected,
        actual,
        report: a.snp.clone().unwrap_or_default(),
        gpu: None,
        tdx: None,
        azure: Some(AzureFailure { error, table: a.azure }),
    })))
}
