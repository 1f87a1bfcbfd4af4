//! NVFP4 (ggml type 40): 64 E2M1 values in four groups of 16, each group
//! with its own UE4M3 scale, stored as `d: [u8; 4], qs: [u8; 32]` with
//! group `g`'s value `j` in the low nibble of `qs[8g + j]` and value `j + 8`
//! in the high one.
//!
//! ggml decodes a nibble to an integer from MXFP4's table (the E2M1 values
//! doubled) and a scale to half its UE4M3 value, and pairs NVFP4 with Q8_0
//! activations: per group of 16, the exact integer dot times the group's
//! scale and the activation block's. A group's scale is no integer multiple
//! of a neighbour's (an FP8 number each), so the blocks here are halved in
//! a way the integer-multiplier types (IQ2_XS) are not: each 32-weight block
//! keeps both groups' scale bytes, and the kernels scale each half's lanes
//! of the integer dot by its own scale ([`super::super::I8Block::lane_scales`]).
//!
//! In memory a 64-value block becomes two blocks of 18 bytes (the file's 36:
//! 0.5625 bytes a weight), the nibbles reordered at load to MXFP4's layout
//! (value `j` low, `j + 16` high) so the same `pshufb` lookup expands them.

use super::{Codebook, Expand, Mxfp4Code, BLOCK};
use crate::model::quant::dequant::ue4m3_half;

/// Bytes of one NVFP4 block (64 weights) in a GGUF.
pub const NVFP4_BLOCK_BYTES: usize = 36;

/// Every UE4M3 byte's value, halved ([`ue4m3_half`]'s values, so the
/// kernels' scales are dequantisation's).
static UE4M3_HALF: [f32; 256] = {
    let mut t = [0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = ue4m3_half(i as u8);
        i += 1;
    }
    t
};

/// 32 NVFP4 weights (two groups of 16): their UE4M3 scale bytes, and their
/// codes with value `j` in the low nibble of `qs[j]` and `j + 16` in the high.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(super) struct BlockNvfp4 {
    s: [u8; 2],
    qs: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<BlockNvfp4>() == 18);

/// A file block's two 32-weight halves.
pub(super) fn nvfp4(b: &[u8]) -> [BlockNvfp4; 2] {
    debug_assert_eq!(b.len(), NVFP4_BLOCK_BYTES);
    // Code of weight `w` (0..64) as the file stores it.
    let code = |w: usize| {
        let (g, j) = (w / 16, w % 16);
        let byte = b[4 + 8 * g + j % 8];
        if j < 8 {
            byte & 0x0F
        } else {
            byte >> 4
        }
    };
    std::array::from_fn(|t| BlockNvfp4 {
        s: [b[2 * t], b[2 * t + 1]],
        qs: std::array::from_fn(|j| code(32 * t + j) | (code(32 * t + j + 16) << 4)),
    })
}

impl Expand for BlockNvfp4 {
    const HALVED: bool = true;
    const OWN_HALF_SCALES: bool = true;
    /// The first half's scale (no scale is the block's: see
    /// [`Expand::half_scales`]).
    fn scale(&self) -> f32 {
        UE4M3_HALF[usize::from(self.s[0])]
    }
    fn half_scales(&self) -> [f32; 2] {
        self.s.map(|s| UE4M3_HALF[usize::from(s)])
    }
    fn ints(&self) -> [i8; BLOCK] {
        std::array::from_fn(|j| {
            Mxfp4Code::TABLE[usize::from(if j < 16 { self.qs[j] & 0x0F } else { self.qs[j - 16] >> 4 })]
        })
    }
    fn bytes_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.s);
        out.extend_from_slice(&self.qs);
    }
}

#[cfg(target_arch = "x86_64")]
impl super::super::I8Block for BlockNvfp4 {
    /// The first half's scale; the kernels read [`Self::lane_scales`].
    fn scale(&self) -> f32 {
        Expand::scale(self)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn weights(&self) -> std::arch::x86_64::__m256i {
        // SAFETY: AVX2 and FMA are enabled here.
        unsafe { super::lookup(&self.qs, &Mxfp4Code::TABLE_BITS) }
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn lane_scales(&self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        let [lo, hi] = self.half_scales();
        _mm256_set_m128(_mm_set1_ps(hi), _mm_set1_ps(lo))
    }
}
