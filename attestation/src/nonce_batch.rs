//! Many verifiers, one evidence: the nonces that reach the entry together
//! are the leaves of a Merkle tree (the RFC 6962 / RFC 9162 shape: SHA-256,
//! leaves and inner nodes domain-separated), the entry signs evidence whose
//! claimed nonce is the tree's root, and each verifier gets the inclusion
//! path of its own nonce. A verifier recomputes the root from its nonce and
//! path and requires that root in the signed claims: its nonce is in the
//! evidence as surely as if it were the claim itself (collision resistance
//! of SHA-256), and nobody else's nonce tells it anything.
//!
//! ```text
//!            root  ← the claims' nonce (32 bytes)
//!           /    \
//!        h01      h2          inclusion path of n1: [h0, h2]
//!       /   \      \
//!     h0     h1     h2 = leaf(n2)
//!   leaf(n0) leaf(n1)
//! ```
//!
//! Pure: no clock, no I/O.

use crate::invalid::{InvalidValue, ValueKind};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::claims::Nonce;

/// Domain separator of a leaf (after the RFC 6962 leaf prefix 0x00).
pub const LEAF_DOMAIN: &[u8] = b"veil/nonce-batch/v1\0";
/// Most nonces one evidence answers.
pub const MAX_BATCH: usize = 1024;
/// Longest inclusion path accepted (a tree of [`MAX_BATCH`] leaves needs 10).
pub const MAX_PATH: usize = 16;

use crate::merkle::Hash;

/// The leaf hash of one verifier's nonce.
pub fn leaf(nonce: &Nonce) -> Hash {
    let bytes = nonce.as_bytes();
    Sha256::new()
        .chain_update([0u8])
        .chain_update(LEAF_DOMAIN)
        .chain_update((bytes.len() as u32).to_be_bytes())
        .chain_update(bytes)
        .finalize()
        .into()
}

pub use crate::merkle::root;
use crate::merkle::{node, split};

/// The inclusion path of leaf `index` (RFC 6962 §2.1.1 `PATH`), leaf side first.
pub fn path(index: usize, leaves: &[Hash]) -> Vec<Hash> {
    let n = leaves.len();
    if n <= 1 || index >= n {
        return Vec::new();
    }
    let k = split(n);
    let (mut p, sibling) = if index < k {
        (path(index, &leaves[..k]), root(&leaves[k..]))
    } else {
        (path(index - k, &leaves[k..]), root(&leaves[..k]))
    };
    p.push(sibling);
    p
}

/// The root over `leaves` and every leaf's inclusion path, in one pass
/// (O(n log n); [`path`] per leaf would be O(n²)).
pub fn batch(leaves: &[Hash]) -> (Hash, Vec<NoncePath>) {
    fn paths(leaves: &[Hash]) -> (Hash, Vec<Vec<Hash>>) {
        if leaves.len() <= 1 {
            return (leaves.first().copied().unwrap_or([0; 32]), vec![Vec::new(); leaves.len()]);
        }
        let k = split(leaves.len());
        let (left, mut lp) = paths(&leaves[..k]);
        let (right, rp) = paths(&leaves[k..]);
        for p in &mut lp {
            p.push(right);
        }
        lp.extend(rp.into_iter().map(|mut p| {
            p.push(left);
            p
        }));
        (node(&left, &right), lp)
    }
    let (root, all) = paths(leaves);
    let size = leaves.len() as u32;
    let out = all
        .into_iter()
        .enumerate()
        .map(|(i, p)| NoncePath { index: i as u32, size, path: p.into_iter().map(PathHash).collect() })
        .collect();
    (root, out)
}

/// One verifier's place in a batch: what the attestation document gives it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoncePath {
    /// Its leaf's index.
    pub index: u32,
    /// How many nonces the evidence answers.
    pub size: u32,
    /// Sibling hashes from its leaf up (hex).
    pub path: Vec<PathHash>,
}

/// A 32-byte hash of an inclusion path, hex in JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathHash(pub Hash);

impl Serialize for PathHash {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(self.0))
    }
}

impl<'de> Deserialize<'de> for PathHash {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let v = hex::decode(&s).map_err(serde::de::Error::custom)?;
        let h: Hash = v.try_into().map_err(|_| serde::de::Error::custom("a path hash is 32 bytes"))?;
        Ok(Self(h))
    }
}

impl NoncePath {
    /// Leaf `index`'s path in a batch of `leaves`.
    pub fn of(index: usize, leaves: &[Hash]) -> Self {
        Self {
            index: index as u32,
            size: leaves.len() as u32,
            path: path(index, leaves).into_iter().map(PathHash).collect(),
        }
    }

