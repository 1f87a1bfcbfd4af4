//! The model manifest: one root per model, whatever the split, and the proof
//! that a slice is part of it.
//!
//! ```text
//! leaf(t) = SHA-256(0x00 ‖ "veil/manifest-leaf/v3\0" ‖ len(name) ‖ name ‖ len(type) ‖ type
//!                   ‖ rank ‖ dims (u64 BE) ‖ SHA-256(bytes))          lengths u32 BE
//! root    = SHA-256("veil/manifest/v3\0" ‖ metadata digest ‖ u32 count ‖ MTH(leaf(t) for t in model order))
//! ```
//!
//! MTH is the RFC 6962 tree ([`veil_attestation::merkle`]); model order is
//! the files' order (split 1, 2, …), then tensor offset within a file. The
//! metadata digest covers every GGUF metadata key and value of the model
//! (vocabulary, merges, special tokens, chat template, architecture,
//! hyper-parameters; see `gguf::metadata_digest`) except the `split.*`
//! bookkeeping, so a model has one root however it is split into files.
//!
//! A shard hashes only its own tensors. The other leaves come from a
//! [`ModelManifest`] file that anyone can compute from the weights
//! (`veil-shard manifest`) and the host hands over: the host may lie in it,
//! but then the root the shard computes — and attests — is not the root the
//! client pinned, and the route is refused. Without such a file the shard
//! hashes the other tensors itself (reading them, keeping none).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use veil_attestation::merkle;

use super::error::{ModelError, Result};

/// Domain of a tensor's leaf (after the RFC 6962 leaf prefix 0x00).
pub const LEAF_DOMAIN: &[u8] = b"veil/manifest-leaf/v3\0";
/// Domain of the root.
pub const ROOT_DOMAIN: &[u8] = b"veil/manifest/v3\0";
/// Version of the manifest file format.
pub const FILE_VERSION: u32 = 3;

/// One tensor of a model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorRecord {
    /// GGUF tensor name.
    pub name: String,
    /// Storage type, e.g. `Q4_1`.
    pub dtype: String,
    /// Dimensions as stored in the GGUF.
    pub shape: Vec<usize>,
    /// SHA-256 of the tensor's bytes.
    #[serde(with = "hex32")]
    pub sha256: [u8; 32],
}

impl TensorRecord {
    /// Its leaf in the model's tree.
    pub fn leaf(&self) -> merkle::Hash {
        let mut h = Sha256::new();
        h.update([0u8]);
        h.update(LEAF_DOMAIN);
        for field in [self.name.as_bytes(), self.dtype.as_bytes()] {
            h.update((field.len() as u32).to_be_bytes());
            h.update(field);
        }
        h.update((self.shape.len() as u32).to_be_bytes());
        for d in &self.shape {
            h.update((*d as u64).to_be_bytes());
        }
        h.update(self.sha256);
        h.finalize().into()
    }

    /// Whether `other` names the same tensor (name, type, shape), whatever its bytes.
    pub fn same_tensor(&self, other: &TensorRecord) -> bool {
        self.name == other.name && self.dtype == other.dtype && self.shape == other.shape
    }
}

mod hex32 {
    pub(super) fn serialize<S: serde::Serializer>(v: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(v))
    }

    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
        let s = <String as serde::Deserialize>::deserialize(d)?;
        let v = hex::decode(&s).map_err(serde::de::Error::custom)?;
        v.try_into().map_err(|_| serde::de::Error::custom("a digest is 32 bytes"))
    }
}

/// Every tensor of a model, in model order, and its metadata digest: what
/// the root commits to. Its file is what `veil-shard manifest` writes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelManifest {
    /// [`FILE_VERSION`].
    pub version: u32,
    /// Digest of the model's metadata.
    #[serde(with = "hex32")]
    pub metadata: [u8; 32],
    /// The tensors.
    pub tensors: Vec<TensorRecord>,
}

/// Largest manifest file read (a model of ~60 000 tensors).
pub const MAX_FILE_BYTES: u64 = 16 << 20;

