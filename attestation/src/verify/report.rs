//! What the report says against the policy: format and versions, debug,
//! migration agent, guest policy, SMT, platform info, VMPL, TCB minimum,
//! mitigation vectors, measurement, host data and ID key digest.

use super::{fail, not_run, outcome, skipped, Fail};
use crate::check::{CheckId, CheckReport, Outcome};
use crate::policy::{AbiVersion, GuestPolicyFlag, PlatformPolicy, Policy};
use crate::snp::report::KNOWN_VERSIONS;
use crate::snp::{Product, SnpReport, Tcb};

pub(super) fn check_format(report: Result<&SnpReport, String>, policy: &Policy) -> Result<String, Fail> {
    let r = report.map_err(|e| fail(format!("exactly {} bytes", crate::snp::REPORT_LEN), e))?;
    let v = r.version();
    if !KNOWN_VERSIONS.contains(&v) {
        return Err(fail(
            format!("a known report version ({}..={})", KNOWN_VERSIONS.start(), KNOWN_VERSIONS.end()),
            format!("version {v}"),
        ));
    }
    if v < policy.min_report_version || v > policy.max_report_version {
        return Err(fail(
            format!("report version {}..={} (policy)", policy.min_report_version, policy.max_report_version),
            format!("version {v}"),
        ));
    }
    if r.signature_algo() != crate::snp::report::SIG_ALGO_ECDSA_P384_SHA384 {
        return Err(fail(
            "signature algorithm 1 (ECDSA P-384 with SHA-384)",
            format!("algorithm {}", r.signature_algo()),
        ));
    }
    if !r.policy().reserved_bit_set() {
        return Err(fail("guest policy bit 17 set (reserved, must be one)", format!("policy {:#x}", r.policy().0)));
    }
    if r.policy().0 >> 26 != 0 {
        return Err(fail("guest policy bits 26..63 zero (reserved)", format!("policy {:#x}", r.policy().0)));
    }
    if r.key_info().0 >> 5 != 0 {
        return Err(fail("KEY_INFO bits 5..31 zero (reserved)", format!("KEY_INFO {:#x}", r.key_info().0)));
    }
    if let Some((start, end)) = r.nonzero_reserved() {
        return Err(fail("reserved bytes zero", format!("non-zero bytes in [{start:#x}, {end:#x})")));
    }
    Ok(format!("{} bytes, version {v}, ECDSA P-384/SHA-384", crate::snp::REPORT_LEN))
}

/// The guest policy against `[platform]` (its reserved bits are a
/// `report_format` matter): every required hardening bit set, CXL refused unless allowed, the ABI minimum the guest
/// required at least the policy's and no higher than the running firmware.
fn check_guest_policy(r: &SnpReport, p: &PlatformPolicy) -> Result<String, Fail> {
    let gp = r.policy();
    let missing: Vec<&str> =
        p.require_guest_policy.iter().filter(|f| gp.0 & f.mask() == 0).map(|f| f.abi_name()).collect();
    if !missing.is_empty() {
        return Err(fail(format!("guest policy with {} set", missing.join(", ")), format!("{:#x}", gp.0)));
    }
    if gp.cxl_allowed() && !p.allow_cxl {
        return Err(fail("CXL_ALLOW = 0 (policy: platform.allow_cxl = false)", "CXL_ALLOW = 1"));
    }
    let abi = AbiVersion { major: gp.abi_major(), minor: gp.abi_minor() };
    if let Some(min) = p.min_guest_abi {
        if abi < min {
            return Err(fail(format!("guest ABI minimum >= {min}"), format!("ABI minimum {abi}")));
        }
    }
    if r.version() >= 3 {
        let fw = r.current_version();
        if (fw.major, fw.minor) < (abi.major, abi.minor) {
            return Err(fail(
                format!("running firmware at least the guest's ABI minimum {abi}"),
                format!("firmware {fw}: the report contradicts its own launch policy"),
            ));
        }
    }
    let set: Vec<&str> = GuestPolicyFlag::ALL.iter().filter(|f| gp.0 & f.mask() != 0).map(|f| f.abi_name()).collect();
    Ok(format!(
        "guest policy {:#x}: ABI minimum {abi}, hardening {}",
        gp.0,
        if set.is_empty() { "none".to_owned() } else { set.join(", ") }
    ))
}

