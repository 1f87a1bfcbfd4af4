//! The grid types that large models ship in at two and three bits a
//! weight: IQ2_XXS, IQ2_XS, IQ3_XXS and IQ3_S. Each 8 weights (4 for the
//! IQ3 types) are an index into a table of magnitudes (ggml's
//! `iq2xxs_grid`, `iq2xs_grid`, `iq3xxs_grid`, `iq3s_grid`) and 8 sign
//! bits; each 32 weights share a scale (IQ2_XS: each 16).
//!
//! The blocks stay packed (the indexes, sign codes and scale as read, the
//! scale widened to f32: 12, 13, 16 and 17 bytes per 32 weights, against
//! 8.25, 9.25, 12.25 and 13.75 in the file) and expand in registers to their signed 8-bit integers: table
//! rows gathered into a vector, sign bytes from a 256-entry table. Then
//! the Q8_0 kernels' arithmetic runs on them against Q8_0 activations,
//! exactly as for [`super::expanded`]'s blocks. IQ2_XS's two scales per
//! block are one f32 scale and an integer multiplier per half, applied to
//! the integer dot of each half before it meets the scale, so every
//! product stays exact in integers; the VNNI kernels do not run IQ2_XS.
//!
//! llama.cpp pairs these types with Q8_K activations (one scale per 256);
//! Veil's use one scale per 32.

use super::expand::Expand;
use super::BLOCK;
use crate::model::quant::tables::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};

/// Bytes of one IQ2_XXS super-block (256 weights) in a GGUF.
pub const IQ2_XXS_BLOCK_BYTES: usize = 66;
/// Bytes of one IQ2_XS super-block (256 weights) in a GGUF.
pub const IQ2_XS_BLOCK_BYTES: usize = 74;
/// Bytes of one IQ3_XXS super-block (256 weights) in a GGUF.
pub const IQ3_XXS_BLOCK_BYTES: usize = 98;
/// Bytes of one IQ3_S super-block (256 weights) in a GGUF.
pub const IQ3_S_BLOCK_BYTES: usize = 110;
/// Bytes of one IQ2_S super-block (256 weights) in a GGUF.
pub const IQ2_S_BLOCK_BYTES: usize = 82;
/// Bytes of one IQ1_S super-block (256 weights) in a GGUF.
pub const IQ1_S_BLOCK_BYTES: usize = 50;
/// Bytes of one IQ1_M super-block (256 weights) in a GGUF.
pub const IQ1_M_BLOCK_BYTES: usize = 56;
/// Bytes of one TQ1_0 super-block (256 weights) in a GGUF.
pub const TQ1_0_BLOCK_BYTES: usize = 54;
/// Bytes of one TQ2_0 super-block (256 weights) in a GGUF.
pub const TQ2_0_BLOCK_BYTES: usize = 66;

/// `SIGN_BYTES[s]`: byte `j` is 0xFF where bit `j` of `s` is set, else 0.
static SIGN_BYTES: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut s = 0;
    while s < 256 {
        let mut j = 0;
        while j < 8 {
            if s & (1 << j) != 0 {
                t[s] |= 0xFF << (8 * j);
            }
            j += 1;
        }
        s += 1;
    }
    t
};

/// `KSIGN_BYTES[c]`: the sign bytes of 7-bit code `c`, whose
/// `ksigns_iq2xs` byte is `c` with an eighth sign bit making the count of
/// negatives even: one lookup instead of two on the decode path.
static KSIGN_BYTES: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut c = 0;
    while c < 128 {
        let s = c | (((c as u32).count_ones() as usize & 1) << 7);
        t[c] = SIGN_BYTES[s];
        c += 1;
    }
    t
};

/// The sign bytes of a 7-bit `ksigns_iq2xs` code (its eighth bit is parity).
fn ksigns(code: u32) -> u64 {
    KSIGN_BYTES[(code & 127) as usize]
}

