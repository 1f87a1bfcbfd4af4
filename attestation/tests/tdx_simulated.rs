//! The TDX verifier on a simulated, Intel-shaped platform: the paths a real
//! sample cannot reach with a valid signature (a CRL that revokes the PCK, a
//! debuggable TD, signed collateral for another platform, a platform behind
//! with named advisories), and the simulated hierarchy's own gate.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::SystemTime;

use veil_attestation::check::Outcome;
use veil_attestation::tdx::simulated::{SimulatedLevel, SimulatedTdx, SimulatedTdxConfig};
use veil_attestation::tdx::{appraise_tdx, TcbStatus, TdAttributes, TdxCheckId as C, TdxError, TdxExpected, TdxPolicy};

fn platform(config: SimulatedTdxConfig) -> SimulatedTdx {
    SimulatedTdx::from_seed(b"veil tdx test platform", config).unwrap()
}

fn dev() -> TdxPolicy {
    TdxPolicy { allow_simulated: true, any_measurement: true, ..TdxPolicy::default() }
}

const RD: [u8; 64] = [0x42; 64];

/// The table for `quote` and `collateral` now, expecting [`RD`].
fn run(quote: &[u8], collateral: &[u8], policy: &TdxPolicy) -> veil_attestation::tdx::TdxCheckReport {
    let t = appraise_tdx(quote, collateral, policy, &TdxExpected { report_data: Some(RD) }, SystemTime::now()).table;
    println!("{t}");
    t
}

#[test]
fn a_simulated_quote_passes_every_check_flagged_and_only_under_allow_simulated() {
    let p = platform(SimulatedTdxConfig::default());
    let now = SystemTime::now();
    let (q, c) = (p.quote(RD), p.collateral(&p.default_collateral(now)).unwrap());
    let t = run(&q, &c, &dev());
    assert!(t.accepted(), "{t}");
    assert!(t.verdict().contains("SIMULATED"), "{}", t.verdict());
    assert!(t.results.iter().all(|r| r.check == C::QuoteFormat || r.simulated), "every row but the format is flagged");
    assert!(matches!(t.outcome(C::ReportDataBinding), Some(Outcome::Passed { .. })));
    // Without allow_simulated the chain is refused.
    let t = run(&q, &c, &TdxPolicy { any_measurement: true, ..TdxPolicy::default() });
    assert!(matches!(t.error(C::PckChain), Some(TdxError::Chain { .. })), "{t}");
    assert!(t.to_string().contains("SIMULATED root"), "{t}");
}

#[test]
fn a_crl_that_revokes_the_pck_is_refused() {
    let p = platform(SimulatedTdxConfig::default());
    let mut coll = p.default_collateral(SystemTime::now());
    coll.revoked_pck_serials = vec![p.pck_serial()];
    let t = run(&p.quote(RD), &p.collateral(&coll).unwrap(), &dev());
    assert!(matches!(t.error(C::Revocation), Some(TdxError::Revoked { which: "PCK CRL", .. })), "{t}");
    assert_eq!(t.failures(), vec![C::Revocation]);
}

#[test]
fn a_debuggable_td_with_a_valid_signature_fails_only_the_attribute_check() {
    let config = SimulatedTdxConfig {
        td_attributes: TdAttributes::DEBUG | TdAttributes::SEPT_VE_DISABLE,
        ..SimulatedTdxConfig::default()
    };
    let p = platform(config);
    let c = p.collateral(&p.default_collateral(SystemTime::now())).unwrap();
    let t = run(&p.quote(RD), &c, &dev());
    assert_eq!(t.failures(), vec![C::TdAttributes], "{t}");
    assert!(matches!(t.error(C::TdAttributes), Some(TdxError::Debug)));
    let t = run(&p.quote(RD), &c, &TdxPolicy { allow_debug: true, ..dev() });
    assert!(t.accepted(), "{t}");
}

#[test]
fn signed_collateral_for_another_platform_is_refused() {
    let p = platform(SimulatedTdxConfig::default());
    let mut coll = p.default_collateral(SystemTime::now());
    coll.fmspc = [0x90, 0xC0, 0x6F, 0, 0, 0];
    let t = run(&p.quote(RD), &p.collateral(&coll).unwrap(), &dev());
    assert!(matches!(t.error(C::TcbInfo), Some(TdxError::WrongCollateral { .. })), "{t}");
}

