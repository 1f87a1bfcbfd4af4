//! CPU kernels of the fused forward: quantized matrix × activation products
//! (Q4_1 × Q8_1 and Q8_0 × Q8_0 here, the K-quants × Q8_K in [`kquant`],
//! MXFP4 × Q8_0 in [`mxfp4`], as llama.cpp pairs them) and the f16-KV
//! attention primitives, each with an AVX2/FMA/F16C path selected at run
//! time and a scalar path that defines the arithmetic; Q8_0, MXFP4 and the
//! K-quants also have a grouped AVX-512 VNNI path, their default where the
//! CPU has it ([`q80_isa`], [`kquant_isa`]; [`kernel_name`] says what runs).
//!
//! candle has SIMD dot kernels for Q4_0, Q8_0 and the K-quants but a scalar
//! loop for Q4_1, which is what the reference model's layers are stored in;
//! and each candle op costs an allocation and a dispatch, which for a small
//! model's decode step costs more than the arithmetic. This module is the
//! one place in the crate allowed `unsafe` (for `std::arch` intrinsics);
//! every `unsafe` block says why it holds.
//!
//! Formats (ggml): a Q4_1 block holds 32 weights as `d: f16, m: f16,
//! qs: [u8; 16]` with `w[j] = (qs[j] & 0xF)·d + m` and
//! `w[j + 16] = (qs[j] >> 4)·d + m`; a Q8_0 block `d: f16, qs: [i8; 32]`
//! with `w[j] = qs[j]·d`. Activations are quantized per row to Q8_1
//! (`d, s = d·Σq, q`) or Q8_0 exactly as llama.cpp does.

#![allow(unsafe_code)]

use half::f16;

/// Weights per block.
pub const BLOCK: usize = 32;
/// Bytes of one Q4_1 block in a GGUF.
pub const Q4_1_BLOCK_BYTES: usize = 20;
/// Bytes of one Q8_0 block in a GGUF.
pub const Q8_0_BLOCK_BYTES: usize = 34;

/// One Q4_1 block, decoded from the file's little-endian layout.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
struct BlockQ41 {
    d: f32,
    m: f32,
    qs: [u8; 16],
}

/// A block of 32 unsigned weights `w = d·q + m` (Q4_1, Q5_1), against
/// Q8_1 activations.
pub(crate) trait UBlock: Copy + Send + Sync + 'static {
    /// `(d, m)`.
    fn dm(&self) -> (f32, f32);
    /// The 32 values `q`, in weight order.
    fn unsigned(&self) -> [u8; 32];
    /// [`UBlock::unsigned`] in one vector.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    unsafe fn unsigned_avx2(&self) -> std::arch::x86_64::__m256i;
}

impl UBlock for BlockQ41 {
    fn dm(&self) -> (f32, f32) {
        (self.d, self.m)
    }
    fn unsigned(&self) -> [u8; 32] {
        std::array::from_fn(|j| if j < 16 { self.qs[j] & 0x0F } else { self.qs[j - 16] >> 4 })
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn unsigned_avx2(&self) -> std::arch::x86_64::__m256i {
        nibbles_avx2(&self.qs)
    }
}

/// Values `j` (low nibble of `qs[j]`) and `j + 16` (high nibble) of a
/// 32-value block, as bytes `j` and `j + 16`.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn nibbles_avx2(qs: &[u8; 16]) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    // SAFETY: `qs` is 16 bytes; the load reads exactly them.
    let q = _mm_loadu_si128(qs.as_ptr().cast());
    let low = _mm_set1_epi8(0x0F);
    _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), low), _mm_and_si128(q, low))
}

/// Byte `j` all ones where bit `j` of `bits` is set, else zero (Q5_0's and
/// Q5_1's fifth bits). Each byte takes byte `j / 8` of `bits`, then every
/// bit but bit `j % 8` is set; the byte is all ones when that bit was.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn bits_to_bytes(bits: u32) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_setr_epi64x(0, 0x0101_0101_0101_0101, 0x0202_0202_0202_0202, 0x0303_0303_0303_0303),
    );
    _mm256_cmpeq_epi8(_mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe)), _mm256_set1_epi64x(-1))
}

/// One Q8_0 block (weights or activations).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct BlockQ80 {
    d: f32,
    qs: [i8; 32],
}

