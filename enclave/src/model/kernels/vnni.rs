//! The grouped AVX-512 VNNI kernels of Q8_0-activation products: eight
//! input rows interleaved per block so one `vpdpbusd` serves them all.

use super::*;

/// Sixteen Q8_0 input rows' block `b`, interleaved for `vpdpbusd` on
/// 512-bit vectors: `q[j]` holds bytes `4j..4j + 4` of each row's block
/// (row `i` in bytes `4i..4i + 4`), offset by +128 to u8 (inputs are
/// quantized to ±127, so 1..=255), and `d` the rows' scales. Rows past the
/// input's end are zeros (bytes 128, scale 0), whose dots are 0 and unread.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct Q80x16 {
    q: [[u8; 64]; 8],
    d: [f32; 16],
}

/// Input rows `16g..16g + 16` of `xq` (`m` rows of `per_row` blocks) as
/// [`Q80x16`], group after group (the last padded with zero rows),
/// `per_row` blocks each.
#[cfg(target_arch = "x86_64")]
pub(super) fn interleave_q80(xq: &[BlockQ80], per_row: usize, m: usize) -> Vec<Q80x16> {
    let groups = m.div_ceil(16);
    let mut out = Vec::with_capacity(groups * per_row);
    for g in 0..groups {
        for b in 0..per_row {
            let mut x = Q80x16 { q: [[128; 64]; 8], d: [0.0; 16] };
            for i in (0..16).take_while(|i| 16 * g + i < m) {
                let blk = &xq[(16 * g + i) * per_row + b];
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
/// bit for bit whether its input row ran in a group of sixteen or alone.
/// Batches run on [`q80_panel_vnni`]: four weight rows at a time against
/// every group of sixteen of a task's input rows, one 512-bit `vpdpbusd`
/// per four bytes of a weight block serving sixteen rows, with no
/// horizontal sums; decode runs on [`q80_dot_vnni`]. `w` is Q8_0 blocks or
/// blocks expanded to them in registers.
#[cfg(target_arch = "x86_64")]
pub(super) fn q80_matmul_vnni<B: I8Block>(w: &[B], rows: usize, per_row: usize, xq: &[BlockQ80], m: usize) -> Vec<f32> {
    let xg = if m > 1 { interleave_q80(xq, per_row, m) } else { Vec::new() };
    let wrow = |j: usize| &w[j * per_row..(j + 1) * per_row];
    // SAFETY (both kernel calls): this path is taken only when `q80_isa()`
    // chose VNNI, after run-time detection of AVX2, FMA, AVX-512F, BW,
    // VNNI and VL.
    let panel = |js: std::ops::Range<usize>, first: usize, n: usize, out: &mut [f32]| {
        debug_assert!(first.is_multiple_of(16), "row {first} does not start a group");
        let groups: Vec<&[Q80x16]> =
            (first / 16..(first + n).div_ceil(16)).map(|g| &xg[g * per_row..(g + 1) * per_row]).collect();
        let four = |j: usize, lanes: &mut [[f32; 16]]| {
            let ws = std::array::from_fn(|t| wrow(j + t));
            unsafe { q80_panel_vnni::<B, PANEL_ROWS>(ws, &groups, lanes) }
        };
        let one = |j: usize, lanes: &mut [[f32; 16]]| unsafe { q80_panel_vnni::<B, 1>([wrow(j)], &groups, lanes) };
        run_panels(js, n, groups.len(), out, four, one);
    };
    let xd: Vec<f32> = xq.iter().map(|b| b.d).collect();
    let xs: Vec<i32> = xq.iter().map(|b| 128 * b.qs.iter().map(|&q| i32::from(q)).sum::<i32>()).collect();
    let one = |wr: &[B]| unsafe { q80_dot_vnni(wr, xq, &xd, &xs) };
    par_panels(w, rows, per_row, m, per_row * std::mem::size_of::<BlockQ80>(), one, panel)
}

/// Groups of sixteen input rows a panel holds in its accumulators at once.
#[cfg(target_arch = "x86_64")]
const PANEL_GROUPS: usize = 4;

/// The float partial sums of a panel: four per weight row and group.
#[cfg(target_arch = "x86_64")]
type PanelSums<const R: usize> = [[[std::arch::x86_64::__m512; 4]; PANEL_GROUPS]; R];

/// `R` weight rows against groups of sixteen interleaved input rows (`xs`,
/// each `per_row` blocks): lane `i` of `out[r * xs.len() + g]` is the dot
/// of weight row `r` with row `i` of group `g`, [`q80_dot_scalar`]'s
/// arithmetic (each block's term added into partial sum `block % 4`, the
/// four added as [`add_partials`] does).
///
/// Each block of the `R` weight rows is read (or expanded) once and its
/// words stored for broadcast; then the groups pass it two at a time
/// ([`panel_step`]). The float partial sums stay in memory (L1), up to
/// [`PANEL_GROUPS`] groups per pass.
///
/// # Safety
/// The CPU must have AVX2, FMA, AVX-512F, VNNI and VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512vnni,avx512vl")]
pub(super) unsafe fn q80_panel_vnni<B: I8Block, const R: usize>(w: [&[B]; R], xs: &[&[Q80x16]], out: &mut [[f32; 16]]) {
    use std::arch::x86_64::*;
    let flip = _mm256_set1_epi8(i8::MIN);
    let n = xs.iter().map(|x| x.len()).chain(w.iter().map(|w| w.len())).min().unwrap_or(0);
    for (pass, gs) in xs.chunks(PANEL_GROUPS).enumerate() {
        let mut acc: PanelSums<R> = [[[_mm512_setzero_ps(); 4]; PANEL_GROUPS]; R];
        for bi in 0..n {
            let t = bi % 4;
            let mut words = [[0i32; 8]; R];
            let mut offset = [0i32; R];
            let mut dw = [0f32; R];
            for r in 0..R {
                let b = &w[r][bi];
                // SAFETY: AVX2 is enabled here.
                let qw = unsafe { b.weights() };
                // Σ w: the bytes as w + 128 summed by `vpsadbw`, less 32·128.
                let s = _mm256_sad_epu8(_mm256_xor_si256(qw, flip), _mm256_setzero_si256());
                let s = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
                offset[r] = 128 * (_mm_cvtsi128_si32(_mm_add_epi64(s, _mm_unpackhi_epi64(s, s))) - 32 * 128);
                dw[r] = b.scale();
                // SAFETY: `words[r]` is 32 bytes.
                unsafe { _mm256_storeu_si256(words[r].as_mut_ptr().cast(), qw) };
            }
            let mut g = 0;
            while g + 2 <= gs.len() {
                // SAFETY: the features `panel_step` needs are enabled here.
                unsafe { panel_step::<R, 2>([&gs[g][bi], &gs[g + 1][bi]], &words, &offset, &dw, &mut acc, g, t) };
                g += 2;
            }
            if g < gs.len() {
                // SAFETY: as above.
                unsafe { panel_step::<R, 1>([&gs[g][bi]], &words, &offset, &dw, &mut acc, g, t) };
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (g, a) in acc.iter().enumerate().take(gs.len()) {
                let s = _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3]));
                let o = &mut out[r * xs.len() + pass * PANEL_GROUPS + g];
                // SAFETY: `o` is sixteen f32.
                unsafe { _mm512_storeu_ps(o.as_mut_ptr(), s) };
            }
        }
    }
}

/// One block of [`q80_panel_vnni`]'s `R` weight rows (their words, `128·Σ
/// w` and scales) against `H` groups' blocks `x`: `R·H` chains of eight
/// `vpdpbusd`, each input word loaded once for the `R` rows and each
/// weight word broadcast once for the `H` groups. `vpdpbusd` multiplies
/// the inputs offset to u8 by the weights as i8, so each block's sum is
/// `Σ (x + 128)·w = Σ x·w + 128·Σ w` (at most 32·255·128, exact in i32)
/// and loses `128·Σ w` to give the integer dot; that, scaled, is added
/// into partial sum `t` of groups `g..g + H`.
///
/// # Safety
/// The CPU must have AVX2, FMA, AVX-512F, VNNI and VL.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,avx512f,avx512vnni,avx512vl")]
unsafe fn panel_step<const R: usize, const H: usize>(
    x: [&Q80x16; H],
    words: &[[i32; 8]; R],
    offset: &[i32; R],
    dw: &[f32; R],
    acc: &mut PanelSums<R>,
    g: usize,
    t: usize,
) {
    use std::arch::x86_64::*;
    // Opaque to the optimiser, so the broadcasts stay loads beside their
    // `vpdpbusd`s: hoisted out of the groups' loop, they took every
    // register and the chains ran one after another (a quarter slower).
    let words = std::hint::black_box(words);
    let mut p = [[_mm512_setzero_si512(); H]; R];
    for j in 0..8 {
        // SAFETY: `Q80x16` is 64-byte aligned and each `q[j]` is 64 bytes at a multiple of 64.
        let q: [__m512i; H] = std::array::from_fn(|h| unsafe { _mm512_load_si512(x[h].q[j].as_ptr().cast()) });
        for (p, words) in p.iter_mut().zip(words) {
            let wj = _mm512_set1_epi32(words[j]);
            for (p, q) in p.iter_mut().zip(q) {
                *p = _mm512_dpbusd_epi32(*p, q, wj);
            }
        }
    }
    for h in 0..H {
        // SAFETY: `d` is sixteen f32 at offset 512 of a 64-byte aligned struct.
        let xd = unsafe { _mm512_load_ps(x[h].d.as_ptr()) };
        for r in 0..R {
            let sumi = _mm512_sub_epi32(p[r][h], _mm512_set1_epi32(offset[r]));
            let scale = _mm512_mul_ps(_mm512_set1_ps(dw[r]), xd);
            let a = &mut acc[r][g + h][t];
            *a = _mm512_add_ps(*a, _mm512_mul_ps(scale, _mm512_cvtepi32_ps(sumi)));
        }
    }
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
