//! Writes GGUF files (version 2, 32-byte alignment): the random-weight
//! models of `synth`, whose tensors may be of types candle cannot hold
//! (MXFP4). The layout is the one candle's writer produces, so files it
//! wrote before are reproduced byte for byte.

use std::io::Write;

use candle_core::quantized::gguf_file::Value;

use super::header::TensorType;

/// A tensor to write: its bytes as stored, and what they are.
#[derive(Clone, Debug)]
pub struct OutTensor {
    /// Name in the tensor table.
    pub name: String,
    /// Dimensions, outermost first.
    pub dims: Vec<usize>,
    /// Storage type.
    pub dtype: TensorType,
    /// The stored bytes.
    pub bytes: Vec<u8>,
}

fn type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn string(w: &mut impl Write, s: &str) -> std::io::Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

fn value(w: &mut impl Write, v: &Value) -> std::io::Result<()> {
    match v {
        Value::U8(x) => w.write_all(&[*x]),
        Value::I8(x) => w.write_all(&x.to_le_bytes()),
        Value::U16(x) => w.write_all(&x.to_le_bytes()),
        Value::I16(x) => w.write_all(&x.to_le_bytes()),
        Value::U32(x) => w.write_all(&x.to_le_bytes()),
        Value::I32(x) => w.write_all(&x.to_le_bytes()),
        Value::F32(x) => w.write_all(&x.to_le_bytes()),
        Value::Bool(x) => w.write_all(&[u8::from(*x)]),
        Value::String(s) => string(w, s),
        Value::Array(items) => {
            let ty = items.first().map_or(4, type_id);
            if items.iter().any(|i| type_id(i) != ty) {
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "an array mixes value types"));
            }
            w.write_all(&ty.to_le_bytes())?;
            w.write_all(&(items.len() as u64).to_le_bytes())?;
            items.iter().try_for_each(|i| value(w, i))
        }
        Value::U64(x) => w.write_all(&x.to_le_bytes()),
        Value::I64(x) => w.write_all(&x.to_le_bytes()),
        Value::F64(x) => w.write_all(&x.to_le_bytes()),
    }
}

fn pad(n: usize) -> usize {
    n.next_multiple_of(32) - n
}

/// A tensor's entry in the table: what it is and how many bytes it stores.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Name in the tensor table.
    pub name: String,
    /// Dimensions, outermost first.
    pub dims: Vec<usize>,
    /// Storage type.
    pub dtype: TensorType,
    /// Bytes stored.
    pub len: usize,
}

impl From<&OutTensor> for Entry {
    fn from(t: &OutTensor) -> Self {
        Self { name: t.name.clone(), dims: t.dims.clone(), dtype: t.dtype, len: t.bytes.len() }
    }
}

fn header(metadata: &[(String, Value)], entries: &[Entry]) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::new();
    head.extend_from_slice(&0x4655_4747u32.to_le_bytes());
    head.extend_from_slice(&2u32.to_le_bytes());
    head.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    head.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        string(&mut head, k)?;
        head.extend_from_slice(&type_id(v).to_le_bytes());
        value(&mut head, v)?;
    }
    let mut offset = 0usize;
    for t in entries {
        string(&mut head, &t.name)?;
        head.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for &d in t.dims.iter().rev() {
            head.extend_from_slice(&(d as u64).to_le_bytes());
        }
        head.extend_from_slice(&t.dtype.id().to_le_bytes());
        head.extend_from_slice(&(offset as u64).to_le_bytes());
        offset += t.len + pad(t.len);
    }
    head.resize(head.len() + pad(head.len()), 0);
    Ok(head)
}

/// Bodies of tensors, in table order, produced as they are written (so a
/// file larger than memory can be written).
pub type Bodies<'a> = dyn Iterator<Item = std::io::Result<Vec<u8>>> + 'a;

/// Writes `metadata` (in the order given) and the tensors of `entries`,
/// taking each one's bytes from `bodies` in turn.
pub fn write_streamed(
    w: &mut impl Write,
    metadata: &[(String, Value)],
    entries: &[Entry],
    bodies: &mut Bodies<'_>,
) -> std::io::Result<()> {
    w.write_all(&header(metadata, entries)?)?;
    for t in entries {
        let bytes = bodies.next().ok_or_else(|| std::io::Error::other(format!("no bytes for tensor {}", t.name)))??;
        if bytes.len() != t.len {
            return Err(std::io::Error::other(format!(
                "tensor {}: {} bytes where its entry says {}",
                t.name,
                bytes.len(),
                t.len
            )));
        }
        w.write_all(&bytes)?;
        w.write_all(&vec![0u8; pad(bytes.len())])?;
    }
    Ok(())
}

/// Writes `metadata` (in the order given) and `tensors` to `w`.
pub fn write(w: &mut impl Write, metadata: &[(String, Value)], tensors: &[OutTensor]) -> std::io::Result<()> {
    let entries: Vec<Entry> = tensors.iter().map(Entry::from).collect();
    write_streamed(w, metadata, &entries, &mut tensors.iter().map(|t| Ok(t.bytes.clone())))
}

/// Writes a model split into `files` GGUF files as llama.cpp's `gguf-split`
/// lays them out: `PREFIX-00001-of-0000N.gguf` …, tensors in order, cut
/// where the bytes so far pass each file's even share; the first file holds
/// `metadata`, every file `split.no` (0-based) and `split.count`, the first
/// also `split.tensors.count`. `first` names the first file; returns every path.
pub fn write_split(
    first: &std::path::Path,
    metadata: &[(String, Value)],
    entries: &[Entry],
    bodies: &mut Bodies<'_>,
    files: usize,
) -> std::io::Result<Vec<std::path::PathBuf>> {
    let invalid = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, m);
    if files == 0 || files > entries.len() || files > super::split::MAX_FILES {
        return Err(invalid(format!("cannot split {} tensors into {files} files", entries.len())));
    }
    let names = super::split::names(first, files).map_err(|e| invalid(e.to_string()))?;
    let total: usize = entries.iter().map(|t| t.len).sum();
    let mut groups: Vec<&[Entry]> = Vec::with_capacity(files);
    let (mut start, mut acc) = (0, 0usize);
    for (i, t) in entries.iter().enumerate() {
        acc += t.len;
        let left_files = files - groups.len() - 1;
        let must_cut = entries.len() - i - 1 == left_files;
        if left_files > 0 && (acc * files >= total * (groups.len() + 1) || must_cut) {
            groups.push(&entries[start..=i]);
            start = i + 1;
        }
    }
    groups.push(&entries[start..]);
    for (i, (path, group)) in names.iter().zip(&groups).enumerate() {
        let mut meta: Vec<(String, Value)> = if i == 0 { metadata.to_vec() } else { Vec::new() };
        meta.push(("split.no".into(), Value::U16(i as u16)));
        meta.push(("split.count".into(), Value::U16(files as u16)));
        if i == 0 {
            meta.push(("split.tensors.count".into(), Value::I32(entries.len() as i32)));
        }
        let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
        write_streamed(&mut f, &meta, group, bodies)?;
        f.flush()?;
    }
    Ok(names)
}
