//! XML-DSig verification of NVIDIA RIMs: the one profile NVIDIA uses, and
//! nothing else.
//!
//! ```text
//! <ds:Signature>                         enveloped, child of the SWID root
//!   <ds:SignedInfo>
//!     CanonicalizationMethod  C14N 1.1 (or 1.0; identical for these documents)
//!     SignatureMethod         ecdsa-sha384  (SignatureValue = r ‖ s, 96 bytes)
//!     Reference URI=""        Transforms: enveloped-signature, C14N 1.1; DigestMethod sha384
//!   <ds:KeyInfo><ds:X509Data>  signer certificate first, then its issuers
//! ```
//!
//! Canonicalization is inclusive C14N (W3C xml-c14n11) of a whole document
//! without comments: namespace declarations rendered where they first appear
//! or change (all in-scope ones on the apex of a subset), sorted by prefix;
//! attributes sorted by (namespace URI, local name); C14N escaping; empty
//! elements as start/end pairs; nothing outside the document element but
//! processing instructions. Element and attribute prefixes are read from the
//! source text, since the DOM keeps only expanded names.

use std::collections::BTreeMap;
use std::time::SystemTime;

use base64::Engine;
use roxmltree::{Document, Node, NodeType};
use sha2::{Digest, Sha384};

use crate::x509::{fmt_time, ParsedCert};

const DSIG_NS: &str = "http://www.w3.org/2000/09/xmldsig#";
const C14N_11: &str = "http://www.w3.org/2006/12/xml-c14n11";
const C14N_10: &str = "http://www.w3.org/TR/2001/REC-xml-c14n-20010315";
const ECDSA_SHA384: &str = "http://www.w3.org/2001/04/xmldsig-more#ecdsa-sha384";
const ENVELOPED: &str = "http://www.w3.org/2000/09/xmldsig#enveloped-signature";
const SHA384_DIGEST: &str = "http://www.w3.org/2001/04/xmldsig-more#sha384";
const MAX_SIGNER_CERTS: usize = 6;

/// The NVIDIA CoRIM / RIM signing root (nvtrust `verifier_RIM_root.pem`). A public certificate.
pub const NVIDIA_RIM_ROOT_PEM: &str = include_str!("roots/nvidia_rim_root.pem");

/// Why a RIM signature does not verify.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum XmlDsigError {
    /// Not parsable, or not the profile NVIDIA uses.
    #[error("RIM signature structure: {0}")]
    Structure(String),
    /// The document digest differs from the signed DigestValue.
    #[error("RIM content does not match the signed digest")]
    DigestMismatch,
    /// The signature over SignedInfo does not verify.
    #[error("RIM signature does not verify under the signer certificate")]
    BadSignature,
    /// The signer chain does not reach the pinned RIM root, or is not valid at the time.
    #[error("RIM signer chain: {0}")]
    Chain(String),
}

fn structure(m: impl Into<String>) -> XmlDsigError {
    XmlDsigError::Structure(m.into())
}

/// The pinned NVIDIA RIM root.
pub fn nvidia_rim_root() -> Result<ParsedCert, XmlDsigError> {
    ParsedCert::from_pem(NVIDIA_RIM_ROOT_PEM.as_bytes()).map_err(|e| XmlDsigError::Chain(e.to_string()))
}

fn escape_text(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\r' => out.push_str("&#xD;"),
            c => out.push(c),
        }
    }
}

fn escape_attr(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '"' => out.push_str("&quot;"),
            '\t' => out.push_str("&#x9;"),
            '\n' => out.push_str("&#xA;"),
            '\r' => out.push_str("&#xD;"),
            c => out.push(c),
        }
    }
}

/// The element's qualified name as written in the source.
fn element_qname<'a>(node: Node<'_, '_>, src: &'a str) -> Result<&'a str, XmlDsigError> {
    let start = node.range().start;
    let rest = src.get(start + 1..).ok_or_else(|| structure("element position"))?;
    let end =
        rest.find(|c: char| c.is_whitespace() || c == '/' || c == '>').ok_or_else(|| structure("element name"))?;
    Ok(&rest[..end])
}

/// In-scope namespaces of an element (prefix "" = default), without `xml`.
fn in_scope(node: Node<'_, '_>) -> BTreeMap<String, String> {
    node.namespaces()
        .filter(|n| n.name() != Some("xml"))
        .map(|n| (n.name().unwrap_or_default().to_owned(), n.uri().to_owned()))
        .collect()
}

