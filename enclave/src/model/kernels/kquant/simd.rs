//! AVX2 forms of the K-quant dots: the scalar kernel's integers, computed
//! with `maddubs` (unsigned value × signed activation, pairs to i16, no
//! saturation: at most 2·63·127) and `madd` (pairs to i32 times the
//! sub-block's scale) into eight i32 lanes, summed across lanes per block,
//! then the same float steps.

use std::arch::x86_64::*;

use super::super::hsum4_epi32;
use super::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, Finish};

/// The vector side of a format.
pub(crate) trait Simd: Finish {
    /// Whether each 16 values have their own scale (Q2_K, Q3_K, Q6_K), not each 32.
    const SCALES_PER_16: bool = false;
    /// Values `32j..32j + 32` as unsigned bytes, and their scales as i16
    /// (low half: the first 16 values', high half: the other 16's).
    ///
    /// # Safety
    /// The CPU must have AVX2, and `j < 8`.
    unsafe fn vector(&self, j: usize) -> (__m256i, __m256i);
    /// The weight side of the bias ([`super::block_sums`]): the sixteen
    /// [`Finish::bias16`] as i16.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    unsafe fn bias_weights(&self) -> __m256i;
    /// The bias in eight i32 lanes, from the activation sums and
    /// [`Simd::bias_weights`], shifted by the values' offset without mins.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn bias(bsums: __m256i, weights: __m256i) -> __m256i {
        let b = _mm256_madd_epi16(bsums, weights);
        if Self::MINS {
            b
        } else {
            _mm256_sll_epi32(b, _mm_cvtsi32_si128(Self::OFFSET_SHIFT as i32))
        }
    }
}

/// Sixteen bytes as i16 lanes, unsigned.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn widen_u8(v: &[u8; 16]) -> __m256i {
    // SAFETY: `v` is 16 bytes; the load reads exactly them.
    _mm256_cvtepu8_epi16(_mm_loadu_si128(v.as_ptr().cast()))
}

/// Sixteen bytes as i16 lanes, signed.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn widen_i8(v: &[i8; 16]) -> __m256i {
    // SAFETY: `v` is 16 bytes; the load reads exactly them.
    _mm256_cvtepi8_epi16(_mm_loadu_si128(v.as_ptr().cast()))
}

/// Scales `2j` (low half) and `2j + 1` (high half) as i16 lanes.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn scale_pair(a: i16, b: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(b), _mm_set1_epi16(a))
}

/// Two-bit field `t` (bits `2t`) of the 32 bytes at `qs[32n..]`: values
/// `128n + 32t..` of Q2_K and Q3_K.
///
/// # Safety
/// The CPU must have AVX2 and FMA. `n < 2` (the load reads `qs[32n..32n + 32]`).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn crumbs(qs: &[u8; 64], n: usize, t: usize) -> __m256i {
    // SAFETY: `n < 2`, so `qs[32n..][..32]` is in bounds (64 bytes).
    let q = _mm256_loadu_si256(qs.as_ptr().add(32 * n).cast());
    _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * t as i32)), _mm256_set1_epi8(3))
}

impl Simd for BlockQ2K {
    const SCALES_PER_16: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn vector(&self, j: usize) -> (__m256i, __m256i) {
        let s = |k: usize| i16::from(self.sc[k]);
        (crumbs(&self.qs, j / 4, j % 4), scale_pair(s(2 * j), s(2 * j + 1)))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn bias_weights(&self) -> __m256i {
        widen_u8(&self.m)
    }
}

impl Simd for BlockQ3K {
    const SCALES_PER_16: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn vector(&self, j: usize) -> (__m256i, __m256i) {
        // SAFETY: `hmask` is 32 bytes; the load reads exactly them.
        let h = _mm256_loadu_si256(self.hmask.as_ptr().cast());
        // Bit j of each hmask byte, moved to bit 2 of that byte.
        let bit = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(j as i32)), _mm256_set1_epi8(1));
        let v = _mm256_or_si256(crumbs(&self.qs, j / 4, j % 4), _mm256_slli_epi16(bit, 2));
        let s = |k: usize| i16::from(self.sc[k]);
        (v, scale_pair(s(2 * j), s(2 * j + 1)))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn bias_weights(&self) -> __m256i {
        widen_i8(&self.sc)
    }
}

/// Each 16-bit lane `2k, 2k + 1` of the result holds byte `k` of `m` (k < 8).
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
unsafe fn mins_pairs(m: &[u8; 8]) -> __m256i {
    // SAFETY: `m` is 8 bytes; the load reads exactly them.
    let v = _mm_loadl_epi64(m.as_ptr().cast());
    let dup = _mm_shuffle_epi8(v, _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7));
    _mm256_cvtepu8_epi16(dup)
}

/// # Safety
/// The CPU must have AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn bsums(a: &BlockQ8K) -> __m256i {
    // SAFETY: `bsums` is 16 i16 (32 bytes); the load reads exactly them.
    _mm256_loadu_si256(a.bsums.as_ptr().cast())
}

