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
            gpu_rims: Vec::new(),
            gpu_ocsp: Vec::new(),
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

/// A chunked Oblivious HTTP response split as the host relays it: the
/// 16-byte response nonce (max(Nn, Nk) for AES-128-GCM), each non-final chunk
/// whole (its varint length and its ciphertext), and the final chunk (a zero
/// length and the rest).
pub fn ohttp_response_records(bytes: &[u8]) -> (&[u8], Vec<&[u8]>, &[u8]) {
    let (nonce, mut rest) = bytes.split_at(16);
    let mut records = Vec::new();
    loop {
        let (len, used) = match rest[0] >> 6 {
            0 => (usize::from(rest[0] & 0x3F), 1),
            1 => (usize::from(u16::from_be_bytes([rest[0] & 0x3F, rest[1]])), 2),
            2 => (u32::from_be_bytes([rest[0] & 0x3F, rest[1], rest[2], rest[3]]) as usize, 4),
            _ => panic!("a chunk longer than a test makes"),
        };
        if len == 0 {
            return (nonce, records, rest);
        }
        records.push(&rest[..used + len]);
        rest = &rest[used + len..];
    }
}

/// The chunks' ciphertexts of a chunked Oblivious HTTP response (see
/// [`ohttp_response_records`]); the final chunk (after its zero length) runs
/// to the end.
pub fn ohttp_response_chunks(bytes: &[u8]) -> Vec<&[u8]> {
    let (_, records, last) = ohttp_response_records(bytes);
    let mut chunks: Vec<&[u8]> = records
        .into_iter()
        .map(|r| {
            let used = 1usize << (r[0] >> 6);
            &r[used..]
        })
        .collect();
    chunks.push(&last[1..]);
    chunks
}

/// Fabricated launch inputs for `veil measure` tests: an OVMF-shaped
/// firmware image (the public GUID footer table and SEV metadata layout,
/// with pseudo-random code bytes), a kernel and an initrd. No real firmware
/// boots from them; the measurement only hashes their bytes and layout.
pub mod firmware {
    use sha2::{Digest, Sha256};
    use veil_attestation::measure::{
        guid_le, FOOTER_GUID, SEV_ES_RESET_BLOCK_GUID, SEV_HASH_TABLE_GUID, SEV_METADATA_GUID,
    };

    /// Image size: 1 MiB, mapped just below 4 GiB.
    pub const IMAGE_BYTES: usize = 1 << 20;
    /// GPA of the kernel hashes page when present.
    pub const HASHES_PAGE: u32 = 0x80b000;

    /// Deterministic bytes: SHA-256 in counter mode over `label`.
    pub fn bytes(label: &str, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 32);
        let mut i = 0u64;
        while out.len() < len {
            out.extend_from_slice(&Sha256::new().chain_update(label).chain_update(i.to_le_bytes()).finalize());
            i += 1;
        }
        out.truncate(len);
        out
    }

    /// An OVMF-shaped image with SNP metadata; with `kernel_hashes`, also an
    /// SNP_KERNEL_HASHES section and the SEV hash table entry (which Debian's
    /// `OVMF.fd` lacks), so measured direct boot can be computed.
    pub fn ovmf(kernel_hashes: bool) -> Vec<u8> {
        let mut image = bytes("veil/test/ovmf", IMAGE_BYTES);
        // SEV metadata in the last page: header, then (gpa, size, type) items.
        let mut sections: Vec<(u32, u32, u32)> =
            vec![(0x800000, 0x9000, 1), (0x809000, 0x1000, 2), (0x80a000, 0x1000, 3)];
        if kernel_hashes {
            sections.push((HASHES_PAGE, 0x1000, 0x10));
        }
        sections.push((0x80c000, 0x4000, 1));
        let meta_at = IMAGE_BYTES - 0x1000;
        let mut meta = Vec::new();
        meta.extend_from_slice(b"ASEV");
        meta.extend_from_slice(&((16 + 12 * sections.len()) as u32).to_le_bytes());
        meta.extend_from_slice(&1u32.to_le_bytes());
        meta.extend_from_slice(&(sections.len() as u32).to_le_bytes());
        for (gpa, size, kind) in &sections {
            for v in [gpa, size, kind] {
                meta.extend_from_slice(&v.to_le_bytes());
            }
        }
        image[meta_at..meta_at + meta.len()].copy_from_slice(&meta);
        // The footer table ends 32 bytes before the end of the image; entries
        // are data, then a u16 size and the GUID, read backwards.
        let entry = |data: &[u8], guid: &str| {
            let mut e = data.to_vec();
            e.extend_from_slice(&((data.len() + 18) as u16).to_le_bytes());
            e.extend_from_slice(&guid_le(guid));
            e
        };
        let mut table = entry(&((IMAGE_BYTES - meta_at) as u32).to_le_bytes(), SEV_METADATA_GUID);
        table.extend(entry(&0xffff_f000u32.to_le_bytes(), SEV_ES_RESET_BLOCK_GUID));
        if kernel_hashes {
            let mut d = (HASHES_PAGE + 0xc00).to_le_bytes().to_vec();
            d.extend_from_slice(&0x400u32.to_le_bytes());
            table.extend(entry(&d, SEV_HASH_TABLE_GUID));
        }
        let footer = {
            let mut f = ((table.len() + 18) as u16).to_le_bytes().to_vec();
            f.extend_from_slice(&guid_le(FOOTER_GUID));
            f
        };
        let end = IMAGE_BYTES - 32;
        let start = end - footer.len() - table.len();
        image[start..start + table.len()].copy_from_slice(&table);
        image[end - footer.len()..end].copy_from_slice(&footer);
        image
    }
}
