//! The K-quants on AVX-512 VNNI (256-bit vectors), eight input rows at a
//! time. The rows' activations are interleaved so that one `vpdpbusd`
//! multiplies four weight values (unsigned, broadcast to every lane) by the
//! matching four activations of each of eight rows and adds them to that
//! row's lane: a sub-block of 32 values costs eight instructions for eight
//! rows, against AVX2's three per 32 values per row, and needs no
//! horizontal sums. Each sub-block's sums are then scaled by `vpmulld`, and
//! the bias comes from the activation sums by `vpdpwssd`. These are the
//! scalar kernel's integers, exactly, and the float steps are its own, lane
//! by lane, so every output equals [`super::dot_scalar`] bit for bit,
//! whether its row ran in a group of eight, in four on the AVX2 kernel or
//! (rows left over, decode) on the 512-bit one-row kernel ([`super::wide`]).

use std::arch::x86_64::*;

use super::simd::{dot4_avx2, Simd};
use super::wide::{dot_wide, Wide};
use super::BlockQ8K;

/// Eight input rows' block, interleaved for `vpdpbusd` and `vpdpwssd`:
/// `q[c]` holds activations `4c..4c + 4` of each row (row `i` in bytes
/// `4i..4i + 4`); `bs[p]` each row's sums of the 16-value groups `2p` and
/// `2p + 1` (row `i` in i16 lanes `2i`, `2i + 1`); `d` the rows' scales.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Q8Kx8 {
    q: [[i8; 32]; 64],
    bs: [[i16; 16]; 8],
    d: [f32; 8],
}

/// Input rows `8g..8g + 8` of `xq` (rows of `per_row` blocks) as
/// [`Q8Kx8`], group after group, `per_row` blocks each.
fn interleave(xq: &[BlockQ8K], per_row: usize, groups: usize) -> Vec<Q8Kx8> {
    let mut out = Vec::with_capacity(groups * per_row);
    for g in 0..groups {
        for b in 0..per_row {
            let mut x = Q8Kx8 { q: [[0; 32]; 64], bs: [[0; 16]; 8], d: [0.0; 8] };
            for i in 0..8 {
                let blk = &xq[(8 * g + i) * per_row + b];
                x.d[i] = blk.d;
                for (c, four) in blk.qs.chunks_exact(4).enumerate() {
                    x.q[c][4 * i..4 * i + 4].copy_from_slice(four);
                }
                for (p, pair) in blk.bsums.chunks_exact(2).enumerate() {
                    x.bs[p][2 * i..2 * i + 2].copy_from_slice(pair);
                }
            }
            out.push(x);
        }
    }
    out
}

/// `x · wᵀ` for `m` input rows of `per_row` blocks (`xq`): groups of eight
/// rows on [`dots8`], two groups per pass over a weight row where there
/// are; the rest four at a time on [`dot4_avx2`], then one at a time on
/// [`dot_wide`] (decode's one row too).
pub(super) fn matmul<B: Wide>(w: &[B], rows: usize, per_row: usize, xq: &[BlockQ8K], m: usize) -> Vec<f32> {
    let xg = interleave(xq, per_row, m / 8);
    let xrow = |i: usize| &xq[i * per_row..(i + 1) * per_row];
    let grow = |g: usize| &xg[g * per_row..(g + 1) * per_row];
    // SAFETY (every kernel call below): this path is taken only when
    // `kquant_isa()` chose VNNI, after run-time detection of AVX2, FMA,
    // AVX-512F, BW, VL and VNNI.
    let sweep = |wr: &[B], first: usize, n: usize, out: &mut [f32], stride: usize| {
        super::super::sweep_groups(
            first,
            n,
            out,
            stride,
            |g| unsafe { dots8::<B, 2>(wr, [grow(g), grow(g + 1)]) },
            |g| unsafe { dots8::<B, 1>(wr, [grow(g)])[0] },
            |r, out: &mut [f32]| {
                let left = out.len().div_ceil(stride);
                let mut k = 0;
                if left >= 4 {
                    let v = unsafe { dot4_avx2(wr, [xrow(r), xrow(r + 1), xrow(r + 2), xrow(r + 3)]) };
                    for (t, x) in v.into_iter().enumerate() {
                        out[t * stride] = x;
                    }
                    k = 4;
                }
                for k in k..left {
                    out[k * stride] = unsafe { dot_wide(wr, xrow(r + k)) };
                }
            },
        )
    };
    let row_bytes = per_row * std::mem::size_of::<BlockQ8K>();
    super::super::par_tiles(w, rows, per_row, m, row_bytes, |wr| unsafe { dot_wide(wr, xq) }, sweep)
}

