//! The appraisal policy: every reference value the verifier compares against.
//!
//! A policy is a TOML file owned by the relying party. Unknown keys are an
//! error (a typo must not silently weaken a check). Example:
//!
//! ```toml
//! products = ["Milan", "Genoa", "Turin"]
//! min_report_version = 2
//! allow_vlek = false
//! require_crl = false
//! allow_debug = false
//! allow_migration_agent = false
//! allow_smt = true
//! vmpl = 0
//! measurements = ["7a1e5c266c0108dbc9bb94fa926951320940915d0aafb42464bd88b579ea158d3e1a0dc39b2c60bd95b9c480cd81841f"]
//! # host_data = "…64 hex…"
//! # id_key_digest = "…96 hex…"
//! allow_simulated = false
//!
//! [min_tcb.Milan]
//! bootloader = 3
//! tee = 0
//! snp = 8
//! microcode = 115
//!
//! # Platform hardening (see `PlatformPolicy`; every key optional).
//! [platform]
//! require_guest_policy = ["single_socket", "rapl_disabled"]  # guest-policy bits the launch must set
//! allow_cxl = false                    # refuse guests that allow CXL-attached memory (the default)
//! min_guest_abi = "1.55"               # lowest ABI the guest required of the firmware
//! require_platform = ["tsme", "alias_check_complete"]  # PLATFORM_INFO bits the host must report
//! refuse_unknown_platform_bits = false # true: PLATFORM_INFO bits this verifier cannot name fail (default: WARN)
//! required_mitigations = [0]           # bit numbers set in both mitigation vectors (report v5+)
//!
//! # NVIDIA GPU evidence (see `GpuPolicy`; every key optional, defaults shown commented).
//! [gpu]
//! required = true                      # a shard without GPU evidence is refused
//! # count = 1                          # GPUs each shard must present
//! min_driver_version = "550.54.14"     # dotted decimal, compared numerically
//! min_vbios_version = "96.00.5E.00.01" # dotted hex, compared numerically
//! require_protected_pcie = false       # protected-PCIe status must be on (0xAA)
//! require_rim = true                   # golden measurements (RIMs) must be supplied and match
//! require_rim_signature = false        # every RIM must be signed (signed RIMs are always verified)
//! require_revocation = false           # OCSP data for the device chain must be supplied
//! require_cc_settings = false          # the collector's CC/DevTools report must be present
//! # root_pem = "-----BEGIN CERTIFICATE-----…"  # replaces the compiled-in NVIDIA Device Identity CA
//! # rim_root_pem = "-----BEGIN CERTIFICATE-----…"  # replaces the compiled-in NVIDIA CoRIM signing root
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::claims::{KeyHash, ManifestRoot, Measurement, PolicyDigest};
use crate::snp::{report::KNOWN_VERSIONS, Product};

/// Lowest report version Veil accepts by default. Version 2 reports (no
/// CPUID fields) still come from deployed Milan firmware; the product is then
/// taken from the endorsement chain alone.
pub const DEFAULT_MIN_REPORT_VERSION: u32 = 2;

/// Minimum security patch level per TCB component; absent components are not checked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcbMinimum {
    /// FMC (Turin only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fmc: Option<u8>,
    /// PSP boot loader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootloader: Option<u8>,
    /// PSP OS (TEE).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tee: Option<u8>,
    /// SNP firmware.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snp: Option<u8>,
    /// Microcode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub microcode: Option<u8>,
}

/// Reference values for NVIDIA GPU evidence (`[gpu]`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuPolicy {
    /// Evidence without GPU evidence is refused.
    #[serde(default)]
    pub required: bool,
    /// Exact number of GPUs each shard must present, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    /// Lowest driver version (dotted decimal, e.g. `550.54.14`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_driver_version: Option<String>,
    /// Lowest VBIOS version (dotted hex, e.g. `96.00.5E.00.01`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_vbios_version: Option<String>,
    /// The protected-PCIe status must be on.
    #[serde(default)]
    pub require_protected_pcie: bool,
    /// Golden measurements (driver and VBIOS RIMs) must be supplied, and every active index must match.
    #[serde(default)]
    pub require_rim: bool,
    /// Every RIM must carry an XML signature (signed RIMs are always verified, to the NVIDIA RIM root).
    #[serde(default)]
    pub require_rim_signature: bool,
    /// PEM of a RIM signing root replacing the compiled-in NVIDIA CoRIM signing Root CA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rim_root_pem: Option<String>,
    /// OCSP responses covering the device chain must be supplied (and say good).
    #[serde(default)]
    pub require_revocation: bool,
    /// The collector's report of CC and DevTools mode must be present (DevTools is not in the signed evidence).
    #[serde(default)]
    pub require_cc_settings: bool,
    /// PEM of a device root replacing the compiled-in NVIDIA Device Identity CA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_pem: Option<String>,
}

