//! A GGUF file opened for slice loading: metadata accessors, and tensors
//! read once, hashed from the very bytes that become the weights (the file
//! on disk is untrusted and may change between reads).

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{ggml_file, GgmlDType, QTensor};
use candle_core::Device;
use sha2::{Digest, Sha256};

use super::error::{ModelError, Result};
use super::manifest::{self, Manifest, ModelManifest, Proof, TensorRecord};

mod header;
pub mod split;
pub mod write;

pub use header::{Header, HeaderError, TensorInfo, TensorType, DEFAULT_ALIGNMENT};

/// Storage types Veil serves.
pub const SUPPORTED_TYPES: [TensorType; 14] = [
    TensorType::Ggml(GgmlDType::F32),
    TensorType::Ggml(GgmlDType::F16),
    TensorType::Ggml(GgmlDType::BF16),
    TensorType::Ggml(GgmlDType::Q4_0),
    TensorType::Ggml(GgmlDType::Q4_1),
    TensorType::Ggml(GgmlDType::Q5_0),
    TensorType::Ggml(GgmlDType::Q5_1),
    TensorType::Ggml(GgmlDType::Q8_0),
    TensorType::Ggml(GgmlDType::Q2K),
    TensorType::Ggml(GgmlDType::Q3K),
    TensorType::Ggml(GgmlDType::Q4K),
    TensorType::Ggml(GgmlDType::Q5K),
    TensorType::Ggml(GgmlDType::Q6K),
    TensorType::Mxfp4,
];

/// Whether tensors of `dtype` load: one of [`SUPPORTED_TYPES`] (Veil's
/// kernels or candle's quantized matmul), or a type outside candle's list
/// that `model::quant::dequant` decodes: on Veil's kernels where it has
/// them (the i-quants, TQ1_0/TQ2_0, NVFP4), otherwise read dequantized to
/// F32 (Q1_0, Q8_K, F64).
pub fn loads(dtype: TensorType) -> bool {
    match dtype {
        TensorType::Other(t) => crate::model::quant::dequant::can_dequantize(t),
        other => SUPPORTED_TYPES.contains(&other),
    }
}

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
                other.ggml_name()
            ))),
        }
    }
}

/// Where a GGUF file's bytes come from: a file, or (in tests) a reader
/// that behaves as a hostile host's storage would.
pub trait Source: Read + Seek + Send {}
impl<T: Read + Seek + Send> Source for T {}

/// An open GGUF model: one file, or the files of a split model
/// (`NAME-00001-of-0000N.gguf` …). Every byte is read at most once: the
/// headers when opened, each tensor when loaded (into private memory,
/// hashed there, built from there) or hashed for the manifest; nothing is
/// mapped, so storage that changes later changes nothing loaded
/// (SECURITY-CASES G2). Reads are positioned: a slice reads its own
/// tensors and never the rest of the file.
pub struct GgufFile {
    path: PathBuf,
    parts: Vec<Part>,
    /// The first file's header: the model's metadata; its tensor table is
    /// moved into `tensors`.
    header: Header,
    /// Every tensor: which part holds it, and its entry there.
    tensors: HashMap<String, (usize, TensorInfo)>,
    metadata_digest: [u8; 32],
    manifest: Option<ModelManifest>,
}

/// One file of a model.
struct Part {
    label: PathBuf,
    file: Box<dyn Source>,
    len: u64,
    data_offset: u64,
}

/// Domain separator of the metadata digest.
pub const METADATA_DOMAIN: &[u8] = b"veil/gguf-metadata/v1\0";

/// `SHA-256("veil/gguf-metadata/v1\0" ‖ u32 count ‖ per key in byte order:
/// u32 len ‖ key ‖ value)`, each value as a type tag (GGUF's value type
/// numbers) and its little-endian bytes; strings and arrays length-prefixed
/// (u64). Every key is covered — vocabulary, merges, token types, special
/// token ids, chat template, architecture and hyper-parameters — so nothing
/// the runtime reads from the header escapes the manifest; only the
/// `split.*` bookkeeping of split files is left out (the runtime reads none
/// of it past opening the files), so a model's root does not depend on how
/// it was split.
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
    let mut keys: Vec<&String> = metadata.keys().filter(|k| !k.starts_with(split::KEY_PREFIX)).collect();
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
        f.debug_struct("GgufFile").field("path", &self.path).field("files", &self.parts.len()).finish_non_exhaustive()
    }
}