/// One Q8_1 block of activations.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
struct BlockQ81 {
    d: f32,
    s: f32,
    qs: [i8; 32],
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Why raw tensor bytes cannot become a kernel matrix (the file is to blame),
/// or why matrices cannot be stacked (our caller is).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// The row length is zero or not a whole number of blocks.
    #[error("{format} row length {cols} is not a positive multiple of {block}")]
    RowLength {
        /// The quant format (`Q4_1`, `Q8_0`, `Q4_K`, …).
        format: &'static str,
        /// The row length given.
        cols: usize,
        /// The format's block length.
        block: usize,
    },
    /// `rows × cols` does not fit in memory's address space.
    #[error("{format} tensor size overflows")]
    SizeOverflow {
        /// The quant format.
        format: &'static str,
    },
    /// The byte count does not match the shape.
    #[error("{format} tensor has {actual} bytes, expected {expected}")]
    ByteCount {
        /// The quant format.
        format: &'static str,
        /// Bytes given.
        actual: usize,
        /// Bytes the shape needs.
        expected: usize,
    },
    /// [`Q41Matrix::stack`] was given no matrices.
    #[error("nothing to stack")]
    NothingToStack,
    /// [`Q41Matrix::stack`] was given matrices of different widths.
    #[error("stacked matrices differ in width")]
    WidthMismatch,
}

fn check_shape(
    raw: &[u8],
    rows: usize,
    cols: usize,
    block_bytes: usize,
    format: &'static str,
) -> Result<usize, KernelError> {
    if cols == 0 || !cols.is_multiple_of(BLOCK) {
        return Err(KernelError::RowLength { format, cols, block: BLOCK });
    }
    let n_blocks = rows.checked_mul(cols / BLOCK).ok_or(KernelError::SizeOverflow { format })?;
    if raw.len() != n_blocks * block_bytes {
        return Err(KernelError::ByteCount { format, actual: raw.len(), expected: n_blocks * block_bytes });
    }
    Ok(n_blocks)
}

/// A Q4_1 weight matrix of `rows × cols` (each row is one output feature).
#[derive(Debug)]
pub struct Q41Matrix {
    rows: usize,
    cols: usize,
    blocks: Vec<BlockQ41>,
}

impl Q41Matrix {
    /// Flips one bit of one weight (tests of the resident digest).
    #[cfg(test)]
    pub(crate) fn flip_for_test(&mut self, block: usize) {
        self.blocks[block].qs[0] ^= 1;
    }

    /// Feeds the resident weights — exactly what the kernels read — to `h`
    /// (SECURITY-CASES G5: re-hashed while serving).
    pub(crate) fn digest_into(&self, h: &mut sha2::Sha256) {
        use sha2::Digest as _;
        let mut buf = Vec::with_capacity(24 * 4096);
        for b in &self.blocks {
            buf.extend_from_slice(&b.d.to_bits().to_le_bytes());
            buf.extend_from_slice(&b.m.to_bits().to_le_bytes());
            buf.extend_from_slice(&b.qs);
            if buf.len() >= 24 * 4096 {
                h.update(&buf);
                buf.clear();
            }
        }
        h.update(&buf);
    }
    /// Decodes raw GGUF bytes of a `rows × cols` Q4_1 tensor.
    pub fn from_gguf_bytes(raw: &[u8], rows: usize, cols: usize) -> Result<Self, KernelError> {
        check_shape(raw, rows, cols, Q4_1_BLOCK_BYTES, "Q4_1")?;
        let blocks = raw
            .chunks_exact(Q4_1_BLOCK_BYTES)
            .map(|b| {
                let mut qs = [0u8; 16];
                qs.copy_from_slice(&b[4..20]);
                BlockQ41 { d: f16_at(b, 0), m: f16_at(b, 2), qs }
            })
            .collect();
        Ok(Self { rows, cols, blocks })
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Stacks matrices of equal width into one (their outputs side by side),
    /// so that one pass over one quantized input feeds them all.
    pub fn stack(parts: Vec<Self>) -> Result<Self, KernelError> {
        let cols = parts.first().map(|p| p.cols).ok_or(KernelError::NothingToStack)?;
        if parts.iter().any(|p| p.cols != cols) {
            return Err(KernelError::WidthMismatch);
        }
        let rows = parts.iter().map(|p| p.rows).sum();
        let blocks = parts.into_iter().flat_map(|p| p.blocks).collect();
        Ok(Self { rows, cols, blocks })
    }

    /// `x (m × cols) · selfᵀ → (m × rows)`, row-major.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        assert_eq!(x.len(), m * self.cols, "input of {} values for {m} rows of {}", x.len(), self.cols);
        let xq: Vec<BlockQ81> = x.chunks_exact(self.cols).flat_map(quantize_row_q8_1).collect();
        par_matmul(&self.blocks, self.rows, self.cols / BLOCK, &xq, m, q41_dots())
    }