impl GpuPolicy {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// Checks the version strings and the root override.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if let Some(v) = &self.min_driver_version {
            crate::gpu::Version::driver(v)
                .map_err(|e| PolicyError::Inconsistent(format!("gpu.min_driver_version: {e}")))?;
        }
        if let Some(v) = &self.min_vbios_version {
            crate::gpu::Version::vbios(v)
                .map_err(|e| PolicyError::Inconsistent(format!("gpu.min_vbios_version: {e}")))?;
        }
        if let Some(pem) = &self.root_pem {
            crate::x509::ParsedCert::from_pem(pem.as_bytes())
                .map_err(|e| PolicyError::Inconsistent(format!("gpu.root_pem: {e}")))?;
        }
        if let Some(pem) = &self.rim_root_pem {
            crate::x509::ParsedCert::from_pem(pem.as_bytes())
                .map_err(|e| PolicyError::Inconsistent(format!("gpu.rim_root_pem: {e}")))?;
        }
        if self.count == Some(0) {
            return Err(PolicyError::Inconsistent("gpu.count = 0: use required = false instead".into()));
        }
        Ok(())
    }
}

/// A guest-policy bit a guest may be required to have been launched with
/// (ABI Table 9). Each is a hardening the firmware enforces for the guest's
/// whole life once set at launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GuestPolicyFlag {
    /// Bit 20: the guest runs on one socket only.
    SingleSocket,
    /// Bit 22: memory encrypted with AES-256-XTS.
    MemAes256Xts,
    /// Bit 23: running average power limit disabled (power side channel).
    RaplDisabled,
    /// Bit 24: ciphertext hiding for DRAM enabled.
    CiphertextHiding,
    /// Bit 25: guest page swapping disabled.
    PageSwapDisabled,
}

impl GuestPolicyFlag {
    /// Every flag.
    pub const ALL: [Self; 5] =
        [Self::SingleSocket, Self::MemAes256Xts, Self::RaplDisabled, Self::CiphertextHiding, Self::PageSwapDisabled];

    /// The bit in the guest policy.
    pub fn mask(self) -> u64 {
        use crate::snp::GuestPolicy as G;
        match self {
            Self::SingleSocket => G::SINGLE_SOCKET,
            Self::MemAes256Xts => G::MEM_AES_256_XTS,
            Self::RaplDisabled => G::RAPL_DIS,
            Self::CiphertextHiding => G::CIPHERTEXT_HIDING,
            Self::PageSwapDisabled => G::PAGE_SWAP_DISABLE,
        }
    }

    /// The ABI's name for the bit.
    pub fn abi_name(self) -> &'static str {
        match self {
            Self::SingleSocket => "SINGLE_SOCKET",
            Self::MemAes256Xts => "MEM_AES_256_XTS",
            Self::RaplDisabled => "RAPL_DIS",
            Self::CiphertextHiding => "CIPHERTEXT_HIDING_DRAM",
            Self::PageSwapDisabled => "PAGE_SWAP_DISABLE",
        }
    }
}

/// A `PLATFORM_INFO` bit a platform may be required to report (ABI Table 24).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlatformFlag {
    /// Bit 1: transparent SME on.
    Tsme,
    /// Bit 2: ECC memory.
    Ecc,
    /// Bit 3: RAPL disabled.
    RaplDisabled,
    /// Bit 4: ciphertext hiding for DRAM enabled.
    CiphertextHiding,
    /// Bit 5: the memory alias check completed (BadRAM mitigation, AMD-SB-3015).
    AliasCheckComplete,
    /// Bit 6: device writes are checked against the RMP (`IOMMU_WRITE_SAFE`, Turin).
    IommuWriteSafe,
    /// Bit 7: SEV-TIO (trusted I/O) enabled.
    TioEnabled,
}

impl PlatformFlag {
    /// Every flag.
    pub const ALL: [Self; 7] = [
        Self::Tsme,
        Self::Ecc,
        Self::RaplDisabled,
        Self::CiphertextHiding,
        Self::AliasCheckComplete,
        Self::IommuWriteSafe,
        Self::TioEnabled,
    ];

