//! The TDX checker: one function per [`TdxCheckId`], every one evaluated,
//! into one table. Pure: the caller passes the quote, the collateral, the
//! policy, what it expects and the time.

use std::time::SystemTime;

use sha2::{Digest, Sha256};

use super::collateral::{fixed_hex, Collateral, IsvLevel, QeIdentity, TcbInfo, TcbStatus};
use super::error::{TdxCheckReport, TdxError};
use super::pck::{pck_extension, PckExtension};
use super::policy::{Register, TdxPolicy};
use super::quote::{Quote, TdAttributes, INTEL_QE_VENDOR_ID};
use super::simulated::is_simulated_tdx_cert;
use crate::check::{fail, TdxCheckId as C};
use crate::x509::{fmt_time, parse_time, ParsedCert, ParsedCrl};

/// Intel's SGX Root CA (SHA-256 fingerprint 44a0196b…74d3), which every TDX
/// chain must end in, byte for byte.
pub const INTEL_SGX_ROOT_CA_PEM: &str = include_str!("roots/intel_sgx_root_ca.pem");

/// The pinned Intel SGX Root CA.
pub fn intel_root() -> Result<ParsedCert, crate::x509::CertError> {
    ParsedCert::from_pem(INTEL_SGX_ROOT_CA_PEM.as_bytes())
}

/// What the relying party knows independently of the quote.
#[derive(Clone, Debug, Default)]
pub struct TdxExpected {
    /// The exact `REPORTDATA` (for Veil shards: SHA-512 of the canonical claims).
    pub report_data: Option<[u8; 64]>,
}

impl TdxExpected {
    /// The expectation for a Veil shard: `REPORTDATA` = SHA-512 of the
    /// canonical encoding of `claims`, exactly as an SNP shard's REPORT_DATA.
    pub fn for_claims(claims: &crate::claims::Claims) -> Result<Self, crate::invalid::InvalidValue> {
        Ok(Self { report_data: Some(claims.report_data()?.0) })
    }
}

/// The matched TCB: the combined status and every advisory of the matched levels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcbVerdict {
    /// Platform, module and QE combined.
    pub status: TcbStatus,
    /// Advisory IDs, sorted, without duplicates.
    pub advisories: Vec<String>,
}

/// The table, and what the checks established when they could run.
#[derive(Clone, Debug)]
pub struct TdxAppraisal {
    /// Every check, in order.
    pub table: TdxCheckReport,
    /// The parsed quote, when it parsed.
    pub quote: Option<Quote>,
    /// The platform values of the PCK certificate, when it parsed.
    pub pck: Option<PckExtension>,
    /// The matched TCB, when the collateral verified and a level matched.
    pub tcb: Option<TcbVerdict>,
}

type Row = crate::check::Row<TdxError>;

/// The parsed inputs every check reads.
struct Input<'a> {
    raw: &'a [u8],
    quote: Quote,
    collateral: Collateral,
    tcb_info: TcbInfo,
    qe_identity: QeIdentity,
    pck_certs: Result<Vec<ParsedCert>, String>,
    root: ParsedCert,
    simulated: bool,
    /// Why a chain ending in the simulated hierarchy was refused.
    simulated_refused: Option<String>,
    policy: &'a TdxPolicy,
    now: SystemTime,
}

impl Input<'_> {
    fn leaf(&self) -> Option<&ParsedCert> {
        self.pck_certs.as_ref().ok().and_then(|c| c.first())
    }
}

/// Runs every check on a quote and its collateral.
pub fn appraise_tdx(
    quote: &[u8],
    collateral: &[u8],
    policy: &TdxPolicy,
    expected: &TdxExpected,
    now: SystemTime,
) -> TdxAppraisal {
    let mut t = TdxCheckReport::default();
    let x = match parse_inputs(quote, collateral, policy, now) {
        Ok((x, detail)) => {
            t.put(C::QuoteFormat, Row::Pass(detail));
            x
        }
        Err(row) => {
            t.put(C::QuoteFormat, row);
            for c in &C::ALL[1..] {
                t.put(*c, Row::NotRun("the quote or its collateral did not parse".into()));
            }
            return TdxAppraisal { table: t, quote: None, pck: None, tcb: None };
        }
    };
    let pck = check_pck_chain(&x, &mut t);
    t.put(C::Revocation, check_revocation(&x));
    let tcb_info_ok = record_ok(&mut t, C::TcbInfo, check_tcb_info(&x, pck.as_ref()));
    let qe_identity_ok = record_ok(&mut t, C::QeIdentity, check_qe_identity(&x));
    t.put(C::QeReportSignature, check_qe_report_signature(&x));
    t.put(C::QeReportData, check_qe_report_data(&x));
    let (row, qe_level) = check_qe_identity_match(&x, qe_identity_ok);
    t.put(C::QeIdentityMatch, row);
    t.put(C::QuoteSignature, check_quote_signature(&x));
    let (row, module_level) = check_tdx_module(&x, tcb_info_ok);
    t.put(C::TdxModule, row);
    let (row, tcb) = check_tcb_status(&x, tcb_info_ok, pck.as_ref(), module_level, qe_level);
    t.put(C::TcbStatus, row);
    t.put(C::TdAttributes, check_td_attributes(&x));
    t.put(C::ServiceTd, check_service_td(&x));
    t.put(C::Measurements, check_measurements(&x));
    t.put(C::ReportDataBinding, check_report_data(&x, expected));
    if x.simulated {
        t.warnings.push(
            "SIMULATED TDX evidence: signed by Veil's software hierarchy, not by Intel hardware. Accepted only \
             because the policy sets allow_simulated = true. It proves nothing."
                .into(),
        );
        t.mark_simulated(&[C::QuoteFormat]);
    }
    TdxAppraisal { table: t, quote: Some(x.quote), pck, tcb }
}

