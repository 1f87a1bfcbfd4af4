//! The SEV-SNP `ATTESTATION_REPORT` structure (AMD SEV-SNP ABI specification,
//! rev 1.57, Table 23 "ATTESTATION_REPORT Structure"), as narrow typed accessors
//! over the raw bytes.
//!
//! The raw bytes are kept exactly as received: the signature covers bytes
//! `[0, 0x2A0)` of *these* bytes, never a re-serialisation.

use std::fmt;

use super::Product;

/// Size of an attestation report in bytes.
pub const REPORT_LEN: usize = 0x4A0;
/// The signature covers bytes `[0, SIGNED_LEN)`.
pub const SIGNED_LEN: usize = 0x2A0;
/// Report versions this parser knows the layout of.
pub const KNOWN_VERSIONS: std::ops::RangeInclusive<u32> = 2..=5;
/// `SIGNATURE_ALGO` value for ECDSA P-384 with SHA-384 (ABI Table 117).
pub const SIG_ALGO_ECDSA_P384_SHA384: u32 = 1;

const _: () = assert!(REPORT_LEN == 1184);
const _: () = assert!(SIGNED_LEN == 672);

/// Byte offsets of the fields, named as in ABI Table 23.
#[allow(missing_docs)]
mod offset {
    pub const VERSION: usize = 0x000;
    pub const GUEST_SVN: usize = 0x004;
    pub const POLICY: usize = 0x008;
    pub const FAMILY_ID: usize = 0x010;
    pub const IMAGE_ID: usize = 0x020;
    pub const VMPL: usize = 0x030;
    pub const SIGNATURE_ALGO: usize = 0x034;
    pub const CURRENT_TCB: usize = 0x038;
    pub const PLATFORM_INFO: usize = 0x040;
    pub const KEY_INFO: usize = 0x048;
    pub const REPORT_DATA: usize = 0x050;
    pub const MEASUREMENT: usize = 0x090;
    pub const HOST_DATA: usize = 0x0C0;
    pub const ID_KEY_DIGEST: usize = 0x0E0;
    pub const AUTHOR_KEY_DIGEST: usize = 0x110;
    pub const REPORT_ID: usize = 0x140;
    pub const REPORT_ID_MA: usize = 0x160;
    pub const REPORTED_TCB: usize = 0x180;
    pub const CPUID_FAM_ID: usize = 0x188;
    pub const CPUID_MOD_ID: usize = 0x189;
    pub const CPUID_STEP: usize = 0x18A;
    pub const CHIP_ID: usize = 0x1A0;
    pub const COMMITTED_TCB: usize = 0x1E0;
    pub const CURRENT_VERSION: usize = 0x1E8;
    pub const COMMITTED_VERSION: usize = 0x1EC;
    pub const LAUNCH_TCB: usize = 0x1F0;
    pub const LAUNCH_MIT_VECTOR: usize = 0x1F8;
    pub const CURRENT_MIT_VECTOR: usize = 0x200;
    pub const SIGNATURE_R: usize = 0x2A0;
    pub const SIGNATURE_S: usize = 0x2E8;
}

/// Layout of a field that can be flipped or rewritten by tests and the
/// simulated attester.
pub mod field {
    pub use super::offset::*;
}

/// An SEV-SNP attestation report: exactly [`REPORT_LEN`] bytes.
///
/// Parsing checks the length only; what the version, the algorithm and every
/// field mean is judged by the verifier's named checks, so that a reviewer
/// sees *which* property a bad report violates.
#[derive(Clone, PartialEq, Eq)]
pub struct SnpReport {
    raw: Box<[u8; REPORT_LEN]>,
}

/// Why bytes are not an attestation report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReportLengthError {
    /// Fewer bytes than a report.
    #[error("report is truncated: {actual} bytes, expected {REPORT_LEN}")]
    Truncated {
        /// Bytes received.
        actual: usize,
    },
    /// More bytes than a report.
    #[error("report has {} trailing bytes after the {REPORT_LEN}-byte structure", actual - REPORT_LEN)]
    TrailingBytes {
        /// Bytes received.
        actual: usize,
    },
}

