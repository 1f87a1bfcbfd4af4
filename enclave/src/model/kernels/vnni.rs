//! The grouped AVX-512 VNNI kernels of Q8_0-activation products: eight
//! input rows interleaved per block so one `vpdpbusd` serves them all.

use super::*;

/// Eight Q8_0 input rows' block `b`, interleaved for `vpdpbusd`: `q[j]`
/// holds bytes `4j..4j + 4` of each row's block (row `i` in bytes
/// `4i..4i + 4`), offset by +128 to u8 (inputs are quantized to ±127, so
/// 1..=255), and `d` the rows' scales.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub(super) struct Q80x8 {
    q: [[u8; 32]; 8],
    d: [f32; 8],
}

/// Input rows `8g..8g + 8` of `xq` (rows of `per_row` blocks) as
/// [`Q80x8`], group after group, `per_row` blocks each.
#[cfg(target_arch = "x86_64")]
pub(super) fn interleave_q80(xq: &[BlockQ80], per_row: usize, groups: usize) -> Vec<Q80x8> {
    let mut out = Vec::with_capacity(groups * per_row);
    for g in 0..groups {
        for b in 0..per_row {
            let mut x = Q80x8 { q: [[0; 32]; 8], d: [0.0; 8] };
            for i in 0..8 {
                let blk = &xq[(8 * g + i) * per_row + b];
                x.d[i] = blk.d;
                for (j, chunk) in blk.qs.chunks_exact(4).enumerate() {
                    for (k, &v) in chunk.iter().enumerate() {
                        x.q[j][4 * i + k] = (v as u8) ^ 0x80;
                    }
                }
            }
            out.push(x);
        }
    }
    out
}

/// A block of 32 signed 8-bit weights with one scale, as the VNNI Q8_0
/// kernels read it: Q8_0's own blocks, and MXFP4's expanded in registers.
#[cfg(target_arch = "x86_64")]
pub(crate) trait I8Block: Sync {
    /// The block's scale.
    fn scale(&self) -> f32;
    /// The 32 weights, in order.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    unsafe fn weights(&self) -> std::arch::x86_64::__m256i;
    /// The 32 weights plus 128, as unsigned bytes (`vpdpbusd`'s unsigned side).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn weights_u8(&self) -> std::arch::x86_64::__m256i {
        use std::arch::x86_64::*;
        // SAFETY: AVX2 is enabled here.
        _mm256_xor_si256(unsafe { self.weights() }, _mm256_set1_epi8(i8::MIN))
    }
    /// The 32 weights' magnitudes (as unsigned bytes), and bytes whose
    /// signs are the weights' (`_mm256_sign_epi8`'s second operand: zero
    /// only where the weight is).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn magnitudes_signs(&self) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i) {
        use std::arch::x86_64::*;
        // SAFETY: AVX2 is enabled here.
        let w = unsafe { self.weights() };
        (_mm256_sign_epi8(w, w), w)
    }
    /// What each of the 16 sums of two neighbouring products is multiplied
    /// by before they are added: 1, except in blocks with a scale per 16
    /// weights, whose two halves carry integer multipliers (the VNNI kernels,
    /// which sum four products at once, do not run those).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn pair_weights(&self) -> std::arch::x86_64::__m256i {
        std::arch::x86_64::_mm256_set1_epi16(1)
    }
    /// The scale of each of the eight i32 lanes of the block's integer dot
    /// (lanes 0–3 sum weights 0–15, lanes 4–7 weights 16–31): the block's
    /// scale, except in blocks whose halves have scales of their own (NVFP4;
    /// the VNNI kernels, which read [`I8Block::scale`], do not run those).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn lane_scales(&self) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_set1_ps(self.scale())
    }
}

