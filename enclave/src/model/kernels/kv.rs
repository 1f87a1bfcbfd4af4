//! The f16-KV attention primitives: `q · k` and `y += a·v` over f16 cache
//! rows, with an AVX2/F16C path chosen at run time and a scalar one that
//! defines the arithmetic.

use half::f16;

#[cfg(target_arch = "x86_64")]
use super::{has_f16c, hsum};

/// `Σ q[i]·k[i]` over an f32 query and an f16 key.
pub fn dot_f16(q: &[f32], k: &[f16]) -> f32 {
    debug_assert_eq!(q.len(), k.len());
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: AVX2, FMA and F16C were detected at run time.
        return unsafe { dot_f16_avx2(q, k) };
    }
    q.iter().zip(k).map(|(a, b)| a * b.to_f32()).sum()
}

/// `y[i] += a·v[i]` over an f16 value row.
pub fn axpy_f16(y: &mut [f32], a: f32, v: &[f16]) {
    debug_assert_eq!(y.len(), v.len());
    #[cfg(target_arch = "x86_64")]
    if has_f16c() {
        // SAFETY: AVX2, FMA and F16C were detected at run time.
        return unsafe { axpy_f16_avx2(y, a, v) };
    }
    for (o, b) in y.iter_mut().zip(v) {
        *o += a * b.to_f32();
    }
}

/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16_avx2(q: &[f32], k: &[f16]) -> f32 {
    use std::arch::x86_64::*;
    let n = q.len().min(k.len());
    let body = n - n % 8;
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 8 <= n`, so both loads stay inside their slices;
        // `f16` is a transparent u16, so 8 of them are 16 bytes.
        let kv = _mm256_cvtph_ps(_mm_loadu_si128(k.as_ptr().add(i).cast()));
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(i)), kv, acc);
        i += 8;
    }
    let mut s = hsum(acc);
    for j in body..n {
        s += q[j] * k[j].to_f32();
    }
    s
}

/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_f16_avx2(y: &mut [f32], a: f32, v: &[f16]) {
    use std::arch::x86_64::*;
    let n = y.len().min(v.len());
    let body = n - n % 8;
    let av = _mm256_set1_ps(a);
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 8 <= n` for both slices (see `dot_f16_avx2`).
        let vv = _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(i).cast()));
        let p = y.as_mut_ptr().add(i);
        _mm256_storeu_ps(p, _mm256_fmadd_ps(av, vv, _mm256_loadu_ps(p)));
        i += 8;
    }
    for j in body..n {
        y[j] += a * v[j].to_f32();
    }
}