impl SnpReport {
    /// Takes exactly [`REPORT_LEN`] bytes; anything else is refused.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, ReportLengthError> {
        let raw: [u8; REPORT_LEN] = match bytes.len() {
            REPORT_LEN => bytes.try_into().map_err(|_| ReportLengthError::Truncated { actual: bytes.len() })?,
            n if n < REPORT_LEN => return Err(ReportLengthError::Truncated { actual: n }),
            n => return Err(ReportLengthError::TrailingBytes { actual: n }),
        };
        Ok(Self { raw: Box::new(raw) })
    }

    /// The raw bytes as received.
    pub fn as_bytes(&self) -> &[u8; REPORT_LEN] {
        &self.raw
    }

    /// The bytes the signature covers.
    pub fn signed_bytes(&self) -> &[u8] {
        &self.raw[..SIGNED_LEN]
    }

    fn u32_at(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.array(at))
    }

    fn u64_at(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.array(at))
    }

    fn array<const N: usize>(&self, at: usize) -> [u8; N] {
        let mut out = [0u8; N];
        out.copy_from_slice(&self.raw[at..at + N]);
        out
    }

    /// `VERSION`.
    pub fn version(&self) -> u32 {
        self.u32_at(offset::VERSION)
    }
    /// `GUEST_SVN`.
    pub fn guest_svn(&self) -> u32 {
        self.u32_at(offset::GUEST_SVN)
    }
    /// `POLICY`: the guest policy the VM was launched with.
    pub fn policy(&self) -> GuestPolicy {
        GuestPolicy(self.u64_at(offset::POLICY))
    }
    /// `FAMILY_ID` from the ID block.
    pub fn family_id(&self) -> [u8; 16] {
        self.array(offset::FAMILY_ID)
    }
    /// `IMAGE_ID` from the ID block.
    pub fn image_id(&self) -> [u8; 16] {
        self.array(offset::IMAGE_ID)
    }
    /// `VMPL` the report was requested from.
    pub fn vmpl(&self) -> u32 {
        self.u32_at(offset::VMPL)
    }
    /// `SIGNATURE_ALGO`.
    pub fn signature_algo(&self) -> u32 {
        self.u32_at(offset::SIGNATURE_ALGO)
    }
    /// `CURRENT_TCB` (layout depends on the product).
    pub fn current_tcb(&self) -> RawTcb {
        RawTcb(self.u64_at(offset::CURRENT_TCB))
    }
    /// `PLATFORM_INFO`.
    pub fn platform_info(&self) -> PlatformInfo {
        PlatformInfo(self.u64_at(offset::PLATFORM_INFO))
    }
    /// `KEY_INFO` (author key, chip-id masking, signing key).
    pub fn key_info(&self) -> KeyInfo {
        KeyInfo(self.u32_at(offset::KEY_INFO))
    }
    /// `REPORT_DATA`: the 64 bytes the guest asked to be signed.
    pub fn report_data(&self) -> [u8; 64] {
        self.array(offset::REPORT_DATA)
    }
    /// `MEASUREMENT`: the launch digest.
    pub fn measurement(&self) -> [u8; 48] {
        self.array(offset::MEASUREMENT)
    }
    /// `HOST_DATA` supplied by the hypervisor at launch.
    pub fn host_data(&self) -> [u8; 32] {
        self.array(offset::HOST_DATA)
    }
    /// `ID_KEY_DIGEST`: SHA-384 of the ID block signing key (zero without an ID block).
    pub fn id_key_digest(&self) -> [u8; 48] {
        self.array(offset::ID_KEY_DIGEST)
    }
    /// `AUTHOR_KEY_DIGEST`.
    pub fn author_key_digest(&self) -> [u8; 48] {
        self.array(offset::AUTHOR_KEY_DIGEST)
    }
    /// `REPORT_ID`.
    pub fn report_id(&self) -> [u8; 32] {
        self.array(offset::REPORT_ID)
    }
    /// `REPORT_ID_MA`.
    pub fn report_id_ma(&self) -> [u8; 32] {
        self.array(offset::REPORT_ID_MA)
    }
    /// `REPORTED_TCB`: the TCB the signing VCEK was derived from.
    pub fn reported_tcb(&self) -> RawTcb {
        RawTcb(self.u64_at(offset::REPORTED_TCB))
    }
    /// CPUID family, model and stepping (report version 3 and later).
    pub fn cpuid(&self) -> Option<Cpuid> {
        (self.version() >= 3).then(|| Cpuid {
            family: self.raw[offset::CPUID_FAM_ID],
            model: self.raw[offset::CPUID_MOD_ID],
            stepping: self.raw[offset::CPUID_STEP],
        })
    }
    /// `CHIP_ID` (zero when the guest masked it).
    pub fn chip_id(&self) -> [u8; 64] {
        self.array(offset::CHIP_ID)
    }
    /// `COMMITTED_TCB`.
    pub fn committed_tcb(&self) -> RawTcb {
        RawTcb(self.u64_at(offset::COMMITTED_TCB))
    }
    /// Firmware version currently running.
    pub fn current_version(&self) -> FirmwareVersion {
        FirmwareVersion::at(&self.raw[offset::CURRENT_VERSION..])
    }
    /// Committed firmware version.
    pub fn committed_version(&self) -> FirmwareVersion {
        FirmwareVersion::at(&self.raw[offset::COMMITTED_VERSION..])
    }
    /// `LAUNCH_TCB`.
    pub fn launch_tcb(&self) -> RawTcb {
        RawTcb(self.u64_at(offset::LAUNCH_TCB))
    }
    /// `LAUNCH_MIT_VECTOR` (report version 5 and later).
    pub fn launch_mit_vector(&self) -> Option<u64> {
        (self.version() >= 5).then(|| self.u64_at(offset::LAUNCH_MIT_VECTOR))
    }
    /// `CURRENT_MIT_VECTOR` (report version 5 and later).
    pub fn current_mit_vector(&self) -> Option<u64> {
        (self.version() >= 5).then(|| self.u64_at(offset::CURRENT_MIT_VECTOR))
    }
    /// Signature component R: 72 bytes, little-endian, upper 24 bytes zero.
    pub fn signature_r(&self) -> [u8; 72] {
        self.array(offset::SIGNATURE_R)
    }
    /// Signature component S: 72 bytes, little-endian, upper 24 bytes zero.
    pub fn signature_s(&self) -> [u8; 72] {
        self.array(offset::SIGNATURE_S)
    }
    /// The first reserved range (ABI Table 23, for this report's version)
    /// holding a non-zero byte, if any. Firmware writes zeros there; a
    /// non-zero byte means a parser disagreement waiting to happen.
    pub fn nonzero_reserved(&self) -> Option<(usize, usize)> {
        let v = self.version();
        let cpuid_end = if v >= 3 { 0x18B } else { 0x188 };
        let tail_start = if v >= 5 { 0x208 } else { 0x1F8 };
        let ranges = [
            (0x04C, 0x050),
            (cpuid_end, 0x1A0),
            (0x1EB, 0x1EC),
            (0x1EF, 0x1F0),
            (tail_start, SIGNED_LEN),
            (0x330, REPORT_LEN),
        ];
        ranges.into_iter().find(|&(a, b)| self.raw[a..b].iter().any(|x| *x != 0))
    }

    /// Whether `CHIP_ID` is all zero (masked by the guest, or a VLEK report).
    pub fn chip_id_masked(&self) -> bool {
        self.chip_id() == [0u8; 64]
    }
    /// Best guess of the product without endorsements: CPUID when present,
    /// else the Turin chip-id shape (8 significant bytes); `None` if unknown.
    pub fn product_hint(&self) -> Option<Product> {
        match self.cpuid() {
            Some(cpuid) => Product::from_cpuid(cpuid),
            None => {
                let chip = self.chip_id();
                (!self.chip_id_masked() && chip[8..] == [0u8; 56]).then_some(Product::Turin)
            }
        }
    }
}

