//! A draft model derived from the target when no second model is at hand:
//! the target's first `layers` transformer blocks with its embedding, final
//! norm and LM head (an early-exit model), optionally requantized to another
//! GGML type with candle. The result is an ordinary GGUF with the target's
//! vocabulary, loaded by [`DraftModel`](super::model::DraftModel).

use std::io::{BufWriter, Seek, SeekFrom};
use std::path::Path;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::Device;

use crate::model::error::{ModelError, Result};

/// What [`derive_draft`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DerivedDraft {
    /// Transformer blocks kept.
    pub layers: usize,
    /// Blocks in the target.
    pub target_layers: usize,
    /// Tensors written.
    pub tensors: usize,
    /// Tensors converted to the requested type.
    pub requantized: usize,
    /// Size of the written file.
    pub bytes: u64,
}

/// Parses a GGML type name (`q4_0`, `q4_1`, `q5_0`, `q5_1`, `q8_0`, `f16`,
/// `q2_k` … `q6_k`).
pub fn parse_dtype(name: &str) -> Result<GgmlDType> {
    Ok(match name.to_ascii_lowercase().as_str() {
        "f16" => GgmlDType::F16,
        "q4_0" => GgmlDType::Q4_0,
        "q4_1" => GgmlDType::Q4_1,
        "q5_0" => GgmlDType::Q5_0,
        "q5_1" => GgmlDType::Q5_1,
        "q8_0" => GgmlDType::Q8_0,
        "q2_k" => GgmlDType::Q2K,
        "q3_k" => GgmlDType::Q3K,
        "q4_k" => GgmlDType::Q4K,
        "q5_k" => GgmlDType::Q5K,
        "q6_k" => GgmlDType::Q6K,
        other => return Err(ModelError::Invalid(format!("unknown GGML type {other:?}"))),
    })
}

fn block_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// Writes to `output` the first `layers` blocks of `input` (with embedding,
/// final norm and head), matrices converted to `dtype` when given (vectors
/// such as norms stay as they are).
pub fn derive_draft(input: &Path, output: &Path, layers: usize, dtype: Option<GgmlDType>) -> Result<DerivedDraft> {
    let mut file = std::fs::File::open(input)?;
    let content =
        gguf_file::Content::read(&mut file).map_err(|e| ModelError::Malformed(format!("{}: {e}", input.display())))?;
    let arch = match content.metadata.get("general.architecture") {
        Some(gguf_file::Value::String(a)) => a.clone(),
        _ => return Err(ModelError::Malformed("general.architecture is missing".into())),
    };
    let count_key = format!("{arch}.block_count");
    let target_layers = content
        .metadata
        .get(&count_key)
        .and_then(|v| v.to_u32().ok())
        .ok_or_else(|| ModelError::Malformed(format!("{count_key} is missing")))? as usize;
    if layers == 0 || layers > target_layers {
        return Err(ModelError::Invalid(format!("a draft needs 1..={target_layers} layers, not {layers}")));
    }
    let mut names: Vec<&String> =
        content.tensor_infos.keys().filter(|n| block_of(n).is_none_or(|b| b < layers)).collect();
    names.sort();
    let mut tensors: Vec<(String, QTensor)> = Vec::with_capacity(names.len());
    let mut requantized = 0;
    for name in names {
        let t = content.tensor(&mut file, name, &Device::Cpu)?;
        let convert = dtype.filter(|&d| t.shape().rank() == 2 && t.dtype() != d && t.dtype() != GgmlDType::F32);
        let t = match convert {
            None => t,
            Some(d) => {
                requantized += 1;
                let full = t.dequantize(&Device::Cpu)?;
                QTensor::quantize(&full, d).map_err(|e| {
                    ModelError::Invalid(format!(
                        "{name} cannot be stored as {d:?} (its rows must be whole blocks): {e}"
                    ))
                })?
            }
        };
        tensors.push((name.clone(), t));
    }
    let mut metadata: Vec<(String, gguf_file::Value)> =
        content.metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    metadata.sort_by(|a, b| a.0.cmp(&b.0));
    for (k, v) in &mut metadata {
        if *k == count_key {
            *v = gguf_file::Value::U32(layers as u32);
        }
        if k == "general.name" {
            if let gguf_file::Value::String(n) = v {
                *n = format!("{n} (draft: first {layers} of {target_layers} layers)");
            }
        }
    }
    let mut out = BufWriter::new(std::fs::File::create(output)?);
    let meta_refs: Vec<(&str, &gguf_file::Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    gguf_file::write(&mut out, &meta_refs, &tensor_refs)?;
    let bytes = out.seek(SeekFrom::End(0))?;
    Ok(DerivedDraft { layers, target_layers, tensors: tensors.len(), requantized, bytes })
}