impl GgufFile {
    /// Opens and parses the header; refuses files that are not GGUF. A
    /// split model is opened from its first file (`…-00001-of-0000N.gguf`);
    /// the others are found next to it. A manifest file next to the model
    /// ([`manifest_path`]) is read when present.
    pub fn open(path: &Path) -> Result<Self> {
        let (label, file, len) = open_file(path)?;
        let mut parts = vec![Part { label, file, len, data_offset: 0 }];
        let header = read_header(&mut parts[0])?;
        if let Some(count) = split::count(&header.metadata)?.filter(|&n| n > 1) {
            for name in &split::names(path, count)?[1..] {
                let (label, file, len) = open_file(name)?;
                parts.push(Part { label, file, len, data_offset: 0 });
            }
        }
        let mut g = Self::assemble(path.to_owned(), header, parts)?;
        let manifest = manifest_path(path);
        if manifest.is_file() {
            g.manifest = Some(ModelManifest::read(&manifest)?);
        }
        Ok(g)
    }

    /// Parses the header of `len` bytes read from `source` (`label` names it
    /// in errors); refuses what is not GGUF.
    pub fn from_source(label: &Path, source: Box<dyn Source>, len: u64) -> Result<Self> {
        Self::from_sources(vec![(label.to_owned(), source, len)])
    }

    /// The files of one model, first file first (each `(label, source, len)`).
    pub fn from_sources(sources: Vec<(PathBuf, Box<dyn Source>, u64)>) -> Result<Self> {
        let mut sources = sources.into_iter();
        let Some((label, source, len)) = sources.next() else {
            return Err(ModelError::Invalid("a model needs at least one file".into()));
        };
        let mut parts = vec![Part { label: label.clone(), file: source, len, data_offset: 0 }];
        parts.extend(sources.map(|(label, file, len)| Part { label, file, len, data_offset: 0 }));
        let header = read_header(&mut parts[0])?;
        Self::assemble(label, header, parts)
    }

    /// Reads the headers of parts 1.. (part 0's is `header`), checks the
    /// split bookkeeping, and merges the tensor tables.
    fn assemble(path: PathBuf, mut header: Header, mut parts: Vec<Part>) -> Result<Self> {
        let count = split::count(&header.metadata)?.unwrap_or(1);
        if count != parts.len() {
            return Err(ModelError::Malformed(format!(
                "{} says the model is split into {count} files; {} were given",
                path.display(),
                parts.len()
            )));
        }
        parts[0].data_offset = header.data_offset;
        let mut tensors = HashMap::new();
        let mut table = std::mem::take(&mut header.tensors);
        for i in 0..parts.len() {
            if i > 0 {
                let h = read_header(&mut parts[i])?;
                split::check_part(&h.metadata, i, count, &parts[i].label)?;
                parts[i].data_offset = h.data_offset;
                table = h.tensors;
            } else if count > 1 {
                split::check_part(&header.metadata, 0, count, &parts[0].label)?;
            }
            for (name, info) in table.drain() {
                if tensors.insert(name.clone(), (i, info)).is_some() {
                    return Err(ModelError::Malformed(format!(
                        "tensor {name} appears in two files of {}",
                        path.display()
                    )));
                }
            }
        }
        if let Some(total) = split::tensor_count(&header.metadata)? {
            if total != tensors.len() {
                return Err(ModelError::Malformed(format!(
                    "{} says the model has {total} tensors; its files hold {}",
                    path.display(),
                    tensors.len()
                )));
            }
        }
        let metadata_digest = metadata_digest(&header.metadata);
        Ok(Self { path, parts, header, tensors, metadata_digest, manifest: None })
    }

    /// Uses `manifest` for the leaves of tensors a slice does not load
    /// (instead of a manifest file next to the model).
    pub fn set_manifest(&mut self, manifest: ModelManifest) {
        self.manifest = Some(manifest);
    }