impl fmt::Debug for SnpReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnpReport")
            .field("version", &self.version())
            .field("vmpl", &self.vmpl())
            .field("policy", &self.policy())
            .field("measurement", &hex::encode(self.measurement()))
            .finish_non_exhaustive()
    }
}

/// CPUID family/model/stepping as reported (v3+).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Cpuid {
    /// Combined family.
    pub family: u8,
    /// Combined model.
    pub model: u8,
    /// Stepping.
    pub stepping: u8,
}

/// SEV firmware version `major.minor` build `build`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct FirmwareVersion {
    /// Major version.
    pub major: u8,
    /// Minor version.
    pub minor: u8,
    /// Build number.
    pub build: u8,
}

impl FirmwareVersion {
    fn at(bytes: &[u8]) -> Self {
        // Layout: build, minor, major, reserved.
        Self { build: bytes[0], minor: bytes[1], major: bytes[2] }
    }
}

impl fmt::Display for FirmwareVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.build)
    }
}

/// A TCB_VERSION as a raw 64-bit value; decode it with the product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawTcb(pub u64);

impl RawTcb {
    /// Decodes the per-component security patch levels. Milan and Genoa:
    /// byte 0 boot loader, 1 TEE, 6 SNP, 7 microcode. Turin: byte 0 FMC,
    /// 1 boot loader, 2 TEE, 3 SNP, 7 microcode.
    pub fn decode(self, product: Product) -> Tcb {
        let b = self.0.to_le_bytes();
        match product {
            Product::Milan | Product::Genoa => {
                Tcb { fmc: None, bootloader: b[0], tee: b[1], snp: b[6], microcode: b[7] }
            }
            Product::Turin => Tcb { fmc: Some(b[0]), bootloader: b[1], tee: b[2], snp: b[3], microcode: b[7] },
        }
    }

