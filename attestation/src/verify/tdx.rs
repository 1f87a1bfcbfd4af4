//! A TDX appraisal into a verdict: [`VerifiedTdx`] (only [`verify_tdx`]
//! makes one) or an [`Error::Rejected`] naming the first failed check.

use std::time::SystemTime;

use crate::check::{CheckId, CheckReport, Outcome};
use crate::error::{Error, Rejection, TdxFailure};
use crate::tdx::{appraise_tdx, Quote, TcbVerdict, TdReport, TdxCheckReport, TdxExpected, TdxPolicy};

/// A TDX quote that passed every check of a policy. Only [`verify_tdx`] makes one.
#[derive(Clone, Debug)]
pub struct VerifiedTdx {
    quote: Quote,
    tcb: TcbVerdict,
    table: TdxCheckReport,
    _private: (),
}

impl VerifiedTdx {
    /// The verified quote.
    pub fn quote(&self) -> &Quote {
        &self.quote
    }
    /// The verified TD report.
    pub fn report(&self) -> &TdReport {
        &self.quote.report
    }
    /// The platform's combined TCB status and its advisories.
    pub fn tcb(&self) -> &TcbVerdict {
        &self.tcb
    }
    /// Every check.
    pub fn checks(&self) -> &TdxCheckReport {
        &self.table
    }
}

/// Verifies a TDX quote and its collateral; `Ok` only when every check
/// passed (a check that could not run for lack of input, such as the
/// report data binding with no expected value, does not refuse).
pub fn verify_tdx(
    quote: &[u8],
    collateral: &[u8],
    policy: &TdxPolicy,
    expected: &TdxExpected,
    now: SystemTime,
) -> Result<VerifiedTdx, Error> {
    let a = appraise_tdx(quote, collateral, policy, expected, now);
    if let Some(row) = a.table.first_failed() {
        let (expected, actual) = match &row.outcome {
            Outcome::Failed { expected, actual } => (expected.clone(), actual.clone()),
            _ => (String::new(), String::new()),
        };
        let Some(error) = row.error.clone() else {
            return Err(Error::ApiMisuse(format!("TDX check {} failed without a typed reason", row.check)));
        };
        return Err(Error::Rejected(Box::new(Rejection {
            check: CheckId::Tdx(row.check),
            expected,
            actual,
            report: CheckReport::default(),
            gpu: None,
            tdx: Some(TdxFailure { error, table: a.table }),
            azure: None,
        })));
    }
    match (a.quote, a.tcb) {
        (Some(quote), Some(tcb)) => Ok(VerifiedTdx { quote, tcb, table: a.table, _private: () }),
        _ => Err(Error::ApiMisuse("TDX appraisal passed without a quote or a TCB verdict".into())),
    }
}
