//! Azure confidential VMs (SEV-SNP behind Microsoft's paravisor): the guest
//! gets no SNP report with its own REPORT_DATA. It gets an HCL report, whose
//! SNP report's REPORT_DATA commits to runtime claims that hold the vTPM's
//! attestation key, and then TPM quotes signed by that key. Verifying the
//! pair means: the SNP report passes the SNP checks; the claims hash to its
//! REPORT_DATA; the quote verifies under the claims' key, with the
//! verifier's nonce as qualifying data, over the PCRs the policy pins.
//!
//! ```text
//!  AMD VCEK ─signs─▶ SNP report ─REPORT_DATA = H(claims)─▶ runtime claims ─HCLAkPub─▶ TPM quote
//!                                                                  extraData = nonce, pcrDigest = H(PCRs)
//! ```
//!
//! This module checks the Azure rows given the SNP table;
//! [`crate::verify::appraise_azure`] runs the SNP checks on the report
//! inside and combines both.

pub mod error;
pub mod hcl;
pub mod policy;
pub mod tpm;

pub use self::error::{AzureCheckReport, AzureCheckResult, AzureError};
pub use self::hcl::{HclError, HclReport, RsaKey, RuntimeClaims};
pub use self::policy::AzurePolicy;
pub use self::tpm::{TpmError, TpmQuote};
pub use crate::check::AzureCheckId;
use crate::check::{fail, CheckReport};
use crate::invalid::InvalidValue;

/// What the relying party expects.
#[derive(Clone, Debug, Default)]
pub struct AzureExpected {
    /// The TPM quote's qualifying data (the nonce the verifier sent).
    pub nonce: Option<Vec<u8>>,
}

/// The evidence: any of an HCL report, a TPM quote and the key to check the
/// quote with (the HCL report's own attestation key when not given).
#[derive(Clone, Copy, Debug, Default)]
pub struct AzureEvidence<'a> {
    /// The HCL report (vTPM NV index 0x01400001).
    pub hcl: Option<&'a [u8]>,
    /// The TPM quote (`az-cvm-vtpm` serialisation).
    pub quote: Option<&'a [u8]>,
    /// An attestation key (SPKI, PEM or DER) to check the quote with.
    pub ak_pub: Option<&'a [u8]>,
}

type Row = crate::check::Row<AzureError>;

/// Runs the Azure checks. `hcl` is the parsed HCL report (or why it did not
/// parse); `snp` the SNP table of the report inside it.
pub fn appraise_parts(
    hcl: Option<&Result<HclReport, HclError>>,
    snp: Option<&CheckReport>,
    ev: &AzureEvidence<'_>,
    policy: &AzurePolicy,
    expected: &AzureExpected,
) -> AzureCheckReport {
    use AzureCheckId as C;
    let mut t = AzureCheckReport::default();
    let parsed = hcl.and_then(|h| h.as_ref().ok());
    t.put(C::HclFormat, check_format(hcl));
    t.put(C::SnpReport, check_snp(parsed, snp));
    t.put(C::RuntimeClaims, check_claims(parsed));
    let (row, hcl_ak) = check_ak(parsed);
    t.put(C::AttestationKey, row);
    t.put(C::VmConfiguration, check_vm_configuration(parsed, policy));
    let quote = ev.quote.map(TpmQuote::parse);
    t.put(
        C::TpmQuoteFormat,
        match &quote {
            None => Row::NotRun("no TPM quote given".into()),
            Some(Ok(q)) => Row::Pass(format!(
                "TPMS_ATTEST quote, {} PCR values, SHA-256 PCRs {:?} selected, {}-byte signature",
                q.pcr_values.len(),
                q.selected_sha256(),
                q.signature.len()
            )),
            Some(Err(e)) => fail(AzureError::Tpm(e.clone()), "a TPM quote", e.to_string()),
        },
    );
    let quote = quote.and_then(Result::ok);
    let given = ev.ak_pub.map(RsaKey::from_spki);
    let (row, key) = check_ak_binding(quote.as_ref(), hcl_ak, given);
    t.put(C::TpmAkBinding, row);
    t.put(C::TpmSignature, check_signature(quote.as_ref(), key.as_ref()));
    t.put(C::TpmNonce, check_nonce(quote.as_ref(), expected));
    t.put(C::TpmPcrDigest, check_pcr_digest(quote.as_ref()));
    t.put(C::TpmPcrs, check_pcrs(quote.as_ref(), policy));
    t
}