    /// Encodes per-component levels for `product`.
    pub fn encode(tcb: Tcb, product: Product) -> Self {
        let mut b = [0u8; 8];
        match product {
            Product::Milan | Product::Genoa => {
                b[0] = tcb.bootloader;
                b[1] = tcb.tee;
                b[6] = tcb.snp;
                b[7] = tcb.microcode;
            }
            Product::Turin => {
                b[0] = tcb.fmc.unwrap_or(0);
                b[1] = tcb.bootloader;
                b[2] = tcb.tee;
                b[3] = tcb.snp;
                b[7] = tcb.microcode;
            }
        }
        Self(u64::from_le_bytes(b))
    }
}

/// Security patch levels per TCB component.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Tcb {
    /// FMC (Turin and later only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fmc: Option<u8>,
    /// PSP boot loader.
    pub bootloader: u8,
    /// PSP operating system (TEE).
    pub tee: u8,
    /// SNP firmware.
    pub snp: u8,
    /// CPU microcode.
    pub microcode: u8,
}

impl fmt::Display for Tcb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(fmc) = self.fmc {
            write!(f, "fmc={fmc} ")?;
        }
        write!(f, "bootloader={} tee={} snp={} microcode={}", self.bootloader, self.tee, self.snp, self.microcode)
    }
}

/// Guest policy (ABI Table 9).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestPolicy(pub u64);

impl GuestPolicy {
    /// Bit 16: SMT is allowed on the host.
    pub const SMT: u64 = 1 << 16;
    /// Bit 17: reserved, must be one.
    pub const RESERVED_MUST_BE_ONE: u64 = 1 << 17;
    /// Bit 18: association with a migration agent is allowed.
    pub const MIGRATE_MA: u64 = 1 << 18;
    /// Bit 19: debugging is allowed (the hypervisor can read guest memory).
    pub const DEBUG: u64 = 1 << 19;
    /// Bit 20: the guest may run on one socket only.
    pub const SINGLE_SOCKET: u64 = 1 << 20;
    /// Bit 21: CXL may be populated with guest memory.
    pub const CXL_ALLOW: u64 = 1 << 21;
    /// Bit 22: AES-256-XTS memory encryption is required.
    pub const MEM_AES_256_XTS: u64 = 1 << 22;
    /// Bit 23: running average power limit must be disabled.
    pub const RAPL_DIS: u64 = 1 << 23;
    /// Bit 24: ciphertext hiding must be enabled.
    pub const CIPHERTEXT_HIDING: u64 = 1 << 24;
    /// Bit 25: guest page swapping is disabled.
    pub const PAGE_SWAP_DISABLE: u64 = 1 << 25;

