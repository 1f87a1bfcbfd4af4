//! A GGUF file opened for slice loading: metadata accessors, and tensors
//! read once, hashed from the very bytes that become the weights (the file
//! on disk is untrusted and may change between reads).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{ggml_file, GgmlDType, QTensor};
use candle_core::Device;
use sha2::{Digest, Sha256};

use super::error::{ModelError, Result};
use super::manifest::TensorRecord;

mod header;
pub mod write;

pub use header::{Header, HeaderError, TensorInfo, TensorType, DEFAULT_ALIGNMENT};

/// Storage types Veil serves.
pub const SUPPORTED_TYPES: [TensorType; 10] = [
    TensorType::Ggml(GgmlDType::F32),
    TensorType::Ggml(GgmlDType::F16),
    TensorType::Ggml(GgmlDType::BF16),
    TensorType::Ggml(GgmlDType::Q4_0),
    TensorType::Ggml(GgmlDType::Q4_1),
    TensorType::Ggml(GgmlDType::Q8_0),
    TensorType::Ggml(GgmlDType::Q4K),
    TensorType::Ggml(GgmlDType::Q5K),
    TensorType::Ggml(GgmlDType::Q6K),
    TensorType::Mxfp4,
];

/// A tensor's bytes as read (and hashed), before decoding.
#[derive(Clone, Debug)]
pub struct RawTensor {
    /// The bytes.
    pub bytes: Vec<u8>,
    /// Their storage type.
    pub dtype: TensorType,
    /// Dimensions (candle order: outermost first).
    pub dims: Vec<usize>,
    /// The manifest record.
    pub record: TensorRecord,
}

impl RawTensor {
    /// The type as candle knows it, for the uses only candle serves (an
    /// embedding, a norm, a device matmul); MXFP4 is refused there.
    pub fn ggml(&self) -> Result<GgmlDType> {
        match self.dtype {
            TensorType::Ggml(d) => Ok(d),
            other => Err(ModelError::Unsupported(format!(
                "tensor {} of type {} where only matrices of that type are read",
                self.record.name,
                other.name()
            ))),
        }
    }
}

/// Where a GGUF file's bytes come from: a file, or (in tests) a reader
/// that behaves as a hostile host's storage would.
pub trait Source: Read + Seek + Send {}
impl<T: Read + Seek + Send> Source for T {}

/// An open GGUF file. Every byte is read at most once: the header when
/// opened, each tensor when loaded (into private memory, hashed there, built
/// from there); nothing is mapped, so storage that changes later changes
/// nothing loaded (SECURITY-CASES G2).
pub struct GgufFile {
    path: PathBuf,
    file: Box<dyn Source>,
    file_len: u64,
    header: Header,
    metadata_digest: [u8; 32],
}

/// Domain separator of the metadata digest.
pub const METADATA_DOMAIN: &[u8] = b"veil/gguf-metadata/v1\0";

/// `SHA-256("veil/gguf-metadata/v1\0" ‖ u32 count ‖ per key in byte order:
/// u32 len ‖ key ‖ value)`, each value as a type tag (GGUF's value type
/// numbers) and its little-endian bytes; strings and arrays length-prefixed
/// (u64). Every key is covered — vocabulary, merges, token types, special
/// token ids, chat template, architecture and hyper-parameters — so nothing
/// the runtime reads from the header escapes the manifest.
pub fn metadata_digest(metadata: &std::collections::HashMap<String, Value>) -> [u8; 32] {
    fn value(h: &mut Sha256, v: &Value) {
        match v {
            Value::U8(x) => h.update([0, *x]),
            Value::I8(x) => h.update([1, *x as u8]),
            Value::U16(x) => {
                h.update([2]);
                h.update(x.to_le_bytes())
            }
            Value::I16(x) => {
                h.update([3]);
                h.update(x.to_le_bytes())
            }
            Value::U32(x) => {
                h.update([4]);
                h.update(x.to_le_bytes())
            }
            Value::I32(x) => {
                h.update([5]);
                h.update(x.to_le_bytes())
            }
            Value::F32(x) => {
                h.update([6]);
                h.update(x.to_bits().to_le_bytes())
            }
            Value::Bool(x) => h.update([7, u8::from(*x)]),
            Value::String(x) => {
                h.update([8]);
                h.update((x.len() as u64).to_le_bytes());
                h.update(x.as_bytes())
            }
            Value::Array(items) => {
                h.update([9]);
                h.update((items.len() as u64).to_le_bytes());
                for i in items {
                    value(h, i);
                }
            }
            Value::U64(x) => {
                h.update([10]);
                h.update(x.to_le_bytes())
            }
            Value::I64(x) => {
                h.update([11]);
                h.update(x.to_le_bytes())
            }
            Value::F64(x) => {
                h.update([12]);
                h.update(x.to_bits().to_le_bytes())
            }
        }
    }
    let mut keys: Vec<&String> = metadata.keys().collect();
    keys.sort();
    let mut h = Sha256::new();
    h.update(METADATA_DOMAIN);
    h.update((keys.len() as u32).to_be_bytes());
    for k in keys {
        h.update((k.len() as u32).to_be_bytes());
        h.update(k.as_bytes());
        value(&mut h, &metadata[k]);
    }
    h.finalize().into()
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile").field("path", &self.path).field("file_len", &self.file_len).finish_non_exhaustive()
    }
}

