//! TDX collateral: what Intel's PCS (or a PCCS cache) publishes for a
//! platform, carried with the evidence because the client has no network to
//! Intel. The JSON form is the one dcap-qvl and Phala's PCCS use: the CRLs as
//! hex DER, the issuer chains as PEM, the TCB info and QE identity as the
//! exact JSON text Intel signed, with their signatures as hex (R ‖ S).
//!
//! Parsing checks shapes and bounds only. Signatures, windows and matching
//! are [`super::verify`]'s.

use serde::Deserialize;

/// Largest collateral document this parser reads (real ones are 16–20 KB).
pub const MAX_COLLATERAL_BYTES: usize = 256 * 1024;
/// Most TCB levels (platform, module or QE) one document may list.
pub const MAX_TCB_LEVELS: usize = 256;

/// Why collateral does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CollateralError {
    /// Larger than [`MAX_COLLATERAL_BYTES`], or too many levels.
    #[error("collateral {what} exceeds its limit of {limit}")]
    TooLarge {
        /// Which part.
        what: &'static str,
        /// Limit.
        limit: usize,
    },
    /// Not JSON of the expected shape.
    #[error("collateral {what} is not valid JSON of the expected shape: {reason}")]
    Json {
        /// Which part.
        what: &'static str,
        /// The parser's message.
        reason: String,
    },
    /// A hex field does not decode, or has the wrong length.
    #[error("collateral field `{field}`: {reason}")]
    Field {
        /// Which field.
        field: &'static str,
        /// Why.
        reason: String,
    },
}

/// The collateral document, as carried.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Collateral {
    /// PEM: the PCK CRL's issuer (the PCK Platform or Processor CA) and the root.
    pub pck_crl_issuer_chain: String,
    /// Hex DER: the root CA's CRL (revokes intermediate CAs).
    pub root_ca_crl: String,
    /// Hex DER: the PCK CA's CRL (revokes PCK leaves).
    pub pck_crl: String,
    /// PEM: the TCB signing certificate and the root.
    pub tcb_info_issuer_chain: String,
    /// The TCB info body, exactly as Intel signed it.
    pub tcb_info: String,
    /// Hex: ECDSA P-256 (R ‖ S) over `tcb_info`'s bytes.
    pub tcb_info_signature: String,
    /// PEM: the QE identity signing certificate and the root.
    pub qe_identity_issuer_chain: String,
    /// The QE identity body, exactly as Intel signed it.
    pub qe_identity: String,
    /// Hex: ECDSA P-256 (R ‖ S) over `qe_identity`'s bytes.
    pub qe_identity_signature: String,
    /// PEM: the PCK chain, when the quote carries only a PCK identifier
    /// (not accepted here: the chain in the quote is used).
    #[serde(default)]
    pub pck_certificate_chain: Option<String>,
}

impl Collateral {
    /// Parses the JSON form.
    pub fn from_json(bytes: &[u8]) -> Result<Self, CollateralError> {
        if bytes.len() > MAX_COLLATERAL_BYTES {
            return Err(CollateralError::TooLarge { what: "document", limit: MAX_COLLATERAL_BYTES });
        }
        serde_json::from_slice(bytes).map_err(|e| CollateralError::Json { what: "document", reason: e.to_string() })
    }

    /// The TCB info body, parsed.
    pub fn tcb_info(&self) -> Result<TcbInfo, CollateralError> {
        let t: TcbInfo = serde_json::from_str(&self.tcb_info)
            .map_err(|e| CollateralError::Json { what: "tcb_info", reason: e.to_string() })?;
        let module_levels = t.tdx_module_identities.iter().map(|m| m.tcb_levels.len()).max().unwrap_or(0);
        if t.tcb_levels.len() > MAX_TCB_LEVELS || module_levels > MAX_TCB_LEVELS {
            return Err(CollateralError::TooLarge { what: "tcb_info levels", limit: MAX_TCB_LEVELS });
        }
        Ok(t)
    }

    /// The QE identity body, parsed.
    pub fn qe_identity(&self) -> Result<QeIdentity, CollateralError> {
        let q: QeIdentity = serde_json::from_str(&self.qe_identity)
            .map_err(|e| CollateralError::Json { what: "qe_identity", reason: e.to_string() })?;
        if q.tcb_levels.len() > MAX_TCB_LEVELS {
            return Err(CollateralError::TooLarge { what: "qe_identity levels", limit: MAX_TCB_LEVELS });
        }
        Ok(q)
    }