/// Nibble `j % 2` (low, then high) of the 32 bytes at `qs[32·(j / 2)..]`.
///
/// # Safety
/// The CPU must have AVX2 and FMA. `j < 8` (the load reads `qs[32·(j / 2)..][..32]`).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn nibbles(qs: &[u8; 128], j: usize) -> __m256i {
    // SAFETY: `j < 8`, so `qs[32·(j / 2)..][..32]` is in bounds (128 bytes).
    let q = _mm256_loadu_si256(qs.as_ptr().add(32 * (j / 2)).cast());
    _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(4 * (j % 2) as i32)), _mm256_set1_epi8(0x0F))
}

impl Simd for BlockQ4K {
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn bias_weights(&self) -> __m256i {
        mins_pairs(&self.m)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn vector(&self, j: usize) -> (__m256i, __m256i) {
        (nibbles(&self.qs, j), _mm256_set1_epi16(i16::from(self.sc[j])))
    }
}

impl Simd for BlockQ5K {
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn bias_weights(&self) -> __m256i {
        mins_pairs(&self.m)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn vector(&self, j: usize) -> (__m256i, __m256i) {
        // SAFETY: `qh` is 32 bytes; the load reads exactly them.
        let h = _mm256_loadu_si256(self.qh.as_ptr().cast());
        // Bit j of each qh byte, moved to bit 4 of that byte.
        let bit = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(j as i32)), _mm256_set1_epi8(1));
        let v = _mm256_or_si256(nibbles(&self.qs, j), _mm256_slli_epi16(bit, 4));
        (v, _mm256_set1_epi16(i16::from(self.sc[j])))
    }
}

impl Simd for BlockQ6K {
    const SCALES_PER_16: bool = true;
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn vector(&self, j: usize) -> (__m256i, __m256i) {
        // Values 128n + 32t: nibble t / 2 of ql[64n + 32·(t % 2)..], bits 2t of qh[32n..].
        let (n, t) = (j / 4, j % 4);
        // SAFETY: `j < 8`: `ql[64n + 32(t % 2)..][..32]` and `qh[32n..][..32]`
        // are in bounds (128 and 64 bytes).
        let ql = _mm256_loadu_si256(self.ql.as_ptr().add(64 * n + 32 * (t % 2)).cast());
        let h = _mm256_loadu_si256(self.qh.as_ptr().add(32 * n).cast());
        let low = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(4 * (t / 2) as i32)), _mm256_set1_epi8(0x0F));
        let high = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * t as i32)), _mm256_set1_epi8(3));
        let v = _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
        let s = |k: usize| _mm_set1_epi16(i16::from(self.sc[k]));
        (v, _mm256_set_m128i(s(2 * j + 1), s(2 * j)))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn bias_weights(&self) -> __m256i {
        widen_i8(&self.sc)
    }
}

/// The products of [`super::finish`] for four blocks, one per lane (`d`,
/// `dmin` the weight factors, `xd` the activation scales): what it adds,
/// and (with mins) what it then subtracts, each rounded as it rounds them.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn terms4(
    mins: bool,
    (d, dmin, xd): (__m128, __m128, __m128),
    sumi: __m128i,
    bias: __m128i,
) -> (__m128, Option<__m128>) {
    let d = _mm_mul_ps(d, xd);
    if mins {
        let minus = _mm_mul_ps(_mm_mul_ps(dmin, xd), _mm_cvtepi32_ps(bias));
        (_mm_mul_ps(d, _mm_cvtepi32_ps(sumi)), Some(minus))
    } else {
        (_mm_mul_ps(d, _mm_cvtepi32_ps(_mm_sub_epi32(sumi, bias))), None)
    }
}

/// [`super::finish`] for four rows at once, one per lane.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn finish4<B: Simd>(b: &B, a: [&BlockQ8K; 4], sumi: __m128i, bias: __m128i, acc: __m128) -> __m128 {
    let xd = _mm_set_ps(a[3].d, a[2].d, a[1].d, a[0].d);
    let (d, dmin) = b.factors();
    let (plus, minus) = terms4(B::MINS, (_mm_set1_ps(d), _mm_set1_ps(dmin), xd), sumi, bias);
    let acc = _mm_add_ps(acc, plus);
    minus.map_or(acc, |m| _mm_sub_ps(acc, m))
}

/// The products of values `32j..32j + 32` with the activations', scaled: eight i32 lanes.
///
/// # Safety
/// The CPU must have AVX2 and FMA. `j < 8` (the load reads `a.qs[32j..32j + 32]`).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn products(v: __m256i, s: __m256i, a: &BlockQ8K, j: usize) -> __m256i {
    // SAFETY: `j < 8`, so `qs[32j..32j + 32]` is in bounds (256 bytes).
    let q8 = _mm256_loadu_si256(a.qs.as_ptr().add(32 * j).cast());
    _mm256_madd_epi16(_mm256_maddubs_epi16(v, q8), s)
}

