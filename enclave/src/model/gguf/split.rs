//! Split GGUF models, as llama.cpp's `gguf-split` writes them: files named
//! `PREFIX-00001-of-0000N.gguf` …, each a GGUF of its own with `split.no`
//! (0-based), `split.count` and, in the first, `split.tensors.count`; the
//! first file holds the model's metadata, every file holds some tensors.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;

use crate::model::error::{ModelError, Result};

/// Keys of split bookkeeping (left out of the metadata digest).
pub const KEY_PREFIX: &str = "split.";
/// Most files a model may be split into (the naming has five digits).
pub const MAX_FILES: usize = 99_999;

fn int(meta: &HashMap<String, Value>, key: &str) -> Result<Option<u64>> {
    let Some(v) = meta.get(key) else { return Ok(None) };
    let n = match v {
        Value::U8(x) => u64::from(*x),
        Value::U16(x) => u64::from(*x),
        Value::U32(x) => u64::from(*x),
        Value::U64(x) => *x,
        Value::I8(x) if *x >= 0 => *x as u64,
        Value::I16(x) if *x >= 0 => *x as u64,
        Value::I32(x) if *x >= 0 => *x as u64,
        Value::I64(x) if *x >= 0 => *x as u64,
        _ => return Err(ModelError::Malformed(format!("metadata {key} is not a non-negative integer"))),
    };
    Ok(Some(n))
}

/// `split.count`, when the file says it is one of several.
pub fn count(meta: &HashMap<String, Value>) -> Result<Option<usize>> {
    match int(meta, "split.count")? {
        None => Ok(None),
        Some(n) if (1..=MAX_FILES as u64).contains(&n) => Ok(Some(n as usize)),
        Some(n) => Err(ModelError::Malformed(format!("split.count = {n} (1..={MAX_FILES})"))),
    }
}

/// `split.tensors.count`, when present.
pub fn tensor_count(meta: &HashMap<String, Value>) -> Result<Option<usize>> {
    Ok(int(meta, "split.tensors.count")?.map(|n| n as usize))
}

/// Checks that file `index` (0-based) of `count` says so.
pub fn check_part(meta: &HashMap<String, Value>, index: usize, count: usize, label: &Path) -> Result<()> {
    let no = int(meta, "split.no")?;
    let n = int(meta, "split.count")?;
    if no != Some(index as u64) || n != Some(count as u64) {
        let show = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_else(|| "absent".into());
        return Err(ModelError::Malformed(format!(
            "{} should be file {} of {count} (split.no {index}); it says split.no {}, split.count {}",
            label.display(),
            index + 1,
            show(no),
            show(n)
        )));
    }
    Ok(())
}

/// `PREFIX` of a file stem `PREFIX-0000i-of-0000N`.
pub fn prefix_of(stem: &str) -> Option<&str> {
    let (rest, n) = stem.rsplit_once("-of-")?;
    let (prefix, i) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    (digits(n) && digits(i)).then_some(prefix)
}

/// The paths of all `count` files, given the first one's.
pub fn names(first: &Path, count: usize) -> Result<Vec<PathBuf>> {
    let name = first.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let want_suffix = format!("-00001-of-{count:05}.gguf");
    let Some(prefix) = name.strip_suffix(&want_suffix) else {
        return Err(ModelError::Invalid(format!(
            "{} is one of {count} files of a split model: give the first, PREFIX{want_suffix}",
            first.display()
        )));
    };
    Ok((1..=count).map(|i| first.with_file_name(format!("{prefix}-{i:05}-of-{count:05}.gguf"))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_llama_cpp_and_only_the_first_file_opens_a_model() {
        let n = names(Path::new("/m/big-00001-of-00003.gguf"), 3).unwrap();
        assert_eq!(n[2], Path::new("/m/big-00003-of-00003.gguf"));
        assert!(names(Path::new("/m/big-00002-of-00003.gguf"), 3).is_err());
        assert!(names(Path::new("/m/big.gguf"), 3).is_err());
        assert_eq!(prefix_of("big-00002-of-00003"), Some("big"));
        assert_eq!(prefix_of("a-b-00002-of-00003"), Some("a-b"));
        assert_eq!(prefix_of("big-2-of-3"), None);
        assert_eq!(prefix_of("big"), None);
    }

    #[test]
    fn split_keys_are_checked() {
        let meta = |no: u16, count: u16| {
            HashMap::from([("split.no".to_owned(), Value::U16(no)), ("split.count".to_owned(), Value::U16(count))])
        };
        assert!(check_part(&meta(1, 3), 1, 3, Path::new("x")).is_ok());
        assert!(check_part(&meta(2, 3), 1, 3, Path::new("x")).is_err());
        assert!(check_part(&meta(1, 4), 1, 3, Path::new("x")).is_err());
        assert!(check_part(&HashMap::new(), 1, 3, Path::new("x")).is_err());
        assert!(count(&meta(0, 0)).is_err());
        assert_eq!(count(&meta(0, 3)).unwrap(), Some(3));
        let bad = HashMap::from([("split.count".to_owned(), Value::I32(-1))]);
        assert!(count(&bad).is_err());
    }
}
