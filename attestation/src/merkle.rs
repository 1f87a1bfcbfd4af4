//! The Merkle tree shape Veil uses wherever one commitment covers many
//! items (a batch of nonces, a model's tensors): RFC 6962 / RFC 9162 —
//! SHA-256, inner nodes prefixed 0x01, split at the largest power of two
//! below the size. Leaf hashing (prefix 0x00 and a domain) is the caller's.
//!
//! Pure: no clock, no I/O.

use sha2::{Digest, Sha256};

/// A node or leaf hash.
pub type Hash = [u8; 32];

/// An inner node over two subtrees.
pub fn node(left: &Hash, right: &Hash) -> Hash {
    Sha256::new().chain_update([1u8]).chain_update(left).chain_update(right).finalize().into()
}

/// The largest power of two strictly below `n` (n ≥ 2).
pub fn split(n: usize) -> usize {
    let mut k = 1;
    while k * 2 < n {
        k *= 2;
    }
    k
}

/// The tree head over `leaves` (all zeros for none).
pub fn root(leaves: &[Hash]) -> Hash {
    match leaves.len() {
        0 => [0; 32],
        1 => leaves[0],
        n => {
            let k = split(n);
            node(&root(&leaves[..k]), &root(&leaves[k..]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shape_is_rfc_6962s() {
        let l: Vec<Hash> = (0..5u8).map(|i| [i; 32]).collect();
        // MTH(d0..d5) = node(node(node(0,1), node(2,3)), 4)
        let want = node(&node(&node(&l[0], &l[1]), &node(&l[2], &l[3])), &l[4]);
        assert_eq!(root(&l), want);
        assert_eq!(root(&l[..1]), l[0]);
        assert_eq!(root(&[]), [0; 32]);
        assert_eq!(split(2), 1);
        assert_eq!(split(5), 4);
        assert_eq!(split(8), 4);
    }
}