    fn bit(self, mask: u64) -> bool {
        self.0 & mask != 0
    }
    /// Minimum ABI minor version.
    pub fn abi_minor(self) -> u8 {
        self.0 as u8
    }
    /// Minimum ABI major version.
    pub fn abi_major(self) -> u8 {
        (self.0 >> 8) as u8
    }
    /// Whether the guest allows SMT on the host.
    pub fn smt_allowed(self) -> bool {
        self.bit(Self::SMT)
    }
    /// Whether the reserved must-be-one bit is set.
    pub fn reserved_bit_set(self) -> bool {
        self.bit(Self::RESERVED_MUST_BE_ONE)
    }
    /// Whether a migration agent may be associated.
    pub fn migrate_ma_allowed(self) -> bool {
        self.bit(Self::MIGRATE_MA)
    }
    /// Whether debugging is allowed.
    pub fn debug_allowed(self) -> bool {
        self.bit(Self::DEBUG)
    }
    /// Whether the guest is restricted to one socket.
    pub fn single_socket_required(self) -> bool {
        self.bit(Self::SINGLE_SOCKET)
    }
    /// Whether CXL memory is allowed.
    pub fn cxl_allowed(self) -> bool {
        self.bit(Self::CXL_ALLOW)
    }
    /// Whether AES-256-XTS is required.
    pub fn aes_256_xts_required(self) -> bool {
        self.bit(Self::MEM_AES_256_XTS)
    }
    /// Whether RAPL must be disabled.
    pub fn rapl_disabled_required(self) -> bool {
        self.bit(Self::RAPL_DIS)
    }
    /// Whether ciphertext hiding is required.
    pub fn ciphertext_hiding_required(self) -> bool {
        self.bit(Self::CIPHERTEXT_HIDING)
    }
    /// Whether page swapping is disabled.
    pub fn page_swap_disabled(self) -> bool {
        self.bit(Self::PAGE_SWAP_DISABLE)
    }
}

/// Platform information (ABI Table 24).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlatformInfo(pub u64);

impl PlatformInfo {
    /// Bit 0: SMT is enabled on the platform.
    pub const SMT_EN: u64 = 1 << 0;
    /// Bit 1: TSME is enabled.
    pub const TSME_EN: u64 = 1 << 1;
    /// Bit 2: ECC memory is in use.
    pub const ECC_EN: u64 = 1 << 2;
    /// Bit 3: RAPL is disabled.
    pub const RAPL_DIS: u64 = 1 << 3;
    /// Bit 4: ciphertext hiding is enabled.
    pub const CIPHERTEXT_HIDING_EN: u64 = 1 << 4;
    /// Bit 5: alias check complete (v3+).
    pub const ALIAS_CHECK_COMPLETE: u64 = 1 << 5;
    /// Bit 6: the IOMMU only lets devices write where the RMP allows
    /// (`IOMMU_WRITE_SAFE`; reported by Turin firmware, e.g. 1.58).
    pub const IOMMU_WRITE_SAFE: u64 = 1 << 6;
    /// Bit 7: SEV-TIO enabled (v5+).
    pub const TIO_EN: u64 = 1 << 7;

    /// Every bit the current firmware ABI defines, with its ABI name, in bit
    /// order. Any other bit is unknown to this verifier.
    pub const NAMED: [(u64, &'static str); 8] = [
        (Self::SMT_EN, "SMT_EN"),
        (Self::TSME_EN, "TSME_EN"),
        (Self::ECC_EN, "ECC_EN"),
        (Self::RAPL_DIS, "RAPL_DIS"),
        (Self::CIPHERTEXT_HIDING_EN, "CIPHERTEXT_HIDING_DRAM_EN"),
        (Self::ALIAS_CHECK_COMPLETE, "ALIAS_CHECK_COMPLETE"),
        (Self::IOMMU_WRITE_SAFE, "IOMMU_WRITE_SAFE"),
        (Self::TIO_EN, "TIO_EN"),
    ];

    /// The mask of every named bit.
    pub const KNOWN: u64 = {
        let mut mask = 0;
        let mut i = 0;
        while i < Self::NAMED.len() {
            mask |= Self::NAMED[i].0;
            i += 1;
        }
        mask
    };

    /// The ABI names of the bits set, in bit order.
    pub fn set_names(self) -> Vec<&'static str> {
        Self::NAMED.iter().filter(|(m, _)| self.0 & m != 0).map(|(_, n)| *n).collect()
    }

