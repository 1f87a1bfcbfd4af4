//! `[platform]`: platform hardening (guest-policy bits, `PLATFORM_INFO`,
//! mitigation vectors) and the SEV ABI version the guest requires.

use crate::invalid::{InvalidValue, ValueKind};
use serde::{Deserialize, Serialize};

use super::PolicyError;

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
    type Err = InvalidValue;
    fn from_str(s: &str) -> Result<Self, InvalidValue> {
        let invalid = |why: &str| InvalidValue::new(ValueKind::AbiVersion, format!("{s:?} is not MAJOR.MINOR{why}"));
        let (a, b) = s.split_once('.').ok_or_else(|| invalid(""))?;
        let num = |x: &str| x.parse::<u8>().map_err(|_| invalid(" (0..=255 each)"));
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
    pub(super) fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// The required mitigation bits as one mask.
    pub fn mitigation_mask(&self) -> u64 {
        self.required_mitigations.iter().fold(0u64, |m, b| m | 1u64.checked_shl(u32::from(*b)).unwrap_or(0))
    }

    pub(super) fn validate(&self) -> Result<(), PolicyError> {
        if let Some(b) = self.required_mitigations.iter().find(|b| **b >= 64) {
            return Err(PolicyError::Inconsistent(format!(
                "platform.required_mitigations: bit {b} is outside the 64-bit mitigation vector"
            )));
        }
        Ok(())
    }

    pub(super) fn normalize(&mut self) {
        self.require_guest_policy.sort();
        self.require_guest_policy.dedup();
        self.require_platform.sort();
        self.require_platform.dedup();
        self.required_mitigations.sort();
        self.required_mitigations.dedup();
    }
}