fn record_ok(t: &mut TdxCheckReport, check: C, row: Row) -> bool {
    let ok = matches!(row, Row::Pass(_) | Row::Warn(..));
    t.put(check, row);
    ok
}

/// Check 1: The quote and the collateral parse.
fn parse_inputs<'a>(
    raw: &'a [u8],
    collateral: &[u8],
    policy: &'a TdxPolicy,
    now: SystemTime,
) -> Result<(Input<'a>, String), Row> {
    let quote = Quote::parse(raw)
        .map_err(|e| fail(TdxError::Quote(e.clone()), "a TDX quote v4 or v5 (ECDSA P-256, Intel QE)", e.to_string()))?;
    if quote.header.qe_vendor_id != INTEL_QE_VENDOR_ID {
        let e = super::quote::QuoteError::Unsupported {
            field: "QE vendor ID",
            actual: hex::encode(quote.header.qe_vendor_id),
            expected: "Intel's (939a7233f79c4ca9940a0db3957f0607)",
        };
        return Err(fail(TdxError::Quote(e.clone()), "Intel's QE vendor ID", e.to_string()));
    }
    let collateral_err = |e: super::collateral::CollateralError| {
        fail(TdxError::Collateral(e.clone()), "collateral in the PCCS JSON form", e.to_string())
    };
    let collateral = Collateral::from_json(collateral).map_err(collateral_err)?;
    let tcb_info = collateral.tcb_info().map_err(collateral_err)?;
    let qe_identity = collateral.qe_identity().map_err(collateral_err)?;
    let root = intel_root().map_err(|e| {
        fail(TdxError::Chain { which: "pinned root", reason: e.to_string() }, "a usable pinned root", e.to_string())
    })?;
    let pck_certs = ParsedCert::chain_from_pem(&quote.pck_chain_pem).map_err(|e| e.to_string());
    // A chain ending in Veil's simulated hierarchy is checked against its own
    // root, only under allow_simulated, and every row is flagged.
    let simulated_top = pck_certs.as_ref().ok().and_then(|c| c.last()).filter(|c| is_simulated_tdx_cert(c));
    let (root, simulated, simulated_refused) = match simulated_top {
        Some(top) if policy.allow_simulated => (top.clone(), true, None),
        Some(top) => {
            (root, false, Some(format!("SIMULATED root {:?} (policy allow_simulated = false)", top.subject_string())))
        }
        None => (root, false, None),
    };
    let padding = match quote.trailing.len() {
        0 => String::new(),
        n if quote.trailing.iter().all(|b| *b == 0) => format!(" ({n} zero bytes of padding after the signature data)"),
        n => format!(" ({n} unsigned non-zero bytes after the signature data, ignored)"),
    };
    let detail = format!(
        "quote v{} ({}), {} bytes{padding}; collateral: TCB info {} v{} (FMSPC {}), QE identity {} v{}",
        quote.header.version,
        if quote.is_td15() { "TD 1.5" } else { "TD 1.0" },
        raw.len(),
        tcb_info.id,
        tcb_info.version,
        tcb_info.fmspc,
        qe_identity.id,
        qe_identity.version,
    );
    let x = Input {
        raw,
        quote,
        collateral,
        tcb_info,
        qe_identity,
        pck_certs,
        root,
        simulated,
        simulated_refused,
        policy,
        now,
    };
    Ok((x, detail))
}