/// A block of 32 weights as four groups of 8: magnitudes (unsigned bytes)
/// and sign bytes (0xFF: negative).
pub(super) trait Grid: Copy + Send + Sync + std::fmt::Debug + 'static {
    /// Whether each half has its own multiplier ([`Expand::halves`]).
    const HALVED: bool = false;
    /// The block's scale.
    fn scale(&self) -> f32;
    /// The multipliers of the two halves' scale.
    fn halves(&self) -> [i32; 2] {
        [1, 1]
    }
    /// Weights `8k..8k + 8`'s magnitudes, little-endian, for each `k`.
    fn magnitudes(&self) -> [u64; 4];
    /// Weights `8k..8k + 8`'s sign bytes, little-endian, for each `k`.
    fn signs(&self) -> [u64; 4];
    /// Appends the resident fields to `out`.
    fn bytes_into(&self, out: &mut Vec<u8>);
}

impl<G: Grid> Expand for G {
    const HALVED: bool = G::HALVED;
    fn scale(&self) -> f32 {
        Grid::scale(self)
    }
    fn halves(&self) -> [i32; 2] {
        Grid::halves(self)
    }
    fn ints(&self) -> [i8; BLOCK] {
        let (m, s) = (self.magnitudes(), self.signs());
        std::array::from_fn(|j| {
            let magnitude = (m[j / 8] >> (8 * (j % 8))) as u8 as i8;
            if (s[j / 8] >> (8 * (j % 8))) & 1 == 1 {
                -magnitude
            } else {
                magnitude
            }
        })
    }
    fn bytes_into(&self, out: &mut Vec<u8>) {
        Grid::bytes_into(self, out);
    }
}

#[cfg(target_arch = "x86_64")]
impl<G: Grid> super::I8Block for G {
    fn scale(&self) -> f32 {
        Grid::scale(self)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn weights(&self) -> std::arch::x86_64::__m256i {
        use std::arch::x86_64::*;
        // SAFETY: AVX2 is enabled here.
        let (m, s) = unsafe { self.magnitudes_signs() };
        _mm256_sign_epi8(m, s)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn magnitudes_signs(&self) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i) {
        use std::arch::x86_64::*;
        let v = |q: [u64; 4]| _mm256_set_epi64x(q[3] as i64, q[2] as i64, q[1] as i64, q[0] as i64);
        // Sign bytes 0xFF (−1) or 0x01 (+1): `_mm256_sign_epi8`'s operand.
        (v(self.magnitudes()), _mm256_or_si256(v(self.signs()), _mm256_set1_epi8(1)))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn pair_weights(&self) -> std::arch::x86_64::__m256i {
        use std::arch::x86_64::*;
        if G::HALVED {
            let [a, b] = Grid::halves(self).map(|m| _mm_set1_epi16(m as i16));
            _mm256_set_m128i(b, a)
        } else {
            _mm256_set1_epi16(1)
        }
    }
}

/// 32 IQ2_XXS (`N` = 4) or IQ3_XXS (`N` = 8) weights: `N` indexes into
/// `iq2xxs_grid` (8 magnitudes each) or `iq3xxs_grid` (4 each), and four
/// 7-bit sign codes in the low 28 bits of `signs`; `d` is ggml's
/// `d·(0.5 + s)·0.25` (IQ2_XXS) or `d·(0.5 + s)·0.5` (IQ3_XXS).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(super) struct BlockXxs<const N: usize> {
    d: f32,
    grid: [u8; N],
    signs: u32,
}

/// An IQ2_XXS block.
pub(super) type BlockIq2Xxs = BlockXxs<4>;
/// An IQ3_XXS block.
pub(super) type BlockIq3Xxs = BlockXxs<8>;

impl<const N: usize> Grid for BlockXxs<N> {
    fn scale(&self) -> f32 {
        self.d
    }
    fn magnitudes(&self) -> [u64; 4] {
        if N == 4 {
            std::array::from_fn(|k| IQ2XXS_GRID[usize::from(self.grid[k])])
        } else {
            let row = |i: u8| u64::from(IQ3XXS_GRID[usize::from(i)]);
            std::array::from_fn(|k| row(self.grid[2 * k]) | row(self.grid[2 * k + 1]) << 32)
        }
    }
    fn signs(&self) -> [u64; 4] {
        std::array::from_fn(|k| ksigns(self.signs >> (7 * k)))
    }
    fn bytes_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.d.to_bits().to_le_bytes());
        out.extend_from_slice(&self.grid);
        out.extend_from_slice(&self.signs.to_le_bytes());
    }
}