/// One block's integers in eight lanes each: the scaled products and the bias.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_lanes<B: Simd>(b: &B, a: &BlockQ8K) -> (__m256i, __m256i) {
    let mut sumi = _mm256_setzero_si256();
    for j in 0..8 {
        let (v, s) = b.vector(j);
        sumi = _mm256_add_epi32(sumi, products(v, s, a, j));
    }
    (sumi, B::bias(bsums(a), b.bias_weights()))
}

/// A one-row K-quant dot from `$lanes(b, a)`, one block's integers in
/// eight i32 lanes each: four blocks at a time through [`fold4`], the rest
/// through [`fold1`], so every kernel built on it is [`super::dot_scalar`]
/// bit for bit. A macro, not a function taking a closure, so that the
/// lanes compile inline with the calling kernel's target features.
macro_rules! one_row {
    ($w:expr, $x:expr, $lanes:path) => {{
        use $crate::model::kernels::kquant::simd::{fold1, fold4};
        let (w, x) = ($w, $x);
        let n = w.len().min(x.len());
        let mut acc = 0f32;
        let mut k = 0;
        while k + 4 <= n {
            let (b, a) = (&w[k..k + 4], &x[k..k + 4]);
            let lanes: [(__m256i, __m256i); 4] = std::array::from_fn(|t| $lanes(&b[t], &a[t]));
            acc = fold4(b, a, lanes, acc);
            k += 4;
        }
        for (b, a) in w[k..n].iter().zip(&x[k..n]) {
            acc = fold1(b, a, $lanes(b, a), acc);
        }
        acc
    }};
}
pub(super) use one_row;

/// The scalar `dot_scalar`, bit for bit: four blocks' lanes summed at once,
/// their products taken at once, then added to the sum in block order.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_avx2<B: Simd>(w: &[B], x: &[BlockQ8K]) -> f32 {
    one_row!(w, x, block_lanes)
}

/// Four blocks' integers (each block's products and bias in eight i32
/// lanes, as [`block_lanes`] gives them) summed at once, their products
/// taken at once, then added to `acc` in block order: [`super::finish`]
/// four times, bit for bit.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn fold4<B: Simd>(b: &[B], a: &[BlockQ8K], lanes: [(__m256i, __m256i); 4], mut acc: f32) -> f32 {
    let sumi = hsum4_epi32(lanes.map(|l| l.0));
    let bias = hsum4_epi32(lanes.map(|l| l.1));
    let xd = _mm_set_ps(a[3].d, a[2].d, a[1].d, a[0].d);
    let f: [(f32, f32); 4] = std::array::from_fn(|t| b[t].factors());
    let factors = (_mm_set_ps(f[3].0, f[2].0, f[1].0, f[0].0), _mm_set_ps(f[3].1, f[2].1, f[1].1, f[0].1), xd);
    let (plus, minus) = terms4(B::MINS, factors, sumi, bias);
    let (mut p, mut m) = ([0f32; 4], [0f32; 4]);
    // SAFETY (both): `p` and `m` are four f32.
    _mm_storeu_ps(p.as_mut_ptr(), plus);
    if let Some(minus) = minus {
        _mm_storeu_ps(m.as_mut_ptr(), minus);
    }
    for t in 0..4 {
        acc += p[t];
        if minus.is_some() {
            acc -= m[t];
        }
    }
    acc
}

/// One block's lanes summed and added to `acc`: [`super::finish`].
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn fold1<B: Simd>(b: &B, a: &BlockQ8K, (sumi, bias): (__m256i, __m256i), acc: f32) -> f32 {
    let zero = _mm256_setzero_si256();
    let sums = hsum4_epi32([sumi, bias, zero, zero]);
    super::finish(b, a, _mm_cvtsi128_si32(sums), _mm_extract_epi32(sums, 1), acc)
}

/// [`dot_avx2`] for four input rows sharing each vector's unpacking.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot4_avx2<B: Simd>(w: &[B], x: [&[BlockQ8K]; 4]) -> [f32; 4] {
    let mut acc = _mm_setzero_ps();
    let n = x.iter().map(|r| r.len()).min().unwrap_or(0).min(w.len());
    for (i, b) in w[..n].iter().enumerate() {
        let a = [&x[0][i], &x[1][i], &x[2][i], &x[3][i]];
        let mut sumi = [_mm256_setzero_si256(); 4];
        for j in 0..8 {
            let (v, s) = b.vector(j);
            for r in 0..4 {
                sumi[r] = _mm256_add_epi32(sumi[r], products(v, s, a[r], j));
            }
        }
        let bw = b.bias_weights();
        let bias = a.map(|a| B::bias(bsums(a), bw));
        acc = finish4(b, a, hsum4_epi32(sumi), hsum4_epi32(bias), acc);
    }
    let mut out = [0f32; 4];
    // SAFETY: `out` is four f32.
    _mm_storeu_ps(out.as_mut_ptr(), acc);
    out
}
