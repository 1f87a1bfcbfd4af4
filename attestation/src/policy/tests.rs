//! Unit tests of the policy: parsing, canonical digest, gaps, strict defaults.

use super::*;

#[test]
fn parses_full_policy() {
    let p = Policy::from_toml(
        r#"
products = ["Milan"]
allow_vlek = true
vmpl = 1
measurements = ["7a1e5c266c0108dbc9bb94fa926951320940915d0aafb42464bd88b579ea158d3e1a0dc39b2c60bd95b9c480cd81841f"]
[min_tcb.Milan]
snp = 8
"#,
    )
    .unwrap();
    assert_eq!(p.products, vec![Product::Milan]);
    assert_eq!(p.min_tcb[&Product::Milan].snp, Some(8));
    assert!(!p.allow_simulated);
    let again = Policy::from_toml(&p.to_toml()).unwrap();
    assert_eq!(again, p);
}

#[test]
fn refuses_typos_and_contradictions() {
    assert!(matches!(Policy::from_toml("alow_debug = true"), Err(PolicyError::Parse(_))));
    assert!(matches!(
        Policy::from_toml("min_report_version = 5\nmax_report_version = 3"),
        Err(PolicyError::Inconsistent(_))
    ));
    assert!(matches!(Policy::from_toml("products = []"), Err(PolicyError::Inconsistent(_))));
    assert!(matches!(Policy::from_toml("[min_tcb.Milan]\nfmc = 1"), Err(PolicyError::Inconsistent(_))));
    assert!(matches!(Policy::from_toml("measurements = [\"abcd\"]"), Err(PolicyError::Parse(_))));
}

#[test]
fn parses_gpu_section_and_refuses_bad_versions() {
    let p = Policy::from_toml(
        "[gpu]\nrequired = true\nmin_driver_version = \"550.54.14\"\nmin_vbios_version = \"96.00.5E.00.01\"\nrequire_rim = true",
    )
    .unwrap();
    assert!(p.gpu.required && p.gpu.require_rim);
    assert_eq!(Policy::from_toml(&p.to_toml()).unwrap(), p);
    assert!(matches!(Policy::from_toml("[gpu]\nmin_driver_version = \"new\""), Err(PolicyError::Inconsistent(_))));
    assert!(matches!(Policy::from_toml("[gpu]\nreqired = true"), Err(PolicyError::Parse(_))));
    assert!(matches!(Policy::from_toml("[gpu]\nroot_pem = \"x\""), Err(PolicyError::Inconsistent(_))));
}

#[test]
fn digest_is_canonical() {
    let a = Policy::from_toml("products = [\"Genoa\", \"Milan\"]\nallow_smt = true").unwrap();
    let b = Policy::from_toml("# comment\nproducts = [\"Milan\", \"Genoa\", \"Milan\"]").unwrap();
    assert_eq!(a.digest(), b.digest());
    let c = Policy::from_toml("products = [\"Milan\"]").unwrap();
    assert_ne!(a.digest(), c.digest());
    let d = Policy { allow_debug: true, ..a.clone() };
    assert_ne!(a.digest(), d.digest());
    assert!(a.canonical_bytes().starts_with(POLICY_DOMAIN));
}

#[test]
fn gaps_name_every_weaker_setting() {
    let mine = Policy::from_toml(
        r#"
products = ["Genoa"]
require_crl = true
measurements = ["7a1e5c266c0108dbc9bb94fa926951320940915d0aafb42464bd88b579ea158d3e1a0dc39b2c60bd95b9c480cd81841f"]
[min_tcb.Genoa]
snp = 8
microcode = 115
[gpu]
required = true
min_driver_version = "550.54.14"
"#,
    )
    .unwrap();
    assert!(mine.gaps_in(&mine).is_empty());
    // Stricter everywhere: no gap.
    let stricter = Policy { allow_smt: false, min_report_version: 3, ..mine.clone() };
    assert!(mine.gaps_in(&stricter).is_empty());
    let cases: Vec<(&str, Policy)> = vec![
        ("products", Policy { products: vec![Product::Genoa, Product::Milan], ..mine.clone() }),
        ("min_report_version", Policy { min_report_version: 2, ..Policy { min_report_version: 3, ..mine.clone() } }),
        ("require_crl", Policy { require_crl: false, ..mine.clone() }),
        ("allow_debug", Policy { allow_debug: true, ..mine.clone() }),
        ("allow_vlek", Policy { allow_vlek: true, ..mine.clone() }),
        ("allow_migration_agent", Policy { allow_migration_agent: true, ..mine.clone() }),
        ("allow_simulated", Policy { allow_simulated: true, ..mine.clone() }),
        ("vmpl", Policy { vmpl: 1, ..mine.clone() }),
        ("min_tcb.Genoa.snp", {
            let mut p = mine.clone();
            p.min_tcb.get_mut(&Product::Genoa).unwrap().snp = Some(7);
            p
        }),
        ("min_tcb.Genoa.microcode", {
            let mut p = mine.clone();
            p.min_tcb.get_mut(&Product::Genoa).unwrap().microcode = None;
            p
        }),
        ("measurements", Policy { any_measurement: true, measurements: vec![], ..mine.clone() }),
        ("measurements", Policy { measurements: vec![Measurement([1; 48])], ..mine.clone() }),
        (
            "host_data",
            Policy { host_data: None, ..Policy { host_data: Some(HostData(KeyHash([1; 32]))), ..mine.clone() } },
        ),
        ("gpu.required", Policy { gpu: GpuPolicy { required: false, ..mine.gpu.clone() }, ..mine.clone() }),
        (
            "gpu.min_driver_version",
            Policy { gpu: GpuPolicy { min_driver_version: Some("535.1".into()), ..mine.gpu.clone() }, ..mine.clone() },
        ),
        ("gpu.root_pem", Policy { gpu: GpuPolicy { root_pem: Some("x".into()), ..mine.gpu.clone() }, ..mine.clone() }),
    ];
    for (setting, peer) in cases {
        let base = if setting == "host_data" {
            Policy { host_data: Some(HostData(KeyHash([1; 32]))), ..mine.clone() }
        } else if setting == "min_report_version" {
            Policy { min_report_version: 3, ..mine.clone() }
        } else {
            mine.clone()
        };
        let gaps = base.gaps_in(&peer);
        assert!(gaps.iter().any(|g| g.setting == setting), "{setting}: {gaps:?}");
    }
    // Simulated roots: a pinned client refuses a peer accepting any root.
    let sim = Policy { allow_simulated: true, simulated_roots: vec![KeyHash([5; 32])], ..Policy::default() };
    let any_root = Policy { allow_simulated: true, ..Policy::default() };
    assert!(sim.gaps_in(&any_root).iter().any(|g| g.setting == "simulated_roots"));
    assert!(any_root.gaps_in(&sim).is_empty());
}

#[test]
fn hardware_shards_refuse_permissive_peer_policies() {
    assert!(Policy { allow_simulated: true, ..Policy::default() }.fit_for_hardware().is_err());
    assert!(Policy { any_measurement: true, ..Policy::default() }.fit_for_hardware().is_err());
    assert!(Policy::default().fit_for_hardware().is_ok());
}

#[test]
fn default_is_strict() {
    let p = Policy::default();
    assert!(!p.allow_simulated && !p.allow_debug && !p.any_measurement && p.measurements.is_empty());
    assert_eq!(Policy::from_toml("").unwrap(), p);
}