/// `PLATFORM_INFO` against `[platform]`: every required bit set; every bit
/// shown by its ABI name. A bit the ABI this verifier knows does not define
/// is a platform state it cannot judge: a warning by default (firmware adds
/// bits, as Turin's did with `IOMMU_WRITE_SAFE`, and real hardware must not
/// fail for it), a failure when the policy sets
/// `refuse_unknown_platform_bits`.
fn check_platform_info(r: &SnpReport, p: &PlatformPolicy) -> Outcome {
    let pi = r.platform_info();
    let info = pi.0;
    let missing: Vec<&str> = p.require_platform.iter().filter(|f| info & f.mask() == 0).map(|f| f.abi_name()).collect();
    if !missing.is_empty() {
        return Outcome::Failed {
            expected: format!("PLATFORM_INFO with {} set", missing.join(", ")),
            actual: format!("{info:#x} ({})", named_platform_bits(pi)),
        };
    }
    let unknown = pi.unknown_bits();
    if unknown != 0 && p.refuse_unknown_platform_bits {
        return Outcome::Failed {
            expected: format!(
                "no PLATFORM_INFO bits outside {:#x} (policy: refuse_unknown_platform_bits)",
                crate::snp::PlatformInfo::KNOWN
            ),
            actual: format!("{info:#x}: unknown bits {unknown:#x}"),
        };
    }
    let detail = format!("PLATFORM_INFO {info:#x} ({})", named_platform_bits(pi));
    if unknown != 0 {
        return Outcome::Warned {
            detail,
            warning: format!(
                "unknown bits {unknown:#x}: firmware newer than this verifier; set \
                 platform.refuse_unknown_platform_bits to refuse them"
            ),
        };
    }
    Outcome::Passed { detail }
}