#[cfg(target_arch = "x86_64")]
impl I8Block for BlockQ80 {
    fn scale(&self) -> f32 {
        self.d
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn weights(&self) -> std::arch::x86_64::__m256i {
        // SAFETY: `qs` is 32 bytes; the unaligned load reads exactly it.
        unsafe { std::arch::x86_64::_mm256_loadu_si256(self.qs.as_ptr().cast()) }
    }
}

/// Q8_0 `x · wᵀ` on the VNNI kernels, the scalar kernel's arithmetic
/// exactly (each block's integer dot, times `w.d · x.d`, added into the
/// partial sums of [`sum4`]), so every output equals [`q80_dot_scalar`]
/// bit for bit whether its input row ran in a group of eight or alone.
/// Groups of eight input rows run on [`q80_dots8_vnni`]: one `vpdpbusd`
/// per four bytes of a weight block serves eight rows, with no horizontal
/// sums; the rows left over (and decode) run on [`q80_dot_vnni`]. `w` is
/// Q8_0 or MXFP4 blocks.
#[cfg(target_arch = "x86_64")]
pub(super) fn q80_matmul_vnni<B: I8Block>(w: &[B], rows: usize, per_row: usize, xq: &[BlockQ80], m: usize) -> Vec<f32> {
    let xg = interleave_q80(xq, per_row, m / 8);
    let xd: Vec<f32> = xq.iter().map(|b| b.d).collect();
    let xs: Vec<i32> = xq.iter().map(|b| 128 * b.qs.iter().map(|&q| i32::from(q)).sum::<i32>()).collect();
    let xrow = |i: usize| {
        let r = i * per_row..(i + 1) * per_row;
        (&xq[r.clone()], &xd[r.clone()], &xs[r])
    };
    let grow = |g: usize| &xg[g * per_row..(g + 1) * per_row];
    // SAFETY (all three calls): this path is taken only when `q80_isa()`
    // chose VNNI, after run-time detection of AVX2, FMA, AVX512-VNNI and
    // AVX512-VL.
    let sweep = |wr: &[B], first: usize, n: usize, out: &mut [f32], stride: usize| {
        sweep_groups(
            first,
            n,
            out,
            stride,
            |g| unsafe { q80_dots8_vnni::<B, 2>(wr, [grow(g), grow(g + 1)]) },
            |g| unsafe { q80_dots8_vnni::<B, 1>(wr, [grow(g)])[0] },
            |r, out: &mut [f32]| {
                for (k, o) in out.iter_mut().step_by(stride).enumerate() {
                    let (x, d, s) = xrow(r + k);
                    *o = unsafe { q80_dot_vnni(wr, x, d, s) };
                }
            },
        )
    };
    par_tiles(
        w,
        rows,
        per_row,
        m,
        per_row * std::mem::size_of::<BlockQ80>(),
        |wr| unsafe { q80_dot_vnni(wr, xq, &xd, &xs) },
        sweep,
    )
}

/// A grouped kernel's sweep (see [`par_tiles`]): one weight row's dots
/// with input rows `first..first + n` (`first` a multiple of 8), written
/// at `out[i * stride]`. Sixteen rows at a time by `two(g)` (groups `g` and
/// `g + 1` of eight interleaved rows), then eight by `one(g)`, then the
/// rest by `rest(first row, out)`, `out` starting at that row's output (its
/// length covers the rest at `stride`).
#[cfg(target_arch = "x86_64")]
pub(super) fn sweep_groups(
    first: usize,
    n: usize,
    out: &mut [f32],
    stride: usize,
    two: impl Fn(usize) -> [[f32; 8]; 2],
    one: impl Fn(usize) -> [f32; 8],
    rest: impl Fn(usize, &mut [f32]),
) {
    debug_assert!(first.is_multiple_of(8), "row {first} does not start a group");
    let mut i = 0;
    while i + 16 <= n {
        for (k, x) in two((first + i) / 8).iter().flatten().enumerate() {
            out[(i + k) * stride] = *x;
        }
        i += 16;
    }
    if i + 8 <= n {
        for (k, x) in one((first + i) / 8).iter().enumerate() {
            out[(i + k) * stride] = *x;
        }
        i += 8;
    }
    if i < n {
        rest(first + i, &mut out[i * stride..(n - 1) * stride + 1]);
    }
}

/// One weight row against `G` groups of eight interleaved input rows:
/// lane `i` of group `g` is row `i`'s dot, [`q80_dot_scalar`]'s arithmetic
/// (the four partial sums of [`sum4`] in four registers).
/// `vpdpbusd` multiplies the inputs offset to u8 by the weights as i8, so
/// each block's sum is `Σ (x + 128)·w = Σ x·w + 128·Σ w` (at most
/// 32·255·128, exact in i32) and loses `128·Σ w` to give the integer dot.
///
/// # Safety
/// The CPU must have AVX2, FMA, AVX-512 VNNI and AVX-512VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
pub(super) unsafe fn q80_dots8_vnni<B: I8Block, const G: usize>(w: &[B], xs: [&[Q80x8]; G]) -> [[f32; 8]; G] {
    use std::arch::x86_64::*;
    let flip = _mm256_set1_epi8(i8::MIN);
    // Block `bi`'s terms added to `acc` (partial sum `bi % 4` of each group).
    let step = |bi: usize, acc: &mut [__m256; G]| {
        let b = &w[bi];
        // SAFETY: AVX2 is enabled here.
        let qw = unsafe { b.weights() };
        // Σ w: the bytes as w + 128 summed by `vpsadbw`, less 32·128.
        let s = _mm256_sad_epu8(_mm256_xor_si256(qw, flip), _mm256_setzero_si256());
        let s = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        let sum_w = _mm_cvtsi128_si32(_mm_add_epi64(s, _mm_unpackhi_epi64(s, s))) - 32 * 128;
        let offset = _mm256_set1_epi32(128 * sum_w);
        let dw = _mm256_set1_ps(b.scale());
        // Each four weights broadcast to every lane (from memory: load ports, not shuffles).
        let mut words = [0i32; 8];
        // SAFETY: `words` is 32 bytes.
        unsafe { _mm256_storeu_si256(words.as_mut_ptr().cast(), qw) };
        let wj: [__m256i; 8] = words.map(|w| _mm256_set1_epi32(w));
        for (g, acc) in acc.iter_mut().enumerate() {
            let x = &xs[g][bi];
            let mut p = _mm256_setzero_si256();
            for (q, wq) in x.q.iter().zip(&wj) {
                // SAFETY: `Q80x8` is 32-byte aligned and each `q[j]` is 32 bytes at a multiple of 32.
                p = _mm256_dpbusd_epi32(p, unsafe { _mm256_load_si256(q.as_ptr().cast()) }, *wq);
            }
            let sumi = _mm256_sub_epi32(p, offset);
            // SAFETY: `d` is eight f32 at offset 256 of a 32-byte aligned struct.
            let scale = _mm256_mul_ps(dw, unsafe { _mm256_load_ps(x.d.as_ptr()) });
            *acc = _mm256_add_ps(*acc, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(sumi)));
        }
    };
    let mut acc = [[_mm256_setzero_ps(); G]; 4];
    let n = xs.iter().map(|x| x.len()).min().unwrap_or(0).min(w.len());
    let mut bi = 0;
    while bi + 4 <= n {
        for (t, acc) in acc.iter_mut().enumerate() {
            step(bi + t, acc);
        }
        bi += 4;
    }
    for (t, acc) in acc.iter_mut().enumerate().take(n - bi) {
        step(bi + t, acc);
    }
    let mut out = [[0f32; 8]; G];
    for (g, o) in out.iter_mut().enumerate() {
        let s = _mm256_add_ps(_mm256_add_ps(acc[0][g], acc[2][g]), _mm256_add_ps(acc[1][g], acc[3][g]));
        // SAFETY: `o` is eight f32.
        _mm256_storeu_ps(o.as_mut_ptr(), s);
    }
    out
}