/// Inclusive C14N of `node` (an element) whose output parent rendered `parent_ns`.
fn c14n_element(
    node: Node<'_, '_>,
    src: &str,
    parent_ns: &BTreeMap<String, String>,
    skip: Option<roxmltree::NodeId>,
    depth: usize,
    out: &mut String,
) -> Result<(), XmlDsigError> {
    if depth > 64 {
        return Err(structure("document nested deeper than 64 elements"));
    }
    let qname = element_qname(node, src)?;
    out.push('<');
    out.push_str(qname);
    let ns = in_scope(node);
    if !ns.contains_key("") && parent_ns.get("").is_some_and(|u| !u.is_empty()) {
        out.push_str(" xmlns=\"\"");
    }
    for (prefix, uri) in &ns {
        if parent_ns.get(prefix) != Some(uri) {
            if prefix.is_empty() {
                out.push_str(" xmlns=\"");
            } else {
                out.push_str(" xmlns:");
                out.push_str(prefix);
                out.push_str("=\"");
            }
            escape_attr(uri, out);
            out.push('"');
        }
    }
    let mut attrs = Vec::new();
    for a in node.attributes() {
        let q = src.get(a.range_qname()).ok_or_else(|| structure("attribute position"))?;
        attrs.push((a.namespace().unwrap_or_default(), a.name(), q, a.value()));
    }
    attrs.sort_by(|x, y| (x.0, x.1).cmp(&(y.0, y.1)));
    for (_, _, q, v) in attrs {
        out.push(' ');
        out.push_str(q);
        out.push_str("=\"");
        escape_attr(v, out);
        out.push('"');
    }
    out.push('>');
    for child in node.children() {
        if Some(child.id()) == skip {
            continue;
        }
        match child.node_type() {
            NodeType::Element => c14n_element(child, src, &ns, skip, depth + 1, out)?,
            NodeType::Text => escape_text(child.text().unwrap_or_default(), out),
            NodeType::PI => {
                if let Some(pi) = child.pi() {
                    write_pi(pi, out);
                }
            }
            NodeType::Comment | NodeType::Root => {}
        }
    }
    out.push_str("</");
    out.push_str(qname);
    out.push('>');
    Ok(())
}

/// A processing instruction in canonical form.
fn write_pi(pi: roxmltree::PI<'_>, out: &mut String) {
    out.push_str("<?");
    out.push_str(pi.target);
    if let Some(v) = pi.value {
        out.push(' ');
        out.push_str(v);
    }
    out.push_str("?>");
}