/// One weight row against `G` groups of eight interleaved input rows:
/// lane `i` of group `g` is row `i`'s dot.
///
/// # Safety
/// The CPU must have AVX2, FMA, AVX-512 VNNI and AVX-512VL.
#[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
unsafe fn dots8<B: Simd, const G: usize>(w: &[B], xs: [&[Q8Kx8]; G]) -> [[f32; 8]; G] {
    let zero = _mm256_setzero_si256();
    let mut acc = [_mm256_setzero_ps(); G];
    let n = xs.iter().map(|x| x.len()).min().unwrap_or(0).min(w.len());
    for (bi, b) in w[..n].iter().enumerate() {
        // The 256 values as bytes, so that each four are one i32 to broadcast.
        let mut words = [0i32; 64];
        for j in 0..8 {
            // SAFETY: AVX2 is enabled; `words[8j..8j + 8]` is 32 bytes in bounds (j < 8).
            _mm256_storeu_si256(words.as_mut_ptr().add(8 * j).cast(), b.vector(j).0);
        }
        let s = b.scales16();
        let mut bw = [0i32; 8];
        // SAFETY: `bw` is 32 bytes.
        _mm256_storeu_si256(bw.as_mut_ptr().cast(), b.bias_weights());
        let x: [&Q8Kx8; G] = std::array::from_fn(|g| &xs[g][bi]);
        let mut sumi = [zero; G];
        for j in 0..8 {
            // Values 32j..32j + 16 in `lo`, the rest in `hi` where they have their own scale.
            let (mut lo, mut hi) = ([zero; G], [zero; G]);
            for k in 0..8 {
                let wk = _mm256_set1_epi32(words[8 * j + k]);
                for g in 0..G {
                    // SAFETY: `Q8Kx8` is 32-byte aligned and each `q[c]` is 32 bytes at a multiple of 32.
                    let q = _mm256_load_si256(x[g].q[8 * j + k].as_ptr().cast());
                    if k < 4 || !B::SCALES_PER_16 {
                        lo[g] = _mm256_dpbusd_epi32(lo[g], wk, q);
                    } else {
                        hi[g] = _mm256_dpbusd_epi32(hi[g], wk, q);
                    }
                }
            }
            for g in 0..G {
                sumi[g] = _mm256_add_epi32(sumi[g], _mm256_mullo_epi32(lo[g], _mm256_set1_epi32(s[2 * j])));
                if B::SCALES_PER_16 {
                    sumi[g] = _mm256_add_epi32(sumi[g], _mm256_mullo_epi32(hi[g], _mm256_set1_epi32(s[2 * j + 1])));
                }
            }
        }
        let (d, dmin) = b.factors();
        for g in 0..G {
            let mut bias = zero;
            for (p, &pair) in bw.iter().enumerate() {
                // SAFETY: each `bs[p]` is 32 bytes at a multiple of 32 in a 32-byte aligned struct.
                bias =
                    _mm256_dpwssd_epi32(bias, _mm256_load_si256(x[g].bs[p].as_ptr().cast()), _mm256_set1_epi32(pair));
            }
            // SAFETY: `d` is eight f32 at a multiple of 32 in a 32-byte aligned struct.
            let xd = _mm256_load_ps(x[g].d.as_ptr());
            let dx = _mm256_mul_ps(_mm256_set1_ps(d), xd);
            acc[g] = if !B::MINS {
                let shift = _mm_cvtsi32_si128(B::OFFSET_SHIFT as i32);
                let lanes = _mm256_sub_epi32(sumi[g], _mm256_sll_epi32(bias, shift));
                _mm256_add_ps(acc[g], _mm256_mul_ps(dx, _mm256_cvtepi32_ps(lanes)))
            } else {
                let a = _mm256_add_ps(acc[g], _mm256_mul_ps(dx, _mm256_cvtepi32_ps(sumi[g])));
                _mm256_sub_ps(a, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(dmin), xd), _mm256_cvtepi32_ps(bias)))
            };
        }
    }
    let mut out = [[0f32; 8]; G];
    for (o, a) in out.iter_mut().zip(acc) {
        // SAFETY: `o` is eight f32.
        _mm256_storeu_ps(o.as_mut_ptr(), a);
    }
    out
}
