//! AMD EPYC product lines that support SEV-SNP, and their pinned roots.

use std::fmt;
use std::sync::OnceLock;

use super::report::Cpuid;
use crate::x509::ParsedCert;

/// An EPYC generation with its own AMD Root Key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum Product {
    /// 4th generation (Zen 4): Genoa, Bergamo, Siena.
    Genoa,
    /// 3rd generation (Zen 3).
    Milan,
    /// 5th generation (Zen 5).
    Turin,
}

impl Product {
    /// Every product, in the order the policy file lists them.
    pub const ALL: [Product; 3] = [Product::Milan, Product::Genoa, Product::Turin];

    /// Product from the CPUID fields of a v3+ report (combined family and model).
    pub fn from_cpuid(cpuid: Cpuid) -> Option<Self> {
        match (cpuid.family, cpuid.model) {
            (0x19, 0x00..=0x0F) => Some(Self::Milan),
            (0x19, 0x10..=0x1F) | (0x19, 0xA0..=0xAF) => Some(Self::Genoa),
            (0x1A, 0x00..=0x11) => Some(Self::Turin),
            _ => None,
        }
    }

    /// Product from the `productName` extension of a VCEK/VLEK (`Milan-B0`, `Genoa`, ...).
    pub fn from_product_name(name: &str) -> Option<Self> {
        let family = name.split('-').next().unwrap_or(name);
        match family {
            "Milan" => Some(Self::Milan),
            "Genoa" => Some(Self::Genoa),
            "Turin" => Some(Self::Turin),
            _ => None,
        }
    }

    /// Lower-case key used in the policy file.
    pub fn name(self) -> &'static str {
        match self {
            Self::Genoa => "Genoa",
            Self::Milan => "Milan",
            Self::Turin => "Turin",
        }
    }

    /// CPUID family/model the simulated attester writes for this product.
    pub fn canonical_cpuid(self) -> Cpuid {
        let (family, model) = match self {
            Self::Milan => (0x19, 0x01),
            Self::Genoa => (0x19, 0x11),
            Self::Turin => (0x1A, 0x02),
        };
        Cpuid { family, model, stepping: 1 }
    }

    /// The pinned AMD Root Key for this product (from the `sev` crate's builtin certificates).
    pub fn amd_ark(self) -> &'static ParsedCert {
        &amd_roots()[self as usize].0
    }

    /// The AMD SEV Key (intermediate for VCEKs) for this product.
    pub fn amd_ask(self) -> &'static ParsedCert {
        &amd_roots()[self as usize].1
    }
}

impl fmt::Display for Product {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn amd_roots() -> &'static [(ParsedCert, ParsedCert); 3] {
    static ROOTS: OnceLock<[(ParsedCert, ParsedCert); 3]> = OnceLock::new();
    ROOTS.get_or_init(|| {
        use sev::certs::snp::builtin::{genoa, milan, turin};
        let load = |pem: &[u8]| {
            // Invariant: these are AMD's published certificates compiled into
            // the `sev` crate; a failure here is a build defect, not input.
            #[allow(clippy::expect_used)]
            ParsedCert::from_pem(pem).expect("builtin AMD certificate parses")
        };
        let pair = |ark: &[u8], ask: &[u8]| {
            let (ark, ask) = (load(ark), load(ask));
            // Verified once here so per-report verification need not repeat it.
            #[allow(clippy::expect_used)]
            {
                ark.verify_signed_by(&ark).expect("builtin ARK is self-signed");
                ask.verify_signed_by(&ark).expect("builtin ASK is signed by its ARK");
            }
            (ark, ask)
        };
        // Order matches the enum discriminants: Genoa, Milan, Turin.
        [pair(genoa::ARK, genoa::ASK), pair(milan::ARK, milan::ASK), pair(turin::ARK, turin::ASK)]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_roots_are_self_signed_and_sign_their_ask() {
        for product in Product::ALL {
            let ark = product.amd_ark();
            let ask = product.amd_ask();
            ark.verify_signed_by(ark).unwrap();
            ask.verify_signed_by(ark).unwrap();
            assert_eq!(ark.common_name().as_deref(), Some(format!("ARK-{product}").as_str()));
        }
    }

    #[test]
    fn product_names_map() {
        assert_eq!(Product::from_product_name("Milan-B0"), Some(Product::Milan));
        assert_eq!(Product::from_product_name("Genoa"), Some(Product::Genoa));
        assert_eq!(Product::from_product_name("Rome"), None);
    }
}