impl GgufFile {
    /// Opens and parses the header; refuses files that are not GGUF.
    pub fn open(path: &Path) -> Result<Self> {
        // The path in the error: "No such file or directory" alone names nothing.
        let named =
            |e: std::io::Error| ModelError::Io(std::io::Error::new(e.kind(), format!("{}: {e}", path.display())));
        let file = File::open(path).map_err(named)?;
        let file_len = file.metadata().map_err(named)?.len();
        Self::from_source(path, Box::new(file), file_len)
    }

    /// Parses the header of `len` bytes read from `source` (`label` names it
    /// in errors); refuses what is not GGUF.
    pub fn from_source(label: &Path, mut source: Box<dyn Source>, len: u64) -> Result<Self> {
        // The header is read once, from the start: the magic is judged from
        // the parser's error rather than by reading those bytes twice.
        let header = Header::read(&mut source, len).map_err(|e| match e {
            HeaderError::Io(e) => ModelError::Io(e),
            HeaderError::Magic(_) => {
                ModelError::Malformed(format!("{} is not a GGUF file (bad magic): {e}", label.display()))
            }
            HeaderError::Truncated(_) if len < 8 => {
                ModelError::Malformed(format!("{} is not a GGUF file (bad magic): {e}", label.display()))
            }
            e => ModelError::Malformed(format!("{}: {e}", label.display())),
        })?;
        let metadata_digest = metadata_digest(&header.metadata);
        Ok(Self { path: label.to_owned(), file: source, file_len: len, header, metadata_digest })
    }

    /// Digest of every metadata key and value as parsed (see [`metadata_digest`]):
    /// the tokenizer, template and configuration read from this file are these.
    pub fn metadata_digest(&self) -> [u8; 32] {
        self.metadata_digest
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every metadata key, in no particular order.
    pub fn metadata_keys(&self) -> Vec<String> {
        self.header.metadata.keys().cloned().collect()
    }

    /// Metadata value.
    pub fn meta(&self, key: &str) -> Option<&Value> {
        self.header.metadata.get(key)
    }

    /// Required string metadata.
    pub fn meta_str(&self, key: &str) -> Result<&str> {
        match self.meta(key) {
            Some(Value::String(s)) => Ok(s),
            Some(_) => Err(ModelError::Malformed(format!("metadata {key} is not a string"))),
            None => Err(ModelError::Malformed(format!("metadata {key} is missing"))),
        }
    }

    /// Required unsigned metadata (any integer width).
    pub fn meta_u64(&self, key: &str) -> Result<u64> {
        let v = self.meta(key).ok_or_else(|| ModelError::Malformed(format!("metadata {key} is missing")))?;
        v.to_u64()
            .or_else(|_| v.to_u32().map(u64::from))
            .or_else(|_| v.to_i32().map(|x| x.max(0) as u64))
            .map_err(|_| ModelError::Malformed(format!("metadata {key} is not an integer")))
    }

    /// Optional float metadata.
    pub fn meta_f32(&self, key: &str) -> Result<Option<f32>> {
        match self.meta(key) {
            None => Ok(None),
            Some(v) => v
                .to_f32()
                .or_else(|_| v.to_f64().map(|x| x as f32))
                .map(Some)
                .map_err(|_| ModelError::Malformed(format!("metadata {key} is not a float"))),
        }
    }

    /// Optional bool metadata.
    pub fn meta_bool(&self, key: &str) -> Option<bool> {
        self.meta(key).and_then(|v| v.to_bool().ok())
    }

    /// String array metadata.
    pub fn meta_strings(&self, key: &str) -> Result<Vec<String>> {
        match self.meta(key) {
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.to_string().cloned().map_err(|_| ModelError::Malformed(format!("{key} holds a non-string"))))
                .collect(),
            _ => Err(ModelError::Malformed(format!("metadata {key} is missing or not an array"))),
        }
    }

