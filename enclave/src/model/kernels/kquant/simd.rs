//! AVX2 forms of the K-quant dots: the scalar kernels' lanes, computed
//! with `maddubs` (unsigned value × signed activation, pairs to i16, no
//! saturation: at most 2·63·127) and `madd` (pairs to i32 times the
//! sub-block's scale), then the same float steps.

use std::arch::x86_64::*;

use super::{BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, Finish};

/// The vector side of a format.
pub(crate) trait Simd: Finish {
    /// The 256 unsigned values as eight vectors of 32 in weight order, and
    /// each vector's scales as i16 (low half: its first 16 values, high
    /// half: the other 16).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    unsafe fn unpack(&self) -> ([__m256i; 8], [__m256i; 8]);
    /// [`super::bias_lanes`] from the activation block's sums.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    unsafe fn bias(&self, a: &BlockQ8K) -> __m256i;
}

/// Each 16-bit lane `2k, 2k + 1` of the result holds byte `k` of `m` (k < 8).
#[target_feature(enable = "avx2,fma")]
unsafe fn mins_pairs(m: &[u8; 8]) -> __m256i {
    // SAFETY: `m` is 8 bytes; the load reads exactly them.
    let v = _mm_loadl_epi64(m.as_ptr().cast());
    let dup = _mm_shuffle_epi8(v, _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7));
    _mm256_cvtepu8_epi16(dup)
}

#[target_feature(enable = "avx2,fma")]
unsafe fn bsums(a: &BlockQ8K) -> __m256i {
    // SAFETY: `bsums` is 16 i16 (32 bytes); the load reads exactly them.
    _mm256_loadu_si256(a.bsums.as_ptr().cast())
}

/// Q4_K/Q5_K: one scale for each vector of 32.
#[target_feature(enable = "avx2,fma")]
unsafe fn scales32(sc: &[u8; 8]) -> [__m256i; 8] {
    sc.map(|s| _mm256_set1_epi16(i16::from(s)))
}

impl Simd for BlockQ4K {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn unpack(&self) -> ([__m256i; 8], [__m256i; 8]) {
        let m4 = _mm256_set1_epi8(0x0F);
        let mut v = [_mm256_setzero_si256(); 8];
        for c in 0..4 {
            // SAFETY: `qs[32c..32c + 32]` is in bounds (c < 4, 128 bytes).
            let q = _mm256_loadu_si256(self.qs.as_ptr().add(32 * c).cast());
            v[2 * c] = _mm256_and_si256(q, m4);
            v[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        }
        (v, scales32(&self.sc))
    }
    #[target_feature(enable = "avx2,fma")]
    unsafe fn bias(&self, a: &BlockQ8K) -> __m256i {
        _mm256_madd_epi16(bsums(a), mins_pairs(&self.m))
    }
}

impl Simd for BlockQ5K {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn unpack(&self) -> ([__m256i; 8], [__m256i; 8]) {
        let m4 = _mm256_set1_epi8(0x0F);
        let one = _mm256_set1_epi8(1);
        // SAFETY: `qh` is 32 bytes; the load reads exactly them.
        let h = _mm256_loadu_si256(self.qh.as_ptr().cast());
        let mut v = [_mm256_setzero_si256(); 8];
        for c in 0..4 {
            // SAFETY: `qs[32c..32c + 32]` is in bounds (c < 4, 128 bytes).
            let q = _mm256_loadu_si256(self.qs.as_ptr().add(32 * c).cast());
            // Bit 2c (and 2c + 1) of each qh byte, moved to bit 4 of that byte.
            let bit = |s: i32| {
                let b = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(s)), one);
                _mm256_slli_epi16(b, 4)
            };
            v[2 * c] = _mm256_or_si256(_mm256_and_si256(q, m4), bit(2 * c as i32));
            v[2 * c + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), bit(2 * c as i32 + 1));
        }
        (v, scales32(&self.sc))
    }
    #[target_feature(enable = "avx2,fma")]
    unsafe fn bias(&self, a: &BlockQ8K) -> __m256i {
        _mm256_madd_epi16(bsums(a), mins_pairs(&self.m))
    }
}

