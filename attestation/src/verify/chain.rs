//! What the endorsement proves: the product, the VCEK/VLEK chain to a
//! pinned (or allowed simulated) root, revocation, the report signature, and
//! the chip id and reported TCB bound to the endorsement.

use std::time::SystemTime;

use super::{fail, skipped, Fail, RootKind};
use crate::check::Outcome;
use crate::claims::KeyHash;
use crate::evidence::EvidenceBundle;
use crate::policy::Policy;
use crate::simulated;
use crate::snp::{Endorsement, Product, SigningKey, SnpReport};
use crate::x509::{fmt_time, ParsedCert, ParsedCrl};

pub(super) fn check_product(
    r: &SnpReport,
    endorsement: Result<&Endorsement, &String>,
    policy: &Policy,
) -> Result<String, Fail> {
    let e = endorsement.map_err(|e| fail("an endorsement naming the product", e.clone()))?;
    let from_cert =
        e.product().ok_or_else(|| fail("productName Milan*, Genoa* or Turin*", e.product_name().to_owned()))?;
    let detail = match r.cpuid() {
        Some(cpuid) => {
            let from_cpuid = Product::from_cpuid(cpuid).ok_or_else(|| {
                fail(
                    "a CPUID family/model of Milan, Genoa or Turin",
                    format!("family {:#x} model {:#x}", cpuid.family, cpuid.model),
                )
            })?;
            if from_cpuid != from_cert {
                return Err(fail(
                    format!("{from_cert} (endorsement productName {})", e.product_name()),
                    format!("{from_cpuid} (report CPUID)"),
                ));
            }
            format!("{from_cert} (CPUID and endorsement agree)")
        }
        None => format!("{from_cert} (from endorsement; report v{} has no CPUID fields)", r.version()),
    };
    if !policy.products.contains(&from_cert) {
        let allowed: Vec<_> = policy.products.iter().map(|p| p.name()).collect();
        return Err(fail(format!("one of [{}] (policy)", allowed.join(", ")), from_cert.to_string()));
    }
    Ok(detail)
}

/// The established endorsement chain.
pub(super) struct Chain {
    pub(super) root: RootKind,
    pub(super) ark: ParsedCert,
    pub(super) intermediate: ParsedCert,
    pub(super) leaf_name: String,
    leaf_serial: Vec<u8>,
}