    #[cfg(test)]
    fn dequantized(&self) -> Vec<f32> {
        self.blocks
            .iter()
            .flat_map(|b| {
                let lo = b.qs.map(|q| f32::from(q & 0x0F) * b.d + b.m);
                let hi = b.qs.map(|q| f32::from(q >> 4) * b.d + b.m);
                lo.into_iter().chain(hi)
            })
            .collect()
    }
}

/// A Q8_0 weight matrix of `rows × cols`; also serves as a token embedding
/// (a row per token) so a tied LM head and embedding share one copy.
#[derive(Debug)]
pub struct Q80Matrix {
    rows: usize,
    cols: usize,
    blocks: Vec<BlockQ80>,
}

impl Q80Matrix {
    /// Feeds the resident weights — exactly what the kernels read — to `h`.
    pub(crate) fn digest_into(&self, h: &mut sha2::Sha256) {
        use sha2::Digest as _;
        let mut buf = Vec::with_capacity(36 * 4096);
        for b in &self.blocks {
            buf.extend_from_slice(&b.d.to_bits().to_le_bytes());
            buf.extend(b.qs.iter().map(|q| q.to_le_bytes()[0]));
            if buf.len() >= 36 * 4096 {
                h.update(&buf);
                buf.clear();
            }
        }
        h.update(&buf);
    }
    /// Decodes raw GGUF bytes of a `rows × cols` Q8_0 tensor.
    pub fn from_gguf_bytes(raw: &[u8], rows: usize, cols: usize) -> Result<Self, KernelError> {
        check_shape(raw, rows, cols, Q8_0_BLOCK_BYTES, "Q8_0")?;
        let blocks = raw
            .chunks_exact(Q8_0_BLOCK_BYTES)
            .map(|b| {
                let mut qs = [0i8; 32];
                for (q, &byte) in qs.iter_mut().zip(&b[2..34]) {
                    *q = byte as i8;
                }
                BlockQ80 { d: f16_at(b, 0), qs }
            })
            .collect();
        Ok(Self { rows, cols, blocks })
    }

    /// Output features (tokens, for an embedding).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `r` dequantized into `out` (an embedding lookup).
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        let per_row = self.cols / BLOCK;
        for (b, o) in self.blocks[r * per_row..(r + 1) * per_row].iter().zip(out.chunks_exact_mut(BLOCK)) {
            for (w, &q) in o.iter_mut().zip(&b.qs) {
                *w = f32::from(q) * b.d;
            }
        }
    }

    /// `x (m × cols) · selfᵀ → (m × rows)`, row-major.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_on(x, m, q80_isa())
    }

    /// [`Self::matmul`] on the kernels of `isa`, which this CPU must run
    /// ([`at_most`]).
    fn matmul_on(&self, x: &[f32], m: usize, isa: Isa) -> Vec<f32> {
        assert_eq!(x.len(), m * self.cols, "input of {} values for {m} rows of {}", x.len(), self.cols);
        let xq: Vec<BlockQ80> = x.chunks_exact(self.cols).flat_map(quantize_row_q8_0).collect();
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx512Vnni {
            return q80_matmul_vnni(&self.blocks, self.rows, self.cols / BLOCK, &xq, m);
        }
        par_matmul(&self.blocks, self.rows, self.cols / BLOCK, &xq, m, q80_dots(isa))
    }
}

