//! A draft model derived from the target when no second model is at hand:
//! a subset of the target's transformer blocks (its first `n`, an early-exit
//! model, or any other set: layer skipping) with its embedding, final norm and
//! LM head, optionally requantized to another GGML type with candle. The
//! result is an ordinary GGUF with the target's vocabulary, loaded by
//! [`DraftModel`](super::model::DraftModel); [`select`](super::select) picks
//! the set per model from measured acceptance and cost.

use std::io::{BufWriter, Seek, SeekFrom};
use std::path::Path;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::Device;

use crate::model::error::{ModelError, Result};

/// What [`derive_draft`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DerivedDraft {
    /// The target's blocks kept, in order (block `i` of the draft is the
    /// target's block `layers[i]`).
    pub layers: Vec<usize>,
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

/// Parses a block list such as `0-11,14,18-29` (ascending, no repeats).
pub fn parse_layers(spec: &str) -> Result<Vec<usize>> {
    let bad = |why: &str| ModelError::Invalid(format!("layer list {spec:?}: {why}"));
    let mut out: Vec<usize> = Vec::new();
    for part in spec.split(',').map(str::trim) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let a: usize = a.parse().map_err(|_| bad("expected numbers and ranges"))?;
        let b: usize = b.parse().map_err(|_| bad("expected numbers and ranges"))?;
        if b < a || out.last().is_some_and(|&l| a <= l) {
            return Err(bad("blocks must ascend without repeats"));
        }
        out.extend(a..=b);
    }
    Ok(out)
}

/// Writes a compact form of a block list (`0-11,14,18-29`).
pub fn format_layers(layers: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < layers.len() {
        let mut j = i;
        while j + 1 < layers.len() && layers[j + 1] == layers[j] + 1 {
            j += 1;
        }
        parts.push(if i == j { layers[i].to_string() } else { format!("{}-{}", layers[i], layers[j]) });
        i = j + 1;
    }
    parts.join(",")
}

/// Writes to `output` the target's blocks `keep` (ascending), renumbered from
/// 0, with the embedding, final norm and head; matrices converted to `dtype`
/// when given (vectors such as norms stay as they are). Per-layer metadata
/// (`{arch}.*` arrays with one entry per block, such as a sliding-window
/// pattern) keeps the entries of the kept blocks, and the written file is
/// read back to check that every kept block has its target's attention kind.
pub fn derive_draft(input: &Path, output: &Path, keep: &[usize], dtype: Option<GgmlDType>) -> Result<DerivedDraft> {
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
    if keep.is_empty() || keep.windows(2).any(|w| w[0] >= w[1]) || keep.iter().any(|&l| l >= target_layers) {
        return Err(ModelError::Invalid(format!(
            "a draft keeps 1..={target_layers} distinct ascending blocks below {target_layers}, not [{}]",
            format_layers(keep)
        )));
    }
    let renumber = |name: &str| -> Option<String> {
        match block_of(name) {
            None => Some(name.to_owned()),
            Some(b) => {
                let i = keep.iter().position(|&k| k == b)?;
                Some(format!("blk.{i}{}", &name[format!("blk.{b}").len()..]))
            }
        }
    };
    let mut names: Vec<(&String, String)> =
        content.tensor_infos.keys().filter_map(|n| renumber(n).map(|r| (n, r))).collect();
    names.sort_by(|a, b| a.1.cmp(&b.1));
    let mut tensors: Vec<(String, QTensor)> = Vec::with_capacity(names.len());
    let mut requantized = 0;
    for (name, renamed) in names {
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
        tensors.push((renamed, t));
    }
    let prefix = format!("{arch}.");
    let mut metadata: Vec<(String, gguf_file::Value)> =
        content.metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    metadata.sort_by(|a, b| a.0.cmp(&b.0));
    let what = if keep.iter().enumerate().all(|(i, &l)| i == l) {
        format!("first {} of {target_layers} layers", keep.len())
    } else {
        format!("layers {} of {target_layers}", format_layers(keep))
    };
    for (k, v) in &mut metadata {
        if *k == count_key {
            *v = gguf_file::Value::U32(keep.len() as u32);
        }
        if k.starts_with(&prefix) {
            if let gguf_file::Value::Array(per_layer) = v {
                if per_layer.len() == target_layers {
                    *per_layer = keep.iter().map(|&l| per_layer[l].clone()).collect();
                }
            }
        }
        if k == "general.name" {
            if let gguf_file::Value::String(n) = v {
                *n = format!("{n} (draft: {what})");
            }
        }
    }
    let swa_key = format!("{arch}.attention.sliding_window_pattern");
    let target_config = crate::model::config::Config::from_gguf(&crate::model::gguf::GgufFile::open(input)?)?;
    if target_config.swa.is_some() && !metadata.iter().any(|(k, _)| *k == swa_key) {
        // The family's default period would re-derive the pattern from the new
        // numbering: write the kept blocks' own flags instead.
        let flags = keep.iter().map(|&l| gguf_file::Value::Bool(target_config.is_swa(l))).collect();
        metadata.push((swa_key, gguf_file::Value::Array(flags)));
    }
    let mut out = BufWriter::new(std::fs::File::create(output)?);
    let meta_refs: Vec<(&str, &gguf_file::Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    gguf_file::write(&mut out, &meta_refs, &tensor_refs)?;
    let bytes = out.seek(SeekFrom::End(0))?;
    drop(out);
    let written = crate::model::config::Config::from_gguf(&crate::model::gguf::GgufFile::open(output)?)?;
    if let Some(i) = (0..keep.len()).find(|&i| written.is_swa(i) != target_config.is_swa(keep[i])) {
        return Err(ModelError::Invalid(format!(
            "draft block {i} (the target's {}) would change its attention kind",
            keep[i]
        )));
    }
    Ok(DerivedDraft { layers: keep.to_vec(), target_layers, tensors: tensors.len(), requantized, bytes })
}
