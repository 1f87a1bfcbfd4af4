//! The K-quants' batches on AVX-512 VNNI (512-bit vectors), four weight
//! rows against sixteen input rows at a time. The rows' activations are
//! interleaved so that one `vpdpbusd` multiplies four weight values
//! (unsigned, broadcast to every lane) by the matching four activations of
//! each of sixteen rows and adds them to that row's lane, and each load of
//! activations serves the four weight rows: a sub-block of 32 values costs
//! eight instructions for sixteen rows, and needs no horizontal sums. Each
//! sub-block's sums are then scaled by `vpmulld`, and the bias comes from
//! the activation sums by `vpdpwssd`. These are the scalar kernel's
//! integers, exactly, and the float steps are its own, lane by lane, so
//! every output equals [`super::dot_scalar`] bit for bit, whether its row
//! ran in a group of sixteen or (decode) on the 512-bit one-row kernel
//! ([`super::wide`]).

use std::arch::x86_64::*;

use super::simd::Simd;
use super::wide::{dot_wide, Wide};
use super::BlockQ8K;

/// Sixteen input rows' block, interleaved for 512-bit `vpdpbusd` and
/// `vpdpwssd`: `q[c]` holds activations `4c..4c + 4` of each row (row `i`
/// in bytes `4i..4i + 4`); `bs[p]` each row's sums of the 16-value groups
/// `2p` and `2p + 1` (row `i` in i16 lanes `2i`, `2i + 1`); `d` the rows'
/// scales. Rows past the input's end are zeros, whose dots are 0 and unread.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Q8Kx16 {
    q: [[i8; 64]; 64],
    bs: [[i16; 32]; 8],
    d: [f32; 16],
}