    /// The root this path proves for `nonce`, as the nonce the evidence must
    /// claim; `Err` when the path cannot be one of a batch (index outside the
    /// batch, batch too large, path of the wrong length).
    pub fn claimed_nonce(&self, nonce: &Nonce) -> Result<Nonce, InvalidValue> {
        let (index, size) = (self.index as usize, self.size as usize);
        if size == 0 || size > MAX_BATCH || index >= size || self.path.len() > MAX_PATH {
            return Err(InvalidValue::new(
                ValueKind::NonceBatch,
                format!("path {index} of {size} with {} hashes is not one of a batch", self.path.len()),
            ));
        }
        let hashes: Vec<Hash> = self.path.iter().map(|h| h.0).collect();
        let root = root_from_path(leaf(nonce), index, size, &hashes).ok_or_else(|| {
            InvalidValue::new(
                ValueKind::NonceBatch,
                format!("a path of {} hashes does not fit leaf {index} of {size}", hashes.len()),
            )
        })?;
        Nonce::new(root.to_vec())
    }
}

/// RFC 9162 §2.1.3.2, recursively: the root a path proves for `leaf` at
/// `index` of `size`, or `None` when the path has the wrong length.
fn root_from_path(leaf: Hash, index: usize, size: usize, path: &[Hash]) -> Option<Hash> {
    if size == 1 {
        return path.is_empty().then_some(leaf);
    }
    let (sibling, rest) = path.split_last()?;
    let k = split(size);
    if index < k {
        Some(node(&root_from_path(leaf, index, k, rest)?, sibling))
    } else {
        Some(node(sibling, &root_from_path(leaf, index - k, size - k, rest)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nonces(n: usize) -> Vec<Nonce> {
        (0..n).map(|i| Nonce::new(format!("nonce {i}").into_bytes()).unwrap()).collect()
    }

    #[test]
    fn every_nonce_of_every_batch_size_proves_the_root_and_no_other_does() {
        for n in 1..=33 {
            let ns = nonces(n);
            let leaves: Vec<Hash> = ns.iter().map(leaf).collect();
            let want = Nonce::new(root(&leaves).to_vec()).unwrap();
            for (i, nonce) in ns.iter().enumerate() {
                let p = NoncePath::of(i, &leaves);
                assert_eq!(p.claimed_nonce(nonce).unwrap(), want, "leaf {i} of {n}");
                // Another verifier's nonce, or this one at another index, proves another root.
                let stranger = Nonce::new(b"not in the batch".to_vec()).unwrap();
                assert_ne!(p.claimed_nonce(&stranger).ok(), Some(want.clone()));
                if n > 1 {
                    let moved = NoncePath { index: ((i + 1) % n) as u32, ..p.clone() };
                    assert_ne!(moved.claimed_nonce(nonce).ok(), Some(want.clone()), "leaf {i} of {n} moved");
                }
            }
        }
    }

    #[test]
    fn the_one_pass_batch_equals_root_and_path_per_leaf() {
        for n in 1..=40 {
            let leaves: Vec<Hash> = nonces(n).iter().map(leaf).collect();
            let (r, paths) = batch(&leaves);
            assert_eq!(r, root(&leaves));
            for (i, p) in paths.iter().enumerate() {
                assert_eq!(*p, NoncePath::of(i, &leaves), "leaf {i} of {n}");
            }
        }
    }

    #[test]
    fn malformed_paths_are_refused() {
        let ns = nonces(5);
        let leaves: Vec<Hash> = ns.iter().map(leaf).collect();
        let p = NoncePath::of(2, &leaves);
        let short = NoncePath { path: p.path[..p.path.len() - 1].to_vec(), ..p.clone() };
        assert!(short.claimed_nonce(&ns[2]).is_err());
        let long = NoncePath { path: [p.path.clone(), vec![PathHash([0; 32])]].concat(), ..p.clone() };
        assert!(long.claimed_nonce(&ns[2]).is_err());
        assert!(NoncePath { index: 5, ..p.clone() }.claimed_nonce(&ns[2]).is_err());
        assert!(NoncePath { size: 0, ..p.clone() }.claimed_nonce(&ns[2]).is_err());
        assert!(NoncePath { size: MAX_BATCH as u32 + 1, ..p }.claimed_nonce(&ns[2]).is_err());
    }

    #[test]
    fn a_batch_of_one_claims_its_leaf() {
        let n = nonces(1);
        let p = NoncePath::of(0, &[leaf(&n[0])]);
        assert!(p.path.is_empty());
        assert_eq!(p.claimed_nonce(&n[0]).unwrap().as_bytes(), &leaf(&n[0]));
    }
}