/// The set bits by name, then any unknown ones.
fn named_platform_bits(pi: crate::snp::PlatformInfo) -> String {
    let mut names: Vec<String> = pi.set_names().into_iter().map(str::to_owned).collect();
    if pi.unknown_bits() != 0 {
        names.push(format!("unknown {:#x}", pi.unknown_bits()));
    }
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// The required mitigation bits must be a subset of both the launch and the
/// current mitigation vector: bit sets, never compared as numbers.
fn check_mitigations(r: &SnpReport, p: &PlatformPolicy) -> Outcome {
    let need = p.mitigation_mask();
    if need == 0 {
        return skipped("policy requires no mitigation-vector bits");
    }
    let (Some(launch), Some(current)) = (r.launch_mit_vector(), r.current_mit_vector()) else {
        return Outcome::Failed {
            expected: format!("mitigation vectors with bits {need:#x} (report version 5 or later)"),
            actual: format!("report version {} has no mitigation vectors", r.version()),
        };
    };
    for (name, v) in [("LAUNCH_MIT_VECTOR", launch), ("CURRENT_MIT_VECTOR", current)] {
        if v & need != need {
            return Outcome::Failed {
                expected: format!("{name} ⊇ {need:#x}"),
                actual: format!("{v:#x} (missing {:#x})", need & !v),
            };
        }
    }
    Outcome::Passed { detail: format!("bits {need:#x} set at launch ({launch:#x}) and now ({current:#x})") }
}

pub(super) fn record_policy_checks(t: &mut CheckReport, r: &SnpReport, product: Option<Product>, policy: &Policy) {
    let gp = r.policy();
    t.record(
        CheckId::Debug,
        if policy.allow_debug {
            skipped(format!("policy allows debug (DEBUG bit is {})", u8::from(gp.debug_allowed())))
        } else if gp.debug_allowed() {
            Outcome::Failed {
                expected: "DEBUG = 0".into(),
                actual: "DEBUG = 1: the host can read and write guest memory".into(),
            }
        } else {
            Outcome::Passed { detail: "DEBUG = 0".into() }
        },
    );
    t.record(
        CheckId::MigrationAgent,
        if policy.allow_migration_agent {
            skipped(format!("policy allows a migration agent (MIGRATE_MA is {})", u8::from(gp.migrate_ma_allowed())))
        } else if gp.migrate_ma_allowed() {
            Outcome::Failed { expected: "MIGRATE_MA = 0".into(), actual: "MIGRATE_MA = 1".into() }
        } else {
            Outcome::Passed { detail: "MIGRATE_MA = 0".into() }
        },
    );
    t.record(CheckId::GuestPolicy, outcome(check_guest_policy(r, &policy.platform)));
    let smt_on = r.platform_info().smt_enabled();
    t.record(
        CheckId::Smt,
        if policy.allow_smt {
            skipped(format!("policy allows SMT (platform SMT {})", if smt_on { "enabled" } else { "disabled" }))
        } else if smt_on {
            Outcome::Failed {
                expected: "SMT disabled on the platform (policy: allow_smt = false)".into(),
                actual: "SMT enabled".into(),
            }
        } else {
            Outcome::Passed { detail: "SMT disabled on the platform".into() }
        },
    );
    t.record(CheckId::PlatformInfo, check_platform_info(r, &policy.platform));
    t.record(
        CheckId::Vmpl,
        if r.vmpl() == policy.vmpl {
            Outcome::Passed { detail: format!("VMPL {}", r.vmpl()) }
        } else {
            Outcome::Failed { expected: format!("VMPL {} (policy)", policy.vmpl), actual: format!("VMPL {}", r.vmpl()) }
        },
    );
    t.record(
        CheckId::TcbMinimum,
        match product {
            None => not_run("product unknown"),
            Some(p) => match policy.min_tcb.get(&p) {
                None => skipped(format!("policy sets no TCB minimum for {p}")),
                Some(min) => outcome(check_tcb_minimum(r.reported_tcb().decode(p), min)),
            },
        },
    );
    t.record(CheckId::MitigationVector, check_mitigations(r, &policy.platform));
    let m = crate::claims::Measurement(r.measurement());
    t.record(
        CheckId::Measurement,
        if policy.any_measurement {
            skipped(format!("policy allows ANY launch measurement (this one is {m})"))
        } else if policy.measurements.is_empty() {
            Outcome::Failed {
                expected: "a launch measurement on the policy allowlist".into(),
                actual: format!("{m}, and the allowlist is empty (pin a measurement or waive with any_measurement)"),
            }
        } else if policy.measurements.contains(&m) {
            Outcome::Passed { detail: format!("{m} is allowlisted") }
        } else {
            Outcome::Failed {
                expected: format!("one of {} allowlisted measurements", policy.measurements.len()),
                actual: m.to_string(),
            }
        },
    );
    t.record(
        CheckId::HostData,
        match &policy.host_data {
            None => skipped("HOST_DATA not pinned by policy"),
            Some(pin) if pin.0 .0 == r.host_data() => {
                Outcome::Passed { detail: format!("HOST_DATA {}", hex::encode(r.host_data())) }
            }
            Some(pin) => Outcome::Failed { expected: pin.0.to_string(), actual: hex::encode(r.host_data()) },
        },
    );
    t.record(
        CheckId::IdKeyDigest,
        match &policy.id_key_digest {
            None => skipped("ID key digest not pinned by policy"),
            Some(pin) if pin.0 == r.id_key_digest() => Outcome::Passed { detail: format!("ID_KEY_DIGEST {pin}") },
            Some(pin) => Outcome::Failed { expected: pin.to_string(), actual: hex::encode(r.id_key_digest()) },
        },
    );
}

fn check_tcb_minimum(reported: Tcb, min: &crate::policy::TcbMinimum) -> Result<String, Fail> {
    let mut low = Vec::new();
    let mut want = Vec::new();
    let mut cmp = |name: &str, actual: Option<u8>, minimum: Option<u8>| {
        if let Some(m) = minimum {
            let a = actual.unwrap_or(0);
            if a < m {
                want.push(format!("{name} >= {m}"));
                low.push(format!("{name} = {a}"));
            }
        }
    };
    cmp("fmc", reported.fmc, min.fmc);
    cmp("bootloader", Some(reported.bootloader), min.bootloader);
    cmp("tee", Some(reported.tee), min.tee);
    cmp("snp", Some(reported.snp), min.snp);
    cmp("microcode", Some(reported.microcode), min.microcode);
    if low.is_empty() {
        Ok(format!("REPORTED_TCB {reported} meets the policy minimums"))
    } else {
        Err(fail(want.join(", "), low.join(", ")))
    }
}
