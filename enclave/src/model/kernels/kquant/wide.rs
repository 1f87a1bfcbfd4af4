//! One input row (decode) of the K-quants on 512-bit vectors (AVX-512BW
//! and VNNI). A decode step reads every weight once and uses it once, so
//! what bounds it is how many instructions a weight block costs. The AVX2
//! kernel ([`super::simd`]) takes 32 values an instruction and broadcasts
//! each sub-block's scale from a byte (three instructions); here one
//! instruction unpacks 64 values (two sub-blocks: the low and high nibbles
//! of the same 32 bytes, or Q6_K's two bit planes), one permute places
//! their scales, `vpmaddubsw` multiplies them by the activations, and
//! `vpdpwssd` scales and adds the pairs. The integers are the scalar
//! kernel's exactly (integer sums do not depend on their order), and the
//! float steps are [`super::simd`]'s, so every output equals
//! [`super::dot_scalar`] bit for bit, as the batched kernels' do.

use std::arch::x86_64::*;

use super::simd::{bsums, Simd};
use super::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};

/// A format's 64-value vectors.
pub(crate) trait Wide: Simd {
    /// The block's scales widened to i16, scale `i` in lane `i`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and BW.
    unsafe fn scales(&self) -> __m512i;
    /// Values `64c..64c + 64` as unsigned bytes, and for each i16 lane
    /// (a pair of values after `vpmaddubsw`) its scale, taken from
    /// `scales` ([`Wide::scales`]).
    ///
    /// # Safety
    /// The CPU must have AVX-512F and BW, and `c < 4`.
    unsafe fn wide(&self, c: usize, scales: __m512i) -> (__m512i, __m512i);
}

/// i16 lanes: `a` in the low 256 bits, `b` in the high.
const fn halves(a: i16, b: i16) -> [i16; 32] {
    let mut v = [a; 32];
    let mut i = 16;
    while i < 32 {
        v[i] = b;
        i += 1;
    }
    v
}

/// Which scale each i16 lane takes, for values `64c..`: Q4_K/Q5_K one
/// scale per 32 values (sub-blocks `2c`, `2c + 1`).
const PAIRS: [[i16; 32]; 4] = [halves(0, 1), halves(2, 3), halves(4, 5), halves(6, 7)];

/// Q2_K, Q3_K, Q6_K: one scale per 16 values (`4c..4c + 4`, eight lanes each).
const QUADS: [[i16; 32]; 4] = {
    let mut q = [[0i16; 32]; 4];
    let mut c = 0;
    while c < 4 {
        let mut i = 0;
        while i < 32 {
            q[c][i] = (4 * c + i / 8) as i16;
            i += 1;
        }
        c += 1;
    }
    q
};

/// The low nibbles in the low half, the high nibbles in the high half.
const NIBBLE_SHIFTS: [i16; 32] = halves(0, 4);
/// Q2_K's and Q3_K's two low bits of values `128n + 64h..`: bits `4h` and
/// `4h + 2` of each `qs[32n..]` byte.
const CRUMB_SHIFTS: [[i16; 32]; 2] = [halves(0, 2), halves(4, 6)];

/// u32 lanes: `a` in the low 256 bits, `b` in the high.
const fn halves32(a: u32, b: u32) -> [u32; 16] {
    let mut v = [a; 16];
    let mut i = 8;
    while i < 16 {
        v[i] = b;
        i += 1;
    }
    v
}

/// The left rotation of a u32 lane that moves bit `from` of each of its
/// bytes to bit `to` of the same byte (a rotation by a multiple of 8 plus
/// `to - from` takes bit `8k + from` to `8k + to` in every byte at once).
const fn to_bit(from: u32, to: u32) -> u32 {
    (32 + to - from) % 32
}