/// Inclusive C14N of the whole document without comments, leaving out `skip`'s subtree.
fn c14n_document(doc: &Document<'_>, src: &str, skip: Option<roxmltree::NodeId>) -> Result<String, XmlDsigError> {
    let mut out = String::with_capacity(src.len());
    let mut after_root = false;
    for child in doc.root().children() {
        match child.node_type() {
            NodeType::Element => {
                c14n_element(child, src, &BTreeMap::new(), skip, 0, &mut out)?;
                after_root = true;
            }
            NodeType::PI => {
                if let Some(pi) = child.pi() {
                    if after_root {
                        out.push('\n');
                    }
                    write_pi(pi, &mut out);
                    if !after_root {
                        out.push('\n');
                    }
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

fn ds_child<'a, 'i>(node: Node<'a, 'i>, name: &str) -> Result<Node<'a, 'i>, XmlDsigError> {
    let mut found = node.children().filter(|n| n.is_element() && n.has_tag_name((DSIG_NS, name)));
    let first = found.next().ok_or_else(|| structure(format!("no ds:{name}")))?;
    if found.next().is_some() {
        return Err(structure(format!("ds:{name} appears twice")));
    }
    Ok(first)
}

fn algorithm<'a>(node: Node<'a, '_>) -> &'a str {
    node.attribute("Algorithm").unwrap_or_default()
}

fn b64(text: Option<&str>) -> Result<Vec<u8>, XmlDsigError> {
    let clean: String = text.unwrap_or_default().chars().filter(|c| !c.is_whitespace()).collect();
    base64::engine::general_purpose::STANDARD.decode(clean).map_err(|e| structure(format!("base64: {e}")))
}

/// Verifies a RIM's enveloped XML-DSig and its signer chain to `root` at `now`.
/// Returns the signer's common name.
pub fn verify_rim_signature(xml: &[u8], root: &ParsedCert, now: SystemTime) -> Result<String, XmlDsigError> {
    let src = std::str::from_utf8(xml).map_err(|_| structure("not UTF-8"))?;
    let options = roxmltree::ParsingOptions { allow_dtd: false, ..Default::default() };
    let doc = Document::parse_with_options(src, options).map_err(|e| structure(e.to_string()))?;
    let signature = ds_child(doc.root_element(), "Signature")?;
    let signed_info = ds_child(signature, "SignedInfo")?;
    let c14n = algorithm(ds_child(signed_info, "CanonicalizationMethod")?);
    if c14n != C14N_11 && c14n != C14N_10 {
        return Err(structure(format!("canonicalization {c14n} not supported")));
    }
    let method = algorithm(ds_child(signed_info, "SignatureMethod")?);
    if method != ECDSA_SHA384 {
        return Err(structure(format!("signature method {method} not supported")));
    }
    let reference = ds_child(signed_info, "Reference")?;
    if reference.attribute("URI") != Some("") {
        return Err(structure("the Reference must cover the whole document (URI=\"\")"));
    }
    let transforms: Vec<&str> =
        ds_child(reference, "Transforms")?.children().filter(|n| n.is_element()).map(algorithm).collect();
    if transforms.first() != Some(&ENVELOPED)
        || transforms.len() > 2
        || transforms.get(1).is_some_and(|t| *t != C14N_11 && *t != C14N_10)
    {
        return Err(structure(format!("transforms {transforms:?} not supported")));
    }
    let digest_method = algorithm(ds_child(reference, "DigestMethod")?);
    if digest_method != SHA384_DIGEST {
        return Err(structure(format!("digest method {digest_method} not supported")));
    }
    let digest_value = b64(ds_child(reference, "DigestValue")?.text())?;

    // 1. The document, without the signature, hashes to the signed digest.
    let content = c14n_document(&doc, src, Some(signature.id()))?;
    if Sha384::digest(content.as_bytes())[..] != digest_value[..] {
        return Err(XmlDsigError::DigestMismatch);
    }

    // 2. The signer's certificate chain reaches the pinned root, valid at `now`.
    let certs: Vec<ParsedCert> = ds_child(ds_child(signature, "KeyInfo")?, "X509Data")?
        .children()
        .filter(|n| n.is_element() && n.has_tag_name((DSIG_NS, "X509Certificate")))
        .take(MAX_SIGNER_CERTS + 1)
        .map(|n| b64(n.text()).and_then(|d| ParsedCert::from_der(&d).map_err(|e| XmlDsigError::Chain(e.to_string()))))
        .collect::<Result<_, _>>()?;
    if certs.is_empty() || certs.len() > MAX_SIGNER_CERTS {
        return Err(XmlDsigError::Chain(format!(
            "{} signer certificates (1..={MAX_SIGNER_CERTS} expected)",
            certs.len()
        )));
    }
    let mut chain: Vec<&ParsedCert> = certs.iter().collect();
    if chain.last().is_some_and(|c| c.der() == root.der()) {
        chain.pop();
    }
    chain.push(root);
    for pair in chain.windows(2) {
        let name = pair[0].common_name().unwrap_or_default();
        if !pair[0].issued_by_name(pair[1]) {
            return Err(XmlDsigError::Chain(format!("{name} is not issued by {}", pair[1].subject_string())));
        }
        pair[0].verify_signed_by(pair[1]).map_err(|e| XmlDsigError::Chain(format!("{name}: {e}")))?;
    }
    for c in &chain {
        c.check_validity(now).map_err(|why| {
            XmlDsigError::Chain(format!(
                "{} not valid at {}: {why}",
                c.common_name().unwrap_or_default(),
                fmt_time(now)
            ))
        })?;
    }

    // 3. The signature over the canonical SignedInfo, by the signer key.
    let mut canonical = String::new();
    c14n_element(signed_info, src, &BTreeMap::new(), None, 0, &mut canonical)?;
    let sig: [u8; 96] = b64(ds_child(signature, "SignatureValue")?.text())?
        .try_into()
        .map_err(|v: Vec<u8>| structure(format!("ECDSA P-384 signature of {} bytes, expected 96", v.len())))?;
    certs[0].verify_p384_fixed(canonical.as_bytes(), &sig).map_err(|_| XmlDsigError::BadSignature)?;
    Ok(certs[0].common_name().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(xml: &str) -> String {
        let doc = Document::parse(xml).unwrap();
        c14n_document(&doc, xml, None).unwrap()
    }

    #[test]
    fn canonicalizes_per_c14n_rules() {
        // Attribute order, namespace order and redundancy, empty elements, escaping (W3C C14N §3 examples).
        assert_eq!(
            canon(
                r#"<?xml version="1.0"?><a xmlns:b="u:b" xmlns="u:a" z="1" b:y="&amp;" a="&#x9;"><c xmlns="u:a"/><b:d xmlns:b="u:b2">1 &lt; 2 &gt; 0</b:d></a>"#
            ),
            r#"<a xmlns="u:a" xmlns:b="u:b" a="&#x9;" z="1" b:y="&amp;"><c></c><b:d xmlns:b="u:b2">1 &lt; 2 &gt; 0</b:d></a>"#
        );
        assert_eq!(canon("<a><!-- gone --><b/></a>"), "<a><b></b></a>");
        assert_eq!(canon(r#"<a xmlns="u"><b xmlns=""/></a>"#), r#"<a xmlns="u"><b xmlns=""></b></a>"#);
    }

    #[test]
    fn pinned_rim_root_parses() {
        let root = nvidia_rim_root().unwrap();
        root.verify_signed_by(&root).unwrap();
    }

    #[test]
    fn refuses_unsigned_or_foreign_profiles() {
        let root = nvidia_rim_root().unwrap();
        let now = SystemTime::now();
        assert!(matches!(verify_rim_signature(b"<a/>", &root, now), Err(XmlDsigError::Structure(_))));
        let x = format!(
            r#"<a><ds:Signature xmlns:ds="{DSIG_NS}"><ds:SignedInfo><ds:CanonicalizationMethod Algorithm="x"/></ds:SignedInfo></ds:Signature></a>"#
        );
        assert!(
            matches!(verify_rim_signature(x.as_bytes(), &root, now), Err(XmlDsigError::Structure(m)) if m.contains("canonicalization"))
        );
    }
}
