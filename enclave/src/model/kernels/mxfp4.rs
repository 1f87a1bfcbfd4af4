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

use super::{check_shape, BlockQ80, KernelError, Q80Matrix, BLOCK};

/// Bytes of one MXFP4 block in a GGUF.
pub const MXFP4_BLOCK_BYTES: usize = 17;

/// E2M1 values, doubled (ggml's `kvalues_mxfp4`).
pub const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half the E8M0 scale `e`: `2^(e - 128)`, bit-exact as ggml's
/// `GGML_E8M0_TO_FP32_HALF` (subnormal for `e < 2`).
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { u32::from(e - 1) << 23 };
    f32::from_bits(bits)
}

/// A block's 32 integers (value `j` in the low nibble of `qs[j]`, value
/// `j + 16` in the high one), each looked up in `KVALUES`.
fn decode_qs(qs: &[u8]) -> [i8; BLOCK] {
    let mut out = [0i8; BLOCK];
    for j in 0..16 {
        out[j] = KVALUES[usize::from(qs[j] & 0x0F)];
        out[j + 16] = KVALUES[usize::from(qs[j] >> 4)];
    }
    out
}

/// One MXFP4 block as its 32 values (what ggml's `dequantize_row_mxfp4` gives).
pub fn dequantize_block(b: &[u8]) -> [f32; 32] {
    let d = e8m0_half(b[0]);
    decode_qs(&b[1..17]).map(|q| f32::from(q) * d)
}

/// Quantizes 32 values to one MXFP4 block: the exponent from the largest
/// magnitude (`floor(log2(amax)) - 2`, so it maps near 6, E2M1's top
/// value), each value to its nearest representable one (the lower on a
/// tie), as gguf-py's reference quantizer does.
pub fn quantize_block(x: &[f32]) -> [u8; MXFP4_BLOCK_BYTES] {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let e = if amax > 0.0 { (amax.log2().floor() as i32 - 2 + 127).clamp(0, 255) as u8 } else { 0 };
    let d = e8m0_half(e);
    let nearest = |v: f32| -> u8 {
        let mut best = 0usize;
        for (i, &k) in KVALUES.iter().enumerate() {
            if (d * f32::from(k) - v).abs() < (d * f32::from(KVALUES[best]) - v).abs() {
                best = i;
            }
        }
        best as u8
    };
    let mut out = [0u8; MXFP4_BLOCK_BYTES];
    out[0] = e;
    for j in 0..16 {
        out[1 + j] = nearest(x[j]) | (nearest(x[j + 16]) << 4);
    }
    out
}

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
    fn the_scale_is_ggmls_half_e8m0() {
        assert_eq!(e8m0_half(128), 1.0);
        assert_eq!(e8m0_half(127), 0.5);
        assert_eq!(e8m0_half(130), 4.0);
        assert_eq!(e8m0_half(2), 2f32.powi(-126));
        assert_eq!(e8m0_half(1), 2f32.powi(-127), "subnormal");
        assert_eq!(e8m0_half(0), 2f32.powi(-128), "subnormal");
        assert_eq!(e8m0_half(255), 2f32.powi(127));
    }

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
