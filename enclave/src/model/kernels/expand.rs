//! What a block the expanded kernels compute on is: 32 exact integers and
//! one scale (a leaf: [`super::expanded`] computes on such blocks,
//! [`super::grid`] defines the i-quants' ones).

use super::BLOCK;

/// A block that unpacks to 32 exact integers and one scale.
pub(crate) trait Expand: Copy + Send + Sync + 'static {
    /// The block's scale.
    fn scale(&self) -> f32;
    /// The 32 integers, in weight order.
    fn ints(&self) -> [i8; BLOCK];
    /// Appends the resident fields to `out` (what the digest covers).
    fn bytes_into(&self, out: &mut Vec<u8>);
    /// Whether the block has a scale per 16 weights: the scale times an
    /// integer multiplier per half ([`Expand::halves`]).
    const HALVED: bool = false;
    /// The multipliers of the first and second 16 weights' scale.
    fn halves(&self) -> [i32; 2] {
        [1, 1]
    }
    /// The block dequantized, as ggml's `dequantize_row_*` computes each
    /// value: the integer times the scale (times its half's multiplier).
    fn dequantize(&self) -> [f32; BLOCK] {
        let d = self.scale();
        let h = self.halves().map(|m| d * m as f32);
        let q = self.ints();
        std::array::from_fn(|j| f32::from(q[j]) * h[j / 16])
    }
}
