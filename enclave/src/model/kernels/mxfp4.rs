//! MXFP4 (OCP microscaling, ggml type 39; gpt-oss's experts): 32 E2M1
//! values sharing an E8M0 exponent, stored as `e: u8, qs: [u8; 16]` with
//! value `j` in the low nibble of `qs[j]` and value `j + 16` in the high one.
//!
//! ggml decodes a nibble to an integer from `KVALUES` (the E2M1 values
//! doubled) and the exponent to `2^(e - 128)` (half the E8M0 scale,
//! undoing the doubling). So a block is exactly an 8-bit block with that
//! scale, and llama.cpp's MXFP4 × Q8_0 dot (`d = x.d · e8m0_half(e)`, an
//! integer sum of products) is the Q8_0 × Q8_0 kernels' arithmetic on it.
//! [`super::expanded::ExpandedMatrix`] keeps the 4-bit blocks and expands
//! each to its 32 integers in registers; its results equal those of the
//! blocks expanded to Q8_0 at load ([`Q80Matrix::from_mxfp4_bytes`]), bit
//! for bit.

use super::{check_shape, BlockQ80, KernelError, Q80Matrix};
use crate::model::quant::mxfp4::decode_qs;
pub use crate::model::quant::mxfp4::{dequantize_block, e8m0_half, quantize_block, KVALUES, MXFP4_BLOCK_BYTES};

impl Q80Matrix {
    /// Decodes raw GGUF bytes of a `rows × cols` MXFP4 tensor into exact
    /// 8-bit blocks.
    pub fn from_mxfp4_bytes(raw: &[u8], rows: usize, cols: usize) -> Result<Self, KernelError> {
        check_shape(raw, rows, cols, MXFP4_BLOCK_BYTES, "MXFP4")?;
        let blocks = raw
            .chunks_exact(MXFP4_BLOCK_BYTES)
            .map(|b| BlockQ80 { d: e8m0_half(b[0]), qs: decode_qs(&b[1..17]) })
            .collect();
        Ok(Self { rows, cols, blocks })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoding_to_8_bit_blocks_keeps_every_value() {
        let mut seed = 11u64;
        let x = crate::model::synth::uniform(64 * 4, 3.0, &mut seed);
        let raw: Vec<u8> = x.chunks_exact(32).flat_map(quantize_block).collect();
        let m = Q80Matrix::from_mxfp4_bytes(&raw, 4, 64).unwrap();
        let mut row = vec![0f32; 64];
        for r in 0..4 {
            m.row_into(r, &mut row);
            let want: Vec<f32> = raw[r * 34..(r + 1) * 34].chunks_exact(17).flat_map(dequantize_block).collect();
            assert_eq!(row, want, "row {r}");
            // And the quantizer is near: within half a step of the block's scale.
            for (blk, (got, orig)) in row.chunks(32).zip(x[r * 64..].chunks(32)).enumerate() {
                let amax = orig.iter().fold(0f32, |a, v| a.max(v.abs()));
                for (g, o) in got.iter().zip(orig) {
                    assert!((g - o).abs() <= amax / 3.0, "row {r} block {blk}: {o} became {g}");
                }
            }
        }
    }

    #[test]
    fn a_wrong_length_is_refused() {
        assert!(Q80Matrix::from_mxfp4_bytes(&[0u8; 33], 1, 64).is_err());
        assert!(Q80Matrix::from_mxfp4_bytes(&[0u8; 17], 1, 16).is_err());
    }
}
