//! Fixtures for Veil's cross-crate tests: real hardware vectors, simulated
//! attesters with fixed keys, and policies.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use veil_attestation::simulated::{SimulatedAttester, SimulatedConfig};
use veil_attestation::snp::Product;
use veil_attestation::x509::{parse_time, ParsedCert};
use veil_attestation::{EvidenceBundle, Measurement, Policy};

/// Records a check that did not run for lack of input: printed (hidden by
/// the test harness unless `--nocapture`) and appended to
/// `target/<profile>/veil-skipped.txt`, which `.ci/run` prints after the
/// tests and a user can read after `cargo test`.
pub fn skip(reason: &str) {
    eprintln!("SKIP: {reason}");
    let file =
        std::env::current_exe().ok().and_then(|exe| exe.parent()?.parent().map(|dir| dir.join("veil-skipped.txt")));
    if let Some(file) = file {
        use std::io::Write as _;
        let test = std::thread::current().name().unwrap_or("?").to_owned();
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(file) {
            let _ = writeln!(f, "{test}: {reason}");
        }
    }
}

/// Where the real hardware vectors live: `$VEIL_VECTORS`, else `../shared/vectors`
/// next to the repository. `None` when absent, unless `VEIL_REQUIRE_VECTORS=1`,
/// in which case absence is a test failure (CI sets it when the vectors exist).
pub fn vectors_dir() -> Option<PathBuf> {
    let candidates = std::env::var_os("VEIL_VECTORS")
        .map(PathBuf::from)
        .into_iter()
        .chain([Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/vectors")]);
    for c in candidates {
        if c.join("README.md").exists() {
            return Some(c);
        }
    }
    if std::env::var("VEIL_REQUIRE_VECTORS").as_deref() == Ok("1") {
        panic!("VEIL_REQUIRE_VECTORS=1 but no vectors at $VEIL_VECTORS or ../shared/vectors");
    }
    skip("real hardware vectors not found (set VEIL_VECTORS)");
    None
}

/// A real vector set.
#[derive(Debug)]
pub struct Vector {
    /// Directory.
    pub dir: PathBuf,
    /// `expected.json`.
    pub expected: serde_json::Value,
}

impl Vector {
    /// Loads set `name`, or `None` when vectors are unavailable.
    pub fn load(name: &str) -> Option<Self> {
        let dir = vectors_dir()?.join(name);
        let expected = serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
        Some(Self { dir, expected })
    }

    /// Bytes of a file in the set.
    pub fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    /// The endorsement certificate (vcek.der, vcek.pem or vlek.der) as DER.
    pub fn endorsement_der(&self) -> Vec<u8> {
        for name in ["vcek.der", "vlek.der", "vcek.pem"] {
            if self.dir.join(name).exists() {
                return ParsedCert::from_der_or_pem(&self.read(name)).unwrap().der().to_vec();
            }
        }
        panic!("no endorsement in {}", self.dir.display())
    }

    /// Certificates of a PEM chain file as DER.
    pub fn chain_der(&self, name: &str) -> Vec<Vec<u8>> {
        ParsedCert::chain_from_pem(&self.read(name)).unwrap().into_iter().map(|c| c.der().to_vec()).collect()
    }

    /// A bundle: report + endorsement + the set's own chain file, no claims.
    pub fn bundle(&self, chain_file: Option<&str>) -> EvidenceBundle {
        EvidenceBundle {
            report: self.read("report.bin"),
            endorsement: self.endorsement_der(),
            chain: chain_file.map(|f| self.chain_der(f)).unwrap_or_default(),
            crl: None,
            claims: None,
            gpus: Vec::new(),
        }
    }

    /// The expected measurement.
    pub fn measurement(&self) -> Measurement {
        self.expected["measurement_hex"].as_str().unwrap().parse().unwrap()
    }

    /// A strict policy that pins this set's measurement.
    pub fn pinned_policy(&self) -> Policy {
        Policy { measurements: vec![self.measurement()], ..Policy::default() }
    }
}

/// The fixed instant the vector tests verify at (deterministic, and inside
/// the validity of every VCEK in the set except the expired AWS VLEK).
pub fn test_now() -> SystemTime {
    parse_time("2026-11-29T00:00:00Z").unwrap()
}

/// A simulated attester with fixed keys.
pub fn sim(product: Product) -> SimulatedAttester {
    sim_with(SimulatedConfig::new(product, b"veil-tests"))
}

/// A simulated attester with fixed keys and a custom configuration.
pub fn sim_with(config: SimulatedConfig) -> SimulatedAttester {
    SimulatedAttester::from_seed(b"veil-tests fixed seed", config).unwrap()
}

/// A policy that accepts the simulated attester's default evidence.
pub fn sim_policy() -> Policy {
    Policy {
        allow_simulated: true,
        measurements: vec![veil_attestation::simulated::default_measurement()],
        ..Policy::default()
    }
}

/// A loopback address whose port is free now and was never handed out
/// before in this test process: tests run clusters in parallel, and two of
/// them given the same port would dial each other's processes.
pub fn free_loopback_port() -> std::net::SocketAddr {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    loop {
        let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let mut given = GIVEN.lock().unwrap();
        if !given.contains(&addr.port()) {
            given.push(addr.port());
            return addr;
        }
    }
}

/// The chunks of a chunked Oblivious HTTP response as the host relays them:
/// after the 16-byte response nonce (max(Nn, Nk) for AES-128-GCM), each
/// chunk's varint length and ciphertext; the final chunk (length 0) runs to
/// the end.
pub fn ohttp_response_chunks(bytes: &[u8]) -> Vec<&[u8]> {
    let mut rest = &bytes[16..];
    let mut chunks = Vec::new();
    loop {
        let (len, used) = match rest[0] >> 6 {
            0 => (usize::from(rest[0] & 0x3F), 1),
            1 => (usize::from(u16::from_be_bytes([rest[0] & 0x3F, rest[1]])), 2),
            2 => (u32::from_be_bytes([rest[0] & 0x3F, rest[1], rest[2], rest[3]]) as usize, 4),
            _ => panic!("a chunk longer than a test makes"),
        };
        rest = &rest[used..];
        if len == 0 {
            chunks.push(rest);
            return chunks;
        }
        chunks.push(&rest[..len]);
        rest = &rest[len..];
    }
}