    /// The bits set that the ABI this verifier knows does not define.
    pub fn unknown_bits(self) -> u64 {
        self.0 & !Self::KNOWN
    }

    fn bit(self, mask: u64) -> bool {
        self.0 & mask != 0
    }
    /// SMT enabled on the platform.
    pub fn smt_enabled(self) -> bool {
        self.bit(Self::SMT_EN)
    }
    /// TSME enabled.
    pub fn tsme_enabled(self) -> bool {
        self.bit(Self::TSME_EN)
    }
    /// ECC memory enabled.
    pub fn ecc_enabled(self) -> bool {
        self.bit(Self::ECC_EN)
    }
    /// RAPL disabled.
    pub fn rapl_disabled(self) -> bool {
        self.bit(Self::RAPL_DIS)
    }
    /// Ciphertext hiding enabled.
    pub fn ciphertext_hiding_enabled(self) -> bool {
        self.bit(Self::CIPHERTEXT_HIDING_EN)
    }
    /// Alias check complete.
    pub fn alias_check_complete(self) -> bool {
        self.bit(Self::ALIAS_CHECK_COMPLETE)
    }
    /// IOMMU write-safe (bit 6).
    pub fn iommu_write_safe(self) -> bool {
        self.bit(Self::IOMMU_WRITE_SAFE)
    }
    /// SEV-TIO enabled.
    pub fn tio_enabled(self) -> bool {
        self.bit(Self::TIO_EN)
    }
}

/// Which key signed the report (`KEY_INFO.SIGNING_KEY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum SigningKey {
    /// No key: the report is unsigned.
    None,
    /// A reserved value.
    Reserved(u8),
    /// Versioned Chip Endorsement Key (per chip and TCB).
    Vcek,
    /// Versioned Loaded Endorsement Key (per cloud provider).
    Vlek,
}

impl fmt::Display for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("none"),
            Self::Reserved(v) => write!(f, "reserved({v})"),
            Self::Vcek => f.write_str("VCEK"),
            Self::Vlek => f.write_str("VLEK"),
        }
    }
}

/// `KEY_INFO` (ABI Table 23, offset 0x48).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyInfo(pub u32);

impl KeyInfo {
    /// Whether the author key digest is present.
    pub fn author_key_enabled(self) -> bool {
        self.0 & 1 != 0
    }
    /// Whether the guest masked `CHIP_ID`.
    pub fn mask_chip_key(self) -> bool {
        self.0 & 2 != 0
    }
    /// The key that signed the report.
    pub fn signing_key(self) -> SigningKey {
        match (self.0 >> 2) & 0b111 {
            0 => SigningKey::Vcek,
            1 => SigningKey::Vlek,
            7 => SigningKey::None,
            other => SigningKey::Reserved(other as u8),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_wrong_lengths() {
        assert_eq!(SnpReport::from_bytes(&[0; 10]), Err(ReportLengthError::Truncated { actual: 10 }));
        assert_eq!(
            SnpReport::from_bytes(&[0; REPORT_LEN + 1]),
            Err(ReportLengthError::TrailingBytes { actual: REPORT_LEN + 1 })
        );
        assert!(SnpReport::from_bytes(&[0; REPORT_LEN]).is_ok());
    }

    #[test]
    fn tcb_round_trips_per_product() {
        let tcb = Tcb { fmc: None, bootloader: 3, tee: 1, snp: 22, microcode: 213 };
        for product in [Product::Milan, Product::Genoa] {
            assert_eq!(RawTcb::encode(tcb, product).decode(product), tcb);
        }
        let turin = Tcb { fmc: Some(2), ..tcb };
        assert_eq!(RawTcb::encode(turin, Product::Turin).decode(Product::Turin), turin);
    }
}
