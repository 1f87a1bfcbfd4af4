//! NVIDIA Reference Integrity Manifests (RIMs): signed SWID tags (ISO/IEC
//! 19770-2, TCG RIM information model) that list golden measurements per
//! index for a driver or VBIOS build.
//!
//! ```xml
//! <SoftwareIdentity … name="GH100" version="1.0">
//!   <Meta colloquialVersion="96.00.74.00.1A" … />
//!   <Payload>
//!     <Resource type="Measurement" index="9" active="True" alternatives="1" Hash0="…96 hex…" size="48"/>
//!   </Payload>
//!   <ds:Signature>…</ds:Signature>   (XML-DSig: see `super::xmldsig`)
//! </SoftwareIdentity>
//! ```
//!
//! RIM index `i` is SPDM measurement block `i + 1`.

use std::collections::BTreeMap;

/// Largest RIM accepted.
pub const MAX_RIM_BYTES: usize = 1024 * 1024;
/// Most measurement resources accepted in one RIM.
pub const MAX_RESOURCES: usize = 1024;
/// Most alternatives accepted per index.
pub const MAX_ALTERNATIVES: usize = 16;
const SWID_NS: &str = "http://standards.iso.org/iso/19770/-2/2015/schema.xsd";

/// Why a RIM is unusable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RimError {
    /// Larger than [`MAX_RIM_BYTES`].
    #[error("RIM of {0} bytes exceeds the {MAX_RIM_BYTES}-byte limit")]
    TooLarge(usize),
    /// Not well-formed XML (or uses DTDs, which are refused).
    #[error("RIM is not well-formed XML: {0}")]
    Xml(String),
    /// Not a SWID tag.
    #[error("RIM root element is {0:?}, expected SoftwareIdentity")]
    NotSwid(String),
    /// A required element or attribute is missing or malformed.
    #[error("RIM {element}: {reason}")]
    Invalid {
        /// Element.
        element: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// Two resources claim the same index.
    #[error("RIM lists measurement index {0} twice")]
    DuplicateIndex(u32),
}

/// Golden values for one index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoldenMeasurement {
    /// Whether the index is compared.
    pub active: bool,
    /// Acceptable values (any one matches).
    pub alternatives: Vec<Vec<u8>>,
    /// Resource name.
    pub name: String,
}

/// A parsed RIM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rim {
    /// `tagId`.
    pub tag_id: String,
    /// `SoftwareIdentity/@name` (e.g. GH100).
    pub name: String,
    /// `Meta/@colloquialVersion`: the driver or VBIOS version the RIM is for.
    pub version: String,
    /// Golden measurements by RIM index.
    pub measurements: BTreeMap<u32, GoldenMeasurement>,
    /// Whether an XML-DSig `Signature` element is present (verified by the `gpu_rim_signature` check).
    pub has_signature: bool,
    source: Vec<u8>,
}

fn invalid(element: &'static str, reason: impl Into<String>) -> RimError {
    RimError::Invalid { element, reason: reason.into() }
}

fn bool_attr(v: &str) -> Option<bool> {
    match v {
        "True" | "true" | "1" => Some(true),
        "False" | "false" | "0" => Some(false),
        _ => None,
    }
}

