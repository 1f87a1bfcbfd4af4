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
    /// A type number Veil does not read.
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
            id => GGML_IDS.iter().find(|(i, _)| *i == id).map_or(Self::Unknown(id), |(_, d)| Self::Ggml(*d)),
        }
    }

    /// The ggml type number.
    pub fn id(self) -> u32 {
        match self {
            Self::Ggml(d) => GGML_IDS.iter().find(|(_, t)| *t == d).map_or(u32::MAX, |(i, _)| *i),
            Self::Mxfp4 => 39,
            Self::Unknown(id) => id,
        }
    }

    /// `(values per block, bytes per block)`, where the type is known.
    pub fn block(self) -> Option<(usize, usize)> {
        match self {
            Self::Ggml(d) => Some((d.block_size(), d.type_size())),
            Self::Mxfp4 => Some((32, 17)),
            Self::Unknown(_) => None,
        }
    }

    /// Bytes of `elems` values, where the type is known and `elems` whole blocks.
    pub fn bytes_for(self, elems: usize) -> Option<usize> {
        let (per, size) = self.block()?;
        (elems % per == 0).then(|| (elems / per).checked_mul(size)).flatten()
    }

    /// The name recorded in manifests (`Q4_1`, `Q8_0`, `MXFP4`, …).
    pub fn name(self) -> String {
        match self {
            Self::Ggml(d) => format!("{d:?}"),
            Self::Mxfp4 => "MXFP4".into(),
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
