//! The GGUF header (magic, version, metadata, tensor table), parsed by Veil
//! rather than by candle so that tensor types candle does not know (MXFP4)
//! and files it would accept silently (a tensor or key named twice) are
//! judged here. Every count and length is checked against the bytes left
//! before anything is allocated; limits follow llama.cpp's `gguf.cpp`.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;

/// Longest string (a key, a name, a metadata value) read.
const MAX_STRING: u64 = 1 << 30;
/// Most elements in one metadata array, tensors, or metadata entries.
const MAX_COUNT: u64 = 1 << 30;
/// Most dimensions of a tensor (ggml's `GGML_MAX_DIMS`).
const MAX_DIMS: u32 = 4;
/// Arrays of arrays nest at most this deep.
const MAX_DEPTH: usize = 2;
/// The tensor data's alignment when `general.alignment` does not say.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// How one tensor is stored, by its ggml type number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorType {
    /// A type candle decodes.
    Ggml(GgmlDType),
    /// MXFP4 (ggml type 39; gpt-oss's experts): 32 E2M1 values sharing an
    /// E8M0 scale, 17 bytes a block.
    Mxfp4,
    /// A ggml type candle does not decode (the i-quants, ternary and
    /// NVFP4 types, the integer types): on Veil's kernels where it has
    /// them, else read dequantized where `model::quant::dequant` can,
    /// refused by its ggml name otherwise.
    Other(crate::model::quant::GgmlType),
    /// A type number ggml does not have.
    Unknown(u32),
}

/// ggml's type numbers of the types candle decodes (`ggml.h`).
const GGML_IDS: [(u32, GgmlDType); 15] = [
    (0, GgmlDType::F32),
    (1, GgmlDType::F16),
    (2, GgmlDType::Q4_0),
    (3, GgmlDType::Q4_1),
    (6, GgmlDType::Q5_0),
    (7, GgmlDType::Q5_1),
    (8, GgmlDType::Q8_0),
    (9, GgmlDType::Q8_1),
    (10, GgmlDType::Q2K),
    (11, GgmlDType::Q3K),
    (12, GgmlDType::Q4K),
    (13, GgmlDType::Q5K),
    (14, GgmlDType::Q6K),
    (15, GgmlDType::Q8K),
    (30, GgmlDType::BF16),
];

impl TensorType {
    /// The ggml type number `id`.
    pub fn from_id(id: u32) -> Self {
        match id {
            39 => Self::Mxfp4,
            id => match GGML_IDS.iter().find(|(i, _)| *i == id) {
                Some((_, d)) => Self::Ggml(*d),
                None => crate::model::quant::GgmlType::from_id(id).map_or(Self::Unknown(id), Self::Other),
            },
        }
    }

    /// The ggml type number.
    pub fn id(self) -> u32 {
        match self {
            Self::Ggml(d) => GGML_IDS.iter().find(|(_, t)| *t == d).map_or(u32::MAX, |(i, _)| *i),
            Self::Mxfp4 => 39,
            Self::Other(t) => t.id(),
            Self::Unknown(id) => id,
        }
    }

    /// The name ggml gives the type (`Q2_K`, `IQ4_NL`), or "unknown ggml
    /// type N": what errors say.
    pub fn ggml_name(self) -> String {
        match crate::model::quant::GgmlType::from_id(self.id()) {
            Some(t) => t.name().into(),
            None => format!("unknown ggml type {}", self.id()),
        }
    }

    /// `(values per block, bytes per block)`, where the type is known.
    pub fn block(self) -> Option<(usize, usize)> {
        match self {
            Self::Ggml(d) => Some((d.block_size(), d.type_size())),
            Self::Mxfp4 => Some((32, 17)),
            Self::Other(t) => Some((t.block_values(), t.block_bytes())),
            Self::Unknown(_) => None,
        }
    }

    /// Bytes of `elems` values, where the type is known and `elems` whole blocks.
    pub fn bytes_for(self, elems: usize) -> Option<usize> {
        let (per, size) = self.block()?;
        elems.is_multiple_of(per).then(|| (elems / per).checked_mul(size)).flatten()
    }

    /// The name recorded in manifests (`Q4_1`, `Q8_0`, `MXFP4`, …).
    pub fn name(self) -> String {
        match self {
            Self::Ggml(d) => format!("{d:?}"),
            Self::Mxfp4 => "MXFP4".into(),
            Self::Other(t) => t.name().into(),
            Self::Unknown(id) => format!("type {id}"),
        }
    }
}