/// A chain (leaf first) to the pinned root: 2 or 3 certificates, each
/// issued (name and signature) by the next, those above the leaf CAs, the
/// top equal to the root byte for byte, all valid at `now`.
fn intel_chain(certs: &[ParsedCert], root: &ParsedCert, now: SystemTime) -> Result<String, String> {
    if !(2..=3).contains(&certs.len()) {
        return Err(format!("{} certificates, expected 2 or 3 ending in the root", certs.len()));
    }
    for pair in certs.windows(2) {
        let (child, parent) = (&pair[0], &pair[1]);
        if !child.issued_by_name(parent) {
            return Err(format!("{:?} is not issued by {:?}", child.subject_string(), parent.subject_string()));
        }
        child.verify_signed_by(parent).map_err(|e| format!("{:?}: {e}", child.subject_string()))?;
        if !is_ca(parent) {
            return Err(format!("{:?} is not a CA", parent.subject_string()));
        }
    }
    let top = &certs[certs.len() - 1];
    if top.der() != root.der() {
        return Err(format!("the chain ends in {:?}, not the pinned Intel SGX Root CA", top.subject_string()));
    }
    for c in certs {
        c.check_validity(now).map_err(|r| format!("{:?} at {}: {r}", c.subject_string(), fmt_time(now)))?;
    }
    Ok(certs.iter().map(|c| c.common_name().unwrap_or_default()).collect::<Vec<_>>().join(" → "))
}

fn is_ca(cert: &ParsedCert) -> bool {
    use der::Decode;
    let bc = const_oid::ObjectIdentifier::new_unwrap("2.5.29.19");
    match cert.extension(bc) {
        Ok(Some(v)) => x509_cert::ext::pkix::BasicConstraints::from_der(v).map(|b| b.ca).unwrap_or(false),
        _ => false,
    }
}

/// Check 2: The PCK chain; returns the PCK certificate's platform values.
fn check_pck_chain(x: &Input<'_>, t: &mut TdxCheckReport) -> Option<PckExtension> {
    if let Some(why) = &x.simulated_refused {
        let err = TdxError::Chain { which: "PCK", reason: why.clone() };
        t.put(C::PckChain, fail(err, "a chain to the Intel SGX Root CA", why.clone()));
        return None;
    }
    let certs = match &x.pck_certs {
        Ok(c) => c,
        Err(e) => {
            let err = TdxError::Chain { which: "PCK", reason: e.clone() };
            t.put(C::PckChain, fail(err, "a PEM chain: PCK, PCK CA, Intel SGX Root CA", e.clone()));
            return None;
        }
    };
    let chain = intel_chain(certs, &x.root, x.now);
    let ext = x.leaf().map(pck_extension).transpose();
    match (chain, ext) {
        (Ok(names), Ok(Some(ext))) => {
            t.put(
                C::PckChain,
                Row::Pass(format!(
                    "{names} (pinned root), valid at {}; FMSPC {}, PCE ID {}, PCESVN {}",
                    fmt_time(x.now),
                    hex::encode_upper(ext.fmspc),
                    hex::encode_upper(ext.pce_id),
                    ext.pce_svn
                )),
            );
            Some(ext)
        }
        (Err(e), _) => {
            let err = TdxError::Chain { which: "PCK", reason: e.clone() };
            t.put(C::PckChain, fail(err, "PCK → PCK CA → the pinned Intel SGX Root CA, valid now", e));
            None
        }
        (Ok(_), Err(e)) => {
            let err = TdxError::Chain { which: "PCK", reason: e.to_string() };
            t.put(C::PckChain, fail(err, "a PCK certificate with Intel's SGX extension", e.to_string()));
            None
        }
        (Ok(_), Ok(None)) => None,
    }
}

/// A CRL issued and signed by `issuer`, current at `now`.
fn usable_crl(which: &'static str, der: &[u8], issuer: &ParsedCert, now: SystemTime) -> Result<ParsedCrl, TdxError> {
    let unusable = |reason: String| TdxError::CrlUnusable { which, reason };
    let crl = ParsedCrl::from_der(der).map_err(|e| unusable(e.to_string()))?;
    if !crl.issued_by_name(issuer) {
        return Err(unusable(format!("not issued by {:?}", issuer.subject_string())));
    }
    crl.verify_signed_by(issuer).map_err(|e| unusable(e.to_string()))?;
    let (this, next) = crl.window();
    if now < this || next.is_some_and(|n| now > n) {
        return Err(unusable(format!(
            "valid {} to {}, not at {}",
            fmt_time(this),
            next.map(fmt_time).unwrap_or_else(|| "(no nextUpdate)".into()),
            fmt_time(now)
        )));
    }
    Ok(crl)
}