pub(super) fn check_chain(
    r: &SnpReport,
    e: &Endorsement,
    product: Option<Product>,
    bundle: &EvidenceBundle,
    policy: &Policy,
    now: SystemTime,
) -> Result<Chain, Fail> {
    let in_report = r.key_info().signing_key();
    if in_report != e.kind() {
        return Err(fail(
            format!("KEY_INFO signing key {} (the certificate supplied)", e.kind()),
            format!("report says {in_report}"),
        ));
    }
    if e.kind() == SigningKey::Vlek && !policy.allow_vlek {
        return Err(fail(
            "a VCEK-signed report (policy: allow_vlek = false)",
            format!("VLEK-signed (cloud provider {})", e.csp_id().unwrap_or("unnamed")),
        ));
    }
    let product = product.ok_or_else(|| fail("an endorsement for a known product", e.product_name().to_owned()))?;
    let supplied = bundle
        .chain
        .iter()
        .map(|der| ParsedCert::from_der(der))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| fail("parsable chain certificates", err.to_string()))?;

    // The root: pinned AMD ARK for the product, or a simulated root when the
    // policy explicitly allows it. Anything else is an untrusted root.
    let amd_ark = product.amd_ark();
    let supplied_root = supplied.iter().find(|c| c.issued_by_name(c));
    let (ark, root) = match supplied_root {
        None => (amd_ark.clone(), RootKind::Amd),
        Some(c) if c.spki_der() == amd_ark.spki_der() => (amd_ark.clone(), RootKind::Amd),
        Some(c) if simulated::is_simulated_cert(c) => {
            let fingerprint = KeyHash(c.spki_sha256());
            if !policy.allow_simulated {
                return Err(fail(
                    format!("AMD ARK-{product} (simulated evidence refused: policy allow_simulated = false)"),
                    format!("Veil SIMULATED root {fingerprint}"),
                ));
            }
            if !policy.simulated_roots.is_empty() && !policy.simulated_roots.contains(&fingerprint) {
                return Err(fail(
                    "a simulated root pinned in policy simulated_roots",
                    format!("simulated root {fingerprint}"),
                ));
            }
            (c.clone(), RootKind::Simulated(fingerprint))
        }
        Some(c) => {
            return Err(fail(
                format!("AMD ARK-{product} (key {})", KeyHash(amd_ark.spki_sha256())),
                format!("untrusted root \"{}\" (key {})", c.subject_string(), KeyHash(c.spki_sha256())),
            ))
        }
    };
    // The pinned AMD ARK's self-signature and its ASK were verified once when
    // the builtin roots were loaded; only supplied certificates are checked here.
    if matches!(root, RootKind::Simulated(_)) {
        ark.verify_signed_by(&ark).map_err(|err| fail("a self-signed ARK", err.to_string()))?;
    }

    let intermediate_cn = match e.kind() {
        SigningKey::Vlek => format!("SEV-VLEK-{product}"),
        _ => format!("SEV-{product}"),
    };
    let mut candidates: Vec<&ParsedCert> = supplied.iter().filter(|c| !c.issued_by_name(c)).collect();
    if root == RootKind::Amd {
        candidates.push(product.amd_ask());
    }
    let intermediate = candidates
        .into_iter()
        .find(|c| e.cert().issued_by_name(c) && c.common_name().as_deref() == Some(intermediate_cn.as_str()))
        .ok_or_else(|| {
            fail(
                format!("an intermediate {intermediate_cn} that issued the {}", e.kind()),
                format!("issuer \"{}\" not supplied", e.cert().issuer_common_name().unwrap_or_default()),
            )
        })?
        .clone();
    if !intermediate.issued_by_name(&ark) {
        return Err(fail(format!("{intermediate_cn} issued by the ARK"), "issuer name differs"));
    }
    let pinned_ask = root == RootKind::Amd && intermediate.der() == product.amd_ask().der();
    if !pinned_ask {
        intermediate
            .verify_signed_by(&ark)
            .map_err(|err| fail(format!("{intermediate_cn} signed by ARK-{product}"), err.to_string()))?;
    }
    let leaf_name = format!("{}", e.kind());
    e.cert()
        .verify_signed_by(&intermediate)
        .map_err(|err| fail(format!("{leaf_name} signed by {intermediate_cn}"), err.to_string()))?;
    for (name, cert) in [(leaf_name.as_str(), e.cert()), (intermediate_cn.as_str(), &intermediate), ("ARK", &ark)] {
        cert.check_validity(now)
            .map_err(|why| fail(format!("{name} certificate valid at {}", fmt_time(now)), why.to_string()))?;
    }
    Ok(Chain { root, ark, intermediate, leaf_name, leaf_serial: e.cert().serial().to_vec() })
}

pub(super) fn check_crl(der: &[u8], chain: &Chain, now: SystemTime) -> Result<String, Fail> {
    let crl = ParsedCrl::from_der(der).map_err(|e| fail("a parsable CRL", e.to_string()))?;
    if !crl.issued_by_name(&chain.ark) {
        return Err(fail("a CRL issued by the ARK", "CRL issuer differs"));
    }
    crl.verify_signed_by(&chain.ark).map_err(|e| fail("a CRL signed by the ARK", e.to_string()))?;
    let (this_update, next_update) = crl.window();
    if now < this_update {
        return Err(fail(
            format!("a CRL issued before {}", fmt_time(now)),
            format!("thisUpdate {}", fmt_time(this_update)),
        ));
    }
    match next_update {
        None => return Err(fail("a CRL with nextUpdate", "no nextUpdate")),
        Some(next) if now > next => {
            return Err(fail(
                format!("a current CRL at {}", fmt_time(now)),
                format!("stale: nextUpdate {}", fmt_time(next)),
            ))
        }
        Some(_) => {}
    }
    let intermediate_name = chain.intermediate.common_name().unwrap_or_default();
    if crl.revokes(chain.intermediate.serial()) {
        return Err(fail(
            format!("{intermediate_name} not revoked"),
            format!("{intermediate_name} serial {} is revoked", hex::encode(chain.intermediate.serial())),
        ));
    }
    if crl.revokes(&chain.leaf_serial) {
        return Err(fail(
            format!("{} not revoked", chain.leaf_name),
            format!("serial {} is revoked", hex::encode(&chain.leaf_serial)),
        ));
    }
    Ok(format!(
        "CRL signed by the ARK, current until {}, chain not listed",
        next_update.map(fmt_time).unwrap_or_default()
    ))
}