    /// The bit in `PLATFORM_INFO`.
    pub fn mask(self) -> u64 {
        use crate::snp::PlatformInfo as P;
        match self {
            Self::Tsme => P::TSME_EN,
            Self::Ecc => P::ECC_EN,
            Self::RaplDisabled => P::RAPL_DIS,
            Self::CiphertextHiding => P::CIPHERTEXT_HIDING_EN,
            Self::AliasCheckComplete => P::ALIAS_CHECK_COMPLETE,
            Self::IommuWriteSafe => P::IOMMU_WRITE_SAFE,
            Self::TioEnabled => P::TIO_EN,
        }
    }

    /// The ABI's name for the bit.
    pub fn abi_name(self) -> &'static str {
        match self {
            Self::Tsme => "TSME_EN",
            Self::Ecc => "ECC_EN",
            Self::RaplDisabled => "RAPL_DIS",
            Self::CiphertextHiding => "CIPHERTEXT_HIDING_DRAM_EN",
            Self::AliasCheckComplete => "ALIAS_CHECK_COMPLETE",
            Self::IommuWriteSafe => "IOMMU_WRITE_SAFE",
            Self::TioEnabled => "TIO_EN",
        }
    }
}

/// An SEV ABI version `MAJOR.MINOR`, written `"1.55"` in the policy file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AbiVersion {
    /// Major version.
    pub major: u8,
    /// Minor version.
    pub minor: u8,
}

impl std::fmt::Display for AbiVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl std::str::FromStr for AbiVersion {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (a, b) = s.split_once('.').ok_or_else(|| format!("ABI version {s:?} is not MAJOR.MINOR"))?;
        let num = |x: &str| x.parse::<u8>().map_err(|_| format!("ABI version {s:?} is not MAJOR.MINOR (0..=255 each)"));
        Ok(Self { major: num(a)?, minor: num(b)? })
    }
}

impl Serialize for AbiVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for AbiVersion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// Platform hardening (`[platform]`): guest-policy bits, `PLATFORM_INFO`
/// and mitigation vectors (SECURITY-CASES C4, C10, C11). Every key is
/// optional; the default requires nothing beyond refusing CXL memory, and
/// shows unknown `PLATFORM_INFO` bits as a warning.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlatformPolicy {
    /// Guest-policy bits the guest must have been launched with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub require_guest_policy: Vec<GuestPolicyFlag>,
    /// Accept guests whose policy allows CXL-attached memory (CXL_ALLOW).
    #[serde(default)]
    pub allow_cxl: bool,
    /// Lowest ABI version the guest must have required of the firmware at
    /// launch (guest policy bits 0–15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_guest_abi: Option<AbiVersion>,
    /// `PLATFORM_INFO` bits the platform must report.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub require_platform: Vec<PlatformFlag>,
    /// Refuse `PLATFORM_INFO` bits the firmware ABI this verifier knows does
    /// not define. Off by default: newer firmware sets new bits, and they are
    /// shown as a warning.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub refuse_unknown_platform_bits: bool,
    /// Mitigation-vector bit numbers (report version 5 and later) that must be
    /// set in both `LAUNCH_MIT_VECTOR` and `CURRENT_MIT_VECTOR`. Compared as bit
    /// sets, never as numbers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required_mitigations: Vec<u8>,
}

impl PlatformPolicy {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// The required mitigation bits as one mask.
    pub fn mitigation_mask(&self) -> u64 {
        self.required_mitigations.iter().fold(0u64, |m, b| m | 1u64.checked_shl(u32::from(*b)).unwrap_or(0))
    }

    fn validate(&self) -> Result<(), PolicyError> {
        if let Some(b) = self.required_mitigations.iter().find(|b| **b >= 64) {
            return Err(PolicyError::Inconsistent(format!(
                "platform.required_mitigations: bit {b} is outside the 64-bit mitigation vector"
            )));
        }
        Ok(())
    }

    fn normalize(&mut self) {
        self.require_guest_policy.sort();
        self.require_guest_policy.dedup();
        self.require_platform.sort();
        self.require_platform.dedup();
        self.required_mitigations.sort();
        self.required_mitigations.dedup();
    }