/// One input row on VNNI with [`q80_dot_scalar`]'s arithmetic, four
/// blocks at a time: `vpdpbusd` multiplies the weights offset to u8 by
/// the inputs (read from memory as they are), so each block's lanes sum to
/// `Σ (w + 128)·x = Σ w·x + 128·Σ x` (exact in i32), `vphaddd` sums four
/// blocks' lanes at once, and `xs` (each input block's `128·Σ x`) is taken
/// off; lane `t` of one float register holds partial sum `t` of [`sum4`],
/// so no add waits on the one before. `xd` and `xs` are the input blocks'
/// scales and offsets, contiguous.
///
/// # Safety
/// The CPU must have AVX2, FMA, AVX-512 VNNI and AVX-512VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
pub(super) unsafe fn q80_dot_vnni<B: I8Block>(w: &[B], x: &[BlockQ80], xd: &[f32], xs: &[i32]) -> f32 {
    use std::arch::x86_64::*;
    let block = |b: &B, a: &BlockQ80| {
        // SAFETY: AVX2 is enabled here; `a.qs` is 32 bytes, the unaligned load reads exactly it.
        let (qw, qx) = unsafe { (b.weights_u8(), _mm256_loadu_si256(a.qs.as_ptr().cast())) };
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), qw, qx)
    };
    let n = w.len().min(x.len()).min(xd.len()).min(xs.len());
    let mut acc = _mm_setzero_ps();
    let mut k = 0;
    while k + 4 <= n {
        // The weights two groups ahead, into L1. Rows whose block count is not
        // a multiple of four (the one to three blocks left after the groups)
        // otherwise streamed a fifth slower: gpt-oss's output head, 90 blocks a
        // row, at 26 GB/s against 32 GB/s with this, measured alone; rows of 64
        // or 88 blocks, the same either way. A prefetch never faults, so it
        // may point past the row.
        _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().wrapping_add(k + 8).cast());
        _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().wrapping_add(k + 10).cast());
        let (b, a) = (&w[k..k + 4], &x[k..k + 4]);
        let lanes = hsum4_epi32([block(&b[0], &a[0]), block(&b[1], &a[1]), block(&b[2], &a[2]), block(&b[3], &a[3])]);
        // SAFETY (both): `k + 4 <= n`, within `xs` and `xd`: the loads read `[k..k + 4]`.
        let sumi = _mm_sub_epi32(lanes, _mm_loadu_si128(xs[k..k + 4].as_ptr().cast()));
        let dx = _mm_loadu_ps(xd[k..k + 4].as_ptr());
        let scale = _mm_mul_ps(_mm_set_ps(b[3].scale(), b[2].scale(), b[1].scale(), b[0].scale()), dx);
        acc = _mm_add_ps(acc, _mm_mul_ps(scale, _mm_cvtepi32_ps(sumi)));
        k += 4;
    }
    let mut s = [0f32; 4];
    // SAFETY: `s` is four f32.
    _mm_storeu_ps(s.as_mut_ptr(), acc);
    let zero = _mm256_setzero_si256();
    for (t, (b, a)) in w[k..n].iter().zip(&x[k..n]).enumerate() {
        let sumi = _mm_cvtsi128_si32(hsum4_epi32([block(b, a), zero, zero, zero])) - xs[k + t];
        s[t] += b.scale() * a.d * sumi as f32;
    }
    add_partials(s)
}