fn check_format(hcl: Option<&Result<HclReport, HclError>>) -> Row {
    match hcl {
        None => Row::NotRun("no HCL report given".into()),
        Some(Ok(h)) => Row::Pass(format!(
            "HCL report v{}: SNP report, runtime claims {} bytes ({}), {} key(s)",
            h.version,
            h.claims_bytes.len(),
            h.hash.name(),
            h.claims.keys.len()
        )),
        Some(Err(e)) => fail(AzureError::Hcl(e.clone()), "an HCL report holding an SNP report", e.to_string()),
    }
}

fn check_snp(hcl: Option<&HclReport>, snp: Option<&CheckReport>) -> Row {
    match (hcl, snp) {
        (None, _) => Row::NotRun("no HCL report".into()),
        (Some(_), None) => fail(
            AzureError::NoEndorsement,
            "the VCEK (and chain) that signed the SNP report inside",
            "none given: the hardware report is unverified",
        ),
        (Some(_), Some(t)) => match t.first_failure() {
            None => Row::Pass(format!("the SNP table: {}", t.verdict())),
            Some((check, expected, actual)) => fail(
                AzureError::SnpRejected(check.name().to_owned()),
                format!("an SNP report that passes every SNP check ({check}: {expected})"),
                actual.to_owned(),
            ),
        },
    }
}

fn check_claims(hcl: Option<&HclReport>) -> Row {
    let Some(h) = hcl else { return Row::NotRun("no HCL report".into()) };
    let Ok(report) = crate::snp::SnpReport::from_bytes(&h.snp_report) else {
        return Row::NotRun("the SNP report does not parse".into());
    };
    let want = h.hash.report_data(&h.claims_bytes);
    let got = report.report_data();
    if got == want {
        Row::Pass(format!("REPORT_DATA = {}(runtime claims) ‖ zeros", h.hash.name()))
    } else {
        fail(AzureError::ClaimsNotBound, hex::encode(want), hex::encode(got))
    }
}

fn check_ak(hcl: Option<&HclReport>) -> (Row, Option<RsaKey>) {
    let Some(h) = hcl else { return (Row::NotRun("no HCL report".into()), None) };
    match h.claims.ak_pub() {
        Ok(k) if k.bits() >= 2048 => {
            (Row::Pass(format!("HCLAkPub: RSA-{} (from the claims REPORT_DATA commits to)", k.bits())), Some(k))
        }
        Ok(k) => {
            let e = AzureError::NoAttestationKey(format!("RSA-{}", k.bits()));
            (fail(e, "an RSA key of at least 2048 bits", format!("RSA-{}", k.bits())), None)
        }
        Err(why) => {
            (fail(AzureError::NoAttestationKey(why.reason.clone()), "HCLAkPub in the claims", why.reason), None)
        }
    }
}

fn check_vm_configuration(hcl: Option<&HclReport>, p: &AzurePolicy) -> Row {
    let Some(h) = hcl else { return Row::NotRun("no HCL report".into()) };
    let Some(c) = &h.claims.vm_configuration else {
        if p.require_secure_boot || p.require_tpm {
            return fail(AzureError::VmConfiguration("absent"), "a vm-configuration claim", "none");
        }
        return Row::Pass("no vm-configuration claim; policy requires none".into());
    };
    let word = |v: Option<bool>| v.map_or("absent", |b| if b { "true" } else { "false" });
    let detail = format!(
        "secure-boot {}, tpm-enabled {}, console-enabled {}",
        word(c.secure_boot),
        word(c.tpm_enabled),
        word(c.console_enabled)
    );
    if p.require_secure_boot && c.secure_boot != Some(true) {
        return fail(AzureError::VmConfiguration("secure-boot"), "secure-boot true", detail);
    }
    if p.require_tpm && c.tpm_enabled != Some(true) {
        return fail(AzureError::VmConfiguration("tpm-enabled"), "tpm-enabled true", detail);
    }
    match c.console_enabled {
        Some(true) if !p.allow_console => {
            fail(AzureError::VmConfiguration("console-enabled"), "console-enabled false", detail)
        }
        Some(true) => Row::Warn(detail, "the serial console is enabled (allowed by policy)".into()),
        _ => Row::Pass(detail),
    }
}