/// Q5_K's fifth bits of sub-blocks `2c`, `2c + 1` (bits `2c`, `2c + 1` of
/// each `qh` byte), rotated to bit 4.
const Q5_HIGH_ROTATIONS: [[u32; 16]; 4] = {
    let mut r = [[0u32; 16]; 4];
    let mut c = 0;
    while c < 4 {
        r[c] = halves32(to_bit(2 * c as u32, 4), to_bit(2 * c as u32 + 1, 4));
        c += 1;
    }
    r
};
/// Q6_K's top two bits of values `128n + 64h..` (bits `4h, 4h + 1` and
/// `4h + 2, 4h + 3` of each `qh[32n..]` byte), rotated to bits 4 and 5.
const Q6_HIGH_ROTATIONS: [[u32; 16]; 2] = [halves32(to_bit(0, 4), to_bit(2, 4)), halves32(to_bit(4, 4), to_bit(6, 4))];
/// Q3_K's third bits of values `64c..` (bits `2c`, `2c + 1` of each
/// `hmask` byte), rotated to bit 2.
const Q3_HIGH_ROTATIONS: [[u32; 16]; 4] = {
    let mut r = [[0u32; 16]; 4];
    let mut c = 0;
    while c < 4 {
        r[c] = halves32(to_bit(2 * c as u32, 2), to_bit(2 * c as u32 + 1, 2));
        c += 1;
    }
    r
};

/// # Safety
/// The CPU must have AVX-512F and AVX-512BW.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn constant(v: &[i16; 32]) -> __m512i {
    // SAFETY: `v` is 64 bytes; the load reads exactly them.
    _mm512_loadu_si512(v.as_ptr().cast())
}

/// 32 bytes at `p`, in both halves.
///
/// # Safety
/// The CPU must have AVX-512F and AVX-512BW. `p` must point to 32 readable bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn twice(p: *const u8) -> __m512i {
    // SAFETY: the caller passes 32 readable bytes.
    _mm512_broadcast_i64x4(_mm256_loadu_si256(p.cast()))
}

/// Each byte of `v` shifted right by its 16-bit lane's count in `shifts`, masked to `mask`.
///
/// # Safety
/// The CPU must have AVX-512F and AVX-512BW.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn bits(v: __m512i, shifts: &[i16; 32], mask: i8) -> __m512i {
    _mm512_and_si512(_mm512_srlv_epi16(v, constant(shifts)), _mm512_set1_epi8(mask))
}

/// `low` with the bits of `high` that `mask` selects (in every byte) after
/// each u32 lane of `high` is rotated left by its count in `rotations`:
/// two instructions for a format's high bits, where shifting, masking,
/// moving and or-ing them took four.
///
/// # Safety
/// The CPU must have AVX-512F and AVX-512BW.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn with_high(low: __m512i, high: __m512i, rotations: &[u32; 16], mask: i8) -> __m512i {
    // SAFETY: `rotations` is 64 bytes; the load reads exactly them.
    let rotated = _mm512_rolv_epi32(high, _mm512_loadu_si512(rotations.as_ptr().cast()));
    // The truth table of `a | (b & c)`, with a, b, c as 0xF0, 0xCC, 0xAA.
    _mm512_ternarylogic_epi32::<0xF8>(low, rotated, _mm512_set1_epi8(mask))
}

/// Q4_K/Q5_K's eight 6-bit scales (one per 32 values) as i16 lanes 0..8.
///
/// # Safety
/// The CPU must have AVX-512F and AVX-512BW.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn scales32(sc: &[u8; 8]) -> __m512i {
    // SAFETY: `sc` is 8 bytes; the load reads exactly them.
    _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64(sc.as_ptr().cast())))
}