/// 32 IQ2_XS weights: four 16-bit codes (a 9-bit `iq2xs_grid` index, a
/// 7-bit sign code); `d` is ggml's `d / 8`, and the halves' multipliers
/// `2s + 1` for their 4-bit scales `s` (so `d·m` is ggml's `d·(0.5 + s)·0.25`).
#[derive(Clone, Copy, Debug)]
#[repr(C, packed)]
pub(super) struct BlockIq2Xs {
    d: f32,
    qs: [u16; 4],
    scales: u8,
}

impl Grid for BlockIq2Xs {
    const HALVED: bool = true;
    fn scale(&self) -> f32 {
        self.d
    }
    fn halves(&self) -> [i32; 2] {
        [i32::from(self.scales & 0x0F) * 2 + 1, i32::from(self.scales >> 4) * 2 + 1]
    }
    fn magnitudes(&self) -> [u64; 4] {
        self.qs.map(|q| IQ2XS_GRID[usize::from(q & 511)])
    }
    fn signs(&self) -> [u64; 4] {
        self.qs.map(|q| ksigns(u32::from(q >> 9)))
    }
    fn bytes_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.d.to_bits().to_le_bytes());
        { self.qs }.iter().for_each(|q| out.extend_from_slice(&q.to_le_bytes()));
        out.push(self.scales);
    }
}

/// 32 IQ3_S weights: eight 9-bit `iq3s_grid` indexes (low bytes in `qs`,
/// the ninth bits in `qh`), a sign byte per 8 weights; `d` is ggml's
/// `d·(1 + 2s)`.
#[derive(Clone, Copy, Debug)]
#[repr(C, packed)]
pub(super) struct BlockIq3S {
    d: f32,
    qs: [u8; 8],
    signs: [u8; 4],
    qh: u8,
}

impl Grid for BlockIq3S {
    fn scale(&self) -> f32 {
        self.d
    }
    fn magnitudes(&self) -> [u64; 4] {
        let row = |k: usize| {
            let high = usize::from((self.qh >> k) & 1) << 8;
            u64::from(IQ3S_GRID[usize::from(self.qs[k]) | high])
        };
        std::array::from_fn(|k| row(2 * k) | row(2 * k + 1) << 32)
    }
    fn signs(&self) -> [u64; 4] {
        self.signs.map(|s| SIGN_BYTES[usize::from(s)])
    }
    fn bytes_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.d.to_bits().to_le_bytes());
        out.extend_from_slice(&self.qs);
        out.extend_from_slice(&self.signs);
        out.push(self.qh);
    }
}

/// 32 IQ2_S weights: four 10-bit `iq2s_grid` indexes (low bytes in `qs`,
/// the two high bits of each in `qh`), a sign byte per 8 weights; `d` is
/// ggml's `d / 8` and the halves' multipliers `2s + 1`, as for IQ2_XS.
#[derive(Clone, Copy, Debug)]
#[repr(C, packed)]
pub(super) struct BlockIq2S {
    d: f32,
    qs: [u8; 4],
    signs: [u8; 4],
    qh: u8,
    scales: u8,
}

impl Grid for BlockIq2S {
    const HALVED: bool = true;
    fn scale(&self) -> f32 {
        self.d
    }
    fn halves(&self) -> [i32; 2] {
        [i32::from(self.scales & 0x0F) * 2 + 1, i32::from(self.scales >> 4) * 2 + 1]
    }
    fn magnitudes(&self) -> [u64; 4] {
        std::array::from_fn(|l| {
            let high = (usize::from(self.qh) << (8 - 2 * l)) & 0x300;
            IQ2S_GRID[usize::from(self.qs[l]) | high]
        })
    }
    fn signs(&self) -> [u64; 4] {
        self.signs.map(|s| SIGN_BYTES[usize::from(s)])
    }
    fn bytes_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&{ self.d }.to_bits().to_le_bytes());
        out.extend_from_slice(&self.qs);
        out.extend_from_slice(&self.signs);
        out.extend_from_slice(&[self.qh, self.scales]);
    }
}