/// One entry of the tensor table.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    /// Storage type.
    pub dtype: TensorType,
    /// Dimensions, outermost first (candle's order; the file stores them reversed).
    pub dims: Vec<usize>,
    /// Offset from the start of the tensor data.
    pub offset: u64,
}

impl TensorInfo {
    /// Number of values (checked when parsed, so it does not overflow).
    pub fn elems(&self) -> usize {
        self.dims.iter().product()
    }
}

/// A parsed header.
#[derive(Debug)]
pub struct Header {
    /// Metadata by key.
    pub metadata: HashMap<String, Value>,
    /// The tensor table by name.
    pub tensors: HashMap<String, TensorInfo>,
    /// Where tensor data starts in the file.
    pub data_offset: u64,
}

/// Why a header is refused.
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    /// Not a GGUF file.
    #[error("bad magic {0:#010x}")]
    Magic(u32),
    /// A version this parser does not read.
    #[error("unsupported GGUF version {0}")]
    Version(u32),
    /// The file ends inside the header.
    #[error("truncated: {0}")]
    Truncated(String),
    /// A value out of range or inconsistent.
    #[error("{0}")]
    Invalid(String),
    /// Reading failed.
    #[error("read failed: {0}")]
    Io(#[from] std::io::Error),
}

struct Reader<'a, R> {
    r: &'a mut R,
    pos: u64,
    len: u64,
    /// GGUF v1 writes lengths and dimensions as u32.
    v1: bool,
}

impl<R: Read> Reader<'_, R> {
    fn left(&self) -> u64 {
        self.len.saturating_sub(self.pos)
    }

    fn bytes(&mut self, n: u64, what: &str) -> Result<Vec<u8>, HeaderError> {
        if n > self.left() {
            return Err(HeaderError::Truncated(format!("{what} needs {n} bytes, {} left", self.left())));
        }
        let mut buf = vec![0u8; n as usize];
        self.r.read_exact(&mut buf).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => HeaderError::Truncated(format!("{what}: file ended")),
            _ => HeaderError::Io(e),
        })?;
        self.pos += n;
        Ok(buf)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], HeaderError> {
        let b = self.bytes(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(&b);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, HeaderError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, HeaderError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn length(&mut self, what: &str) -> Result<u64, HeaderError> {
        if self.v1 {
            self.u32(what).map(u64::from)
        } else {
            self.u64(what)
        }
    }

    fn string(&mut self, what: &str) -> Result<String, HeaderError> {
        let n = self.length(what)?;
        if n > MAX_STRING {
            return Err(HeaderError::Invalid(format!("{what}: string of {n} bytes")));
        }
        let b = self.bytes(n, what)?;
        String::from_utf8(b).map_err(|_| HeaderError::Invalid(format!("{what}: not UTF-8")))
    }

    fn value(&mut self, ty: u32, depth: usize, what: &str) -> Result<Value, HeaderError> {
        Ok(match ty {
            0 => Value::U8(self.array::<1>(what)?[0]),
            1 => Value::I8(self.array::<1>(what)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            4 => Value::U32(self.u32(what)?),
            5 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.array::<1>(what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(HeaderError::Invalid(format!("{what}: bool byte {b}"))),
            },
            8 => Value::String(self.string(what)?),
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(HeaderError::Invalid(format!("{what}: arrays nested deeper than {MAX_DEPTH}")));
                }
                let inner = self.u32(what)?;
                let n = self.length(what)?;
                let min = match inner {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    10..=12 => 8,
                    8 => {
                        if self.v1 {
                            4
                        } else {
                            8
                        }
                    }
                    9 => {
                        if self.v1 {
                            8
                        } else {
                            12
                        }
                    }
                    t => return Err(HeaderError::Invalid(format!("{what}: value type {t}"))),
                };
                if n > MAX_COUNT || n.saturating_mul(min) > self.left() {
                    return Err(HeaderError::Truncated(format!(
                        "{what}: array of {n} needs more than {} bytes",
                        self.left()
                    )));
                }
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(inner, depth + 1, what)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(what)?),
            11 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            t => return Err(HeaderError::Invalid(format!("{what}: value type {t}"))),
        })
    }
}