impl ModelManifest {
    /// The model's root.
    pub fn root(&self) -> [u8; 32] {
        let leaves: Vec<merkle::Hash> = self.tensors.iter().map(TensorRecord::leaf).collect();
        let mut h = Sha256::new();
        h.update(ROOT_DOMAIN);
        h.update(self.metadata);
        h.update((self.tensors.len() as u32).to_be_bytes());
        h.update(merkle::root(&leaves));
        h.finalize().into()
    }

    /// Parses a manifest file (JSON), refusing other versions.
    pub fn from_json(bytes: &[u8]) -> Result<Self> {
        let m: Self = serde_json::from_slice(bytes)
            .map_err(|e| ModelError::Manifest(format!("the manifest file does not parse: {e}")))?;
        if m.version != FILE_VERSION {
            return Err(ModelError::Manifest(format!(
                "manifest file version {} (this build reads {FILE_VERSION}; run `veil-shard manifest` again)",
                m.version
            )));
        }
        Ok(m)
    }

    /// Reads a manifest file.
    pub fn read(path: &std::path::Path) -> Result<Self> {
        use std::io::Read;
        let f = std::fs::File::open(path)
            .map_err(|e| ModelError::Manifest(format!("cannot open manifest {}: {e}", path.display())))?;
        let mut bytes = Vec::new();
        f.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return Err(ModelError::Manifest(format!(
                "manifest {} is larger than {MAX_FILE_BYTES} bytes",
                path.display()
            )));
        }
        Self::from_json(&bytes)
    }

    /// The file's text.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a manifest serialises")
    }
}

/// Where the leaves of the tensors a slice did not load came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proof {
    /// The slice is the whole model: it hashed everything itself.
    Whole,
    /// A manifest file handed over by the host, checked against the
    /// slice's own tensors.
    File,
    /// No manifest file: the slice read and hashed the other tensors,
    /// keeping none of them.
    Rehashed,
}

/// What a slice loaded, and the model root it proved them part of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// Digest of the GGUF metadata the slice was configured from.
    pub metadata: [u8; 32],
    /// The tensors the slice loaded, in load order.
    pub tensors: Vec<TensorRecord>,
    /// Tensors in the whole model.
    pub model_tensors: usize,
    /// How the other leaves were obtained.
    pub proof: Proof,
    root: [u8; 32],
}

impl Manifest {
    /// Proves `loaded` (the slice's records, hashed from the bytes it keeps)
    /// part of the model whose tensors, in model order, are `model`
    /// (names, types and shapes from the file headers). `leaves` gives the
    /// other tensors' digests: a manifest file, or `None` for "the
    /// caller hashed them all" (then `model` carries real digests).
    pub fn prove(
        metadata: [u8; 32],
        loaded: Vec<TensorRecord>,
        model: &[TensorRecord],
        file: Option<&ModelManifest>,
        proof: Proof,
    ) -> Result<Self> {
        let whole = match file {
            None => ModelManifest { version: FILE_VERSION, metadata, tensors: model.to_vec() },
            Some(f) => {
                if f.metadata != metadata {
                    return Err(ModelError::Manifest(format!(
                        "the manifest file is of other metadata ({}, the file's is {})",
                        hex::encode(f.metadata),
                        hex::encode(metadata)
                    )));
                }
                if f.tensors.len() != model.len() {
                    return Err(ModelError::Manifest(format!(
                        "the manifest file lists {} tensors; the model has {}",
                        f.tensors.len(),
                        model.len()
                    )));
                }
                if let Some((want, got)) = model.iter().zip(&f.tensors).find(|(a, b)| !a.same_tensor(b)) {
                    return Err(ModelError::Manifest(format!(
                        "the manifest file lists {} {} {:?} where the model has {} {} {:?}",
                        got.name, got.dtype, got.shape, want.name, want.dtype, want.shape
                    )));
                }
                f.clone()
            }
        };
        for t in &loaded {
            match whole.tensors.iter().find(|w| w.name == t.name) {
                Some(w) if w == t => {}
                Some(w) => {
                    return Err(ModelError::Manifest(format!(
                        "tensor {}: the bytes read hash to {}, the manifest says {}",
                        t.name,
                        hex::encode(t.sha256),
                        hex::encode(w.sha256)
                    )))
                }
                None => return Err(ModelError::Manifest(format!("tensor {} is not in the model", t.name))),
            }
        }
        Ok(Self { metadata, tensors: loaded, model_tensors: whole.tensors.len(), proof, root: whole.root() })
    }