/// Verifies the report signature with the endorsement's key over the raw
/// bytes `[0, 0x2A0)`. R and S are 72-byte little-endian fields whose upper
/// 24 bytes must be zero (ABI Table 119).
pub fn check_signature(r: &SnpReport, e: &Endorsement) -> Result<String, Fail> {
    let (r_le, s_le) = (r.signature_r(), r.signature_s());
    if r_le[48..].iter().chain(&s_le[48..]).any(|b| *b != 0) {
        return Err(fail("signature R and S with zero upper 24 bytes", "non-zero padding"));
    }
    // Little-endian R and S become the big-endian R ‖ S the verifier takes.
    let mut fixed = [0u8; 96];
    for i in 0..48 {
        fixed[i] = r_le[47 - i];
        fixed[48 + i] = s_le[47 - i];
    }
    e.cert().verify_p384_fixed(r.signed_bytes(), &fixed).map_err(|err| match err {
        crate::x509::CertError::BadSignature => {
            fail(format!("a valid {} signature over bytes [0, 0x2A0)", e.kind()), "signature does not verify")
        }
        other => fail("an ECDSA P-384 endorsement key", other.to_string()),
    })?;
    Ok(format!("ECDSA P-384 signature by the {} verifies over bytes [0, 0x2A0)", e.kind()))
}

pub(super) fn check_chip_id(r: &SnpReport, e: &Endorsement, product: Product) -> Outcome {
    if e.kind() == SigningKey::Vlek {
        return skipped("VLEK: the key is bound to the cloud provider, not to a chip (no hwID)");
    }
    let Some(hw_id) = e.hw_id() else {
        return Outcome::Failed { expected: "a VCEK with hwID".into(), actual: "no hwID extension".into() };
    };
    let chip = r.chip_id();
    if r.chip_id_masked() {
        return Outcome::Failed {
            expected: format!("CHIP_ID {}", hex::encode(hw_id)),
            actual: "CHIP_ID masked (all zero)".into(),
        };
    }
    let significant = if product == Product::Turin { 8 } else { 64 };
    let matches =
        hw_id.len() == significant && chip[..significant] == *hw_id && chip[significant..].iter().all(|b| *b == 0);
    if matches {
        Outcome::Passed { detail: format!("CHIP_ID equals the VCEK hwID ({significant} bytes)") }
    } else {
        Outcome::Failed {
            expected: format!("CHIP_ID {} (VCEK hwID)", hex::encode(hw_id)),
            actual: hex::encode(&chip[..]),
        }
    }
}

pub(super) fn check_reported_tcb(r: &SnpReport, e: &Endorsement, product: Product) -> Result<String, Fail> {
    let reported = r.reported_tcb().decode(product);
    let certified = e.tcb();
    let same = reported.bootloader == certified.bootloader
        && reported.tee == certified.tee
        && reported.snp == certified.snp
        && reported.microcode == certified.microcode
        && (product != Product::Turin || reported.fmc == certified.fmc);
    if same {
        Ok(format!("REPORTED_TCB {reported} equals the {} TCB", e.kind()))
    } else {
        Err(fail(format!("{certified} ({} extensions)", e.kind()), format!("{reported} (REPORTED_TCB)")))
    }
}