impl Simd for BlockQ6K {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn unpack(&self) -> ([__m256i; 8], [__m256i; 8]) {
        let m4 = _mm256_set1_epi8(0x0F);
        let m2 = _mm256_set1_epi8(3);
        let mut v = [_mm256_setzero_si256(); 8];
        for n in 0..2 {
            // SAFETY: `ql[64n..64n + 64]` and `qh[32n..32n + 32]` are in
            // bounds (n < 2; 128 and 64 bytes).
            let ql0 = _mm256_loadu_si256(self.ql.as_ptr().add(64 * n).cast());
            let ql1 = _mm256_loadu_si256(self.ql.as_ptr().add(64 * n + 32).cast());
            let h = _mm256_loadu_si256(self.qh.as_ptr().add(32 * n).cast());
            // Two bits of qh moved to bits 4 and 5 of their byte.
            let high = |s: i32| {
                let b = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(s)), m2);
                _mm256_slli_epi16(b, 4)
            };
            v[4 * n] = _mm256_or_si256(_mm256_and_si256(ql0, m4), high(0));
            v[4 * n + 1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), high(2));
            v[4 * n + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), high(4));
            v[4 * n + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), high(6));
        }
        let s = |j: usize| _mm_set1_epi16(i16::from(self.sc[j]));
        let scales = std::array::from_fn(|v| _mm256_set_m128i(s(2 * v + 1), s(2 * v)));
        (v, scales)
    }
    #[target_feature(enable = "avx2,fma")]
    unsafe fn bias(&self, a: &BlockQ8K) -> __m256i {
        // SAFETY: `sc` is 16 bytes; the load reads exactly them.
        let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(self.sc.as_ptr().cast()));
        _mm256_slli_epi32(_mm256_madd_epi16(bsums(a), sc), 5)
    }
}

/// Lanes of one unpacked weight block against one activation block.
#[target_feature(enable = "avx2,fma")]
unsafe fn lanes(v: &[__m256i; 8], s: &[__m256i; 8], a: &BlockQ8K) -> __m256i {
    let mut sumi = _mm256_setzero_si256();
    for j in 0..8 {
        // SAFETY: `qs[32j..32j + 32]` is in bounds (j < 8, 256 bytes).
        let q8 = _mm256_loadu_si256(a.qs.as_ptr().add(32 * j).cast());
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(v[j], q8), s[j]));
    }
    sumi
}

/// `acc` after one block: the scalar kernel's float steps, eight lanes at once.
#[target_feature(enable = "avx2,fma")]
unsafe fn step<B: Simd>(b: &B, a: &BlockQ8K, sumi: __m256i, acc: __m256 ) -> __m256 {
    let (d, dm) = b.scales(a);
    let bias = b.bias(a);
    if b.mins().is_some() {
        let acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi)));
        _mm256_sub_ps(acc, _mm256_mul_ps(_mm256_set1_ps(dm), _mm256_cvtepi32_ps(bias)))
    } else {
        let lanes = _mm256_cvtepi32_ps(_mm256_sub_epi32(sumi, bias));
        _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(d), lanes))
    }
}

/// The scalar `dot_scalar`, bit for bit.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_avx2<B: Simd>(w: &[B], x: &[BlockQ8K]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (b, a) in w.iter().zip(x) {
        let (v, s) = b.unpack();
        acc = step(b, a, lanes(&v, &s, a), acc);
    }
    super::super::hsum(acc)
}

/// [`dot_avx2`] for four input rows sharing each block's unpacking.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot4_avx2<B: Simd>(w: &[B], x: [&[BlockQ8K]; 4]) -> [f32; 4] {
    let mut acc = [_mm256_setzero_ps(); 4];
    let n = x.iter().map(|r| r.len()).min().unwrap_or(0).min(w.len());
    for (i, b) in w[..n].iter().enumerate() {
        let (v, s) = b.unpack();
        for r in 0..4 {
            let a = &x[r][i];
            acc[r] = step(b, a, lanes(&v, &s, a), acc[r]);
        }
    }
    acc.map(|a| super::super::hsum(a))
}
