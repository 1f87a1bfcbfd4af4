//! Arbitrary bytes as a report, verified with a fixed simulated endorsement:
//! every check must return a verdict, never panic.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use veil_attestation::simulated::{SimulatedAttester, SimulatedConfig};
use veil_attestation::snp::{Product, SnpReport};
use veil_attestation::{appraise, ExpectedClaims, Policy};

fn fixture() -> &'static (SimulatedAttester, Policy) {
    static F: OnceLock<(SimulatedAttester, Policy)> = OnceLock::new();
    F.get_or_init(|| {
        let sim = SimulatedAttester::from_seed(b"fuzz", SimulatedConfig::new(Product::Genoa, b"fuzz")).unwrap();
        (sim, Policy { allow_simulated: true, any_measurement: true, ..Policy::default() })
    })
}

fuzz_target!(|data: &[u8]| {
    let (sim, policy) = fixture();
    if let Ok(r) = SnpReport::from_bytes(data) {
        let _ = (r.version(), r.policy(), r.cpuid(), r.product_hint(), r.current_version());
    }
    let bundle = sim.bundle_for(data.to_vec(), None);
    let a = appraise(&bundle, policy, &ExpectedClaims::default(), std::time::SystemTime::now());
    let _ = a.checks.to_string();
});