impl Rim {
    /// Parses a RIM. DTDs are refused (no entity expansion).
    pub fn parse(bytes: &[u8]) -> Result<Self, RimError> {
        if bytes.len() > MAX_RIM_BYTES {
            return Err(RimError::TooLarge(bytes.len()));
        }
        let text = std::str::from_utf8(bytes).map_err(|e| RimError::Xml(format!("not UTF-8: {e}")))?;
        let options = roxmltree::ParsingOptions { allow_dtd: false, ..Default::default() };
        let doc = roxmltree::Document::parse_with_options(text, options).map_err(|e| RimError::Xml(e.to_string()))?;
        let root = doc.root_element();
        if root.tag_name().name() != "SoftwareIdentity" || root.tag_name().namespace() != Some(SWID_NS) {
            return Err(RimError::NotSwid(root.tag_name().name().to_owned()));
        }
        let tag_id = root.attribute("tagId").ok_or_else(|| invalid("SoftwareIdentity", "no tagId"))?.to_owned();
        let name = root.attribute("name").unwrap_or_default().to_owned();
        let in_swid = |n: &roxmltree::Node<'_, '_>, local: &str| {
            n.is_element() && n.tag_name().name() == local && n.tag_name().namespace() == Some(SWID_NS)
        };
        let meta: Vec<_> = root.children().filter(|n| in_swid(n, "Meta")).collect();
        let [meta] = meta.as_slice() else {
            return Err(invalid("Meta", format!("expected exactly one, found {}", meta.len())));
        };
        let version =
            meta.attribute("colloquialVersion").ok_or_else(|| invalid("Meta", "no colloquialVersion"))?.to_owned();
        let payloads: Vec<_> = root.children().filter(|n| in_swid(n, "Payload")).collect();
        let [payload] = payloads.as_slice() else {
            return Err(invalid("Payload", format!("expected exactly one, found {}", payloads.len())));
        };
        let mut measurements = BTreeMap::new();
        for r in payload.children().filter(|n| in_swid(n, "Resource")) {
            if r.attribute("type") != Some("Measurement") {
                continue;
            }
            if measurements.len() >= MAX_RESOURCES {
                return Err(invalid("Resource", format!("more than {MAX_RESOURCES} measurements")));
            }
            let index: u32 = r
                .attribute("index")
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| invalid("Resource", "index missing or not a number"))?;
            let active = r
                .attribute("active")
                .and_then(bool_attr)
                .ok_or_else(|| invalid("Resource", format!("index {index}: active missing or not a boolean")))?;
            let count: usize = r
                .attribute("alternatives")
                .and_then(|v| v.parse().ok())
                .filter(|n| (1..=MAX_ALTERNATIVES).contains(n))
                .ok_or_else(|| {
                    invalid("Resource", format!("index {index}: alternatives missing or not 1..={MAX_ALTERNATIVES}"))
                })?;
            let size: usize = r
                .attribute("size")
                .and_then(|v| v.parse().ok())
                .filter(|n| (1..=64).contains(n))
                .ok_or_else(|| invalid("Resource", format!("index {index}: size missing or not 1..=64")))?;
            let mut alternatives = Vec::with_capacity(count);
            for k in 0..count {
                let attr = format!("Hash{k}");
                let value = r
                    .attributes()
                    .find(|a| a.name() == attr)
                    .ok_or_else(|| invalid("Resource", format!("index {index}: {attr} missing")))?
                    .value();
                let bytes = hex::decode(value)
                    .map_err(|e| invalid("Resource", format!("index {index}: {attr} is not hex: {e}")))?;
                if bytes.len() != size {
                    return Err(invalid(
                        "Resource",
                        format!("index {index}: {attr} has {} bytes, size says {size}", bytes.len()),
                    ));
                }
                alternatives.push(bytes);
            }
            let name = r.attribute("name").unwrap_or_default().to_owned();
            if measurements.insert(index, GoldenMeasurement { active, alternatives, name }).is_some() {
                return Err(RimError::DuplicateIndex(index));
            }
        }
        if measurements.is_empty() {
            return Err(invalid("Payload", "no Measurement resources"));
        }
        let has_signature = root.children().any(|n| n.is_element() && n.tag_name().name() == "Signature");
        Ok(Self { tag_id, name, version, measurements, has_signature, source: bytes.to_vec() })
    }

    /// The document as received (what the XML signature covers).
    pub fn source(&self) -> &[u8] {
        &self.source
    }

    /// Indices whose golden values are compared.
    pub fn active_indices(&self) -> impl Iterator<Item = u32> + '_ {
        self.measurements.iter().filter(|(_, m)| m.active).map(|(i, _)| *i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn rim_xml(version: &str, entries: &[(u32, bool, &str)]) -> String {
        let mut s = format!(
            r#"<SoftwareIdentity xmlns="{SWID_NS}" xmlns:h="http://www.w3.org/2001/04/xmlenc#sha384" name="GH100" tagId="t1" version="1.0"><Meta colloquialVersion="{version}"/><Payload>"#
        );
        for (i, active, hash) in entries {
            s.push_str(&format!(
                r#"<Resource type="Measurement" index="{i}" active="{}" alternatives="1" h:Hash0="{hash}" size="{}"/>"#,
                if *active { "True" } else { "False" },
                hash.len() / 2
            ));
        }
        s.push_str("</Payload></SoftwareIdentity>");
        s
    }

    #[test]
    fn parses_minimal_rim() {
        let x = rim_xml("96.00.74.00.1A", &[(0, true, "aa"), (1, false, "bb")]);
        let r = Rim::parse(x.as_bytes()).unwrap();
        assert_eq!(r.version, "96.00.74.00.1A");
        assert_eq!(r.active_indices().collect::<Vec<_>>(), vec![0]);
        assert!(!r.has_signature);
    }

    #[test]
    fn refuses_malformed_rims() {
        assert!(matches!(Rim::parse(b"<SoftwareIdentity"), Err(RimError::Xml(_))));
        assert!(matches!(Rim::parse(b"<a/>"), Err(RimError::NotSwid(_))));
        let dup = rim_xml("1", &[(3, true, "aa"), (3, true, "bb")]);
        assert_eq!(Rim::parse(dup.as_bytes()), Err(RimError::DuplicateIndex(3)));
        let bad_hex = rim_xml("1", &[(3, true, "zz")]);
        assert!(matches!(Rim::parse(bad_hex.as_bytes()), Err(RimError::Invalid { element: "Resource", .. })));
        let dtd = format!("<!DOCTYPE x [<!ENTITY e \"boom\">]>{}", rim_xml("1", &[(3, true, "aa")]));
        assert!(matches!(Rim::parse(dtd.as_bytes()), Err(RimError::Xml(_))));
        let empty = rim_xml("1", &[]);
        assert!(matches!(Rim::parse(empty.as_bytes()), Err(RimError::Invalid { element: "Payload", .. })));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_text_never_panics(s in "\\PC{0,300}") {
            let _ = Rim::parse(s.as_bytes());
        }
    }
}