/// The IQ1 types' layout: each 8 weights an 11-bit index into
/// `iq1s_grid` (8 values of −1, 0 or 1) and the sign of a delta of
/// ±1/8 added to all 8. Times 8, every weight is the integer
/// `8·g ± 1` (odd, so never 0), and the block's scale is ggml's over 8.
pub(super) trait DeltaGrid: Copy + Send + Sync + std::fmt::Debug + 'static {
    /// Whether each half has its own multiplier.
    const HALVED: bool;
    /// The block's scale.
    fn scale(&self) -> f32;
    /// The multipliers of the two halves' scale.
    fn halves(&self) -> [i32; 2];
    /// Weights `8k..8k + 8`'s `iq1s_grid` row, for each `k`.
    fn rows(&self) -> [u64; 4];
    /// Whether weights `8k..8k + 8`'s delta is −1/8, for each `k`.
    fn negative(&self) -> [bool; 4];
    /// Appends the resident fields to `out`.
    fn bytes_into(&self, out: &mut Vec<u8>);
}

/// `IQ1S_GRID`'s row for an 11-bit index.
fn iq1_row(index: usize) -> u64 {
    IQ1S_GRID[index & 0x7FF]
}

/// 32 IQ1_S weights: four 11-bit indexes (low bytes in `qs`, three high
/// bits each in bits 0–11 of `qh`) and one delta sign (bit 15 of `qh`);
/// `d` is ggml's `d·(2s + 1) / 8`.
#[derive(Clone, Copy, Debug)]
#[repr(C, packed)]
pub(super) struct BlockIq1S {
    d: f32,
    qs: [u8; 4],
    qh: u16,
}

impl DeltaGrid for BlockIq1S {
    const HALVED: bool = false;
    fn scale(&self) -> f32 {
        self.d
    }
    fn halves(&self) -> [i32; 2] {
        [1, 1]
    }
    fn rows(&self) -> [u64; 4] {
        let qh = usize::from(self.qh);
        std::array::from_fn(|l| iq1_row(usize::from(self.qs[l]) | ((qh >> (3 * l)) & 7) << 8))
    }
    fn negative(&self) -> [bool; 4] {
        [self.qh & 0x8000 != 0; 4]
    }
    fn bytes_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&{ self.d }.to_bits().to_le_bytes());
        out.extend_from_slice(&self.qs);
        out.extend_from_slice(&{ self.qh }.to_le_bytes());
    }
}

/// 32 IQ1_M weights: four 11-bit indexes (low bytes in `qs`, and per 8
/// weights a nibble of `qh`: three high bits and the delta's sign), and a
/// 3-bit scale per half in `scales`; `d` is ggml's `d / 8` and the halves'
/// multipliers `2s + 1`.
#[derive(Clone, Copy, Debug)]
#[repr(C, packed)]
pub(super) struct BlockIq1M {
    d: f32,
    qs: [u8; 4],
    qh: [u8; 2],
    scales: u8,
}

impl BlockIq1M {
    fn nibble(&self, l: usize) -> u8 {
        (self.qh[l / 2] >> (4 * (l % 2))) & 0x0F
    }
}

impl DeltaGrid for BlockIq1M {
    const HALVED: bool = true;
    fn scale(&self) -> f32 {
        self.d
    }
    fn halves(&self) -> [i32; 2] {
        [i32::from(self.scales & 7) * 2 + 1, i32::from((self.scales >> 3) & 7) * 2 + 1]
    }
    fn rows(&self) -> [u64; 4] {
        std::array::from_fn(|l| iq1_row(usize::from(self.qs[l]) | usize::from(self.nibble(l) & 7) << 8))
    }
    fn negative(&self) -> [bool; 4] {
        std::array::from_fn(|l| self.nibble(l) & 8 != 0)
    }
    fn bytes_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&{ self.d }.to_bits().to_le_bytes());
        out.extend_from_slice(&self.qs);
        out.extend_from_slice(&self.qh);
        out.push(self.scales);
    }
}

