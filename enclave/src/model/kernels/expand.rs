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
    /// Whether each half has a scale of its own ([`Expand::half_scales`]:
    /// NVFP4's UE4M3 scale per 16), not the scale times an integer.
    const OWN_HALF_SCALES: bool = false;
    /// The first and second 16 weights' scales: the scale times each half's
    /// multiplier, or each half's own scale.
    fn half_scales(&self) -> [f32; 2] {
        let d = self.scale();
        self.halves().map(|m| d * m as f32)
    }
    /// The block dequantized, as ggml's `dequantize_row_*` computes each
    /// value: the integer times its half's scale.
    fn dequantize(&self) -> [f32; BLOCK] {
        let h = self.half_scales();
        let q = self.ints();
        std::array::from_fn(|j| f32::from(q[j]) * h[j / 16])
    }
}