    fn gaps(&self, peer: &Self, gap: &mut impl FnMut(&str, String, String)) {
        let missing: Vec<&str> = self
            .require_guest_policy
            .iter()
            .filter(|f| !peer.require_guest_policy.contains(f))
            .map(|f| f.abi_name())
            .collect();
        if !missing.is_empty() {
            gap("platform.require_guest_policy", missing.join(", "), "not required".into());
        }
        if peer.allow_cxl && !self.allow_cxl {
            gap("platform.allow_cxl", "false".into(), "true".into());
        }
        if let Some(mine) = self.min_guest_abi {
            if peer.min_guest_abi.is_none_or(|t| t < mine) {
                gap(
                    "platform.min_guest_abi",
                    mine.to_string(),
                    peer.min_guest_abi.map_or("no minimum".into(), |t| t.to_string()),
                );
            }
        }
        let missing: Vec<&str> =
            self.require_platform.iter().filter(|f| !peer.require_platform.contains(f)).map(|f| f.abi_name()).collect();
        if !missing.is_empty() {
            gap("platform.require_platform", missing.join(", "), "not required".into());
        }
        if self.refuse_unknown_platform_bits && !peer.refuse_unknown_platform_bits {
            gap("platform.refuse_unknown_platform_bits", "true".into(), "false".into());
        }
        let missing = self.mitigation_mask() & !peer.mitigation_mask();
        if missing != 0 {
            gap("platform.required_mitigations", format!("{missing:#x}"), "not required".into());
        }
    }
}

/// Hex-encoded 32-byte value in the policy file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct HostData(pub KeyHash);

/// Hex-encoded 48-byte digest (ID key digest) in the policy file.
pub type IdKeyDigest = Measurement;

/// The appraisal policy for SEV-SNP evidence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Products whose evidence is acceptable.
    #[serde(default = "all_products")]
    pub products: Vec<Product>,
    /// Lowest acceptable report version.
    #[serde(default = "default_min_version")]
    pub min_report_version: u32,
    /// Highest acceptable report version.
    #[serde(default = "default_max_version")]
    pub max_report_version: u32,
    /// Accept reports signed by a VLEK (cloud-provider key, ASVK chain).
    #[serde(default)]
    pub allow_vlek: bool,
    /// Fail when no CRL accompanies the evidence.
    #[serde(default)]
    pub require_crl: bool,
    /// Accept guests launched with the DEBUG policy bit (never in production).
    #[serde(default)]
    pub allow_debug: bool,
    /// Accept guests that may be associated with a migration agent.
    #[serde(default)]
    pub allow_migration_agent: bool,
    /// Accept platforms with SMT enabled.
    #[serde(default = "yes")]
    pub allow_smt: bool,
    /// Required VMPL of the report.
    #[serde(default)]
    pub vmpl: u32,
    /// TCB minimums per product, compared with `REPORTED_TCB`.
    #[serde(default)]
    pub min_tcb: BTreeMap<Product, TcbMinimum>,
    /// Allowed launch measurements.
    #[serde(default)]
    pub measurements: Vec<Measurement>,
    /// Accept any launch measurement. Must be said in so many words; an
    /// empty allowlist without it rejects everything.
    #[serde(default)]
    pub any_measurement: bool,
    /// Required `HOST_DATA`, when pinned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_data: Option<HostData>,
    /// Required `ID_KEY_DIGEST`, when pinned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_key_digest: Option<IdKeyDigest>,
    /// Accept evidence from Veil's *simulated* attester. Development only:
    /// simulated evidence proves nothing about hardware.
    #[serde(default)]
    pub allow_simulated: bool,
    /// When non-empty, only these simulated roots (SHA-256 of the ARK's
    /// SubjectPublicKeyInfo) are accepted under `allow_simulated`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub simulated_roots: Vec<KeyHash>,
    /// Allowed model manifests per layer range (`"START..END"` → roots).
    /// When non-empty, evidence claiming a layer range must claim one of the
    /// roots listed for exactly that range; a range not listed is refused.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub manifest_roots: BTreeMap<String, Vec<ManifestRoot>>,
    /// Platform hardening: guest-policy bits, `PLATFORM_INFO`, mitigation vectors.
    #[serde(default, skip_serializing_if = "PlatformPolicy::is_default")]
    pub platform: PlatformPolicy,
    /// NVIDIA GPU evidence requirements.
    #[serde(default, skip_serializing_if = "GpuPolicy::is_default")]
    pub gpu: GpuPolicy,
    /// Peer policies accepted by digest (relying party): a route whose
    /// shards enforce one of these on their links is accepted even where it
    /// is not at least as strict as this policy (`veil policy init` pins
    /// what it saw here).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peer_policies: Vec<PolicyDigest>,
    /// The model's layer count the route must cover, from layer 0, when pinned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_layers: Option<u32>,
    /// Drafters the entry may speculate with, by digest (relying party; the
    /// `drafter` route check). Empty: any drafter the entry commits to.
    /// Greedy output and the sampled distribution never depend on the
    /// drafter; a seeded sampled request's text does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drafters: Vec<crate::claims::DrafterDigest>,
}