#[test]
fn a_platform_below_up_to_date_passes_only_when_the_policy_names_status_and_advisories() {
    let p = platform(SimulatedTdxConfig::default());
    let c = p.config().clone();
    let mut coll = p.default_collateral(SystemTime::now());
    let mut newer = c.cpu_svn;
    newer[7] += 2;
    let level = |cpu_svn, status, advisories| SimulatedLevel {
        cpu_svn,
        pce_svn: c.pce_svn,
        tee_tcb_svn: c.tee_tcb_svn,
        status,
        advisories,
    };
    coll.levels = vec![level(newer, "UpToDate", vec![]), level(c.cpu_svn, "OutOfDate", vec!["INTEL-SA-01036".into()])];
    let collateral = p.collateral(&coll).unwrap();
    let q = p.quote(RD);
    let t = run(&q, &collateral, &dev());
    assert!(
        matches!(t.error(C::TcbStatus), Some(TdxError::TcbStatusRefused { status: TcbStatus::OutOfDate, .. })),
        "{t}"
    );
    let lenient = TdxPolicy { accept_tcb_status: vec![TcbStatus::UpToDate, TcbStatus::OutOfDate], ..dev() };
    let t = run(&q, &collateral, &lenient);
    assert!(
        matches!(&t.error(C::TcbStatus), Some(TdxError::TcbStatusRefused { advisories, .. }) if advisories == &["INTEL-SA-01036"]),
        "{t}"
    );
    let named = TdxPolicy { accept_advisories: vec!["INTEL-SA-01036".into()], ..lenient };
    let t = run(&q, &collateral, &named);
    assert!(t.accepted(), "{t}");
    assert!(matches!(t.outcome(C::TcbStatus), Some(Outcome::Warned { .. })), "accepted below UpToDate warns");
    // Behind every level: the row names the component.
    coll.levels.truncate(1);
    let t = run(&q, &p.collateral(&coll).unwrap(), &named);
    assert!(
        matches!(&t.error(C::TcbStatus), Some(TdxError::NoTcbLevel(why)) if why.contains("SGX TCB component 8 (component) 3 < 5")),
        "{t}"
    );
}

#[test]
fn a_report_data_mismatch_and_stale_collateral_are_refused() {
    let p = platform(SimulatedTdxConfig::default());
    let now = SystemTime::now();
    let c = p.collateral(&p.default_collateral(now)).unwrap();
    let t = run(&p.quote([0; 64]), &c, &dev());
    assert_eq!(t.failures(), vec![C::ReportDataBinding], "{t}");
    let mut old = p.default_collateral(now - std::time::Duration::from_secs(60 * 86400));
    old.next_update = now - std::time::Duration::from_secs(86400);
    let t = run(&p.quote(RD), &p.collateral(&old).unwrap(), &dev());
    assert!(matches!(t.error(C::TcbInfo), Some(TdxError::Stale { .. })), "{t}");
    assert!(matches!(t.error(C::Revocation), Some(TdxError::CrlUnusable { .. })), "{t}");
}

/// A Veil shard's quote commits to its claims as an SNP report does: the
/// expectation built from the same claims passes, from other claims fails.
#[test]
fn reportdata_binds_veil_claims() {
    use veil_attestation::{Claims, Nonce};
    let p = platform(SimulatedTdxConfig::default());
    let claims = Claims {
        nonce: Some(Nonce::new(vec![7; 16]).unwrap()),
        software_version: "veil test".into(),
        ..Claims::default()
    };
    let q = p.quote(claims.report_data().unwrap().0);
    let c = p.collateral(&p.default_collateral(SystemTime::now())).unwrap();
    let ok = TdxExpected::for_claims(&claims).unwrap();
    assert!(appraise_tdx(&q, &c, &dev(), &ok, SystemTime::now()).table.accepted());
    let other = Claims { nonce: Some(Nonce::new(vec![8; 16]).unwrap()), ..claims };
    let t = appraise_tdx(&q, &c, &dev(), &TdxExpected::for_claims(&other).unwrap(), SystemTime::now()).table;
    assert_eq!(t.failures(), vec![C::ReportDataBinding], "{t}");
}