/// The delta bytes of [`DeltaGrid::negative`]: −1 or 1 in each of 8 bytes.
fn delta_bytes(negative: bool) -> u64 {
    if negative {
        u64::MAX
    } else {
        0x0101_0101_0101_0101
    }
}

macro_rules! delta_grid_block {
    ($($t:ty),*) => {$(
        impl Expand for $t {
            const HALVED: bool = <$t as DeltaGrid>::HALVED;
            fn scale(&self) -> f32 {
                DeltaGrid::scale(self)
            }
            fn halves(&self) -> [i32; 2] {
                DeltaGrid::halves(self)
            }
            fn ints(&self) -> [i8; BLOCK] {
                let (rows, negative) = (self.rows(), self.negative());
                std::array::from_fn(|j| {
                    let g = (rows[j / 8] >> (8 * (j % 8))) as u8 as i8;
                    8 * g + if negative[j / 8] { -1 } else { 1 }
                })
            }
            fn bytes_into(&self, out: &mut Vec<u8>) {
                DeltaGrid::bytes_into(self, out);
            }
        }

        #[cfg(target_arch = "x86_64")]
        impl super::I8Block for $t {
            fn scale(&self) -> f32 {
                DeltaGrid::scale(self)
            }
            #[inline]
            #[target_feature(enable = "avx2,fma")]
            unsafe fn weights(&self) -> std::arch::x86_64::__m256i {
                use std::arch::x86_64::*;
                let v = |q: [u64; 4]| _mm256_set_epi64x(q[3] as i64, q[2] as i64, q[1] as i64, q[0] as i64);
                // 8·g (g is −1, 0 or 1), plus the delta's ±1.
                let eight_g = _mm256_sign_epi8(_mm256_set1_epi8(8), v(self.rows()));
                _mm256_add_epi8(eight_g, v(self.negative().map(delta_bytes)))
            }
            #[inline]
            #[target_feature(enable = "avx2,fma")]
            unsafe fn pair_weights(&self) -> std::arch::x86_64::__m256i {
                use std::arch::x86_64::*;
                let [a, b] = DeltaGrid::halves(self).map(|m| _mm_set1_epi16(m as i16));
                _mm256_set_m128i(b, a)
            }
        }
    )*};
}
delta_grid_block!(BlockIq1S, BlockIq1M);

/// 32 ternary weights (TQ1_0, TQ2_0): weight `j` is `c − 1` for its code
/// `c` (a trit; TQ2_0's 2-bit codes also allow 3, which ggml reads as 2),
/// whose low bit is bit `j` of `low` and high bit bit `j` of `high`; `d`
/// is the super-block's scale.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(super) struct BlockTernary {
    d: f32,
    low: u32,
    high: u32,
}

impl BlockTernary {
    /// The block of the 32 codes `c` (each below 4).
    fn new(d: f32, c: &[u8]) -> Self {
        let (mut low, mut high) = (0u32, 0u32);
        for (j, &c) in c.iter().enumerate() {
            low |= u32::from(c & 1) << j;
            high |= u32::from((c >> 1) & 1) << j;
        }
        Self { d, low, high }
    }
}

impl Expand for BlockTernary {
    fn scale(&self) -> f32 {
        self.d
    }
    fn ints(&self) -> [i8; BLOCK] {
        std::array::from_fn(|j| ((self.low >> j) & 1) as i8 + 2 * ((self.high >> j) & 1) as i8 - 1)
    }
    fn bytes_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.d.to_bits().to_le_bytes());
        out.extend_from_slice(&self.low.to_le_bytes());
        out.extend_from_slice(&self.high.to_le_bytes());
    }
}

#[cfg(target_arch = "x86_64")]
impl super::I8Block for BlockTernary {
    fn scale(&self) -> f32 {
        self.d
    }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn weights(&self) -> std::arch::x86_64::__m256i {
        use std::arch::x86_64::*;
        // SAFETY: AVX2 and FMA are enabled here.
        let (low, high) = unsafe { (super::bits_to_bytes(self.low), super::bits_to_bytes(self.high)) };
        let c =
            _mm256_or_si256(_mm256_and_si256(low, _mm256_set1_epi8(1)), _mm256_and_si256(high, _mm256_set1_epi8(2)));
        _mm256_sub_epi8(c, _mm256_set1_epi8(1))
    }
}