impl Wide for BlockQ4K {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn scales(&self) -> __m512i {
        scales32(&self.sc)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn wide(&self, c: usize, scales: __m512i) -> (__m512i, __m512i) {
        // SAFETY: `c < 4`: `qs[32c..][..32]` is in bounds (128 bytes).
        let v = bits(twice(self.qs.as_ptr().add(32 * c)), &NIBBLE_SHIFTS, 0x0F);
        (v, _mm512_permutexvar_epi16(constant(&PAIRS[c]), scales))
    }
}

impl Wide for BlockQ5K {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn scales(&self) -> __m512i {
        scales32(&self.sc)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn wide(&self, c: usize, scales: __m512i) -> (__m512i, __m512i) {
        // SAFETY: `c < 4`: `qs[32c..][..32]` is in bounds (128 bytes); `qh` is 32 bytes.
        let low = bits(twice(self.qs.as_ptr().add(32 * c)), &NIBBLE_SHIFTS, 0x0F);
        let v = with_high(low, twice(self.qh.as_ptr()), &Q5_HIGH_ROTATIONS[c], 0x10);
        (v, _mm512_permutexvar_epi16(constant(&PAIRS[c]), scales))
    }
}

impl Wide for BlockQ6K {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn scales(&self) -> __m512i {
        // SAFETY: `sc` is 16 bytes; the load reads exactly them.
        _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128(self.sc.as_ptr().cast())))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn wide(&self, c: usize, scales: __m512i) -> (__m512i, __m512i) {
        // Values 128n + 64h..: the nibble h of ql[64n..][..64], bits 4h, 4h + 2 of qh[32n..][..32].
        let (n, h) = (c / 2, c % 2);
        // SAFETY: `c < 4`: `ql[64n..][..64]` and `qh[32n..][..32]` are in bounds (128 and 64 bytes).
        let ql = _mm512_loadu_si512(self.ql.as_ptr().add(64 * n).cast());
        let low = _mm512_and_si512(_mm512_srl_epi16(ql, _mm_cvtsi32_si128(4 * h as i32)), _mm512_set1_epi8(0x0F));
        let v = with_high(low, twice(self.qh.as_ptr().add(32 * n)), &Q6_HIGH_ROTATIONS[h], 0x30);
        (v, _mm512_permutexvar_epi16(constant(&QUADS[c]), scales))
    }
}

impl Wide for BlockQ2K {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn scales(&self) -> __m512i {
        // SAFETY: `sc` is 16 bytes; the load reads exactly them.
        _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_loadu_si128(self.sc.as_ptr().cast())))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn wide(&self, c: usize, scales: __m512i) -> (__m512i, __m512i) {
        // Values 128n + 64h..: bits 4h and 4h + 2 of qs[32n..][..32].
        let (n, h) = (c / 2, c % 2);
        // SAFETY: `c < 4`: `qs[32n..][..32]` is in bounds (64 bytes).
        let v = bits(twice(self.qs.as_ptr().add(32 * n)), &CRUMB_SHIFTS[h], 3);
        (v, _mm512_permutexvar_epi16(constant(&QUADS[c]), scales))
    }
}

impl Wide for BlockQ3K {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn scales(&self) -> __m512i {
        // SAFETY: `sc` is 16 bytes; the load reads exactly them.
        _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128(self.sc.as_ptr().cast())))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn wide(&self, c: usize, scales: __m512i) -> (__m512i, __m512i) {
        let (n, h) = (c / 2, c % 2);
        // SAFETY: `c < 4`: `qs[32n..][..32]` is in bounds (64 bytes); `hmask` is 32 bytes.
        let low = bits(twice(self.qs.as_ptr().add(32 * n)), &CRUMB_SHIFTS[h], 3);
        let v = with_high(low, twice(self.hmask.as_ptr()), &Q3_HIGH_ROTATIONS[c], 0x04);
        (v, _mm512_permutexvar_epi16(constant(&QUADS[c]), scales))
    }
}

/// One block's integers in eight i32 lanes each, as [`super::simd`]'s
/// `block_lanes` gives them (same sums, other lanes).
///
/// # Safety
/// The CPU must have AVX2, FMA, AVX-512F, AVX-512BW and AVX-512 VNNI.
#[inline]
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vnni")]
unsafe fn block_lanes<B: Wide>(b: &B, a: &BlockQ8K) -> (__m256i, __m256i) {
    let scales = b.scales();
    let mut sum = _mm512_setzero_si512();
    for c in 0..4 {
        let (v, s) = b.wide(c, scales);
        // SAFETY: `c < 4`: `qs[64c..][..64]` is in bounds (256 bytes).
        let q8 = _mm512_loadu_si512(a.qs.as_ptr().add(64 * c).cast());
        sum = _mm512_dpwssd_epi32(sum, _mm512_maddubs_epi16(v, q8), s);
    }
    let sumi = _mm256_add_epi32(_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64::<1>(sum));
    (sumi, B::bias(bsums(a), b.bias_weights()))
}

/// [`super::simd::dot_avx2`] on 64-value vectors: equal bit for bit.
///
/// # Safety
/// The CPU must have AVX2, FMA, AVX-512F, BW and VNNI.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn dot_wide<B: Wide>(w: &[B], x: &[BlockQ8K]) -> f32 {
    super::simd::one_row!(w, x, block_lanes)
}