fn check_ak_binding(
    quote: Option<&TpmQuote>,
    hcl_ak: Option<RsaKey>,
    given: Option<Result<RsaKey, InvalidValue>>,
) -> (Row, Option<RsaKey>) {
    if quote.is_none() {
        return (Row::NotRun("no TPM quote".into()), None);
    }
    match (hcl_ak, given) {
        (_, Some(Err(why))) => {
            let e = AzureError::NoAttestationKey(why.reason.clone());
            (fail(e, "an RSA public key (SPKI)", why.reason), None)
        }
        (Some(ak), Some(Ok(g))) if ak == g => (Row::Pass("the given key is the HCL report's HCLAkPub".into()), Some(g)),
        (Some(ak), Some(Ok(g))) => (fail(AzureError::AkMismatch, format!("{ak:?}"), format!("{g:?}")), Some(g)),
        (Some(ak), None) => (Row::Pass("the HCL report's HCLAkPub".into()), Some(ak)),
        (None, Some(Ok(g))) => {
            (Row::NotRun("no HCL report: the key is the caller's, bound to no hardware report".into()), Some(g))
        }
        (None, None) => (Row::NotRun("no key to check the quote with".into()), None),
    }
}

fn check_signature(quote: Option<&TpmQuote>, key: Option<&RsaKey>) -> Row {
    match (quote, key) {
        (Some(q), Some(k)) if k.verify_pkcs1_sha256(&q.message, &q.signature) => {
            Row::Pass(format!("RSASSA-PKCS1-v1_5 SHA-256 over TPMS_ATTEST, RSA-{}", k.bits()))
        }
        (Some(_), Some(k)) => fail(AzureError::SignatureInvalid, format!("a signature by {k:?}"), "does not verify"),
        _ => Row::NotRun("no quote or no key".into()),
    }
}

fn check_nonce(quote: Option<&TpmQuote>, expected: &AzureExpected) -> Row {
    match (quote, &expected.nonce) {
        (None, _) => Row::NotRun("no TPM quote".into()),
        (Some(_), None) => Row::NotRun("no expected nonce given".into()),
        (Some(q), Some(n)) if &q.extra_data == n => Row::Pass(format!("qualifying data = the {}-byte nonce", n.len())),
        (Some(q), Some(n)) => fail(AzureError::NonceMismatch, hex::encode(n), hex::encode(&q.extra_data)),
    }
}

fn check_pcr_digest(quote: Option<&TpmQuote>) -> Row {
    let Some(q) = quote else { return Row::NotRun("no TPM quote".into()) };
    match q.computed_pcr_digest() {
        Some(d) if d.as_slice() == q.pcr_digest.as_slice() => {
            Row::Pass(format!("SHA-256 of PCRs {:?} = pcrDigest", q.selected_sha256()))
        }
        Some(d) => fail(AzureError::PcrDigestMismatch, hex::encode(d), hex::encode(&q.pcr_digest)),
        None => fail(
            AzureError::PcrDigestMismatch,
            "a value for every selected SHA-256 PCR",
            "a selected PCR without a value, or another bank",
        ),
    }
}

fn check_pcrs(quote: Option<&TpmQuote>, p: &AzurePolicy) -> Row {
    let Some(q) = quote else { return Row::NotRun("no TPM quote".into()) };
    let pinned = match p.pinned() {
        Ok(v) if v.is_empty() => return Row::NotRun("policy pins no PCR".into()),
        Ok(v) => v,
        Err(e) => return fail(AzureError::InvalidPolicy(e.to_string()), "PCR pins that parse", e.to_string()),
    };
    let selected = q.selected_sha256();
    for (i, allowed) in &pinned {
        let got = q.pcr_values.get(usize::from(*i));
        match got {
            Some(v) if selected.contains(i) && allowed.iter().any(|a| a.0 == *v) => {}
            Some(v) if selected.contains(i) => {
                return fail(AzureError::Pcr(*i), format!("PCR {i} on the allowlist"), hex::encode(v));
            }
            _ => return fail(AzureError::Pcr(*i), format!("PCR {i} selected by the quote"), format!("{selected:?}")),
        }
    }
    let names: Vec<String> = pinned.iter().map(|(i, _)| i.to_string()).collect();
    Row::Pass(format!("PCRs {} as pinned", names.join(", ")))
}
