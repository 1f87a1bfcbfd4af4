//! ggml's storage types, all of them, by the numbers and names ggml gives
//! them (`ggml.h`, `ggml_type`; gguf-py's `GGMLQuantizationType` and
//! `GGML_QUANT_SIZES`), and their dequantization (`dequant`), equal bit for
//! bit to ggml's (gguf-py's `gguf.quants.dequantize` is the reference the
//! tests compare with).
//!
//! A file's tensors are refused by these names, never by a number: a type
//! id outside the table is "unknown ggml type 77", and a type in it that
//! Veil cannot compute with is refused as, say, `I64`.

pub mod dequant;
pub mod mxfp4;
pub(crate) mod tables;

/// One of ggml's storage types.
#[allow(non_camel_case_types, missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
}

/// `(type, ggml id, name, values per block, bytes per block)`, in id order.
const TABLE: [(GgmlType, u32, &str, usize, usize); 34] = [
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 18),
    (GgmlType::Q4_1, 3, "Q4_1", 32, 20),
    (GgmlType::Q5_0, 6, "Q5_0", 32, 22),
    (GgmlType::Q5_1, 7, "Q5_1", 32, 24),
    (GgmlType::Q8_0, 8, "Q8_0", 32, 34),
    (GgmlType::Q8_1, 9, "Q8_1", 32, 40),
    (GgmlType::Q2_K, 10, "Q2_K", 256, 84),
    (GgmlType::Q3_K, 11, "Q3_K", 256, 110),
    (GgmlType::Q4_K, 12, "Q4_K", 256, 144),
    (GgmlType::Q5_K, 13, "Q5_K", 256, 176),
    (GgmlType::Q6_K, 14, "Q6_K", 256, 210),
    (GgmlType::Q8_K, 15, "Q8_K", 256, 292),
    (GgmlType::IQ2_XXS, 16, "IQ2_XXS", 256, 66),
    (GgmlType::IQ2_XS, 17, "IQ2_XS", 256, 74),
    (GgmlType::IQ3_XXS, 18, "IQ3_XXS", 256, 98),
    (GgmlType::IQ1_S, 19, "IQ1_S", 256, 50),
    (GgmlType::IQ4_NL, 20, "IQ4_NL", 32, 18),
    (GgmlType::IQ3_S, 21, "IQ3_S", 256, 110),
    (GgmlType::IQ2_S, 22, "IQ2_S", 256, 82),
    (GgmlType::IQ4_XS, 23, "IQ4_XS", 256, 136),
    (GgmlType::I8, 24, "I8", 1, 1),
    (GgmlType::I16, 25, "I16", 1, 2),
    (GgmlType::I32, 26, "I32", 1, 4),
    (GgmlType::I64, 27, "I64", 1, 8),
    (GgmlType::F64, 28, "F64", 1, 8),
    (GgmlType::IQ1_M, 29, "IQ1_M", 256, 56),
    (GgmlType::BF16, 30, "BF16", 1, 2),
    (GgmlType::TQ1_0, 34, "TQ1_0", 256, 54),
    (GgmlType::TQ2_0, 35, "TQ2_0", 256, 66),
    (GgmlType::MXFP4, 39, "MXFP4", 32, 17),
    (GgmlType::NVFP4, 40, "NVFP4", 64, 36),
    (GgmlType::Q1_0, 41, "Q1_0", 128, 18),
];

impl GgmlType {
    /// Every type, in id order.
    pub fn all() -> impl Iterator<Item = Self> {
        TABLE.iter().map(|e| e.0)
    }

    fn entry(self) -> &'static (GgmlType, u32, &'static str, usize, usize) {
        // Every variant has exactly one row (checked by a test).
        TABLE.iter().find(|e| e.0 == self).unwrap_or(&TABLE[0])
    }

    /// The type with ggml id `id`, if ggml has one.
    pub fn from_id(id: u32) -> Option<Self> {
        TABLE.iter().find(|e| e.1 == id).map(|e| e.0)
    }

    /// The type ggml names `name` (`Q4_K`, `IQ4_NL`, …).
    pub fn from_name(name: &str) -> Option<Self> {
        TABLE.iter().find(|e| e.2.eq_ignore_ascii_case(name)).map(|e| e.0)
    }

    /// ggml's id.
    pub fn id(self) -> u32 {
        self.entry().1
    }

    /// ggml's name.
    pub fn name(self) -> &'static str {
        self.entry().2
    }

    /// Values per block.
    pub fn block_values(self) -> usize {
        self.entry().3
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.entry().4
    }

    /// Bytes of `values` values, when they are whole blocks.
    pub fn bytes_for(self, values: usize) -> Option<usize> {
        let (per, size) = (self.block_values(), self.block_bytes());
        values.is_multiple_of(per).then(|| (values / per).checked_mul(size)).flatten()
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_one_row_per_type_with_unique_ids_and_names() {
        let mut ids: Vec<u32> = TABLE.iter().map(|e| e.1).collect();
        ids.dedup();
        assert_eq!(ids.len(), TABLE.len(), "ids are unique and in order");
        for t in GgmlType::all() {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
            assert_eq!(format!("{t:?}").replace('_', ""), t.name().replace('_', ""));
        }
        assert_eq!(GgmlType::from_id(4), None, "Q4_2, removed from ggml");
        assert_eq!(GgmlType::IQ4_NL.to_string(), "IQ4_NL");
        assert_eq!(GgmlType::Q6_K.bytes_for(512), Some(420));
        assert_eq!(GgmlType::Q6_K.bytes_for(100), None);
    }
}