/// A GGUF super-block's f16 scale.
fn d(b: &[u8]) -> f32 {
    super::f16_at(b, 0)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The eight blocks of an IQ2_XXS super-block (`d: f16, qs: [u16; 32]`).
pub(super) fn iq2_xxs(b: &[u8]) -> [BlockIq2Xxs; 8] {
    let d = d(b);
    std::array::from_fn(|ib| {
        let at = 2 + 8 * ib;
        let aux = u32_at(b, at + 4);
        let mut grid = [0u8; 4];
        grid.copy_from_slice(&b[at..at + 4]);
        BlockIq2Xxs { d: d * (0.5 + (aux >> 28) as f32) * 0.25, grid, signs: aux & 0x0FFF_FFFF }
    })
}

/// The eight blocks of an IQ2_XS super-block (`d: f16, qs: [u16; 32], scales: [u8; 8]`).
pub(super) fn iq2_xs(b: &[u8]) -> [BlockIq2Xs; 8] {
    let d = d(b);
    std::array::from_fn(|ib| {
        let qs = std::array::from_fn(|l| {
            let at = 2 + 2 * (4 * ib + l);
            u16::from_le_bytes([b[at], b[at + 1]])
        });
        BlockIq2Xs { d: d * 0.125, qs, scales: b[66 + ib] }
    })
}

/// The eight blocks of an IQ3_XXS super-block (`d: f16, qs: [u8; 96]`:
/// 64 grid indexes, then a u32 of sign codes and scale per 32 weights).
pub(super) fn iq3_xxs(b: &[u8]) -> [BlockIq3Xxs; 8] {
    let d = d(b);
    std::array::from_fn(|ib| {
        let aux = u32_at(b, 66 + 4 * ib);
        let mut grid = [0u8; 8];
        grid.copy_from_slice(&b[2 + 8 * ib..10 + 8 * ib]);
        BlockIq3Xxs { d: d * (0.5 + (aux >> 28) as f32) * 0.5, grid, signs: aux & 0x0FFF_FFFF }
    })
}

/// The eight blocks of an IQ3_S super-block (`d: f16, qs: [u8; 64], qh:
/// [u8; 8], signs: [u8; 32], scales: [u8; 4]`).
pub(super) fn iq3_s(b: &[u8]) -> [BlockIq3S; 8] {
    let d = d(b);
    std::array::from_fn(|ib| {
        let s = b[106 + ib / 2];
        let s = if ib % 2 == 0 { s & 0x0F } else { s >> 4 };
        let mut qs = [0u8; 8];
        qs.copy_from_slice(&b[2 + 8 * ib..10 + 8 * ib]);
        let mut signs = [0u8; 4];
        signs.copy_from_slice(&b[74 + 4 * ib..78 + 4 * ib]);
        BlockIq3S { d: d * f32::from(1 + 2 * s), qs, signs, qh: b[66 + ib] }
    })
}

/// The eight blocks of an IQ2_S super-block (`d: f16, qs: [u8; 64]` (32
/// low index bytes, then 32 sign bytes), `qh: [u8; 8], scales: [u8; 8]`).
pub(super) fn iq2_s(b: &[u8]) -> [BlockIq2S; 8] {
    let d = d(b);
    std::array::from_fn(|ib| {
        let mut qs = [0u8; 4];
        qs.copy_from_slice(&b[2 + 4 * ib..6 + 4 * ib]);
        let mut signs = [0u8; 4];
        signs.copy_from_slice(&b[34 + 4 * ib..38 + 4 * ib]);
        BlockIq2S { d: d * 0.125, qs, signs, qh: b[66 + ib], scales: b[74 + ib] }
    })
}

/// The eight blocks of an IQ1_S super-block (`d: f16, qs: [u8; 32], qh: [u16; 8]`).
pub(super) fn iq1_s(b: &[u8]) -> [BlockIq1S; 8] {
    let d = d(b);
    std::array::from_fn(|ib| {
        let qh = u16::from_le_bytes([b[34 + 2 * ib], b[35 + 2 * ib]]);
        let mut qs = [0u8; 4];
        qs.copy_from_slice(&b[2 + 4 * ib..6 + 4 * ib]);
        // ggml's `d·(2s + 1)`, rounded as ggml rounds it, then over 8 (exact).
        BlockIq1S { d: d * f32::from(2 * ((qh >> 12) & 7) + 1) * 0.125, qs, qh }
    })
}

/// The eight blocks of an IQ1_M super-block (`qs: [u8; 32], qh: [u8; 16],
/// scales: [u8; 8]`: four u16s with 3-bit scales in bits 0–11 and the
/// f16 `d` spread over their top nibbles).
pub(super) fn iq1_m(b: &[u8]) -> [BlockIq1M; 8] {
    let sc: [u16; 4] = std::array::from_fn(|k| u16::from_le_bytes([b[48 + 2 * k], b[49 + 2 * k]]));
    let bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000);
    let d = half::f16::from_bits(bits).to_f32();
    std::array::from_fn(|ib| {
        let mut qs = [0u8; 4];
        qs.copy_from_slice(&b[4 * ib..4 * ib + 4]);
        let scales = ((sc[ib / 2] >> (6 * (ib % 2))) & 0x3F) as u8;
        BlockIq1M { d: d * 0.125, qs, qh: [b[32 + 2 * ib], b[33 + 2 * ib]], scales }
    })
}

