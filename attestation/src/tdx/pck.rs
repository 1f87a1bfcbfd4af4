//! What Intel writes into a PCK certificate: the SGX extension
//! (OID 1.2.840.113741.1.13.1) with the platform's FMSPC, PCE ID, CPU SVN
//! components and PCE SVN, which the TCB info rates.

use const_oid::ObjectIdentifier;

use crate::invalid::{InvalidValue, ValueKind};
use crate::x509::{der_children, der_tlv, ParsedCert};

const SGX_EXTENSIONS: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113741.1.13.1");
const TCB: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113741.1.13.1.2");
const PCE_ID: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113741.1.13.1.3");
const FMSPC: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113741.1.13.1.4");
const PCESVN: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113741.1.13.1.2.17");
const CPUSVN: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113741.1.13.1.2.18");

const TAG_SEQUENCE: u8 = 0x30;
const TAG_OID: u8 = 0x06;
const TAG_INTEGER: u8 = 0x02;
const TAG_OCTETS: u8 = 0x04;

/// The platform values a PCK certificate carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PckExtension {
    /// The platform family (6 bytes) the TCB info must be for.
    pub fmspc: [u8; 6],
    /// The PCE ID (2 bytes).
    pub pce_id: [u8; 2],
    /// The 16 CPU SVN components (`sgxtcbcomponents` rate them).
    pub cpu_svn: [u8; 16],
    /// The PCE SVN.
    pub pce_svn: u16,
}

/// Reads the SGX extension of a PCK leaf.
pub fn pck_extension(cert: &ParsedCert) -> Result<PckExtension, InvalidValue> {
    let ext = cert
        .extension(SGX_EXTENSIONS)
        .map_err(|e| bad(e.to_string()))?
        .ok_or_else(|| bad("the PCK certificate has no SGX extension (1.2.840.113741.1.13.1)"))?;
    let (tag, content, used) = der_tlv(ext).ok_or_else(|| bad("the SGX extension is not DER"))?;
    if tag != TAG_SEQUENCE || used != ext.len() {
        return Err(bad("the SGX extension is not one SEQUENCE"));
    }
    let (mut fmspc, mut pce_id, mut tcb) = (None, None, None);
    for (oid, value_tag, value) in pairs(content)? {
        if oid == FMSPC.as_bytes() {
            fmspc = Some(octets::<6>(value_tag, value, "FMSPC")?);
        } else if oid == PCE_ID.as_bytes() {
            pce_id = Some(octets::<2>(value_tag, value, "PCE ID")?);
        } else if oid == TCB.as_bytes() {
            if value_tag != TAG_SEQUENCE {
                return Err(bad("the TCB entry is not a SEQUENCE"));
            }
            tcb = Some(value);
        }
    }
    let (cpu_svn, pce_svn) = parse_tcb(tcb.ok_or_else(|| bad("the SGX extension has no TCB entry"))?)?;
    Ok(PckExtension {
        fmspc: fmspc.ok_or_else(|| bad("the SGX extension has no FMSPC"))?,
        pce_id: pce_id.ok_or_else(|| bad("the SGX extension has no PCE ID"))?,
        cpu_svn,
        pce_svn,
    })
}

fn bad(reason: impl Into<String>) -> InvalidValue {
    InvalidValue::new(ValueKind::PckExtension, reason)
}

/// One `SEQUENCE { OID, value }`: the OID's content, the value's tag and content.
type Entry<'a> = (&'a [u8], u8, &'a [u8]);

/// The `SEQUENCE { OID, value }` entries of a SEQUENCE's content.
fn pairs(content: &[u8]) -> Result<Vec<Entry<'_>>, InvalidValue> {
    let entries = der_children(content).ok_or_else(|| bad("an SGX extension entry is not DER"))?;
    entries
        .into_iter()
        .map(|(tag, entry)| {
            let kids = der_children(entry).ok_or_else(|| bad("an SGX extension entry is not DER"))?;
            match (tag, kids.as_slice()) {
                (TAG_SEQUENCE, [(TAG_OID, oid), (value_tag, value)]) => Ok((*oid, *value_tag, *value)),
                _ => Err(bad("an SGX extension entry is not SEQUENCE { OID, value }")),
            }
        })
        .collect()
}

