//! The certificate table a host attaches to an extended SEV-SNP report
//! (`SNP_GET_EXT_REPORT`, or configfs-tsm's `auxblob`): 24-byte entries
//! (GUID, offset, length, little-endian) ending with an all-zero entry, the
//! certificates after them, offsets from the start of the table.
//!
//! Every byte is the host's. This parser checks every bound and refuses
//! what is ambiguous (SECURITY-CASES A9): an entry outside the blob or inside
//! the entry array, overlapping entries, a missing terminator, a duplicated
//! kind ("first one wins" would let the host choose silently), and a table
//! with both a VCEK and a VLEK. Unknown GUIDs are kept, bound-checked, and
//! never used.

/// Bytes per table entry.
pub const ENTRY_LEN: usize = 24;
/// Largest table accepted (the kernel's limit is a few pages).
pub const MAX_TABLE_BYTES: usize = 1 << 20;
/// Most entries accepted before the terminator.
pub const MAX_ENTRIES: usize = 64;

/// What an entry holds, by its GUID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CertKind {
    /// The chip's Versioned Chip Endorsement Key certificate.
    Vcek,
    /// A cloud provider's Versioned Loaded Endorsement Key certificate.
    Vlek,
    /// AMD SEV Signing Key.
    Ask,
    /// AMD Root Key.
    Ark,
    /// Certificate revocation list.
    Crl,
    /// A GUID this parser does not know (never used).
    Other([u8; 16]),
}

impl CertKind {
    /// The GUID bytes (RFC 4122 order, as the host writes them).
    pub fn guid(self) -> [u8; 16] {
        match self {
            Self::Vcek => guid("63da758d-e664-4564-adc5-f4b93be8accd"),
            Self::Vlek => guid("a8074bc2-a25a-483e-aae6-39c045a0b8a1"),
            Self::Ask => guid("4ab7b379-bbac-4fe4-a02f-05aef327c782"),
            Self::Ark => guid("c0b406a4-a803-4952-9743-3fb6014cd0ae"),
            Self::Crl => guid("92f81bc3-5811-4d3d-97ff-d19f88dc67ea"),
            Self::Other(g) => g,
        }
    }

    fn from_guid(g: [u8; 16]) -> Self {
        [Self::Vcek, Self::Vlek, Self::Ask, Self::Ark, Self::Crl]
            .into_iter()
            .find(|k| k.guid() == g)
            .unwrap_or(Self::Other(g))
    }
}

fn guid(text: &str) -> [u8; 16] {
    let hex: String = text.chars().filter(|c| *c != '-').collect();
    let mut out = [0u8; 16];
    // Invariant: the literals above are 32 hex digits.
    hex::decode_to_slice(hex, &mut out).unwrap_or_default();
    out
}

/// Why a certificate table was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CertTableError {
    /// Larger than [`MAX_TABLE_BYTES`].
    #[error("certificate table of {0} bytes exceeds {MAX_TABLE_BYTES}")]
    TooLarge(usize),
    /// No all-zero terminator entry within the blob (or within [`MAX_ENTRIES`]).
    #[error("certificate table has no terminating all-zero entry")]
    NoTerminator,
    /// An entry's data lies outside the blob.
    #[error("certificate table entry {index}: offset {offset} + length {length} is outside the {blob} bytes")]
    OutOfBounds {
        /// Entry index.
        index: usize,
        /// Its offset.
        offset: u32,
        /// Its length.
        length: u32,
        /// The blob's length.
        blob: usize,
    },
    /// An entry's data overlaps the entry array itself.
    #[error("certificate table entry {0}: data overlaps the entry array")]
    InsideTable(usize),
    /// An entry has no data.
    #[error("certificate table entry {0} is empty")]
    Empty(usize),
    /// Two entries' data overlap.
    #[error("certificate table entries {0} and {1} overlap")]
    Overlap(usize, usize),
    /// A kind appears twice.
    #[error("certificate table has two {0:?} entries")]
    Duplicate(CertKind),
    /// Both a VCEK and a VLEK: which key signed the report is ambiguous.
    #[error("certificate table has both a VCEK and a VLEK")]
    Ambiguous,
}

