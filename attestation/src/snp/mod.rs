//! SEV-SNP: the report structure, the host's certificate table, products and their AMD roots, and the
//! AMD-specific X.509 extensions of VCEK/VLEK certificates.

pub mod certs;
pub mod endorsement;
mod product;
pub mod report;

pub use endorsement::Endorsement;
pub use product::Product;
pub use report::{
    Cpuid, FirmwareVersion, GuestPolicy, KeyInfo, PlatformInfo, RawTcb, SigningKey, SnpReport, Tcb, REPORT_LEN,
    SIGNED_LEN,
};

/// OIDs of the AMD extensions in VCEK/VLEK certificates (AMD "Versioned Chip
/// Endorsement Key (VCEK) Certificate and KDS Interface Specification", Table 8).
pub mod oid {
    use const_oid::ObjectIdentifier;
    /// `structVersion`.
    pub const STRUCT_VERSION: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.1");
    /// `productName` (IA5String, e.g. `Milan-B0`).
    pub const PRODUCT_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.2");
    /// `blSPL`.
    pub const BL_SPL: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.3.1");
    /// `teeSPL`.
    pub const TEE_SPL: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.3.2");
    /// `snpSPL`.
    pub const SNP_SPL: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.3.3");
    /// `ucodeSPL`.
    pub const UCODE_SPL: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.3.8");
    /// `fmcSPL` (Turin).
    pub const FMC_SPL: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.3.9");
    /// `hwID`: the chip id (raw octets; 64 bytes, 8 on Turin).
    pub const HW_ID: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.4");
    /// `cspId` (VLEK only, IA5String naming the cloud provider).
    pub const CSP_ID: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.4.1.3704.1.5");
}