    /// The model's root: what the shard attests and clients pin.
    pub fn root(&self) -> [u8; 32] {
        self.root
    }

    /// Number of tensors the slice loaded.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether the slice loaded no tensor.
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

    fn model(tensors: Vec<TensorRecord>) -> ModelManifest {
        ModelManifest { version: FILE_VERSION, metadata: [0; 32], tensors }
    }

    #[test]
    fn root_depends_on_every_field_and_order() {
        let a = model(vec![rec("a", 1), rec("b", 2)]);
        let mut variants = vec![
            model(vec![rec("b", 2), rec("a", 1)]),
            model(vec![rec("a", 1), rec("b", 3)]),
            model(vec![rec("a", 1)]),
            model(vec![rec("a", 1), rec("b", 2), rec("c", 2)]),
            ModelManifest { metadata: [1; 32], ..a.clone() },
        ];
        let mut shape = a.clone();
        shape.tensors[0].shape = vec![3, 2];
        variants.push(shape);
        let mut dtype = a.clone();
        dtype.tensors[0].dtype = "F16".into();
        variants.push(dtype);
        let mut name = a.clone();
        name.tensors[0].name = "A".into();
        variants.push(name);
        for v in variants {
            assert_ne!(v.root(), a.root(), "{v:?}");
        }
    }

    #[test]
    fn a_slice_proves_the_model_root_from_a_file_and_refuses_one_that_disagrees() {
        let whole = model((0..7).map(|i| rec(&format!("t{i}"), i)).collect());
        let headers: Vec<TensorRecord> =
            whole.tensors.iter().map(|t| TensorRecord { sha256: [0xee; 32], ..t.clone() }).collect();
        let mine = whole.tensors[2..4].to_vec();
        let m = Manifest::prove([0; 32], mine.clone(), &headers, Some(&whole), Proof::File).unwrap();
        assert_eq!(m.root(), whole.root());
        assert_eq!((m.len(), m.model_tensors), (2, 7));
        // The same root when the slice hashed everything itself.
        let all = Manifest::prove([0; 32], mine.clone(), &whole.tensors, None, Proof::Rehashed).unwrap();
        assert_eq!(all.root(), whole.root());

        // Bytes that differ from the file: refused, naming the tensor.
        let mut changed = mine.clone();
        changed[1].sha256[31] ^= 1;
        let e = Manifest::prove([0; 32], changed, &headers, Some(&whole), Proof::File).unwrap_err();
        assert!(matches!(&e, ModelError::Manifest(m) if m.contains("t3")), "{e}");
        // A file of another model, another order, other metadata: refused.
        let mut reordered = whole.clone();
        reordered.tensors.swap(5, 6);
        assert!(Manifest::prove([0; 32], mine.clone(), &headers, Some(&reordered), Proof::File).is_err());
        let short = model(whole.tensors[..6].to_vec());
        assert!(Manifest::prove([0; 32], mine.clone(), &headers, Some(&short), Proof::File).is_err());
        assert!(Manifest::prove([1; 32], mine.clone(), &headers, Some(&whole), Proof::File).is_err());
        // A file that lies about another stage's tensor passes the slice,
        // but proves another root: the client's pin catches it.
        let mut lying = whole.clone();
        lying.tensors[6].sha256 = [0x66; 32];
        let m = Manifest::prove([0; 32], mine, &headers, Some(&lying), Proof::File).unwrap();
        assert_ne!(m.root(), whole.root());
    }

    #[test]
    fn manifest_files_round_trip_and_bad_ones_are_refused() {
        let whole = model(vec![rec("a", 1), rec("b", 2)]);
        assert_eq!(ModelManifest::from_json(whole.to_json().as_bytes()).unwrap(), whole);
        let old = whole.to_json().replace("\"version\": 3", "\"version\": 2");
        assert!(matches!(ModelManifest::from_json(old.as_bytes()), Err(ModelError::Manifest(_))));
        assert!(ModelManifest::from_json(b"{").is_err());
        let short = whole.to_json().replace(&hex::encode([1u8; 32]), "0101");
        assert!(ModelManifest::from_json(short.as_bytes()).is_err());
    }
}