    /// `tcb_info_signature`, decoded.
    pub fn tcb_info_signature(&self) -> Result<[u8; 64], CollateralError> {
        fixed_hex("tcb_info_signature", &self.tcb_info_signature)
    }

    /// `qe_identity_signature`, decoded.
    pub fn qe_identity_signature(&self) -> Result<[u8; 64], CollateralError> {
        fixed_hex("qe_identity_signature", &self.qe_identity_signature)
    }

    /// `root_ca_crl`, decoded.
    pub fn root_ca_crl_der(&self) -> Result<Vec<u8>, CollateralError> {
        hex::decode(&self.root_ca_crl)
            .map_err(|e| CollateralError::Field { field: "root_ca_crl", reason: e.to_string() })
    }

    /// `pck_crl`, decoded.
    pub fn pck_crl_der(&self) -> Result<Vec<u8>, CollateralError> {
        hex::decode(&self.pck_crl).map_err(|e| CollateralError::Field { field: "pck_crl", reason: e.to_string() })
    }
}

/// Decodes `N` bytes of hex.
pub(crate) fn fixed_hex<const N: usize>(field: &'static str, s: &str) -> Result<[u8; N], CollateralError> {
    let v = hex::decode(s).map_err(|e| CollateralError::Field { field, reason: e.to_string() })?;
    v.try_into()
        .map_err(|v: Vec<u8>| CollateralError::Field { field, reason: format!("{} bytes, expected {N}", v.len()) })
}

/// A TCB status, as Intel's collateral names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, serde::Serialize)]
pub enum TcbStatus {
    /// Patched and configured.
    UpToDate,
    /// Patched; software hardening is needed against a named advisory.
    SWHardeningNeeded,
    /// Patched; the platform's configuration needs a change.
    ConfigurationNeeded,
    /// Both of the above.
    ConfigurationAndSWHardeningNeeded,
    /// Behind the latest TCB recovery.
    OutOfDate,
    /// Behind, and the configuration needs a change.
    OutOfDateConfigurationNeeded,
    /// The platform's keys are revoked.
    Revoked,
}

impl TcbStatus {
    /// Intel's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Self::UpToDate => "UpToDate",
            Self::SWHardeningNeeded => "SWHardeningNeeded",
            Self::ConfigurationNeeded => "ConfigurationNeeded",
            Self::ConfigurationAndSWHardeningNeeded => "ConfigurationAndSWHardeningNeeded",
            Self::OutOfDate => "OutOfDate",
            Self::OutOfDateConfigurationNeeded => "OutOfDateConfigurationNeeded",
            Self::Revoked => "Revoked",
        }
    }

    /// Parses Intel's name.
    pub fn from_name(s: &str) -> Option<Self> {
        [
            Self::UpToDate,
            Self::SWHardeningNeeded,
            Self::ConfigurationNeeded,
            Self::ConfigurationAndSWHardeningNeeded,
            Self::OutOfDate,
            Self::OutOfDateConfigurationNeeded,
            Self::Revoked,
        ]
        .into_iter()
        .find(|t| t.name() == s)
    }

    /// The worse of two statuses (the order of the enum: later is worse),
    /// except that one needing hardening and another needing configuration
    /// need both.
    pub fn worst(self, other: Self) -> Self {
        use TcbStatus::*;
        match (self, other) {
            (SWHardeningNeeded, ConfigurationNeeded) | (ConfigurationNeeded, SWHardeningNeeded) => {
                ConfigurationAndSWHardeningNeeded
            }
            (OutOfDate, ConfigurationNeeded | ConfigurationAndSWHardeningNeeded)
            | (ConfigurationNeeded | ConfigurationAndSWHardeningNeeded, OutOfDate) => OutOfDateConfigurationNeeded,
            (a, b) => a.max(b),
        }
    }
}

impl std::fmt::Display for TcbStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A TCB info body (version 3, id `TDX`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TcbInfo {
    /// `TDX` (or `SGX`, refused here).
    pub id: String,
    /// 3 for TDX.
    pub version: u32,
    /// RFC 3339.
    pub issue_date: String,
    /// RFC 3339.
    pub next_update: String,
    /// Hex, 6 bytes: the platform family this document rates.
    pub fmspc: String,
    /// Hex, 2 bytes.
    pub pce_id: String,
    /// The evaluation data number (Intel's TCB recovery counter).
    pub tcb_evaluation_data_number: u32,
    /// The base TDX module identity.
    pub tdx_module: Option<TdxModule>,
    /// Per-major-version module identities with their own levels.
    #[serde(default)]
    pub tdx_module_identities: Vec<TdxModuleIdentity>,
    /// The platform's levels, best first.
    pub tcb_levels: Vec<TcbLevel>,
}

/// The TDX module's expected signer and attributes.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TdxModule {
    /// Hex, 48 bytes.
    pub mrsigner: String,
    /// Hex, 8 bytes.
    pub attributes: String,
    /// Hex, 8 bytes.
    pub attributes_mask: String,
}