/// Check 3: Revocation: the root's CRL and the PCK CA's CRL, both current and
/// signed by their issuers; neither lists a certificate this quote or its
/// collateral rests on.
fn check_revocation(x: &Input<'_>) -> Row {
    let Ok(certs) = &x.pck_certs else { return Row::NotRun("the PCK chain did not parse".into()) };
    let Some(pck_ca) = certs.get(1).filter(|_| certs.len() == 3) else {
        return Row::NotRun("the PCK chain has no intermediate CA".into());
    };
    let decoded = x.collateral.root_ca_crl_der().and_then(|r| Ok((r, x.collateral.pck_crl_der()?)));
    let (root_der, pck_der) = match decoded {
        Ok(d) => d,
        Err(e) => return fail(TdxError::Collateral(e.clone()), "hex DER CRLs", e.to_string()),
    };
    let crls = usable_crl("root CA CRL", &root_der, &x.root, x.now)
        .and_then(|r| Ok((r, usable_crl("PCK CRL", &pck_der, pck_ca, x.now)?)));
    let (root_crl, pck_crl) = match crls {
        Ok(c) => c,
        Err(e) => return fail(e.clone(), "CRLs signed by the root and the PCK CA, current now", e.to_string()),
    };
    let mut signers: Vec<ParsedCert> = vec![pck_ca.clone()];
    for pem in [&x.collateral.tcb_info_issuer_chain, &x.collateral.qe_identity_issuer_chain] {
        if let Some(c) = ParsedCert::chain_from_pem(pem.as_bytes()).ok().and_then(|c| c.into_iter().next()) {
            signers.push(c);
        }
    }
    for (crl, which, cert) in
        signers.iter().map(|c| (&root_crl, "root CA CRL", c)).chain([(&pck_crl, "PCK CRL", &certs[0])])
    {
        if crl.revokes(cert.serial()) {
            let name = cert.common_name().unwrap_or_else(|| cert.subject_string());
            return fail(
                TdxError::Revoked { cert: name.clone(), which },
                format!("{name} not listed"),
                format!("serial {} listed in the {which}", hex::encode(cert.serial())),
            );
        }
    }
    let (_, next) = pck_crl.window();
    Row::Pass(format!(
        "root CA CRL and PCK CRL current at {} (PCK CRL next update {}); no certificate listed",
        fmt_time(x.now),
        next.map(fmt_time).unwrap_or_else(|| "none".into())
    ))
}

/// A signed collateral document: its issuer chain to the pinned root, the
/// signature over its exact text, and its window at `now`.
fn signed_document(
    x: &Input<'_>,
    what: &'static str,
    chain_pem: &str,
    body: &str,
    signature: Result<[u8; 64], super::collateral::CollateralError>,
    window: (&str, &str),
) -> Result<String, Row> {
    let chain = ParsedCert::chain_from_pem(chain_pem.as_bytes()).map_err(|e| e.to_string()).and_then(|certs| {
        let names = intel_chain(&certs, &x.root, x.now)?;
        Ok((certs, names))
    });
    let (certs, names) = chain.map_err(|reason| {
        fail(TdxError::Chain { which: what, reason: reason.clone() }, "a signing chain to the pinned root", reason)
    })?;
    let signature =
        signature.map_err(|e| fail(TdxError::Collateral(e.clone()), "a 64-byte hex signature", e.to_string()))?;
    certs[0]
        .verify_p256_fixed(body.as_bytes(), &signature)
        .map_err(|e| fail(TdxError::BadSignature(what), format!("the {what} signed by {names}"), e.to_string()))?;
    let (issue, next) = (parse_time(window.0), parse_time(window.1));
    let (Some(issue), Some(next)) = (issue, next) else {
        let reason = format!("issueDate {:?}, nextUpdate {:?} do not parse", window.0, window.1);
        return Err(fail(TdxError::Stale { what, reason: reason.clone() }, "RFC 3339 dates", reason));
    };
    if x.now < issue || x.now > next {
        let reason = format!("valid {} to {}, not at {}", window.0, window.1, fmt_time(x.now));
        return Err(fail(TdxError::Stale { what, reason: reason.clone() }, "a current document", reason));
    }
    Ok(format!("signed by {names}; valid {} to {}", window.0, window.1))
}

/// Check 4: The TCB info: signed, current, for this platform (FMSPC, PCE ID) and for TDX.
fn check_tcb_info(x: &Input<'_>, pck: Option<&PckExtension>) -> Row {
    let ti = &x.tcb_info;
    let c = &x.collateral;
    let detail = match signed_document(
        x,
        "TCB info",
        &c.tcb_info_issuer_chain,
        &c.tcb_info,
        c.tcb_info_signature(),
        (&ti.issue_date, &ti.next_update),
    ) {
        Ok(d) => d,
        Err(row) => return row,
    };
    let wrong =
        |reason: String| fail(TdxError::WrongCollateral { what: "TCB info", reason: reason.clone() }, "", reason);
    if ti.id != "TDX" || ti.version != 3 {
        return wrong(format!("id {:?} version {}, expected TDX version 3", ti.id, ti.version));
    }
    let Some(pck) = pck else { return Row::NotRun("no PCK certificate to compare the FMSPC with".into()) };
    let fmspc = hex::decode(&ti.fmspc).unwrap_or_default();
    if fmspc != pck.fmspc {
        return wrong(format!(
            "FMSPC {} in the TCB info, {} in the PCK certificate",
            ti.fmspc,
            hex::encode_upper(pck.fmspc)
        ));
    }
    if hex::decode(&ti.pce_id).unwrap_or_default() != pck.pce_id {
        return wrong(format!("PCE ID {} in the TCB info, {} in the PCK", ti.pce_id, hex::encode_upper(pck.pce_id)));
    }
    Row::Pass(format!("{detail}; FMSPC {}, evaluation data number {}", ti.fmspc, ti.tcb_evaluation_data_number))
}