/// Domain separator of a policy's canonical encoding.
pub const POLICY_DOMAIN: &[u8] = b"veil/peer-policy/v1\0";

/// One setting on which a peer policy is weaker than the relying party's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PolicyGap {
    /// The policy key (`products`, `min_tcb.Genoa.snp`, `gpu.required`, …).
    pub setting: String,
    /// What the relying party's policy requires.
    pub yours: String,
    /// What the peer policy enforces.
    pub peer: String,
}

impl std::fmt::Display for PolicyGap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: yours {}, the route's {}", self.setting, self.yours, self.peer)
    }
}

fn all_products() -> Vec<Product> {
    Product::ALL.to_vec()
}
fn default_min_version() -> u32 {
    DEFAULT_MIN_REPORT_VERSION
}
fn default_max_version() -> u32 {
    *KNOWN_VERSIONS.end()
}
fn yes() -> bool {
    true
}

/// Why a policy file was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// Not valid TOML or not the policy schema.
    #[error("policy is not valid: {0}")]
    Parse(String),
    /// Values contradict each other.
    #[error("policy is inconsistent: {0}")]
    Inconsistent(String),
}

impl Default for Policy {
    /// The strict default: every product, debug and migration agent off,
    /// VMPL 0, no TCB minimums, simulated evidence refused, and an empty
    /// measurement allowlist (which rejects until a measurement is pinned).
    fn default() -> Self {
        Self {
            products: all_products(),
            min_report_version: DEFAULT_MIN_REPORT_VERSION,
            max_report_version: default_max_version(),
            allow_vlek: false,
            require_crl: false,
            allow_debug: false,
            allow_migration_agent: false,
            allow_smt: true,
            vmpl: 0,
            min_tcb: BTreeMap::new(),
            measurements: Vec::new(),
            any_measurement: false,
            host_data: None,
            id_key_digest: None,
            allow_simulated: false,
            simulated_roots: Vec::new(),
            manifest_roots: BTreeMap::new(),
            platform: PlatformPolicy::default(),
            gpu: GpuPolicy::default(),
            peer_policies: Vec::new(),
            model_layers: None,
            drafters: Vec::new(),
        }
    }
}

impl Policy {
    /// Parses and validates a TOML policy.
    pub fn from_toml(text: &str) -> Result<Self, PolicyError> {
        let policy: Self = toml::from_str(text).map_err(|e| PolicyError::Parse(e.to_string()))?;
        policy.validate()?;
        Ok(policy)
    }

    /// Serialises to TOML.
    pub fn to_toml(&self) -> String {
        // Invariant: every field is TOML-representable.
        toml::to_string_pretty(self).unwrap_or_default()
    }