/// One major version of the TDX module (`TDX_01`, `TDX_03`, …).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TdxModuleIdentity {
    /// `TDX_` and the major version in two hex digits.
    pub id: String,
    /// Hex, 48 bytes.
    pub mrsigner: String,
    /// Hex, 8 bytes.
    pub attributes: String,
    /// Hex, 8 bytes.
    pub attributes_mask: String,
    /// Levels by the module's SVN, best first.
    pub tcb_levels: Vec<IsvLevel>,
}

/// A level rated by one SVN (a module's or the QE's).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IsvLevel {
    /// `{ "isvsvn": N }`.
    pub tcb: IsvSvn,
    /// RFC 3339.
    pub tcb_date: String,
    /// Its status.
    pub tcb_status: TcbStatus,
    /// Advisories that apply at this level.
    #[serde(default, rename = "advisoryIDs")]
    pub advisory_ids: Vec<String>,
}

/// `{ "isvsvn": N }`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct IsvSvn {
    /// The SVN.
    pub isvsvn: u16,
}

/// A platform TCB level.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TcbLevel {
    /// The components.
    pub tcb: TcbComponents,
    /// RFC 3339.
    pub tcb_date: String,
    /// Its status.
    pub tcb_status: TcbStatus,
    /// Advisories that apply at this level.
    #[serde(default, rename = "advisoryIDs")]
    pub advisory_ids: Vec<String>,
}

/// The SVNs a platform level requires.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct TcbComponents {
    /// 16 CPU SVN components, compared with the PCK certificate's.
    pub sgxtcbcomponents: Vec<Component>,
    /// The PCE SVN.
    pub pcesvn: u16,
    /// 16 TEE TCB SVN components, compared with the TD report's.
    pub tdxtcbcomponents: Vec<Component>,
}

/// One component's SVN (its category and type are for people).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Component {
    /// The SVN.
    pub svn: u8,
    /// e.g. `BIOS`, `OS/VMM`.
    #[serde(default)]
    pub category: Option<String>,
    /// e.g. `TDX Module`, `SEAMLDR ACM`.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
}

/// A QE identity body (id `TD_QE`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QeIdentity {
    /// `TD_QE`.
    pub id: String,
    /// 2 (or 3).
    pub version: u32,
    /// RFC 3339.
    pub issue_date: String,
    /// RFC 3339.
    pub next_update: String,
    /// Hex, 4 bytes (little-endian as in the report).
    pub miscselect: String,
    /// Hex, 4 bytes.
    pub miscselect_mask: String,
    /// Hex, 16 bytes.
    pub attributes: String,
    /// Hex, 16 bytes.
    pub attributes_mask: String,
    /// Hex, 32 bytes.
    pub mrsigner: String,
    /// The QE's product ID.
    pub isvprodid: u16,
    /// Levels by the QE's SVN, best first.
    pub tcb_levels: Vec<IsvLevel>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worst_status_combines_as_intel_does() {
        use TcbStatus::*;
        assert_eq!(UpToDate.worst(OutOfDate), OutOfDate);
        assert_eq!(SWHardeningNeeded.worst(ConfigurationNeeded), ConfigurationAndSWHardeningNeeded);
        assert_eq!(ConfigurationNeeded.worst(OutOfDate), OutOfDateConfigurationNeeded);
        assert_eq!(OutOfDate.worst(Revoked), Revoked);
        for s in [UpToDate, SWHardeningNeeded, OutOfDate, Revoked] {
            assert_eq!(TcbStatus::from_name(s.name()), Some(s));
        }
    }

    #[test]
    fn refuses_unknown_fields_and_oversize() {
        assert!(matches!(Collateral::from_json(b"{\"x\":1}"), Err(CollateralError::Json { .. })));
        let big = vec![b' '; MAX_COLLATERAL_BYTES + 1];
        assert!(matches!(Collateral::from_json(&big), Err(CollateralError::TooLarge { .. })));
        assert!(matches!(fixed_hex::<4>("f", "0011"), Err(CollateralError::Field { .. })));
    }
}