/// Check 5: The QE identity: signed, current, Intel's TD QE.
fn check_qe_identity(x: &Input<'_>) -> Row {
    let q = &x.qe_identity;
    let c = &x.collateral;
    let detail = match signed_document(
        x,
        "QE identity",
        &c.qe_identity_issuer_chain,
        &c.qe_identity,
        c.qe_identity_signature(),
        (&q.issue_date, &q.next_update),
    ) {
        Ok(d) => d,
        Err(row) => return row,
    };
    if q.id != "TD_QE" || !matches!(q.version, 2 | 3) {
        let reason = format!("id {:?} version {}, expected TD_QE version 2 or 3", q.id, q.version);
        return fail(TdxError::WrongCollateral { what: "QE identity", reason: reason.clone() }, "TD_QE", reason);
    }
    Row::Pass(detail)
}

/// Check 6: The PCK key signed the QE report.
fn check_qe_report_signature(x: &Input<'_>) -> Row {
    let Some(leaf) = x.leaf() else { return Row::NotRun("no PCK certificate".into()) };
    match leaf.verify_p256_fixed(&x.quote.qe_report.raw, &x.quote.qe_report_signature) {
        Ok(()) => Row::Pass("ECDSA P-256 over the 384-byte QE report, PCK key".into()),
        Err(e) => fail(TdxError::BadSignature("QE report"), "a QE report signed by the PCK key", e.to_string()),
    }
}

/// Check 7: The QE report data is SHA-256(attestation key ‖ QE auth data) ‖ zeros.
fn check_qe_report_data(x: &Input<'_>) -> Row {
    let q = &x.quote;
    let mut h = Sha256::new();
    h.update(q.attestation_key);
    h.update(&q.qe_auth_data);
    let want: [u8; 32] = h.finalize().into();
    let rd = &q.qe_report.report_data;
    if rd[..32] == want && rd[32..].iter().all(|b| *b == 0) {
        Row::Pass(format!(
            "SHA-256(attestation key ‖ {}-byte auth data) = {}…",
            q.qe_auth_data.len(),
            &hex::encode(want)[..16]
        ))
    } else {
        fail(TdxError::QeReportDataMismatch, format!("{} ‖ zeros", hex::encode(want)), hex::encode(rd))
    }
}

/// The first level (best first) whose SVN the value reaches.
fn isv_level(levels: &[IsvLevel], svn: u16) -> Option<&IsvLevel> {
    levels.iter().find(|l| svn >= l.tcb.isvsvn)
}

/// Check 8: The QE report matches the QE identity; returns the QE's level.
fn check_qe_identity_match(x: &Input<'_>, identity_ok: bool) -> (Row, Option<(TcbStatus, Vec<String>)>) {
    if !identity_ok {
        return (Row::NotRun("the QE identity did not verify".into()), None);
    }
    let (qi, r) = (&x.qe_identity, &x.quote.qe_report);
    let mismatch =
        |what: String| (fail(TdxError::QeIdentityMismatch(what.clone()), "the QE identity's values", what), None);
    let fields = fixed_hex::<32>("mrsigner", &qi.mrsigner).and_then(|s| {
        Ok((
            s,
            fixed_hex::<4>("miscselect", &qi.miscselect)?,
            fixed_hex::<4>("miscselectMask", &qi.miscselect_mask)?,
            fixed_hex::<16>("attributes", &qi.attributes)?,
            fixed_hex::<16>("attributesMask", &qi.attributes_mask)?,
        ))
    });
    let (signer, misc, misc_mask, attrs, attrs_mask) = match fields {
        Ok(f) => f,
        Err(e) => return (fail(TdxError::Collateral(e.clone()), "hex fields", e.to_string()), None),
    };
    if r.mr_signer != signer {
        return mismatch(format!("MRSIGNER {} (identity: {})", hex::encode(r.mr_signer), qi.mrsigner));
    }
    if r.isv_prod_id != qi.isvprodid {
        return mismatch(format!("ISVPRODID {} (identity: {})", r.isv_prod_id, qi.isvprodid));
    }
    let (misc, misc_mask) = (u32::from_le_bytes(misc), u32::from_le_bytes(misc_mask));
    if r.misc_select & misc_mask != misc & misc_mask {
        return mismatch(format!("MISCSELECT {:08x} under mask {misc_mask:08x}", r.misc_select));
    }
    if r.attributes.iter().zip(attrs_mask).zip(attrs).any(|((a, m), e)| a & m != e & m) {
        return mismatch(format!("ATTRIBUTES {} under mask {}", hex::encode(r.attributes), qi.attributes_mask));
    }
    if r.attributes[0] & 0x02 != 0 {
        return mismatch("the QE is a debug enclave".into());
    }
    match isv_level(&qi.tcb_levels, r.isv_svn) {
        Some(l) => (
            Row::Pass(format!("Intel TD QE (ISVPRODID {}), ISVSVN {} → {}", r.isv_prod_id, r.isv_svn, l.tcb_status)),
            Some((l.tcb_status, l.advisory_ids.clone())),
        ),
        None => {
            let min = qi.tcb_levels.last().map(|l| l.tcb.isvsvn.to_string()).unwrap_or_else(|| "(no levels)".into());
            let e = TdxError::NoTcbLevel(format!("QE ISVSVN {} is below the lowest level {min}", r.isv_svn));
            (fail(e, format!("QE ISVSVN ≥ {min}"), r.isv_svn.to_string()), None)
        }
    }
}