/// A parsed, unambiguous certificate table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CertTable {
    entries: Vec<(CertKind, Vec<u8>)>,
}

impl CertTable {
    /// The entry of `kind`, when present.
    pub fn get(&self, kind: CertKind) -> Option<&[u8]> {
        self.entries.iter().find(|(k, _)| *k == kind).map(|(_, d)| d.as_slice())
    }

    /// Every entry, in table order.
    pub fn entries(&self) -> &[(CertKind, Vec<u8>)] {
        &self.entries
    }

    /// Builds a table blob (for tests and for hosts): entries, terminator, data.
    pub fn encode(entries: &[(CertKind, &[u8])]) -> Vec<u8> {
        let mut offset = (entries.len() + 1) * ENTRY_LEN;
        let mut table = Vec::new();
        let mut data = Vec::new();
        for (kind, bytes) in entries {
            table.extend_from_slice(&kind.guid());
            table.extend_from_slice(&u32::try_from(offset).unwrap_or(u32::MAX).to_le_bytes());
            table.extend_from_slice(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_le_bytes());
            data.extend_from_slice(bytes);
            offset += bytes.len();
        }
        table.extend_from_slice(&[0; ENTRY_LEN]);
        table.extend_from_slice(&data);
        table
    }
}

/// Parses a certificate table, checking every bound.
pub fn parse(blob: &[u8]) -> Result<CertTable, CertTableError> {
    if blob.len() > MAX_TABLE_BYTES {
        return Err(CertTableError::TooLarge(blob.len()));
    }
    let mut raw: Vec<(CertKind, usize, usize)> = Vec::new();
    let mut at = 0usize;
    loop {
        let entry = blob.get(at..at + ENTRY_LEN).ok_or(CertTableError::NoTerminator)?;
        if entry.iter().all(|b| *b == 0) {
            break;
        }
        if raw.len() == MAX_ENTRIES {
            return Err(CertTableError::NoTerminator);
        }
        let mut g = [0u8; 16];
        g.copy_from_slice(&entry[..16]);
        let offset = u32::from_le_bytes([entry[16], entry[17], entry[18], entry[19]]);
        let length = u32::from_le_bytes([entry[20], entry[21], entry[22], entry[23]]);
        let index = raw.len();
        let start = offset as usize;
        let end = start
            .checked_add(length as usize)
            .filter(|e| *e <= blob.len())
            .ok_or(CertTableError::OutOfBounds { index, offset, length, blob: blob.len() })?;
        if length == 0 {
            return Err(CertTableError::Empty(index));
        }
        raw.push((CertKind::from_guid(g), start, end));
        at += ENTRY_LEN;
    }
    let table_end = at + ENTRY_LEN;
    for (i, (kind, start, end)) in raw.iter().enumerate() {
        if *start < table_end {
            return Err(CertTableError::InsideTable(i));
        }
        for (j, (other, s2, e2)) in raw.iter().enumerate().skip(i + 1) {
            if start < e2 && s2 < end {
                return Err(CertTableError::Overlap(i, j));
            }
            if kind == other {
                return Err(CertTableError::Duplicate(*kind));
            }
        }
    }
    let has = |k: CertKind| raw.iter().any(|(kind, _, _)| *kind == k);
    if has(CertKind::Vcek) && has(CertKind::Vlek) {
        return Err(CertTableError::Ambiguous);
    }
    Ok(CertTable { entries: raw.into_iter().map(|(k, s, e)| (k, blob[s..e].to_vec())).collect() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> Vec<u8> {
        CertTable::encode(&[(CertKind::Vcek, b"vcek der"), (CertKind::Ask, b"ask der"), (CertKind::Ark, b"ark der")])
    }

    fn put(blob: &mut [u8], entry: usize, field: usize, v: u32) {
        let at = entry * ENTRY_LEN + 16 + field * 4;
        blob[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    #[test]
    fn a_well_formed_table_parses() {
        let t = parse(&good()).unwrap();
        assert_eq!(t.get(CertKind::Vcek), Some(&b"vcek der"[..]));
        assert_eq!(t.get(CertKind::Ark), Some(&b"ark der"[..]));
        assert_eq!(t.get(CertKind::Vlek), None);
        // The GUID of the VCEK as the sev crate and the GHCB spec write it.
        assert_eq!(hex::encode(CertKind::Vcek.guid()), "63da758de6644564adc5f4b93be8accd");
        // Unknown GUIDs are kept, bound-checked, never mistaken for a known kind.
        let odd = CertTable::encode(&[(CertKind::Other([7; 16]), b"x"), (CertKind::Vcek, b"v")]);
        assert_eq!(parse(&odd).unwrap().get(CertKind::Vcek), Some(&b"v"[..]));
        assert!(parse(&CertTable::encode(&[])).unwrap().entries().is_empty());
    }

    #[test]
    fn every_defect_has_its_error() {
        let mut b = good();
        put(&mut b, 1, 0, u32::MAX); // offset far outside
        assert!(matches!(parse(&b), Err(CertTableError::OutOfBounds { index: 1, .. })));
        let mut b = good();
        put(&mut b, 2, 1, u32::MAX); // length overflows past the end
        assert!(matches!(parse(&b), Err(CertTableError::OutOfBounds { index: 2, .. })));
        let mut b = good();
        let len = b.len();
        put(&mut b, 0, 0, u32::try_from(len).unwrap()); // starts at the end, length > 0
        assert!(matches!(parse(&b), Err(CertTableError::OutOfBounds { index: 0, .. })));
        let mut b = good();
        put(&mut b, 0, 0, 0); // data inside the entry array
        assert_eq!(parse(&b), Err(CertTableError::InsideTable(0)));
        let mut b = good();
        put(&mut b, 1, 1, 0);
        assert_eq!(parse(&b), Err(CertTableError::Empty(1)));
        let mut b = good();
        let vcek_offset = u32::from_le_bytes(b[16..20].try_into().unwrap());
        put(&mut b, 1, 0, vcek_offset + 2); // ASK overlaps the VCEK
        assert_eq!(parse(&b), Err(CertTableError::Overlap(0, 1)));
        let dup = CertTable::encode(&[(CertKind::Vcek, b"one"), (CertKind::Vcek, b"two")]);
        assert_eq!(parse(&dup), Err(CertTableError::Duplicate(CertKind::Vcek)));
        let both = CertTable::encode(&[(CertKind::Vcek, b"one"), (CertKind::Vlek, b"two")]);
        assert_eq!(parse(&both), Err(CertTableError::Ambiguous));
        // No terminator: the entry array runs off the blob.
        let mut lone = [0u8; ENTRY_LEN];
        lone[..16].copy_from_slice(&CertKind::Vcek.guid());
        lone[20] = 1; // offset 0, length 1: in bounds, and no entry follows
        assert_eq!(parse(&lone), Err(CertTableError::NoTerminator));
        // Cut inside the entry array: the entries point past the end.
        assert!(matches!(parse(&good()[..3 * ENTRY_LEN + 10]), Err(CertTableError::OutOfBounds { .. })));
        assert_eq!(parse(&[]), Err(CertTableError::NoTerminator));
        assert_eq!(parse(&vec![0u8; MAX_TABLE_BYTES + 1]), Err(CertTableError::TooLarge(MAX_TABLE_BYTES + 1)));
        // Too many entries before a terminator.
        let many: Vec<(CertKind, &[u8])> =
            (0..=MAX_ENTRIES).map(|i| (CertKind::Other([i as u8 + 1; 16]), &b"x"[..])).collect();
        assert_eq!(parse(&CertTable::encode(&many)), Err(CertTableError::NoTerminator));
    }

    proptest::proptest! {
        /// Any bytes: a typed result, never a panic, and every entry returned lies within the blob.
        #[test]
        fn arbitrary_bytes_never_panic(blob in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            if let Ok(t) = parse(&blob) {
                for (_, d) in t.entries() {
                    proptest::prop_assert!(d.len() <= blob.len());
                }
            }
        }
    }
}