    /// Number of files.
    pub fn files(&self) -> usize {
        self.parts.len()
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

    /// Names of all tensors in model order: file by file, by offset within one.
    pub fn tensor_names(&self) -> Vec<String> {
        let mut names: Vec<(&String, (usize, u64))> =
            self.tensors.iter().map(|(n, (part, i))| (n, (*part, i.offset))).collect();
        names.sort_by_key(|(_, at)| *at);
        names.into_iter().map(|(n, _)| n.clone()).collect()
    }

    /// Bytes tensor `name` occupies in the file (what a forward reads of it).
    pub fn tensor_bytes(&self, name: &str) -> Option<u64> {
        let (_, info) = self.tensors.get(name)?;
        info.dtype.bytes_for(info.elems()).map(|b| b as u64)
    }

    /// Whether a tensor exists.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Reads `name` once, hashes its bytes, and builds the tensor from them.
    pub fn load(&mut self, name: &str, device: &Device) -> Result<(QTensor, TensorRecord)> {
        let raw = self.load_raw(name)?;
        let tensor = ggml_file::qtensor_from_ggml(raw.ggml()?, &raw.bytes, raw.dims.clone(), device)?;
        Ok((tensor, raw.record))
    }

    /// Where `name`'s bytes are: its part, start and length, bounds checked.
    fn locate(&self, name: &str) -> Result<(usize, u64, usize)> {
        let (part, info) =
            self.tensors.get(name).ok_or_else(|| ModelError::Malformed(format!("tensor {name} is missing")))?;
        let elems = info.elems();
        if info.dtype.block().is_none() {
            // Its size is unknown too, so it cannot even be hashed.
            return Err(ModelError::Unsupported(format!("tensor {name} has quant type {}", info.dtype.ggml_name())));
        }
        let Some(size) = info.dtype.bytes_for(elems) else {
            return Err(ModelError::Malformed(format!(
                "tensor {name}: {elems} elements not a multiple of the block size"
            )));
        };
        let p = &self.parts[*part];
        let start = p
            .data_offset
            .checked_add(info.offset)
            .ok_or_else(|| ModelError::Malformed(format!("tensor {name}: offset overflows")))?;
        if start.saturating_add(size as u64) > p.len {
            return Err(ModelError::Malformed(format!(
                "tensor {name} needs {size} bytes at offset {start} of {}; the file has {} (truncated?)",
                p.label.display(),
                p.len
            )));
        }
        Ok((*part, start, size))
    }

    /// The record a header gives for `name`, with a zero digest.
    fn header_record(&self, name: &str) -> TensorRecord {
        let (_, info) = &self.tensors[name];
        TensorRecord { name: name.to_owned(), dtype: info.dtype.name(), shape: info.dims.clone(), sha256: [0; 32] }
    }

    /// Reads `name` once and hashes its bytes, returning them undecoded
    /// (a type candle does not decode dequantized to F32, see [`Self::load_raw_keeping`]).
    pub fn load_raw(&mut self, name: &str) -> Result<RawTensor> {
        self.load_raw_keeping(name, &[])
    }

    /// [`Self::load_raw`], but a tensor of a type in `packed` (one that
    /// Veil's kernels run as stored, such as IQ4_XS) comes back as stored.
    pub fn load_raw_keeping(&mut self, name: &str, packed: &[crate::model::quant::GgmlType]) -> Result<RawTensor> {
        let (part, start, size) = self.locate(name)?;
        let dtype = self.tensors[name].1.dtype;
        if !loads(dtype) {
            return Err(ModelError::Unsupported(format!("tensor {name} has quant type {}", dtype.ggml_name())));
        }
        let mut record = self.header_record(name);
        let mut raw = vec![0u8; size];
        let file = &mut self.parts[part].file;
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut raw)?;
        record.sha256 = Sha256::digest(&raw).into();
        match dtype {
            // Hashed as stored; computed with as F32, dequantized as ggml does.
            TensorType::Other(t) if !packed.contains(&t) => {
                let values = crate::model::quant::dequant::dequantize(t, &raw)
                    .map_err(|e| ModelError::Malformed(format!("tensor {name}: {e}")))?;
                let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                let dims = record.shape.clone();
                Ok(RawTensor { bytes, dtype: TensorType::Ggml(GgmlDType::F32), dims, record })
            }
            _ => Ok(RawTensor { bytes: raw, dtype, dims: record.shape.clone(), record }),
        }
    }

