//! The model manifest: what a shard actually loaded, as one root.
//!
//! `root = SHA-256("veil/manifest/v2\0" ‖ metadata digest ‖ for each tensor in
//! file order: len(name) ‖ name ‖ len(type) ‖ type ‖ rank ‖ dims (u64 BE) ‖
//! SHA-256(bytes))`, lengths as u32 big-endian. The metadata digest covers
//! every GGUF metadata key and value the file's header holds (vocabulary,
//! merges, special tokens, chat template, architecture, hyper-parameters,
//! layer count; see `gguf::metadata_digest`), so everything that changes
//! outputs is in the root. A slice's root covers exactly its tensors, so a
//! verifier can allow named manifests per layer range.

use serde::Serialize;
use sha2::{Digest, Sha256};

/// One loaded tensor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TensorRecord {
    /// GGUF tensor name.
    pub name: String,
    /// ggml type, e.g. `Q4_1`.
    pub dtype: String,
    /// Dimensions as stored in the GGUF.
    pub shape: Vec<usize>,
    /// SHA-256 of the tensor's bytes as loaded.
    #[serde(serialize_with = "hex32")]
    pub sha256: [u8; 32],
}

fn hex32<S: serde::Serializer>(v: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&hex::encode(v))
}

/// Records of a slice, in file order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Manifest {
    /// Digest of the GGUF metadata the slice was configured from.
    #[serde(serialize_with = "hex32")]
    pub metadata: [u8; 32],
    /// The tensors.
    pub tensors: Vec<TensorRecord>,
}

impl Manifest {
    /// The root over every record.
    pub fn root(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(b"veil/manifest/v2\0");
        h.update(self.metadata);
        for t in &self.tensors {
            for field in [t.name.as_bytes(), t.dtype.as_bytes()] {
                h.update((field.len() as u32).to_be_bytes());
                h.update(field);
            }
            h.update((t.shape.len() as u32).to_be_bytes());
            for d in &t.shape {
                h.update((*d as u64).to_be_bytes());
            }
            h.update(t.sha256);
        }
        h.finalize().into()
    }

    /// Number of tensors recorded.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether the manifest is empty.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(name: &str, byte: u8) -> TensorRecord {
        TensorRecord { name: name.into(), dtype: "F32".into(), shape: vec![2, 3], sha256: [byte; 32] }
    }

    #[test]
    fn root_depends_on_every_field_and_order() {
        let a = Manifest { metadata: [0; 32], tensors: vec![rec("a", 1), rec("b", 2)] };
        let mut variants = vec![
            Manifest { metadata: [0; 32], tensors: vec![rec("b", 2), rec("a", 1)] },
            Manifest { metadata: [0; 32], tensors: vec![rec("a", 1), rec("b", 3)] },
            Manifest { metadata: [0; 32], tensors: vec![rec("a", 1)] },
            Manifest { metadata: [1; 32], tensors: vec![rec("a", 1), rec("b", 2)] },
        ];
        let mut shape = a.clone();
        shape.tensors[0].shape = vec![3, 2];
        variants.push(shape);
        let mut dtype = a.clone();
        dtype.tensors[0].dtype = "F16".into();
        variants.push(dtype);
        for v in variants {
            assert_ne!(v.root(), a.root());
        }
    }
}