    /// Checks internal consistency.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.min_report_version > self.max_report_version {
            return Err(PolicyError::Inconsistent(format!(
                "min_report_version {} > max_report_version {}",
                self.min_report_version, self.max_report_version
            )));
        }
        if self.min_report_version < *KNOWN_VERSIONS.start() || self.max_report_version > *KNOWN_VERSIONS.end() {
            return Err(PolicyError::Inconsistent(format!(
                "report versions must lie within {}..={} (the layouts this verifier knows)",
                KNOWN_VERSIONS.start(),
                KNOWN_VERSIONS.end()
            )));
        }
        if self.products.is_empty() {
            return Err(PolicyError::Inconsistent("products is empty: nothing could be accepted".into()));
        }
        if self.any_measurement && !self.measurements.is_empty() {
            return Err(PolicyError::Inconsistent(
                "any_measurement = true makes the measurements allowlist meaningless; choose one".into(),
            ));
        }
        for (product, min) in &self.min_tcb {
            if min.fmc.is_some() && *product != Product::Turin {
                return Err(PolicyError::Inconsistent(format!("{product} has no FMC component")));
            }
        }
        if !self.simulated_roots.is_empty() && !self.allow_simulated {
            return Err(PolicyError::Inconsistent("simulated_roots is set but allow_simulated = false".into()));
        }
        for (range, roots) in &self.manifest_roots {
            let ok = range
                .split_once("..")
                .and_then(|(a, b)| Some((a.parse::<u32>().ok()?, b.parse::<u32>().ok()?)))
                .is_some_and(|(a, b)| a < b);
            if !ok || roots.is_empty() {
                return Err(PolicyError::Inconsistent(format!(
                    "manifest_roots key {range:?} must be START..END with at least one root"
                )));
            }
        }
        if self.model_layers == Some(0) {
            return Err(PolicyError::Inconsistent("model_layers = 0".into()));
        }
        self.platform.validate()?;
        self.gpu.validate()
    }

    /// The same policy with every list sorted and deduplicated: two files
    /// that accept exactly the same evidence normalise equal.
    pub fn normalized(&self) -> Self {
        fn norm<T: Ord>(v: &mut Vec<T>) {
            v.sort();
            v.dedup();
        }
        let mut p = self.clone();
        norm(&mut p.products);
        norm(&mut p.measurements);
        norm(&mut p.simulated_roots);
        norm(&mut p.peer_policies);
        norm(&mut p.drafters);
        p.platform.normalize();
        for roots in p.manifest_roots.values_mut() {
            norm(roots);
        }
        p
    }

    /// The canonical encoding: `"veil/peer-policy/v1\0" ‖ JSON` of the
    /// normalised policy (fields in declaration order, maps sorted), so the
    /// same policy always encodes — and hashes — the same, whatever its
    /// file's order, comments or spelling of defaults.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        let mut out = POLICY_DOMAIN.to_vec();
        // Invariant: the policy is plain data (strings, numbers, maps); serialising cannot fail.
        out.extend_from_slice(&serde_json::to_vec(&self.normalized()).unwrap_or_default());
        out
    }

    /// SHA-256 of [`canonical_bytes`](Self::canonical_bytes): what a shard's
    /// claims carry as its peer policy.
    pub fn digest(&self) -> PolicyDigest {
        use sha2::Digest as _;
        PolicyDigest(sha2::Sha256::digest(self.canonical_bytes()).into())
    }

    /// Every setting that leaves this policy weaker than a production
    /// policy should be, with why (`veil policy check` prints them).
    pub fn weaknesses(&self) -> Vec<(&'static str, String)> {
        let mut w: Vec<(&'static str, String)> = Vec::new();
        if self.allow_simulated {
            w.push((
                "allow_simulated",
                if self.simulated_roots.is_empty() {
                    "accepts SIMULATED evidence from any simulated root: proves nothing about hardware".into()
                } else {
                    "accepts SIMULATED evidence (pinned roots): proves nothing about hardware; development only".into()
                },
            ));
        }
        if self.any_measurement {
            w.push(("any_measurement", "any launch measurement passes: any code may run in the CVM".into()));
        }
        if self.allow_debug {
            w.push(("allow_debug", "debug guests pass: the host can read and write guest memory".into()));
        }
        if self.allow_migration_agent {
            w.push(("allow_migration_agent", "a migration agent may export the guest's memory".into()));
        }
        if self.platform.allow_cxl {
            w.push(("platform.allow_cxl", "guests may place memory on CXL devices outside the SoC".into()));
        }
        for p in &self.products {
            match self.min_tcb.get(p) {
                None => w.push(("min_tcb", format!("no TCB minimums for {p}: rolled-back firmware passes"))),
                Some(m) if m.snp.is_none() || m.microcode.is_none() => {
                    w.push(("min_tcb", format!("{p}: no minimum for the SNP firmware or microcode")))
                }
                Some(_) => {}
            }
        }
        if self.products.contains(&Product::Milan) {
            w.push((
                "products",
                "Milan is allowed: its root seed has been extracted in software (arXiv 2605.12990); reports from Milan \
                 can be forged"
                    .into(),
            ));
        }
        if !self.require_crl {
            w.push(("require_crl", "a missing CRL is tolerated: a revoked ASK or VCEK could pass".into()));
        }
        if !self.gpu.required {
            w.push(("gpu.required", "GPUs optional: a shard presenting no GPU evidence passes".into()));
        } else if !self.gpu.require_rim {
            w.push(("gpu.require_rim", "GPU firmware measurements are not compared with NVIDIA's RIMs".into()));
        }
        if self.manifest_roots.is_empty() {
            w.push(("manifest_roots", "no model manifests pinned: any weights the route pins pass".into()));
        }
        if !self.peer_policies.is_empty() {
            w.push((
                "peer_policies",
                format!(
                    "{} peer polic(ies) accepted by digest even where weaker than this one",
                    self.peer_policies.len()
                ),
            ));
        }
        w
    }

    /// Whether this policy can be met where evidence is verified without
    /// collateral fetched by the relying party (the serving path: client SDK,
    /// `veil verify URL`, links between shards): `gpu.require_revocation`
    /// needs OCSP responses that only `veil attest verify --gpu-ocsp`
    /// supplies, so there it would refuse every shard — said once, clearly.
    pub fn fit_for_serving_path(&self) -> Result<(), PolicyError> {
        if self.gpu.require_revocation {
            return Err(PolicyError::Inconsistent(
                "gpu.require_revocation = true cannot be met on the serving path: OCSP responses for GPU device \
                 chains are not fetched there (check revocation with `veil attest verify --gpu-ocsp`)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Whether a shard with hardware evidence may enforce this policy on its
    /// links: not if it accepts simulated evidence or waives the measurement.
    pub fn fit_for_hardware(&self) -> Result<(), PolicyError> {
        if self.allow_simulated {
            return Err(PolicyError::Inconsistent(
                "allow_simulated = true: a shard attesting with hardware refuses to link to simulated peers".into(),
            ));
        }
        if self.any_measurement {
            return Err(PolicyError::Inconsistent(
                "any_measurement = true: a shard attesting with hardware requires its peers' launch measurements pinned"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Every setting on which `peer` (the policy a route's shards enforce on
    /// their links) would accept evidence this policy refuses. Empty means
    /// `peer` is at least as strict as `self` on every check.
    ///
    /// Manifests are not compared here: the route pins one manifest root per
    /// stage, which the route verifier compares with `manifest_roots`.
    pub fn gaps_in(&self, peer: &Policy) -> Vec<PolicyGap> {
        let mut gaps = Vec::new();
        let mut gap = |setting: &str, yours: String, theirs: String| {
            gaps.push(PolicyGap { setting: setting.to_owned(), yours, peer: theirs })
        };
        let list = |v: &[String]| if v.is_empty() { "none".to_owned() } else { v.join(", ") };
        let names = |v: &[Product]| list(&v.iter().map(|p| p.to_string()).collect::<Vec<_>>());
        let extra: Vec<Product> = peer.products.iter().filter(|p| !self.products.contains(p)).copied().collect();
        if !extra.is_empty() {
            gap("products", names(&self.products), format!("also {}", names(&extra)));
        }
        if peer.min_report_version < self.min_report_version {
            gap("min_report_version", self.min_report_version.to_string(), peer.min_report_version.to_string());
        }
        if peer.max_report_version > self.max_report_version {
            gap("max_report_version", self.max_report_version.to_string(), peer.max_report_version.to_string());
        }
        let flag = |b: bool| b.to_string();
        for (setting, mine, theirs) in [
            ("allow_vlek", self.allow_vlek, peer.allow_vlek),
            ("allow_debug", self.allow_debug, peer.allow_debug),
            ("allow_migration_agent", self.allow_migration_agent, peer.allow_migration_agent),
            ("allow_smt", self.allow_smt, peer.allow_smt),
            ("allow_simulated", self.allow_simulated, peer.allow_simulated),
        ] {
            // An allowance the peer grants and we do not.
            if theirs && !mine {
                gap(setting, flag(mine), flag(theirs));
            }
        }
        if self.require_crl && !peer.require_crl {
            gap("require_crl", "true".into(), "false".into());
        }
        if peer.vmpl != self.vmpl {
            gap("vmpl", self.vmpl.to_string(), peer.vmpl.to_string());
        }
        // TCB minimums: for every product the peer accepts (that we accept),
        // every component we bound must be bound at least as high.
        for product in peer.products.iter().filter(|p| self.products.contains(p)) {
            let Some(mine) = self.min_tcb.get(product) else { continue };
            let theirs = peer.min_tcb.get(product).copied().unwrap_or_default();
            for (component, m, t) in [
                ("fmc", mine.fmc, theirs.fmc),
                ("bootloader", mine.bootloader, theirs.bootloader),
                ("tee", mine.tee, theirs.tee),
                ("snp", mine.snp, theirs.snp),
                ("microcode", mine.microcode, theirs.microcode),
            ] {
                if let Some(m) = m {
                    if t.is_none_or(|t| t < m) {
                        let t = t.map_or("no minimum".to_owned(), |t| t.to_string());
                        gap(&format!("min_tcb.{product}.{component}"), m.to_string(), t);
                    }
                }
            }
        }
        if !self.any_measurement {
            if peer.any_measurement {
                gap("measurements", format!("{} pinned", self.measurements.len()), "any_measurement = true".into());
            } else {
                let extra: Vec<String> = peer
                    .measurements
                    .iter()
                    .filter(|m| !self.measurements.contains(m))
                    .map(|m| m.to_string())
                    .collect();
                if !extra.is_empty() {
                    gap(
                        "measurements",
                        format!("{} pinned", self.measurements.len()),
                        format!("also {}", list(&extra)),
                    );
                }
            }
        }
        for (setting, mine, theirs) in [
            ("host_data", self.host_data.map(|h| h.0.to_string()), peer.host_data.map(|h| h.0.to_string())),
            ("id_key_digest", self.id_key_digest.map(|h| h.to_string()), peer.id_key_digest.map(|h| h.to_string())),
        ] {
            if mine.is_some() && mine != theirs {
                gap(setting, mine.unwrap_or_default(), theirs.unwrap_or_else(|| "not pinned".into()));
            }
        }
        if self.allow_simulated && peer.allow_simulated && !self.simulated_roots.is_empty() {
            let extra: Vec<String> = peer
                .simulated_roots
                .iter()
                .filter(|r| !self.simulated_roots.contains(r))
                .map(|r| r.to_string())
                .collect();
            if peer.simulated_roots.is_empty() {
                gap(
                    "simulated_roots",
                    list(&self.simulated_roots.iter().map(|r| r.to_string()).collect::<Vec<_>>()),
                    "any simulated root".into(),
                );
            } else if !extra.is_empty() {
                gap(
                    "simulated_roots",
                    format!("{} pinned", self.simulated_roots.len()),
                    format!("also {}", list(&extra)),
                );
            }
        }
        self.platform.gaps(&peer.platform, &mut gap);
        self.gpu_gaps(&peer.gpu, &mut gap);
        gaps
    }

    fn gpu_gaps(&self, peer: &GpuPolicy, gap: &mut impl FnMut(&str, String, String)) {
        let mine = &self.gpu;
        for (setting, m, t) in [
            ("gpu.required", mine.required, peer.required),
            ("gpu.require_protected_pcie", mine.require_protected_pcie, peer.require_protected_pcie),
            ("gpu.require_rim", mine.require_rim, peer.require_rim),
            ("gpu.require_rim_signature", mine.require_rim_signature, peer.require_rim_signature),
            ("gpu.require_revocation", mine.require_revocation, peer.require_revocation),
            ("gpu.require_cc_settings", mine.require_cc_settings, peer.require_cc_settings),
        ] {
            if m && !t {
                gap(setting, "true".into(), "false".into());
            }
        }
        if mine.count.is_some() && mine.count != peer.count {
            let show = |c: Option<u32>| c.map_or("any".to_owned(), |c| c.to_string());
            gap("gpu.count", show(mine.count), show(peer.count));
        }
        let lower = |m: &Option<String>, t: &Option<String>, parse: fn(&str) -> Result<crate::gpu::Version, String>| {
            let Some(m) = m else { return false };
            match (parse(m), t.as_deref().map(parse)) {
                (Ok(m), Some(Ok(t))) => t < m,
                _ => true,
            }
        };
        if lower(&mine.min_driver_version, &peer.min_driver_version, crate::gpu::Version::driver) {
            gap(
                "gpu.min_driver_version",
                mine.min_driver_version.clone().unwrap_or_default(),
                peer.min_driver_version.clone().unwrap_or_else(|| "no minimum".into()),
            );
        }
        if lower(&mine.min_vbios_version, &peer.min_vbios_version, crate::gpu::Version::vbios) {
            gap(
                "gpu.min_vbios_version",
                mine.min_vbios_version.clone().unwrap_or_default(),
                peer.min_vbios_version.clone().unwrap_or_else(|| "no minimum".into()),
            );
        }
        // A replaced root trusts other devices or RIM signers than ours.
        let pem = |p: &Option<String>| p.as_deref().map(str::trim).map(str::to_owned);
        if pem(&mine.root_pem) != pem(&peer.root_pem) {
            let show = |p: &Option<String>| if p.is_some() { "a replaced root" } else { "the NVIDIA root" }.to_owned();
            gap("gpu.root_pem", show(&mine.root_pem), show(&peer.root_pem));
        }
        if pem(&mine.rim_root_pem) != pem(&peer.rim_root_pem) {
            let show = |p: &Option<String>| if p.is_some() { "a replaced root" } else { "the NVIDIA root" }.to_owned();
            gap("gpu.rim_root_pem", show(&mine.rim_root_pem), show(&peer.rim_root_pem));
        }
    }
}

#[cfg(test)]
mod tests {
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
            (
                "min_report_version",
                Policy { min_report_version: 2, ..Policy { min_report_version: 3, ..mine.clone() } },
            ),
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
                Policy {
                    gpu: GpuPolicy { min_driver_version: Some("535.1".into()), ..mine.gpu.clone() },
                    ..mine.clone()
                },
            ),
            (
                "gpu.root_pem",
                Policy { gpu: GpuPolicy { root_pem: Some("x".into()), ..mine.gpu.clone() }, ..mine.clone() },
            ),
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
}
