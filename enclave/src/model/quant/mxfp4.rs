//! The MXFP4 format (OCP microscaling, ggml type 39; gpt-oss's experts):
//! 32 E2M1 values sharing an E8M0 exponent, stored as `e: u8, qs: [u8; 16]`
//! with value `j` in the low nibble of `qs[j]` and value `j + 16` in the
//! high one; its blocks decoded and written as ggml does. The kernels that
//! compute on it are in `model/kernels/mxfp4.rs`.

/// Values in a block.
const BLOCK: usize = 32;

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
pub(crate) fn decode_qs(qs: &[u8]) -> [i8; BLOCK] {
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
}