/// `out[i][j] = dot(w row j, x row i)` with `dots`: see [`par_tiles`].
fn par_matmul<W: Sync, A: Sync>(
    w: &[W],
    rows: usize,
    per_row: usize,
    xq: &[A],
    m: usize,
    dots: Dots<W, A>,
) -> Vec<f32> {
    let xrow = |i: usize| &xq[i * per_row..(i + 1) * per_row];
    // Dots of one weight row with input rows `first..first + n`, written at
    // `out[i * stride]`: four input rows per pass over the weight blocks.
    let sweep = |wr: &[W], first: usize, n: usize, out: &mut [f32], stride: usize| {
        let mut i = 0;
        while i + 4 <= n {
            let r = first + i;
            let v = (dots.four)(wr, [xrow(r), xrow(r + 1), xrow(r + 2), xrow(r + 3)]);
            for (k, x) in v.into_iter().enumerate() {
                out[(i + k) * stride] = x;
            }
            i += 4;
        }
        for i in i..n {
            out[i * stride] = (dots.one)(wr, xrow(first + i));
        }
    };
    par_tiles(w, rows, per_row, m, per_row * std::mem::size_of::<A>(), |wr| (dots.one)(wr, xq), sweep)
}

/// A dot kernel for one input row, and the same arithmetic for four input
/// rows sharing one pass over the weight blocks (bit-identical per row).
struct Dots<W, A> {
    one: fn(&[W], &[A]) -> f32,
    four: fn(&[W], [&[A]; 4]) -> [f32; 4],
}

impl<W, A> Clone for Dots<W, A> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<W, A> Copy for Dots<W, A> {}

/// Quantizes one row to Q8_1 blocks, as llama.cpp's `quantize_row_q8_1`.
fn quantize_row_q8_1(row: &[f32]) -> impl Iterator<Item = BlockQ81> + '_ {
    row.chunks_exact(BLOCK).map(|x| {
        let (d, qs) = quantize_block(x);
        let sum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
        // Stored as f16 in ggml: round through f16 to match.
        BlockQ81 { d: f16::from_f32(d).to_f32(), s: f16::from_f32(sum as f32 * d).to_f32(), qs }
    })
}

/// Quantizes one row to Q8_0 blocks, as llama.cpp's `quantize_row_q8_0`.
fn quantize_row_q8_0(row: &[f32]) -> impl Iterator<Item = BlockQ80> + '_ {
    row.chunks_exact(BLOCK).map(|x| {
        let (d, qs) = quantize_block(x);
        BlockQ80 { d: f16::from_f32(d).to_f32(), qs }
    })
}

fn quantize_block(x: &[f32]) -> (f32, [i8; 32]) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; 32];
    for (q, v) in qs.iter_mut().zip(x) {
        *q = (v * id).round() as i8;
    }
    (d, qs)
}

fn q41_dots<B: UBlock>() -> Dots<B, BlockQ81> {
    #[cfg(target_arch = "x86_64")]
    match q41_isa() {
        Isa::Avx512Vnni => {
            return Dots {
                // SAFETY (both): `at_most` chose VNNI after run-time detection of AVX2, FMA, AVX512-VNNI and -VL.
                one: |w, x| unsafe { q41_dot_vnni(w, x) },
                four: |w, x| unsafe { q41_dot4_vnni(w, x) },
            };
        }
        Isa::Avx2 => {
            return Dots {
                // SAFETY (both): `at_most` chose AVX2 after run-time detection of AVX2 and FMA.
                one: |w, x| unsafe { q41_dot_avx2(w, x) },
                four: |w, x| unsafe { q41_dot4_avx2(w, x) },
            };
        }
        Isa::Scalar => {}
    }
    Dots { one: q41_dot_scalar, four: |w, x| x.map(|x| q41_dot_scalar(w, x)) }
}

/// The Q8_0 dots of the AVX2 and scalar kernels ([`q80_matmul_vnni`] is the VNNI path).
fn q80_dots(isa: Isa) -> Dots<BlockQ80, BlockQ80> {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        return Dots {
            // SAFETY (both): `isa` came from `at_most`, which chose AVX2 or
            // VNNI after run-time detection of AVX2 and FMA.
            one: |w, x| unsafe { q80_dot_avx2(w, x) },
            four: |w, x| unsafe { q80_dot4_avx2(w, x) },
        };
    }
    let _ = isa;
    Dots { one: q80_dot_scalar, four: |w, x| x.map(|x| q80_dot_scalar(w, x)) }
}

fn q41_dot_scalar<B: UBlock>(w: &[B], x: &[BlockQ81]) -> f32 {
    let mut sum = 0f32;
    for (b, a) in w.iter().zip(x) {
        let sumi: i32 = b.unsigned().iter().zip(&a.qs).map(|(&q, &x)| i32::from(q) * i32::from(x)).sum();
        let (d, m) = b.dm();
        sum += d * a.d * sumi as f32 + m * a.s;
    }
    sum
}