/// Check 9: The attestation key signed the header and the TD report.
fn check_quote_signature(x: &Input<'_>) -> Row {
    use ring::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_FIXED};
    let q = &x.quote;
    let mut key = [0x04u8; 65];
    key[1..].copy_from_slice(&q.attestation_key);
    match UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, key).verify(&x.raw[..q.signed_len], &q.signature) {
        Ok(()) => Row::Pass(format!("ECDSA P-256 over the first {} bytes, attestation key", q.signed_len)),
        Err(_) => fail(
            TdxError::BadSignature("quote"),
            "header and TD report signed by the attestation key",
            "does not verify",
        ),
    }
}

/// Check 10: The TDX module's signer and attributes; returns the module's own
/// level when the TCB info rates its major version.
fn check_tdx_module(x: &Input<'_>, tcb_info_ok: bool) -> (Row, Option<(TcbStatus, Vec<String>)>) {
    if !tcb_info_ok {
        return (Row::NotRun("the TCB info did not verify".into()), None);
    }
    let r = &x.quote.report;
    let (svn, major) = (r.tee_tcb_svn[0], r.tee_tcb_svn[1]);
    let Some(base) = &x.tcb_info.tdx_module else {
        let e = TdxError::WrongCollateral { what: "TCB info", reason: "no tdxModule".into() };
        return (fail(e, "a tdxModule entry", "none"), None);
    };
    let wanted = format!("TDX_{major:02X}");
    let identity = if major > 0 {
        match x.tcb_info.tdx_module_identities.iter().find(|m| m.id.eq_ignore_ascii_case(&wanted)) {
            Some(m) => Some(m),
            None if x.tcb_info.tdx_module_identities.is_empty() => None,
            None => {
                let e = TdxError::ModuleMismatch(format!("no identity {wanted} in the TCB info"));
                return (fail(e, format!("a tdxModuleIdentities entry {wanted}"), "none"), None);
            }
        }
    } else {
        None
    };
    let (signer, attrs, mask) = match identity {
        Some(m) => (&m.mrsigner, &m.attributes, &m.attributes_mask),
        None => (&base.mrsigner, &base.attributes, &base.attributes_mask),
    };
    let parsed = fixed_hex::<48>("mrsigner", signer)
        .and_then(|s| Ok((s, fixed_hex::<8>("attributes", attrs)?, fixed_hex::<8>("attributesMask", mask)?)));
    let (signer, attrs, mask) = match parsed {
        Ok(p) => p,
        Err(e) => return (fail(TdxError::Collateral(e.clone()), "hex fields", e.to_string()), None),
    };
    if r.mr_signer_seam != signer {
        let e = TdxError::ModuleMismatch("MRSIGNERSEAM".into());
        return (fail(e, hex::encode(signer), hex::encode(r.mr_signer_seam)), None);
    }
    let seam = r.seam_attributes;
    if seam.iter().zip(mask).zip(attrs).any(|((a, m), e)| a & m != e & m || a & !m != 0) {
        let e = TdxError::ModuleMismatch("SEAMATTRIBUTES".into());
        return (fail(e, format!("{} under mask {}", hex::encode(attrs), hex::encode(mask)), hex::encode(seam)), None);
    }
    let Some(identity) = identity else {
        return (Row::Pass(format!("module v{major} SVN {svn}: signer and attributes match tdxModule")), None);
    };
    match isv_level(&identity.tcb_levels, u16::from(svn)) {
        Some(l) => (
            Row::Pass(format!("{wanted}, module SVN {svn} → {}", l.tcb_status)),
            Some((l.tcb_status, l.advisory_ids.clone())),
        ),
        None => {
            let e = TdxError::NoTcbLevel(format!("TDX module SVN {svn} is below every {wanted} level"));
            (fail(e, format!("a {wanted} level at or below SVN {svn}"), svn.to_string()), None)
        }
    }
}