/// The eight blocks of a TQ1_0 super-block (`qs: [u8; 48]` (5 trits a
/// byte), `qh: [u8; 4]` (4 trits a byte), `d: f16`), in
/// `dequantize_row_tq1_0`'s order.
pub(super) fn tq1_0(b: &[u8]) -> [BlockTernary; 8] {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    let trit = |byte: u8, p: u8| ((u16::from(byte.wrapping_mul(p)) * 3) >> 8) as u8;
    let mut t = [0u8; 256];
    for (n, &p) in POW3.iter().enumerate() {
        for m in 0..32 {
            t[32 * n + m] = trit(b[m], p);
        }
        for m in 0..16 {
            t[160 + 16 * n + m] = trit(b[32 + m], p);
        }
    }
    for (n, &p) in POW3[..4].iter().enumerate() {
        for j in 0..4 {
            t[240 + 4 * n + j] = trit(b[48 + j], p);
        }
    }
    let d = super::f16_at(b, 52);
    std::array::from_fn(|ib| BlockTernary::new(d, &t[32 * ib..32 * ib + 32]))
}

/// The eight blocks of a TQ2_0 super-block (`qs: [u8; 64]`, 2 bits a
/// value, `d: f16`): value `128h + 32l + m` is bits `2l..2l+2` of `qs[32h + m]`.
pub(super) fn tq2_0(b: &[u8]) -> [BlockTernary; 8] {
    let d = super::f16_at(b, 64);
    std::array::from_fn(|ib| {
        let (h, l) = (ib / 4, ib % 4);
        let t: [u8; 32] = std::array::from_fn(|m| (b[32 * h + m] >> (2 * l)) & 3);
        BlockTernary::new(d, &t)
    })
}

// What the module's header says each block costs in memory.
const _: () = assert!(
    std::mem::size_of::<BlockIq2Xxs>() == 12
        && std::mem::size_of::<BlockIq2Xs>() == 13
        && std::mem::size_of::<BlockIq3Xxs>() == 16
        && std::mem::size_of::<BlockIq3S>() == 17
        && std::mem::size_of::<BlockIq2S>() == 14
        && std::mem::size_of::<BlockIq1S>() == 10
        && std::mem::size_of::<BlockIq1M>() == 11
        && std::mem::size_of::<BlockTernary>() == 12
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::quant::tables::KSIGNS_IQ2XS;

    #[test]
    fn the_sign_code_table_is_ggmls_two_lookups_in_one() {
        for c in 0..128u32 {
            assert_eq!(ksigns(c), SIGN_BYTES[usize::from(KSIGNS_IQ2XS[c as usize])], "code {c}");
            assert_eq!(ksigns(c | 0x80), ksigns(c), "only the low 7 bits are read");
        }
    }
}