fn octets<const N: usize>(tag: u8, value: &[u8], what: &str) -> Result<[u8; N], InvalidValue> {
    if tag != TAG_OCTETS {
        return Err(bad(format!("{what} is not an OCTET STRING")));
    }
    value.try_into().map_err(|_| bad(format!("{what} is {} bytes, expected {N}", value.len())))
}

/// An unsigned DER INTEGER of at most 2 value bytes (a leading zero allowed).
fn small_uint(tag: u8, value: &[u8], what: &str) -> Result<u16, InvalidValue> {
    let digits = match value {
        [0, rest @ ..] if !rest.is_empty() => rest,
        v => v,
    };
    if tag != TAG_INTEGER
        || digits.is_empty()
        || digits.len() > 2
        || (value.len() == digits.len() && value[0] & 0x80 != 0)
    {
        return Err(bad(format!("{what} is not a small non-negative INTEGER")));
    }
    Ok(digits.iter().fold(0u16, |acc, b| (acc << 8) | u16::from(*b)))
}

/// The TCB entry: components 1–16, PCESVN (17) and CPUSVN (18). The 16
/// components must agree with the CPUSVN bytes.
fn parse_tcb(content: &[u8]) -> Result<([u8; 16], u16), InvalidValue> {
    let mut comps = [None::<u8>; 16];
    let (mut pce_svn, mut cpu_svn) = (None, None);
    for (oid, tag, value) in pairs(content)? {
        if oid == PCESVN.as_bytes() {
            pce_svn = Some(small_uint(tag, value, "PCESVN")?);
        } else if oid == CPUSVN.as_bytes() {
            cpu_svn = Some(octets::<16>(tag, value, "CPUSVN")?);
        } else if let Some(i) = component_index(oid) {
            let svn = small_uint(tag, value, "a TCB component")?;
            comps[i] =
                Some(u8::try_from(svn).map_err(|_| bad(format!("TCB component {} is {svn}, above 255", i + 1)))?);
        }
    }
    let cpu_svn = cpu_svn.ok_or_else(|| bad("the TCB entry has no CPUSVN"))?;
    for (i, c) in comps.iter().enumerate() {
        match c {
            Some(v) if *v == cpu_svn[i] => {}
            Some(v) => {
                return Err(bad(format!("TCB component {} is {v} but CPUSVN byte {i} is {}", i + 1, cpu_svn[i])))
            }
            None => return Err(bad(format!("the TCB entry has no component {}", i + 1))),
        }
    }
    Ok((cpu_svn, pce_svn.ok_or_else(|| bad("the TCB entry has no PCESVN"))?))
}

/// `1.2.840.113741.1.13.1.2.N` for N in 1..=16 → N - 1.
fn component_index(oid: &[u8]) -> Option<usize> {
    let prefix = TCB.as_bytes();
    match oid.strip_prefix(prefix)? {
        [n @ 1..=16] => Some(usize::from(*n) - 1),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_integers_decode_and_negative_ones_do_not() {
        assert_eq!(small_uint(TAG_INTEGER, &[0x0B], "x"), Ok(11));
        assert_eq!(small_uint(TAG_INTEGER, &[0x00, 0x80], "x"), Ok(128));
        assert!(small_uint(TAG_INTEGER, &[0x80], "x").is_err());
        assert!(small_uint(TAG_INTEGER, &[1, 2, 3], "x").is_err());
        assert!(small_uint(TAG_OCTETS, &[1], "x").is_err());
        assert_eq!(component_index(&[TCB.as_bytes(), &[16]].concat()), Some(15));
        assert_eq!(component_index(&[TCB.as_bytes(), &[17]].concat()), None);
    }
}