/// The arithmetic every Q8_0 and MXFP4 kernel computes: each block's
/// integer dot exactly, its term `(w.d · x.d) · sumi`, then [`sum4`].
fn q80_dot_scalar(w: &[BlockQ80], x: &[BlockQ80]) -> f32 {
    sum4(w.iter().zip(x).map(|(b, a)| {
        let sumi: i32 = b.qs.iter().zip(&a.qs).map(|(&p, &q)| i32::from(p) * i32::from(q)).sum();
        b.d * a.d * sumi as f32
    }))
}

/// The float steps of the Q8_0 and MXFP4 kernels: block `k`'s term is
/// added to partial sum `k % 4`, in block order, and the four partials
/// are added as `(s₀ + s₂) + (s₁ + s₃)`. Four independent sums fit one
/// register's lanes (one input row) or four registers (eight rows, a row
/// per lane), so no kernel waits on a chain of dependent adds, and every
/// kernel on every CPU gives the same bits.
fn sum4(terms: impl Iterator<Item = f32>) -> f32 {
    let mut s = [0f32; 4];
    for (k, t) in terms.enumerate() {
        s[k % 4] += t;
    }
    add_partials(s)
}

/// [`sum4`]'s last step: the four partial sums added as `(s₀ + s₂) + (s₁ + s₃)`.
fn add_partials(s: [f32; 4]) -> f32 {
    (s[0] + s[2]) + (s[1] + s[3])
}

/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum(acc: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let hi = _mm256_extractf128_ps(acc, 1);
    let s = _mm_add_ps(_mm256_castps256_ps128(acc), hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
    _mm_cvtss_f32(s)
}

/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn q41_dot_avx2<B: UBlock>(w: &[B], x: &[BlockQ81]) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0f32;
    let ones = _mm256_set1_epi16(1);
    for (b, a) in w.iter().zip(x) {
        let (d, m) = b.dm();
        summs += m * a.s;
        let q4 = b.unsigned_avx2();
        // SAFETY: `a.qs` is 32 bytes; the unaligned load reads exactly it.
        let q8 = _mm256_loadu_si256(a.qs.as_ptr().cast());
        // u8 × i8 pairs summed to i16 (at most 2·31·128, no saturation), then to i32.
        let p32 = _mm256_madd_epi16(_mm256_maddubs_epi16(q4, q8), ones);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * a.d), _mm256_cvtepi32_ps(p32), acc);
    }
    hsum(acc) + summs
}

/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn q80_dot_avx2<B: I8Block>(w: &[B], x: &[BlockQ80]) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = _mm256_setzero_ps();
    for (b, a) in w.iter().zip(x) {
        let (aw, sw) = b.magnitudes_signs();
        // SAFETY: `a.qs` is 32 bytes; the unaligned load reads exactly it.
        let qx = _mm256_loadu_si256(a.qs.as_ptr().cast());
        // |w| (as u8, so −128 reads 128) times x with w's sign: the pair sums
        // stay below 2·128·127 because activations are quantized to ±127.
        let p16 = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(qx, sw));
        let p32 = _mm256_madd_epi16(p16, b.pair_weights());
        // Each lane's weight scale times `x.d`: `w.d · x.d` in every lane
        // but for blocks with a scale per half (the same product either way).
        let d = _mm256_mul_ps(b.lane_scales(), _mm256_set1_ps(a.d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p32), acc);
    }
    hsum(acc)
}

/// [`q41_dot_avx2`] for four input rows: each weight block is unpacked
/// once; every row's accumulation is the single-row sequence exactly.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn q41_dot4_avx2<B: UBlock>(w: &[B], x: [&[BlockQ81]; 4]) -> [f32; 4] {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut summs = [0f32; 4];
    let ones = _mm256_set1_epi16(1);
    let n = x.iter().map(|r| r.len()).min().unwrap_or(0).min(w.len());
    for (i, b) in w[..n].iter().enumerate() {
        let (d, m) = b.dm();
        let q4 = b.unsigned_avx2();
        for r in 0..4 {
            let a = &x[r][i];
            summs[r] += m * a.s;
            // SAFETY: `a.qs` is 32 bytes; the load reads exactly it.
            let q8 = _mm256_loadu_si256(a.qs.as_ptr().cast());
            let p32 = _mm256_madd_epi16(_mm256_maddubs_epi16(q4, q8), ones);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * a.d), _mm256_cvtepi32_ps(p32), acc[r]);
        }
    }
    [hsum(acc[0]) + summs[0], hsum(acc[1]) + summs[1], hsum(acc[2]) + summs[2], hsum(acc[3]) + summs[3]]
}