/// What the platform has that is behind `level`, component by component.
fn behind(level: &super::collateral::TcbComponents, pck: &PckExtension, tee: &[u8; 16]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, (c, have)) in level.sgxtcbcomponents.iter().zip(pck.cpu_svn).enumerate() {
        if have < c.svn {
            let kind = c.kind.as_deref().or(c.category.as_deref()).unwrap_or("component");
            out.push(format!("SGX TCB component {} ({kind}) {have} < {}", i + 1, c.svn));
        }
    }
    if pck.pce_svn < level.pcesvn {
        out.push(format!("PCESVN {} < {}", pck.pce_svn, level.pcesvn));
    }
    for (i, (c, have)) in level.tdxtcbcomponents.iter().zip(tee).enumerate() {
        if *have < c.svn {
            let kind = c.kind.as_deref().or(c.category.as_deref()).unwrap_or("component");
            out.push(format!("TDX TCB component {} ({kind}) {have} < {}", i + 1, c.svn));
        }
    }
    out
}

/// Check 11: The platform's level (the first, best first, that the PCK's CPU SVN
/// and PCE SVN and the TD report's TEE TCB SVN all reach, every component
/// compared), combined with the module's and the QE's; then the policy.
fn check_tcb_status(
    x: &Input<'_>,
    tcb_info_ok: bool,
    pck: Option<&PckExtension>,
    module: Option<(TcbStatus, Vec<String>)>,
    qe: Option<(TcbStatus, Vec<String>)>,
) -> (Row, Option<TcbVerdict>) {
    if !tcb_info_ok {
        return (Row::NotRun("the TCB info did not verify".into()), None);
    }
    let Some(pck) = pck else { return (Row::NotRun("no PCK certificate values".into()), None) };
    let tee = &x.quote.report.tee_tcb_svn;
    for l in &x.tcb_info.tcb_levels {
        if l.tcb.sgxtcbcomponents.len() != 16 || l.tcb.tdxtcbcomponents.len() != 16 {
            let reason = "a TCB level without 16 SGX and 16 TDX components".to_owned();
            let e = TdxError::WrongCollateral { what: "TCB info", reason: reason.clone() };
            return (fail(e, "16 components per level", reason), None);
        }
    }
    let level = x.tcb_info.tcb_levels.iter().find(|l| behind(&l.tcb, pck, tee).is_empty());
    let Some(level) = level else {
        let lowest = x.tcb_info.tcb_levels.last();
        let what = lowest.map(|l| behind(&l.tcb, pck, tee).join(", ")).unwrap_or_else(|| "no levels".into());
        let e = TdxError::NoTcbLevel(format!("behind the lowest level: {what}"));
        return (fail(e, "a TCB level the platform reaches", format!("behind every level (lowest: {what})")), None);
    };
    let mut status = level.tcb_status;
    let mut advisories = level.advisory_ids.clone();
    let mut parts = vec![format!("platform {} ({})", level.tcb_status, level.tcb_date)];
    for (what, l) in [("module", &module), ("QE", &qe)] {
        if let Some((s, a)) = l {
            status = status.worst(*s);
            advisories.extend(a.iter().cloned());
            parts.push(format!("{what} {s}"));
        }
    }
    advisories.sort();
    advisories.dedup();
    let verdict = TcbVerdict { status, advisories: advisories.clone() };
    let summary = format!(
        "{status} ({}){}",
        parts.join(", "),
        if advisories.is_empty() { String::new() } else { format!("; advisories {}", advisories.join(", ")) }
    );
    let policy = x.policy;
    if !policy.accept_tcb_status.contains(&status) {
        let accepted: Vec<&str> = policy.accept_tcb_status.iter().map(|s| s.name()).collect();
        let e = TdxError::TcbStatusRefused { status, advisories: Vec::new() };
        return (fail(e, format!("one of {}", accepted.join(", ")), summary), Some(verdict));
    }
    let refused: Vec<String> = advisories.iter().filter(|a| !policy.accept_advisories.contains(a)).cloned().collect();
    if status != TcbStatus::UpToDate && !refused.is_empty() {
        let e = TdxError::TcbStatusRefused { status, advisories: refused.clone() };
        return (fail(e, "every advisory named in accept_advisories", summary), Some(verdict));
    }
    if status != TcbStatus::UpToDate {
        let warning = format!("accepted below UpToDate by policy ({status})");
        return (Row::Warn(summary, warning), Some(verdict));
    }
    (Row::Pass(summary), Some(verdict))
}