/// Input rows `16g..16g + 16` of `xq` (`m` rows of `per_row` blocks) as
/// [`Q8Kx16`], group after group (the last padded with zero rows),
/// `per_row` blocks each.
fn interleave16(xq: &[BlockQ8K], per_row: usize, m: usize) -> Vec<Q8Kx16> {
    let groups = m.div_ceil(16);
    let mut out = Vec::with_capacity(groups * per_row);
    for g in 0..groups {
        for b in 0..per_row {
            let mut x = Q8Kx16 { q: [[0; 64]; 64], bs: [[0; 32]; 8], d: [0.0; 16] };
            for i in (0..16).take_while(|i| 16 * g + i < m) {
                let blk = &xq[(16 * g + i) * per_row + b];
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

use super::super::PANEL_ROWS;

/// `x · wᵀ` for `m` input rows of `per_row` blocks (`xq`): batches on
/// [`panel`], four weight rows at a time against groups of sixteen input
/// rows (the last padded); decode's one row on [`dot_wide`].
pub(super) fn matmul<B: Wide>(w: &[B], rows: usize, per_row: usize, xq: &[BlockQ8K], m: usize) -> Vec<f32> {
    let xg = if m > 1 { interleave16(xq, per_row, m) } else { Vec::new() };
    let wrow = |j: usize| &w[j * per_row..(j + 1) * per_row];
    // SAFETY (every kernel call below): this path is taken only when
    // `kquant_isa()` chose VNNI, after run-time detection of AVX2, FMA,
    // AVX-512F, BW, VL and VNNI.
    let sweep = |js: std::ops::Range<usize>, first: usize, n: usize, out: &mut [f32]| {
        debug_assert!(first.is_multiple_of(16), "row {first} does not start a group");
        let groups: Vec<&[Q8Kx16]> =
            (first / 16..(first + n).div_ceil(16)).map(|g| &xg[g * per_row..(g + 1) * per_row]).collect();
        let four = |j: usize, lanes: &mut [[f32; 16]]| {
            let ws = std::array::from_fn(|t| wrow(j + t));
            unsafe { panel::<B, PANEL_ROWS>(ws, &groups, lanes) }
        };
        let one = |j: usize, lanes: &mut [[f32; 16]]| unsafe { panel::<B, 1>([wrow(j)], &groups, lanes) };
        super::super::run_panels(js, n, groups.len(), out, four, one);
    };
    let row_bytes = per_row * std::mem::size_of::<BlockQ8K>();
    super::super::par_panels(w, rows, per_row, m, row_bytes, |wr| unsafe { dot_wide(wr, xq) }, sweep)
}

/// `R` weight rows against groups of sixteen interleaved input rows: lane
/// `i` of `out[r * xs.len() + g]` is weight row `r`'s dot with row `i` of
/// group `g`. Each block of the `R` rows is unpacked once (its values'
/// words stored for broadcast, its scales and bias weights), then every
/// group passes it: each word of activations loaded once serves the `R`
/// rows' `vpdpbusd`s. The integers are the scalar kernel's, exactly, and
/// the float steps its own, lane by lane, so every output equals
/// [`super::dot_scalar`] bit for bit.
///
/// # Safety
/// The CPU must have AVX2, FMA, AVX-512F, VNNI and VL.
#[target_feature(enable = "avx2,fma,avx512f,avx512vnni,avx512vl")]
unsafe fn panel<B: Simd, const R: usize>(w: [&[B]; R], xs: &[&[Q8Kx16]], out: &mut [[f32; 16]]) {
    let n = xs.iter().map(|x| x.len()).chain(w.iter().map(|w| w.len())).min().unwrap_or(0);
    let mut acc = vec![[_mm512_setzero_ps(); R]; xs.len()];
    for bi in 0..n {
        let mut words = [[0i32; 64]; R];
        let mut s = [[0i32; 16]; R];
        let mut bw = [[0i32; 8]; R];
        let mut f = [(0f32, 0f32); R];
        for r in 0..R {
            let b = &w[r][bi];
            for j in 0..8 {
                // SAFETY: AVX2 is enabled; `words[r][8j..8j + 8]` is 32 bytes in bounds (j < 8).
                _mm256_storeu_si256(words[r].as_mut_ptr().add(8 * j).cast(), b.vector(j).0);
            }
            s[r] = b.scales16();
            // SAFETY: `bw[r]` is 32 bytes.
            _mm256_storeu_si256(bw[r].as_mut_ptr().cast(), b.bias_weights());
            f[r] = b.factors();
        }
        for (x, acc) in xs.iter().map(|x| &x[bi]).zip(acc.iter_mut()) {
            // SAFETY: the features `panel_block` needs are enabled here.
            unsafe { panel_block::<B, R>(x, &words, &s, &bw, &f, acc) };
        }
    }
    for (g, acc) in acc.iter().enumerate() {
        for (r, a) in acc.iter().enumerate() {
            // SAFETY: `out[..]` is sixteen f32.
            _mm512_storeu_ps(out[r * xs.len() + g].as_mut_ptr(), *a);
        }
    }
}

/// One block of [`panel`]'s `R` weight rows against one group `x`, added
/// to the rows' float sums `acc`.
///
/// # Safety
/// The CPU must have AVX2, FMA, AVX-512F, VNNI and VL.
#[inline]
#[target_feature(enable = "avx2,fma,avx512f,avx512vnni,avx512vl")]
#[allow(clippy::needless_range_loop)] // `r` indexes several rows' arrays in step.
unsafe fn panel_block<B: Simd, const R: usize>(
    x: &Q8Kx16,
    words: &[[i32; 64]; R],
    s: &[[i32; 16]; R],
    bw: &[[i32; 8]; R],
    f: &[(f32, f32); R],
    acc: &mut [__m512; R],
) {
    // Opaque to the optimiser, so the broadcasts stay loads beside their
    // `vpdpbusd`s rather than hoisted into registers out of the groups' loop.
    let words = std::hint::black_box(words);
    let zero = _mm512_setzero_si512();
    let mut sumi = [zero; R];
    for j in 0..8 {
        // Values 32j..32j + 16 in `lo`, the rest in `hi` where they have their own scale.
        let (mut lo, mut hi) = ([zero; R], [zero; R]);
        for k in 0..8 {
            // SAFETY: `Q8Kx16` is 64-byte aligned and each `q[c]` is 64 bytes at a multiple of 64.
            let q = _mm512_load_si512(x.q[8 * j + k].as_ptr().cast());
            for r in 0..R {
                let wk = _mm512_set1_epi32(words[r][8 * j + k]);
                if k < 4 || !B::SCALES_PER_16 {
                    lo[r] = _mm512_dpbusd_epi32(lo[r], wk, q);
                } else {
                    hi[r] = _mm512_dpbusd_epi32(hi[r], wk, q);
                }
            }
        }
        for r in 0..R {
            sumi[r] = _mm512_add_epi32(sumi[r], _mm512_mullo_epi32(lo[r], _mm512_set1_epi32(s[r][2 * j])));
            if B::SCALES_PER_16 {
                sumi[r] = _mm512_add_epi32(sumi[r], _mm512_mullo_epi32(hi[r], _mm512_set1_epi32(s[r][2 * j + 1])));
            }
        }
    }
    // SAFETY: `d` is sixteen f32 at a multiple of 64 in a 64-byte aligned struct.
    let xd = _mm512_load_ps(x.d.as_ptr());
    let mut bias = [zero; R];
    for p in 0..8 {
        // SAFETY: each `bs[p]` is 64 bytes at a multiple of 64 in a 64-byte aligned struct.
        let sums = _mm512_load_si512(x.bs[p].as_ptr().cast());
        for r in 0..R {
            bias[r] = _mm512_dpwssd_epi32(bias[r], sums, _mm512_set1_epi32(bw[r][p]));
        }
    }
    for r in 0..R {
        let (d, dmin) = f[r];
        let dx = _mm512_mul_ps(_mm512_set1_ps(d), xd);
        acc[r] = if !B::MINS {
            let lanes = _mm512_sub_epi32(sumi[r], _mm512_sll_epi32(bias[r], _mm_cvtsi32_si128(B::OFFSET_SHIFT as i32)));
            _mm512_add_ps(acc[r], _mm512_mul_ps(dx, _mm512_cvtepi32_ps(lanes)))
        } else {
            let a = _mm512_add_ps(acc[r], _mm512_mul_ps(dx, _mm512_cvtepi32_ps(sumi[r])));
            _mm512_sub_ps(a, _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(dmin), xd), _mm512_cvtepi32_ps(bias[r])))
        };
    }
}