    /// Float array metadata.
    pub fn meta_f32s(&self, key: &str) -> Result<Vec<f32>> {
        match self.meta(key) {
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.to_f32()
                        .or_else(|_| v.to_f64().map(|x| x as f32))
                        .map_err(|_| ModelError::Malformed(format!("{key} holds a non-float")))
                })
                .collect(),
            _ => Err(ModelError::Malformed(format!("metadata {key} is missing or not an array"))),
        }
    }

    /// Integer array metadata.
    pub fn meta_ints(&self, key: &str) -> Result<Vec<i64>> {
        match self.meta(key) {
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.to_i32()
                        .map(i64::from)
                        .or_else(|_| v.to_u32().map(i64::from))
                        .or_else(|_| v.to_i64())
                        .map_err(|_| ModelError::Malformed(format!("{key} holds a non-integer")))
                })
                .collect(),
            _ => Err(ModelError::Malformed(format!("metadata {key} is missing or not an array"))),
        }
    }

    /// Names of all tensors, in file (offset) order.
    pub fn tensor_names(&self) -> Vec<String> {
        let mut names: Vec<(&String, u64)> = self.header.tensors.iter().map(|(n, i)| (n, i.offset)).collect();
        names.sort_by_key(|(_, off)| *off);
        names.into_iter().map(|(n, _)| n.clone()).collect()
    }

    /// Bytes tensor `name` occupies in the file (what a forward reads of it).
    pub fn tensor_bytes(&self, name: &str) -> Option<u64> {
        let info = self.header.tensors.get(name)?;
        info.dtype.bytes_for(info.elems()).map(|b| b as u64)
    }

    /// Whether a tensor exists.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.header.tensors.contains_key(name)
    }

    /// Reads `name` once, hashes its bytes, and builds the tensor from them.
    pub fn load(&mut self, name: &str, device: &Device) -> Result<(QTensor, TensorRecord)> {
        let raw = self.load_raw(name)?;
        let tensor = ggml_file::qtensor_from_ggml(raw.ggml()?, &raw.bytes, raw.dims.clone(), device)?;
        Ok((tensor, raw.record))
    }

    /// Reads `name` once and hashes its bytes, returning them undecoded.
    pub fn load_raw(&mut self, name: &str) -> Result<RawTensor> {
        let info =
            self.header.tensors.get(name).ok_or_else(|| ModelError::Malformed(format!("tensor {name} is missing")))?;
        let dtype = info.dtype;
        if !SUPPORTED_TYPES.contains(&dtype) {
            return Err(ModelError::Unsupported(format!("tensor {name} has quant type {}", dtype.name())));
        }
        let dims = info.dims.clone();
        let elems = info.elems();
        let Some(size) = dtype.bytes_for(elems) else {
            return Err(ModelError::Malformed(format!(
                "tensor {name}: {elems} elements not a multiple of the block size"
            )));
        };
        let start = self
            .header
            .data_offset
            .checked_add(info.offset)
            .ok_or_else(|| ModelError::Malformed(format!("tensor {name}: offset overflows")))?;
        if start.saturating_add(size as u64) > self.file_len {
            return Err(ModelError::Malformed(format!(
                "tensor {name} needs {size} bytes at offset {start}; the file has {} (truncated?)",
                self.file_len
            )));
        }
        let mut raw = vec![0u8; size];
        self.file.seek(SeekFrom::Start(start))?;
        self.file.read_exact(&mut raw)?;
        let digest: [u8; 32] = Sha256::digest(&raw).into();
        let record = TensorRecord { name: name.to_owned(), dtype: dtype.name(), shape: dims.clone(), sha256: digest };
        Ok(RawTensor { bytes: raw, dtype, dims, record })
    }
}