/// Check 12: TD attributes.
fn check_td_attributes(x: &Input<'_>) -> Row {
    let a = TdAttributes::from_bytes(x.quote.report.td_attributes);
    let p = x.policy;
    let names = a.names();
    if a.has(TdAttributes::DEBUG) && !p.allow_debug {
        return fail(TdxError::Debug, "DEBUG clear", names);
    }
    if !a.has(TdAttributes::SEPT_VE_DISABLE) && p.require_sept_ve_disable {
        return fail(TdxError::Attribute("SEPT_VE_DISABLE"), "SEPT_VE_DISABLE set", names);
    }
    if a.has(TdAttributes::PERFMON) && !p.allow_perfmon {
        return fail(TdxError::Attribute("PERFMON"), "PERFMON clear", names);
    }
    if a.has(TdAttributes::MIGRATABLE) && !p.allow_migratable {
        return fail(TdxError::Attribute("MIGRATABLE"), "MIGRATABLE clear", names);
    }
    let unknown = a.0 & TdAttributes::UNNAMED;
    if unknown != 0 {
        if p.refuse_unknown_attributes {
            return fail(TdxError::Attribute("an unnamed bit"), "no bits this verifier cannot name", names);
        }
        return Row::Warn(names, format!("attribute bits {unknown:#x} are not named by this verifier"));
    }
    Row::Pass(names)
}

/// Check 13: No service TD bound, unless allowed.
fn check_service_td(x: &Input<'_>) -> Row {
    match x.quote.report.mr_service_td {
        None => Row::Pass("TD 1.0 report: no service TD field".into()),
        Some(m) if m == [0; 48] => Row::Pass("MRSERVICETD is zero".into()),
        Some(m) if x.policy.allow_service_td => {
            Row::Warn(format!("MRSERVICETD {}", hex::encode(m)), "a service TD is bound (allowed by policy)".into())
        }
        Some(m) => fail(TdxError::ServiceTd, "MRSERVICETD zero", hex::encode(m)),
    }
}

/// Check 14: MRTD on the allowlist; the RTMRs and owner fields the policy pins.
fn check_measurements(x: &Input<'_>) -> Row {
    let (r, p) = (&x.quote.report, x.policy);
    let mut pinned = Vec::new();
    if p.any_measurement {
        pinned.push("MRTD (any, by policy)".to_owned());
    } else if p.mrtd.is_empty() {
        return fail(TdxError::Measurement("MRTD"), "an MRTD allowlist (or any_measurement)", hex::encode(r.mr_td));
    } else if !p.mrtd.contains(&Register(r.mr_td)) {
        return fail(TdxError::Measurement("MRTD"), "an MRTD on the allowlist", hex::encode(r.mr_td));
    } else {
        pinned.push("MRTD".to_owned());
    }
    let lists: [(&'static str, &Vec<Register>, &[u8; 48]); 4] = [
        ("RTMR0", &p.rtmr0, &r.rtmr[0]),
        ("RTMR1", &p.rtmr1, &r.rtmr[1]),
        ("RTMR2", &p.rtmr2, &r.rtmr[2]),
        ("RTMR3", &p.rtmr3, &r.rtmr[3]),
    ];
    for (name, allowed, got) in lists {
        if allowed.is_empty() {
            continue;
        }
        if !allowed.contains(&Register(*got)) {
            return fail(TdxError::Measurement(name), format!("{name} on the allowlist"), hex::encode(got));
        }
        pinned.push(name.to_owned());
    }
    let exact: [(&'static str, &Option<Register>, &[u8; 48]); 3] = [
        ("MRCONFIGID", &p.mr_config_id, &r.mr_config_id),
        ("MROWNER", &p.mr_owner, &r.mr_owner),
        ("MROWNERCONFIG", &p.mr_owner_config, &r.mr_owner_config),
    ];
    for (name, want, got) in exact {
        match want {
            Some(w) if w.0 != *got => {
                return fail(TdxError::Measurement(name), hex::encode(w.0), hex::encode(got));
            }
            Some(_) => pinned.push(name.to_owned()),
            None => {}
        }
    }
    let detail = format!("MRTD {}…; pinned: {}", &hex::encode(r.mr_td)[..16], pinned.join(", "));
    if p.any_measurement {
        Row::Warn(detail, "any_measurement: any firmware passes".into())
    } else {
        Row::Pass(detail)
    }
}

/// Check 15: `REPORTDATA` equals the expected value.
fn check_report_data(x: &Input<'_>, expected: &TdxExpected) -> Row {
    let got = &x.quote.report.report_data;
    match &expected.report_data {
        None => Row::NotRun("no expected REPORTDATA given".into()),
        Some(want) if want == got => Row::Pass(format!("REPORTDATA {}…", &hex::encode(got)[..16])),
        Some(want) => fail(TdxError::ReportDataMismatch, hex::encode(want), hex::encode(got)),
    }
}