impl Header {
    /// Parses the header at the start of `r`, a source of `len` bytes.
    pub fn read<R: Read + Seek>(r: &mut R, len: u64) -> Result<Self, HeaderError> {
        r.seek(SeekFrom::Start(0))?;
        let mut rd = Reader { r, pos: 0, len, v1: false };
        let magic = rd.u32("magic")?;
        if magic != 0x4655_4747 {
            return Err(HeaderError::Magic(magic));
        }
        let version = rd.u32("version")?;
        rd.v1 = match version {
            1 => true,
            2 | 3 => false,
            v => return Err(HeaderError::Version(v)),
        };
        let n_tensors = rd.length("tensor count")?;
        let n_kv = rd.length("metadata count")?;
        // Each entry takes at least a length prefix, a type and a byte (or, for
        // a tensor, a prefix, a dimension count, a type and an offset).
        let prefix = if rd.v1 { 4 } else { 8 };
        let needed = n_kv.saturating_mul(prefix + 5).saturating_add(n_tensors.saturating_mul(prefix + 16));
        if n_tensors > MAX_COUNT || n_kv > MAX_COUNT || needed > rd.left() {
            return Err(HeaderError::Truncated(format!(
                "{n_tensors} tensors and {n_kv} metadata entries do not fit in {} bytes",
                rd.left()
            )));
        }
        let mut metadata = HashMap::with_capacity(n_kv as usize);
        for _ in 0..n_kv {
            let key = rd.string("metadata key")?;
            let ty = rd.u32(&key)?;
            let value = rd.value(ty, 0, &key)?;
            if metadata.insert(key.clone(), value).is_some() {
                return Err(HeaderError::Invalid(format!("metadata key {key:?} appears twice")));
            }
        }
        let mut tensors = HashMap::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            let name = rd.string("tensor name")?;
            let n_dims = rd.u32(&name)?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(HeaderError::Invalid(format!("tensor {name:?} has {n_dims} dimensions")));
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                let d = rd.length(&name)?;
                dims.push(
                    usize::try_from(d).map_err(|_| HeaderError::Invalid(format!("tensor {name:?}: dimension {d}")))?,
                );
            }
            dims.reverse();
            let elems = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            if elems.is_none_or(|e| e == 0 || e > i64::MAX as usize) {
                return Err(HeaderError::Invalid(format!("tensor {name:?} has dimensions {dims:?}")));
            }
            let dtype = TensorType::from_id(rd.u32(&name)?);
            let offset = rd.u64(&name)?;
            if tensors.insert(name.clone(), TensorInfo { dtype, dims, offset }).is_some() {
                return Err(HeaderError::Invalid(format!("tensor {name:?} appears twice")));
            }
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(Value::U32(a)) if a.is_power_of_two() => u64::from(*a),
            Some(v) => return Err(HeaderError::Invalid(format!("general.alignment {v:?} is not a power of two u32"))),
        };
        let data_offset = rd.pos.div_ceil(alignment) * alignment;
        for (name, t) in &tensors {
            if t.offset % alignment != 0 {
                return Err(HeaderError::Invalid(format!("tensor {name:?} at offset {} is not aligned", t.offset)));
            }
        }
        Ok(Self { metadata, tensors, data_offset })
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;
    use std::path::Path;

    use super::super::write::{write, OutTensor};
    use super::super::GgufFile;
    use super::*;
    use crate::model::ModelError;

    fn tensor(name: &str, dtype: TensorType, dims: &[usize], bytes: usize) -> OutTensor {
        OutTensor { name: name.into(), dims: dims.to_vec(), dtype, bytes: vec![0x11; bytes] }
    }

    fn file(meta: &[(&str, Value)], tensors: &[OutTensor]) -> Vec<u8> {
        let meta: Vec<(String, Value)> = meta.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
        let mut out = Vec::new();
        write(&mut out, &meta, tensors).unwrap();
        out
    }

    fn open(bytes: Vec<u8>) -> crate::model::Result<GgufFile> {
        let len = bytes.len() as u64;
        GgufFile::from_source(Path::new("test.gguf"), Box::new(Cursor::new(bytes)), len)
    }

    fn malformed(r: crate::model::Result<GgufFile>, needle: &str) {
        match r {
            Err(ModelError::Malformed(m)) => assert!(m.contains(needle), "{m:?} should say {needle:?}"),
            Err(e) => panic!("expected Malformed({needle}), got {e}"),
            Ok(_) => panic!("expected Malformed({needle}), the file was accepted"),
        }
    }

    #[test]
    fn a_file_we_write_reads_back() {
        let bytes = file(
            &[("general.architecture", Value::String("llama".into())), ("a.list", Value::Array(vec![Value::U32(3)]))],
            &[
                tensor("w", TensorType::Mxfp4, &[2, 64], 2 * 2 * 17),
                tensor("n", TensorType::Ggml(GgmlDType::F32), &[5], 20),
            ],
        );
        let mut g = open(bytes).unwrap();
        assert_eq!(g.meta_str("general.architecture").unwrap(), "llama");
        assert_eq!(g.tensor_names(), ["w", "n"]);
        assert_eq!(g.tensor_bytes("w"), Some(68));
        let raw = g.load_raw("w").unwrap();
        assert_eq!((raw.dtype, raw.dims.as_slice(), raw.bytes.len()), (TensorType::Mxfp4, &[2usize, 64][..], 68));
        assert_eq!(raw.record.dtype, "MXFP4");
        assert_eq!(g.load_raw("n").unwrap().record.dtype, "F32", "ggml names are candle's, as manifests recorded them");
    }

    #[test]
    fn a_name_or_key_given_twice_is_refused() {
        let f32s = TensorType::Ggml(GgmlDType::F32);
        // A host could otherwise show one tensor to a reviewer's tool and another to the loader.
        malformed(open(file(&[], &[tensor("w", f32s, &[8], 32), tensor("w", f32s, &[8], 32)])), "appears twice");
        malformed(open(file(&[("k", Value::U32(1)), ("k", Value::U32(2))], &[])), "appears twice");
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let bytes = file(
            &[("general.architecture", Value::String("llama".into())), ("t", Value::Array(vec![Value::F32(1.0); 4]))],
            &[tensor("w", TensorType::Ggml(GgmlDType::Q8_0), &[1, 32], 34)],
        );
        // The data starts 64 bytes before the end; the header ends in the
        // padding before it. Every shorter cut is refused.
        let data_start = bytes.len() - 64;
        let first_accepted = (0..=data_start).find(|&n| open(bytes[..n].to_vec()).is_ok()).unwrap();
        assert!(first_accepted > data_start - 32, "a header cut at {first_accepted} bytes was accepted");
        // Cut inside the tensor data: the header parses, the tensor does not load.
        let mut g = open(bytes[..bytes.len() - 40].to_vec()).unwrap();
        malformed(g.load_raw("w").map(|_| open(vec![]).unwrap_err()).and_then(Err), "truncated");
    }

    #[test]
    fn absurd_counts_and_shapes_are_refused_before_allocating() {
        let mut bytes = file(&[], &[]);
        bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        malformed(open(bytes), "do not fit");
        let mut bytes = file(&[("k", Value::Array(vec![Value::U8(1)]))], &[]);
        // The array's length field: after magic, version, counts, key and value type and element type.
        let at = 4 + 4 + 8 + 8 + 8 + 1 + 4 + 4;
        bytes[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(open(bytes).is_err());
        let f32s = TensorType::Ggml(GgmlDType::F32);
        malformed(open(file(&[], &[tensor("w", f32s, &[1 << 40, 1 << 40], 4)])), "dimensions");
        malformed(open(file(&[], &[tensor("w", f32s, &[1, 1, 1, 1, 1], 4)])), "5 dimensions");
    }

    #[test]
    fn an_unknown_type_opens_and_refuses_to_load_by_name() {
        let mut g = open(file(&[], &[tensor("w", TensorType::Unknown(77), &[256], 64)])).unwrap();
        assert_eq!(g.tensor_bytes("w"), None);
        match g.load_raw("w") {
            Err(ModelError::Unsupported(m)) => {
                assert!(m.contains("tensor w") && m.contains("unknown ggml type 77"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        // A type ggml has and candle does not: known by its name and size.
        let iq4 = TensorType::from_id(23);
        assert_eq!((iq4.ggml_name().as_str(), iq4.bytes_for(256)), ("IQ4_XS", Some(136)));
        // One ggml has and nothing computes with: refused by its name.
        let mut g = open(file(&[], &[tensor("w", TensorType::from_id(27), &[4], 8)])).unwrap();
        match g.load_raw("w") {
            Err(ModelError::Unsupported(m)) => assert!(m.contains("tensor w") && m.contains("I64"), "{m}"),
            other => panic!("{other:?}"),
        }
        // MXFP4 rows must be whole blocks.
        let mut g = open(file(&[], &[tensor("w", TensorType::Mxfp4, &[1, 48], 17)])).unwrap();
        malformed(g.load_raw("w").map(|_| open(vec![]).unwrap_err()).and_then(Err), "block size");
    }

    #[test]
    fn misaligned_offsets_and_odd_alignments_are_refused() {
        let f32s = TensorType::Ggml(GgmlDType::F32);
        malformed(open(file(&[("general.alignment", Value::U32(24))], &[])), "power of two");
        let mut bytes = file(&[], &[tensor("w", f32s, &[8], 32)]);
        // The tensor's offset is the header's last field before padding.
        let name_end = 4 + 4 + 8 + 8 + 8 + 1;
        let at = name_end + 4 + 8 + 4;
        bytes[at..at + 8].copy_from_slice(&3u64.to_le_bytes());
        malformed(open(bytes), "not aligned");
    }
}