    /// Reads `name` in pieces and hashes it, keeping none of its bytes.
    fn hash_tensor(&mut self, name: &str) -> Result<TensorRecord> {
        const CHUNK: usize = 4 << 20;
        let (part, start, size) = self.locate(name)?;
        let mut record = self.header_record(name);
        let file = &mut self.parts[part].file;
        file.seek(SeekFrom::Start(start))?;
        let mut h = Sha256::new();
        let mut buf = vec![0u8; CHUNK.min(size)];
        let mut left = size;
        while left > 0 {
            let n = left.min(CHUNK);
            file.read_exact(&mut buf[..n])?;
            h.update(&buf[..n]);
            left -= n;
        }
        record.sha256 = h.finalize().into();
        Ok(record)
    }

    /// Hashes every tensor (reading each once, keeping none): the model's
    /// manifest, as `veil-shard manifest` writes it.
    pub fn model_manifest(&mut self) -> Result<ModelManifest> {
        let tensors = self.tensor_names().iter().map(|n| self.hash_tensor(n)).collect::<Result<Vec<_>>>()?;
        Ok(ModelManifest { version: manifest::FILE_VERSION, metadata: self.metadata_digest, tensors })
    }

    /// Proves the records a slice `loaded` part of this model: their leaves
    /// with the other tensors' from the manifest file when there is one, or
    /// else from hashing the other tensors here (reading them once, keeping
    /// none). The root is the model's, whichever way.
    pub fn prove(&mut self, loaded: Vec<TensorRecord>) -> Result<Manifest> {
        let names = self.tensor_names();
        let mine: HashMap<&str, &TensorRecord> = loaded.iter().map(|t| (t.name.as_str(), t)).collect();
        let metadata = self.metadata_digest;
        if names.iter().all(|n| mine.contains_key(n.as_str())) {
            let model: Vec<TensorRecord> = names.iter().map(|n| mine[n.as_str()].clone()).collect();
            return Manifest::prove(metadata, loaded, &model, None, Proof::Whole);
        }
        if let Some(file) = &self.manifest {
            let model: Vec<TensorRecord> = names.iter().map(|n| self.header_record(n)).collect();
            return Manifest::prove(metadata, loaded, &model, Some(file), Proof::File);
        }
        let mut model = Vec::with_capacity(names.len());
        let mut hashed = 0u64;
        for n in &names {
            match mine.get(n.as_str()) {
                Some(t) => model.push((*t).clone()),
                None => {
                    model.push(self.hash_tensor(n)?);
                    hashed += self.tensor_bytes(n).unwrap_or(0);
                }
            }
        }
        tracing::warn!(
            hashed_bytes = hashed,
            manifest = %manifest_path(&self.path).display(),
            "no model manifest file: hashed the tensors of the other stages to prove the model root \
             (`veil-shard manifest` writes the file; with it a stage reads only its own tensors)"
        );
        Manifest::prove(metadata, loaded, &model, None, Proof::Rehashed)
    }
}

/// Where the manifest file of the model at `path` is looked for: the model's
/// name without `.gguf` (and without `-00001-of-0000N` for a split model),
/// plus `.veil-manifest.json`.
pub fn manifest_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let stem = name.strip_suffix(".gguf").unwrap_or(&name);
    let stem = split::prefix_of(stem).unwrap_or(stem);
    path.with_file_name(format!("{stem}.veil-manifest.json"))
}

fn open_file(path: &Path) -> Result<(PathBuf, Box<dyn Source>, u64)> {
    // The path in the error: "No such file or directory" alone names nothing.
    let named = |e: std::io::Error| ModelError::Io(std::io::Error::new(e.kind(), format!("{}: {e}", path.display())));
    let file = File::open(path).map_err(named)?;
    let len = file.metadata().map_err(named)?.len();
    Ok((path.to_owned(), Box::new(file), len))
}

/// Parses a part's header, read once from its start; the magic is judged
/// from the parser's error rather than by reading those bytes twice.
fn read_header(part: &mut Part) -> Result<Header> {
    let (label, len) = (&part.label, part.len);
    Header::read(&mut part.file, len).map_err(|e| match e {
        HeaderError::Io(e) => ModelError::Io(e),
        HeaderError::Magic(_) => {
            ModelError::Malformed(format!("{} is not a GGUF file (bad magic): {e}", label.display()))
        }
        HeaderError::Truncated(_) if len < 8 => {
            ModelError::Malformed(format!("{} is not a GGUF file (bad magic): {e}", label.display()))
        }
        e => ModelError::Malformed(format!("{}: {e}", label.display())),
    })
}
