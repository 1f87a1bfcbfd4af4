//! VCEK and VLEK certificates: the AMD extensions that bind a signing key to
//! a chip (hwID), a TCB (SPLs) and a product.

use crate::invalid::{InvalidValue, ValueKind};
use der::Decode;

use super::{oid, Product, SigningKey, Tcb};
use crate::x509::ParsedCert;

/// A VCEK or VLEK certificate with its AMD extensions decoded.
#[derive(Clone, Debug)]
pub struct Endorsement {
    cert: ParsedCert,
    kind: SigningKey,
    product_name: String,
    tcb: Tcb,
    hw_id: Option<Vec<u8>>,
    csp_id: Option<String>,
}

fn spl(cert: &ParsedCert, which: const_oid::ObjectIdentifier, name: &str) -> Result<Option<u8>, String> {
    let Some(bytes) = cert.extension(which).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let value = u32::from_der(bytes).map_err(|e| format!("{name} extension is not a DER INTEGER: {e}"))?;
    u8::try_from(value).map(Some).map_err(|_| format!("{name} extension value {value} exceeds 255"))
}

fn ia5(cert: &ParsedCert, which: const_oid::ObjectIdentifier, name: &str) -> Result<Option<String>, String> {
    let Some(bytes) = cert.extension(which).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    der::asn1::Ia5StringRef::from_der(bytes)
        .map(|s| Some(s.as_str().to_owned()))
        .map_err(|e| format!("{name} extension is not an IA5String: {e}"))
}

impl Endorsement {
    /// Parses a VCEK/VLEK certificate (DER or PEM) and its AMD extensions.
    pub fn parse(bytes: &[u8]) -> Result<Self, InvalidValue> {
        let cert =
            ParsedCert::from_der_or_pem(bytes).map_err(|e| InvalidValue::new(ValueKind::Endorsement, e.to_string()))?;
        Self::from_cert(cert)
    }

    /// Decodes the AMD extensions of an already parsed certificate.
    pub fn from_cert(cert: ParsedCert) -> Result<Self, InvalidValue> {
        Self::decode(cert).map_err(|reason| InvalidValue::new(ValueKind::Endorsement, reason))
    }

    fn decode(cert: ParsedCert) -> Result<Self, String> {
        let kind = match cert.common_name().as_deref() {
            Some("SEV-VCEK") => SigningKey::Vcek,
            Some("SEV-VLEK") => SigningKey::Vlek,
            other => {
                return Err(format!(
                    "certificate subject CN is {:?}, expected SEV-VCEK or SEV-VLEK",
                    other.unwrap_or("(none)")
                ))
            }
        };
        let product_name =
            ia5(&cert, oid::PRODUCT_NAME, "productName")?.ok_or("certificate has no productName extension")?;
        let need = |o, n| spl(&cert, o, n).and_then(|v| v.ok_or(format!("certificate has no {n} extension")));
        let tcb = Tcb {
            fmc: spl(&cert, oid::FMC_SPL, "fmcSPL")?,
            bootloader: need(oid::BL_SPL, "blSPL")?,
            tee: need(oid::TEE_SPL, "teeSPL")?,
            snp: need(oid::SNP_SPL, "snpSPL")?,
            microcode: need(oid::UCODE_SPL, "ucodeSPL")?,
        };
        let hw_id = cert.extension(oid::HW_ID).map_err(|e| e.to_string())?.map(<[u8]>::to_vec);
        let csp_id = ia5(&cert, oid::CSP_ID, "cspId")?;
        if kind == SigningKey::Vcek && hw_id.is_none() {
            return Err("VCEK has no hwID extension".into());
        }
        Ok(Self { cert, kind, product_name, tcb, hw_id, csp_id })
    }

    /// The certificate.
    pub fn cert(&self) -> &ParsedCert {
        &self.cert
    }
    /// VCEK or VLEK, from the subject name.
    pub fn kind(&self) -> SigningKey {
        self.kind
    }
    /// `productName` as written (`Milan-B0`).
    pub fn product_name(&self) -> &str {
        &self.product_name
    }
    /// Product family from `productName`.
    pub fn product(&self) -> Option<Product> {
        Product::from_product_name(&self.product_name)
    }
    /// TCB the key was derived for.
    pub fn tcb(&self) -> Tcb {
        self.tcb
    }
    /// `hwID` (VCEK only): 64 bytes, 8 on Turin.
    pub fn hw_id(&self) -> Option<&[u8]> {
        self.hw_id.as_deref()
    }
    /// `cspId` (VLEK only).
    pub fn csp_id(&self) -> Option<&str> {
        self.csp_id.as_deref()
    }
}