/// [`q80_dot_avx2`] for four input rows (bit-identical per row). `w` is
/// Q8_0 blocks, or blocks that expand to them in registers ([`I8Block`]).
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn q80_dot4_avx2<B: I8Block>(w: &[B], x: [&[BlockQ80]; 4]) -> [f32; 4] {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_ps(); 4];
    let n = x.iter().map(|r| r.len()).min().unwrap_or(0).min(w.len());
    for (i, b) in w[..n].iter().enumerate() {
        let (aw, sw) = b.magnitudes_signs();
        let (pairs, ws) = (b.pair_weights(), b.lane_scales());
        for r in 0..4 {
            let a = &x[r][i];
            // SAFETY: `a.qs` is 32 bytes; the load reads exactly it.
            let qx = _mm256_loadu_si256(a.qs.as_ptr().cast());
            let p32 = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(qx, sw)), pairs);
            let d = _mm256_mul_ps(ws, _mm256_set1_ps(a.d));
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p32), acc[r]);
        }
    }
    [hsum(acc[0]), hsum(acc[1]), hsum(acc[2]), hsum(acc[3])]
}

/// [`q41_dot_avx2`] with `vpdpbusd` for the integer products (bit-identical).
///
/// # Safety
/// The CPU must have AVX2, FMA, AVX-512 VNNI and AVX-512VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
unsafe fn q41_dot_vnni<B: UBlock>(w: &[B], x: &[BlockQ81]) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0f32;
    for (b, a) in w.iter().zip(x) {
        let (d, m) = b.dm();
        summs += m * a.s;
        let q4 = b.unsigned_avx2();
        // SAFETY: `a.qs` is 32 bytes; the unaligned load reads exactly it.
        let q8 = _mm256_loadu_si256(a.qs.as_ptr().cast());
        // Four u8 × i8 products summed to i32 per lane: the AVX2 kernel's lanes exactly.
        let p32 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q4, q8);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d * a.d), _mm256_cvtepi32_ps(p32), acc);
    }
    hsum(acc) + summs
}

/// [`q41_dot4_avx2`] with `vpdpbusd` (bit-identical per row).
///
/// # Safety
/// The CPU must have AVX2, FMA, AVX-512 VNNI and AVX-512VL.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
unsafe fn q41_dot4_vnni<B: UBlock>(w: &[B], x: [&[BlockQ81]; 4]) -> [f32; 4] {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut summs = [0f32; 4];
    let n = x.iter().map(|r| r.len()).min().unwrap_or(0).min(w.len());
    for (i, b) in w[..n].iter().enumerate() {
        let (d, m) = b.dm();
        let q4 = b.unsigned_avx2();
        for r in 0..4 {
            let a = &x[r][i];
            summs[r] += m * a.s;
            // SAFETY: `a.qs` is 32 bytes; the load reads exactly it.
            let q8 = _mm256_loadu_si256(a.qs.as_ptr().cast());
            let p32 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q4, q8);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * a.d), _mm256_cvtepi32_ps(p32), acc[r]);
        }
    }
    [hsum(acc[0]) + summs[0], hsum(acc[1]) + summs[1], hsum(acc[2]) + summs[2], hsum(acc[3]) + summs[3]]
}

/// Lane `i` of the result: the sum of the eight i32 lanes of `v[i]`.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn hsum4_epi32(v: [std::arch::x86_64::__m256i; 4]) -> std::arch::x86_64::__m128i {
    use std::arch::x86_64::*;
    let h = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1))
}

mod isa;
#[cfg(target_arch = "x86_64")]
mod vnni;
pub use isa::*;
#[cfg(target_arch = "x86_64")]
use vnni::*;

mod expand;
pub mod expanded;
pub mod grid;
pub mod kquant;
mod kv;
pub mod mxfp4;
mod parallel;
pub mod q5_1;
pub use kv::{axpy_f16, dot_f16};
#[cfg(target_arch = "x86_64")]
use parallel::run_panels;
use parallel::{par_panels, par_tiles, PANEL_ROWS};

#[cfg(test)]
mod tests;
