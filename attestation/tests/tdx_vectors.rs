//! Real Intel TDX quotes with their collateral (`tdx-dcap-qvl`): each
//! reaches the verdict its PROVENANCE states, and editing any signed region
//! or the collateral makes the check that guards it fail. Vectors come from
//! `$VEIL_VECTORS` or `../shared/vectors`; absent vectors print SKIP, or
//! fail under `VEIL_REQUIRE_VECTORS=1`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use veil_attestation::check::Outcome;
use veil_attestation::tdx::{
    appraise_tdx, Quote, TcbStatus, TdxCheckId as C, TdxCheckReport, TdxError, TdxExpected, TdxPolicy,
};
use veil_attestation::x509::parse_time;
use veil_attestation::{verify_tdx, Error};

fn vectors_dir() -> Option<PathBuf> {
    let candidates = std::env::var_os("VEIL_VECTORS")
        .map(PathBuf::from)
        .into_iter()
        .chain([Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/vectors")]);
    for c in candidates {
        if c.join("README.md").exists() {
            return Some(c);
        }
    }
    assert!(
        std::env::var("VEIL_REQUIRE_VECTORS").as_deref() != Ok("1"),
        "VEIL_REQUIRE_VECTORS=1 but no vectors at $VEIL_VECTORS or ../shared/vectors"
    );
    eprintln!("SKIP: real hardware vectors not found (set VEIL_VECTORS)");
    None
}

struct Sample {
    quote: Vec<u8>,
    collateral: Vec<u8>,
    /// A time inside the collateral's validity: the later issue date plus an hour (as PROVENANCE says).
    at: SystemTime,
}

fn sample(name: &str) -> Option<Sample> {
    let dir = vectors_dir()?.join("tdx-dcap-qvl");
    let quote = std::fs::read(dir.join(name)).unwrap();
    let collateral = std::fs::read(dir.join(format!("{name}_collateral.json"))).unwrap();
    let c: serde_json::Value = serde_json::from_slice(&collateral).unwrap();
    let issue = |field: &str| {
        let body: serde_json::Value = serde_json::from_str(c[field].as_str().unwrap()).unwrap();
        parse_time(body["issueDate"].as_str().unwrap()).unwrap()
    };
    let at = issue("tcb_info").max(issue("qe_identity")) + Duration::from_secs(3600);
    Some(Sample { quote, collateral, at })
}

fn any_measurement() -> TdxPolicy {
    TdxPolicy { any_measurement: true, ..TdxPolicy::default() }
}

fn table(q: &[u8], c: &[u8], p: &TdxPolicy, at: SystemTime) -> TdxCheckReport {
    appraise_tdx(q, c, p, &TdxExpected::default(), at).table
}

fn failed(t: &TdxCheckReport, check: C) -> bool {
    matches!(t.outcome(check), Some(Outcome::Failed { .. }))
}

/// The up-to-date quote passes every check at a time inside its collateral,
/// with status UpToDate and no advisories (dcap-qvl 0.7.0's verdict).
#[test]
fn the_up_to_date_quote_is_accepted_as_dcap_qvl_accepts_it() {
    let Some(s) = sample("tdx_quote") else { return };
    let quote = Quote::parse(&s.quote).unwrap();
    let expected = TdxExpected { report_data: Some(quote.report.report_data) };
    let v = verify_tdx(&s.quote, &s.collateral, &any_measurement(), &expected, s.at).unwrap();
    println!("{}", v.checks());
    assert_eq!(v.tcb().status, TcbStatus::UpToDate);
    assert!(v.tcb().advisories.is_empty());
    assert_eq!(v.checks().results.len(), C::ALL.len());
    for check in C::ALL {
        let o = v.checks().outcome(check).unwrap();
        let ok =
            matches!(o, Outcome::Passed { .. }) || (check == C::Measurements && matches!(o, Outcome::Warned { .. }));
        assert!(ok, "{check}: {o:?}");
    }
    // MRTD pinned instead of waived: passes with the right value, fails with another.
    let pinned =
        TdxPolicy { mrtd: vec![veil_attestation::tdx::policy::Register(quote.report.mr_td)], ..TdxPolicy::default() };
    assert!(verify_tdx(&s.quote, &s.collateral, &pinned, &expected, s.at).is_ok());
    let mut other = quote.report.mr_td;
    other[0] ^= 1;
    let wrong = TdxPolicy { mrtd: vec![veil_attestation::tdx::policy::Register(other)], ..TdxPolicy::default() };
    let e = verify_tdx(&s.quote, &s.collateral, &wrong, &expected, s.at).unwrap_err();
    assert_eq!(e.check(), Some(veil_attestation::CheckId::Tdx(C::Measurements)));
    // The default policy pins nothing, so it refuses.
    assert!(failed(&table(&s.quote, &s.collateral, &TdxPolicy::default(), s.at), C::Measurements));
}

/// The outdated quote is refused by the TCB check, as dcap-qvl refuses it
/// ("No matching TCB level found"), and the table says which components are
/// behind Intel's lowest level.
#[test]
fn the_outdated_quote_is_refused_naming_what_is_behind() {
    let Some(s) = sample("tdx_quote_outdated") else { return };
    let e = verify_tdx(&s.quote, &s.collateral, &any_measurement(), &TdxExpected::default(), s.at).unwrap_err();
    let Error::Rejected(r) = &e else { panic!("{e}") };
    assert_eq!(r.check, veil_attestation::CheckId::Tdx(C::TcbStatus), "{e}");
    let tdx = r.tdx.as_ref().unwrap();
    println!("{}\n{e}", tdx.table);
    assert!(matches!(&tdx.error, TdxError::NoTcbLevel(why) if why.contains("behind the lowest level")), "{e}");
    // Everything before the TCB verdict holds: the quote is genuine, just behind.
    for check in &C::ALL[..9] {
        assert!(matches!(tdx.table.outcome(*check), Some(Outcome::Passed { .. })), "{check}");
    }
    assert_eq!(tdx.table.failures(), vec![C::TcbStatus]);
}

/// Every signed region of the quote, flipped one bit at a time, fails the
/// check that guards it.
#[test]
fn a_flipped_bit_in_each_signed_region_fails_its_check() {
    let Some(s) = sample("tdx_quote") else { return };
    let q = Quote::parse(&s.quote).unwrap();
    let sig_at = q.signed_len + 4;
    let qe_at = sig_at + 128 + 6;
    let auth_at = qe_at + 384 + 64 + 2;
    let cases: [(&str, usize, &[C]); 8] = [
        ("header user data", 30, &[C::QuoteSignature]),
        ("TD report TEE_TCB_SVN", 48 + 2, &[C::QuoteSignature]),
        ("TD report MRTD", 48 + 136, &[C::QuoteSignature]),
        ("TD report REPORTDATA", q.signed_len - 1, &[C::QuoteSignature]),
        ("quote signature", sig_at + 5, &[C::QuoteSignature]),
        ("attestation key", sig_at + 64 + 7, &[C::QuoteSignature, C::QeReportData]),
        ("QE report", qe_at + 70, &[C::QeReportSignature]),
        ("QE auth data", auth_at + 3, &[C::QeReportData]),
    ];
    for (what, at, want) in cases {
        let mut b = s.quote.clone();
        b[at] ^= 0x01;
        let t = table(&b, &s.collateral, &any_measurement(), s.at);
        for c in want {
            assert!(failed(&t, *c), "{what} (byte {at}): {c} did not fail\n{t}");
        }
    }
}

/// A debuggable TD is refused by the attribute check (the edit also breaks
/// the quote's signature; every check still runs and both fail).
#[test]
fn debug_td_attributes_are_refused() {
    let Some(s) = sample("tdx_quote") else { return };
    let mut b = s.quote.clone();
    let attrs = 48 + 16 + 48 + 48 + 8;
    b[attrs] |= 0x01;
    let t = appraise_tdx(&b, &s.collateral, &any_measurement(), &TdxExpected::default(), s.at).table;
    assert!(failed(&t, C::TdAttributes), "{t}");
    assert!(matches!(t.error(C::TdAttributes), Some(TdxError::Debug)));
    assert!(failed(&t, C::QuoteSignature));
    // SEPT_VE_DISABLE cleared is refused by the default policy.
    let mut b = s.quote.clone();
    b[attrs + 3] &= !0x10;
    let t = table(&b, &s.collateral, &any_measurement(), s.at);
    assert!(matches!(t.error(C::TdAttributes), Some(TdxError::Attribute("SEPT_VE_DISABLE"))), "{t}");
}

fn edit_collateral(c: &[u8], field: &str, f: impl Fn(&str) -> String) -> Vec<u8> {
    let mut v: serde_json::Value = serde_json::from_slice(c).unwrap();
    let old = v[field].as_str().unwrap().to_owned();
    v[field] = serde_json::Value::String(f(&old));
    serde_json::to_vec(&v).unwrap()
}

/// Collateral edited, expired, not yet valid, or for another platform fails
/// the check that guards it.
#[test]
fn wrong_stale_or_edited_collateral_is_refused() {
    let (Some(s), Some(other)) = (sample("tdx_quote"), sample("tdx_quote_outdated")) else { return };
    let p = any_measurement();
    // The TCB info's text edited (an UpToDate level claimed): its signature fails.
    let c = edit_collateral(&s.collateral, "tcb_info", |t| t.replacen("\"OutOfDate\"", "\"UpToDate\"", 1));
    let t = table(&s.quote, &c, &p, s.at);
    assert!(matches!(t.error(C::TcbInfo), Some(TdxError::BadSignature("TCB info"))), "{t}");
    assert!(matches!(t.outcome(C::TcbStatus), Some(Outcome::NotRun { .. })), "an unverified TCB info rates nothing");
    let c = edit_collateral(&s.collateral, "qe_identity", |t| t.replacen("\"isvprodid\":2", "\"isvprodid\":3", 1));
    let t = table(&s.quote, &c, &p, s.at);
    assert!(matches!(t.error(C::QeIdentity), Some(TdxError::BadSignature("QE identity"))), "{t}");
    // A signature byte flipped.
    let c = edit_collateral(&s.collateral, "tcb_info_signature", |h| {
        format!("{}{}", if &h[..1] == "0" { "1" } else { "0" }, &h[1..])
    });
    assert!(failed(&table(&s.quote, &c, &p, s.at), C::TcbInfo));
    // Expired (a day after nextUpdate) and not yet issued.
    let late = parse_time("2025-07-20T11:00:00Z").unwrap();
    let t = table(&s.quote, &s.collateral, &p, late);
    assert!(matches!(t.error(C::TcbInfo), Some(TdxError::Stale { .. })), "{t}");
    let early = parse_time("2025-06-19T09:00:00Z").unwrap();
    assert!(matches!(table(&s.quote, &s.collateral, &p, early).error(C::TcbInfo), Some(TdxError::Stale { .. })));
    // Another platform's collateral (FMSPC 90C06F000000 for a B0C06F000000 quote), at its own time.
    let t = table(&s.quote, &other.collateral, &p, other.at);
    assert!(matches!(t.error(C::TcbInfo), Some(TdxError::WrongCollateral { .. })), "{t}");
    // The root's CRL handed over as the PCK CA's: not issued by it.
    let root_crl =
        serde_json::from_slice::<serde_json::Value>(&s.collateral).unwrap()["root_ca_crl"].as_str().unwrap().to_owned();
    let c = edit_collateral(&s.collateral, "pck_crl", |_| root_crl.clone());
    let t = table(&s.quote, &c, &p, s.at);
    assert!(matches!(t.error(C::Revocation), Some(TdxError::CrlUnusable { which: "PCK CRL", .. })), "{t}");
    // Garbage collateral is a format failure; the other checks do not run.
    let t = table(&s.quote, b"{}", &p, s.at);
    assert!(failed(&t, C::QuoteFormat));
    assert_eq!(t.not_run().len(), C::ALL.len() - 1);
}

/// REPORTDATA that differs from the expected value fails the binding check.
#[test]
fn a_report_data_mismatch_is_refused() {
    let Some(s) = sample("tdx_quote") else { return };
    let e = verify_tdx(&s.quote, &s.collateral, &any_measurement(), &TdxExpected { report_data: Some([7; 64]) }, s.at)
        .unwrap_err();
    assert_eq!(e.check(), Some(veil_attestation::CheckId::Tdx(C::ReportDataBinding)), "{e}");
    assert!(e.to_string().contains("tdx_report_data_binding"));
}

/// Policy refuses an accepted-but-behind status unless it names the
/// status and every advisory.
#[test]
fn tcb_statuses_below_up_to_date_need_the_policy_to_name_them() {
    let Some(s) = sample("tdx_quote") else { return };
    // An UpToDate quote passes any policy that lists UpToDate; a policy
    // accepting only OutOfDate refuses it with the status named.
    let p = TdxPolicy { accept_tcb_status: vec![TcbStatus::OutOfDate], ..any_measurement() };
    let t = table(&s.quote, &s.collateral, &p, s.at);
    assert!(
        matches!(t.error(C::TcbStatus), Some(TdxError::TcbStatusRefused { status: TcbStatus::UpToDate, .. })),
        "{t}"
    );
}

/// The fuzz seeds are in the real layout: both quotes parse, and the
/// collateral's bodies parse (their signatures are zero, so nothing verifies).
#[test]
fn tdx_fuzz_seeds_parse() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    for name in ["synthetic_v4.bin", "synthetic_v5_padded.bin"] {
        let q = Quote::parse(&std::fs::read(root.join("tdx_quote").join(name)).unwrap()).unwrap();
        assert_eq!(q.is_td15(), name.contains("v5"), "{name}");
    }
    let c = veil_attestation::tdx::Collateral::from_json(
        &std::fs::read(root.join("tdx_collateral/synthetic.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(c.tcb_info().unwrap().tcb_levels[0].tcb_status, TcbStatus::OutOfDate);
    assert_eq!(c.qe_identity().unwrap().isvprodid, 2);
}
