//! CPU kernels of the fused forward: quantized matrix × activation products
//! (Q4_1 × Q8_1 and Q8_0 × Q8_0, as llama.cpp pairs them) and the f16-KV
//! attention primitives, each with an AVX2/FMA/F16C path selected at run
//! time and a scalar path that defines the arithmetic.
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
use rayon::prelude::*;

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
    #[error("{format} row length {cols} is not a positive multiple of {BLOCK}")]
    RowLength {
        /// The quant format (`Q4_1`, `Q8_0`).
        format: &'static str,
        /// The row length given.
        cols: usize,
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
        return Err(KernelError::RowLength { format, cols });
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
        assert_eq!(x.len(), m * self.cols, "input of {} values for {m} rows of {}", x.len(), self.cols);
        let xq: Vec<BlockQ80> = x.chunks_exact(self.cols).flat_map(quantize_row_q8_0).collect();
        par_matmul(&self.blocks, self.rows, self.cols / BLOCK, &xq, m, q80_dots())
    }
}

/// Output rows handed to one task: enough work to amortise a steal.
const ROWS_PER_TASK: usize = 16;

/// `out[i][j] = dot(w row j, x row i)`. Few input rows (decode): weight
/// rows are split across threads. Many (prefill, batches): input rows are,
/// and each task sweeps the whole weight, every weight row staying in L1
/// while the task's input rows pass it. Every output is one sequential dot,
/// so results do not depend on the thread count or on batching.
fn par_matmul<W: Sync, A: Sync>(
    w: &[W],
    rows: usize,
    per_row: usize,
    xq: &[A],
    m: usize,
    dots: Dots<W, A>,
) -> Vec<f32> {
    let wrow = |j: usize| &w[j * per_row..(j + 1) * per_row];
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
    let mut out = vec![0f32; m * rows];
    let threads = rayon::current_num_threads();
    if m < 4 * threads {
        if m == 1 {
            out.par_chunks_mut(ROWS_PER_TASK).enumerate().for_each(|(c, o)| {
                for (r, v) in o.iter_mut().enumerate() {
                    *v = (dots.one)(wrow(c * ROWS_PER_TASK + r), xq);
                }
            });
            return out;
        }
        let mut t = vec![0f32; rows * m];
        t.par_chunks_mut(ROWS_PER_TASK * m).enumerate().for_each(|(c, o)| {
            for (r, vals) in o.chunks_exact_mut(m).enumerate() {
                sweep(wrow(c * ROWS_PER_TASK + r), 0, m, vals, 1);
            }
        });
        for (j, vals) in t.chunks_exact(m).enumerate() {
            for (i, v) in vals.iter().enumerate() {
                out[i * rows + j] = *v;
            }
        }
        return out;
    }
    let per_task = m.div_ceil(4 * threads).clamp(4, 64).next_multiple_of(4);
    out.par_chunks_mut(per_task * rows).enumerate().for_each(|(c, o)| {
        let n = o.len() / rows;
        for j in 0..rows {
            sweep(wrow(j), c * per_task, n, &mut o[j..], rows);
        }
    });
    out
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

#[cfg(target_arch = "x86_64")]
fn has_avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

#[cfg(target_arch = "x86_64")]
fn has_f16c() -> bool {
    has_avx2_fma() && std::arch::is_x86_feature_detected!("f16c")
}

/// AVX-512 VNNI with 256-bit vectors (EPYC Genoa/Turin, Xeon Sapphire
/// Rapids and later): `vpdpbusd` does the u8×i8 products and their sums to
/// i32 in one instruction where AVX2 needs two, with exactly the same
/// integers per lane and the same float accumulation afterwards, so its
/// results are bit-identical to the AVX2 kernels'.
#[cfg(target_arch = "x86_64")]
fn has_avx512_vnni() -> bool {
    has_avx2_fma()
        && std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

/// Which matrix kernels run: `"avx2"` where the CPU has AVX2 and FMA, else
/// `"scalar"`. `VEIL_KERNELS` (read once) chooses otherwise: `avx512-vnni`
/// (where the CPU has it), `avx2` or `scalar`. The VNNI kernels are not the
/// default because they measured slower here: on an AMD EPYC (Zen 4) prefill
/// ran about 11% slower and decode the same (`cargo bench --bench model`
/// runs both side by side).
pub fn kernel_name() -> &'static str {
    static CHOSEN: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    CHOSEN.get_or_init(|| {
        let wanted = std::env::var("VEIL_KERNELS").unwrap_or_default();
        #[cfg(target_arch = "x86_64")]
        {
            if wanted == "avx512-vnni" && has_avx512_vnni() {
                return "avx512-vnni";
            }
            if wanted != "scalar" && has_avx2_fma() {
                return "avx2";
            }
        }
        let _ = wanted;
        "scalar"
    })
}

/// Whether this CPU can run the AVX-512 VNNI kernels (`VEIL_KERNELS=avx512-vnni`).
pub fn vnni_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        has_avx512_vnni()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn q41_dots() -> Dots<BlockQ41, BlockQ81> {
    #[cfg(target_arch = "x86_64")]
    if kernel_name() == "avx512-vnni" {
        return Dots {
            // SAFETY (both): selected only after run-time detection of AVX2, FMA, AVX512-VNNI and AVX512-VL.
            one: |w, x| unsafe { q41_dot_vnni(w, x) },
            four: |w, x| unsafe { q41_dot4_vnni(w, x) },
        };
    }
    #[cfg(target_arch = "x86_64")]
    if kernel_name() == "avx2" {
        return Dots {
            // SAFETY (both): selected only after run-time detection of AVX2 and FMA.
            one: |w, x| unsafe { q41_dot_avx2(w, x) },
            four: |w, x| unsafe { q41_dot4_avx2(w, x) },
        };
    }
    Dots { one: q41_dot_scalar, four: |w, x| x.map(|x| q41_dot_scalar(w, x)) }
}

fn q80_dots() -> Dots<BlockQ80, BlockQ80> {
    #[cfg(target_arch = "x86_64")]
    if kernel_name() == "avx512-vnni" {
        return Dots {
            // SAFETY (both): selected only after run-time detection of AVX2, FMA, AVX512-VNNI and AVX512-VL.
            one: |w, x| unsafe { q80_dot_vnni(w, x) },
            four: |w, x| unsafe { q80_dot4_vnni(w, x) },
        };
    }
    #[cfg(target_arch = "x86_64")]
    if kernel_name() == "avx2" {
        return Dots {
            // SAFETY (both): selected only after run-time detection of AVX2 and FMA.
            one: |w, x| unsafe { q80_dot_avx2(w, x) },
            four: |w, x| unsafe { q80_dot4_avx2(w, x) },
        };
    }
    Dots { one: q80_dot_scalar, four: |w, x| x.map(|x| q80_dot_scalar(w, x)) }
}

fn q41_dot_scalar(w: &[BlockQ41], x: &[BlockQ81]) -> f32 {
    let mut sum = 0f32;
    for (b, a) in w.iter().zip(x) {
        let mut sumi = 0i32;
        for j in 0..16 {
            sumi += i32::from(b.qs[j] & 0x0F) * i32::from(a.qs[j]);
            sumi += i32::from(b.qs[j] >> 4) * i32::from(a.qs[j + 16]);
        }
        sum += b.d * a.d * sumi as f32 + b.m * a.s;
    }
    sum
}

fn q80_dot_scalar(w: &[BlockQ80], x: &[BlockQ80]) -> f32 {
    let mut sum = 0f32;
    for (b, a) in w.iter().zip(x) {
        let sumi: i32 = b.qs.iter().zip(&a.qs).map(|(&p, &q)| i32::from(p) * i32::from(q)).sum();
        sum += b.d * a.d * sumi as f32;
    }
    sum
}

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

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn q41_dot_avx2(w: &[BlockQ41], x: &[BlockQ81]) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0f32;
    let low = _mm_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    for (b, a) in w.iter().zip(x) {
        summs += b.m * a.s;
        // SAFETY: `b.qs` is 16 bytes and `a.qs` 32 bytes; the unaligned
        // loads read exactly those arrays.
        let q = _mm_loadu_si128(b.qs.as_ptr().cast());
        let lo = _mm_and_si128(q, low);
        let hi = _mm_and_si128(_mm_srli_epi16(q, 4), low);
        let q4 = _mm256_set_m128i(hi, lo);
        let q8 = _mm256_loadu_si256(a.qs.as_ptr().cast());
        // u8 × i8 pairs summed to i16 (at most 2·15·128, no saturation), then to i32.
        let p32 = _mm256_madd_epi16(_mm256_maddubs_epi16(q4, q8), ones);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(b.d * a.d), _mm256_cvtepi32_ps(p32), acc);
    }
    hsum(acc) + summs
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn q80_dot_avx2(w: &[BlockQ80], x: &[BlockQ80]) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = _mm256_setzero_ps();
    let ones = _mm256_set1_epi16(1);
    for (b, a) in w.iter().zip(x) {
        // SAFETY: both `qs` are 32 bytes; the unaligned loads read exactly them.
        let qw = _mm256_loadu_si256(b.qs.as_ptr().cast());
        let qx = _mm256_loadu_si256(a.qs.as_ptr().cast());
        // |w| (as u8, so −128 reads 128) times x with w's sign: the pair sums
        // stay below 2·128·127 because activations are quantized to ±127.
        let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qx, qw));
        let p32 = _mm256_madd_epi16(p16, ones);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(b.d * a.d), _mm256_cvtepi32_ps(p32), acc);
    }
    hsum(acc)
}

/// [`q41_dot_avx2`] for four input rows: each weight block is unpacked
/// once; every row's accumulation is the single-row sequence exactly.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn q41_dot4_avx2(w: &[BlockQ41], x: [&[BlockQ81]; 4]) -> [f32; 4] {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut summs = [0f32; 4];
    let low = _mm_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let n = x.iter().map(|r| r.len()).min().unwrap_or(0).min(w.len());
    for (i, b) in w[..n].iter().enumerate() {
        // SAFETY: `b.qs` is 16 bytes; the load reads exactly it.
        let q = _mm_loadu_si128(b.qs.as_ptr().cast());
        let q4 = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), low), _mm_and_si128(q, low));
        for r in 0..4 {
            let a = &x[r][i];
            summs[r] += b.m * a.s;
            // SAFETY: `a.qs` is 32 bytes; the load reads exactly it.
            let q8 = _mm256_loadu_si256(a.qs.as_ptr().cast());
            let p32 = _mm256_madd_epi16(_mm256_maddubs_epi16(q4, q8), ones);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(b.d * a.d), _mm256_cvtepi32_ps(p32), acc[r]);
        }
    }
    [hsum(acc[0]) + summs[0], hsum(acc[1]) + summs[1], hsum(acc[2]) + summs[2], hsum(acc[3]) + summs[3]]
}

/// [`q80_dot_avx2`] for four input rows (bit-identical per row).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn q80_dot4_avx2(w: &[BlockQ80], x: [&[BlockQ80]; 4]) -> [f32; 4] {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_ps(); 4];
    let ones = _mm256_set1_epi16(1);
    let n = x.iter().map(|r| r.len()).min().unwrap_or(0).min(w.len());
    for (i, b) in w[..n].iter().enumerate() {
        // SAFETY: `b.qs` is 32 bytes; the load reads exactly it.
        let qw = _mm256_loadu_si256(b.qs.as_ptr().cast());
        let aw = _mm256_sign_epi8(qw, qw);
        for r in 0..4 {
            let a = &x[r][i];
            // SAFETY: `a.qs` is 32 bytes; the load reads exactly it.
            let qx = _mm256_loadu_si256(a.qs.as_ptr().cast());
            let p32 = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(qx, qw)), ones);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(b.d * a.d), _mm256_cvtepi32_ps(p32), acc[r]);
        }
    }
    [hsum(acc[0]), hsum(acc[1]), hsum(acc[2]), hsum(acc[3])]
}

/// [`q41_dot_avx2`] with `vpdpbusd` for the integer products (bit-identical).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
unsafe fn q41_dot_vnni(w: &[BlockQ41], x: &[BlockQ81]) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0f32;
    let low = _mm_set1_epi8(0x0F);
    for (b, a) in w.iter().zip(x) {
        summs += b.m * a.s;
        // SAFETY: `b.qs` is 16 bytes and `a.qs` 32 bytes; the unaligned
        // loads read exactly those arrays.
        let q = _mm_loadu_si128(b.qs.as_ptr().cast());
        let q4 = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), low), _mm_and_si128(q, low));
        let q8 = _mm256_loadu_si256(a.qs.as_ptr().cast());
        // Four u8 × i8 products summed to i32 per lane: the AVX2 kernel's lanes exactly.
        let p32 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q4, q8);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(b.d * a.d), _mm256_cvtepi32_ps(p32), acc);
    }
    hsum(acc) + summs
}

/// [`q41_dot4_avx2`] with `vpdpbusd` (bit-identical per row).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
unsafe fn q41_dot4_vnni(w: &[BlockQ41], x: [&[BlockQ81]; 4]) -> [f32; 4] {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut summs = [0f32; 4];
    let low = _mm_set1_epi8(0x0F);
    let n = x.iter().map(|r| r.len()).min().unwrap_or(0).min(w.len());
    for (i, b) in w[..n].iter().enumerate() {
        // SAFETY: `b.qs` is 16 bytes; the load reads exactly it.
        let q = _mm_loadu_si128(b.qs.as_ptr().cast());
        let q4 = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), low), _mm_and_si128(q, low));
        for r in 0..4 {
            let a = &x[r][i];
            summs[r] += b.m * a.s;
            // SAFETY: `a.qs` is 32 bytes; the load reads exactly it.
            let q8 = _mm256_loadu_si256(a.qs.as_ptr().cast());
            let p32 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q4, q8);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(b.d * a.d), _mm256_cvtepi32_ps(p32), acc[r]);
        }
    }
    [hsum(acc[0]) + summs[0], hsum(acc[1]) + summs[1], hsum(acc[2]) + summs[2], hsum(acc[3]) + summs[3]]
}

/// [`q80_dot_avx2`] with `vpdpbusd` (bit-identical): |w| as u8 times x
/// carrying w's sign, four products per lane, no saturation (|x| ≤ 127).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
unsafe fn q80_dot_vnni(w: &[BlockQ80], x: &[BlockQ80]) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = _mm256_setzero_ps();
    for (b, a) in w.iter().zip(x) {
        // SAFETY: both `qs` are 32 bytes; the unaligned loads read exactly them.
        let qw = _mm256_loadu_si256(b.qs.as_ptr().cast());
        let qx = _mm256_loadu_si256(a.qs.as_ptr().cast());
        let p32 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qx, qw));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(b.d * a.d), _mm256_cvtepi32_ps(p32), acc);
    }
    hsum(acc)
}

/// [`q80_dot4_avx2`] with `vpdpbusd` (bit-identical per row).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
unsafe fn q80_dot4_vnni(w: &[BlockQ80], x: [&[BlockQ80]; 4]) -> [f32; 4] {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_ps(); 4];
    let n = x.iter().map(|r| r.len()).min().unwrap_or(0).min(w.len());
    for (i, b) in w[..n].iter().enumerate() {
        // SAFETY: `b.qs` is 32 bytes; the load reads exactly it.
        let qw = _mm256_loadu_si256(b.qs.as_ptr().cast());
        let aw = _mm256_sign_epi8(qw, qw);
        for r in 0..4 {
            let a = &x[r][i];
            // SAFETY: `a.qs` is 32 bytes; the load reads exactly it.
            let qx = _mm256_loadu_si256(a.qs.as_ptr().cast());
            let p32 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, _mm256_sign_epi8(qx, qw));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(b.d * a.d), _mm256_cvtepi32_ps(p32), acc[r]);
        }
    }
    [hsum(acc[0]), hsum(acc[1]), hsum(acc[2]), hsum(acc[3])]
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: u32) -> impl FnMut() -> u32 {
        let mut state = seed;
        move || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            state
        }
    }

    fn q41_sample(rows: usize, cols: usize, seed: u32) -> Vec<u8> {
        let mut next = lcg(seed);
        let mut raw = Vec::new();
        for _ in 0..rows * cols / BLOCK {
            raw.extend(f16::from_f32(0.01 + (next() % 100) as f32 / 5000.0).to_bits().to_le_bytes());
            raw.extend(f16::from_f32(-0.1 + (next() % 100) as f32 / 2000.0).to_bits().to_le_bytes());
            raw.extend((0..16).map(|_| (next() >> 8) as u8));
        }
        raw
    }

    fn q80_sample(rows: usize, cols: usize, seed: u32) -> Vec<u8> {
        let mut next = lcg(seed);
        let mut raw = Vec::new();
        for _ in 0..rows * cols / BLOCK {
            raw.extend(f16::from_f32(0.001 + (next() % 100) as f32 / 50000.0).to_bits().to_le_bytes());
            // Include −128, which the sign trick must read as magnitude 128.
            raw.extend((0..32).map(|i| if i == 5 { 0x80 } else { (next() >> 8) as u8 }));
        }
        raw
    }

    fn input(m: usize, cols: usize) -> Vec<f32> {
        (0..m * cols).map(|i| ((i * 7919) % 200) as f32 / 100.0 - 1.0).collect()
    }

    fn close(got: f32, want: f32, rel: f32) -> bool {
        (got - want).abs() <= rel * want.abs().max(1.0)
    }

    #[test]
    fn q41_simd_equals_scalar_and_approximates_the_dequantized_product() {
        let (rows, cols, m) = (40, 96, 3);
        let w = Q41Matrix::from_gguf_bytes(&q41_sample(rows, cols, 1), rows, cols).unwrap();
        let x = input(m, cols);
        let out = w.matmul(&x, m);
        let dq = w.dequantized();
        let xq: Vec<BlockQ81> = x.chunks_exact(cols).flat_map(quantize_row_q8_1).collect();
        let per = cols / BLOCK;
        for i in 0..m {
            for j in 0..rows {
                let exact: f32 = (0..cols).map(|k| x[i * cols + k] * dq[j * cols + k]).sum();
                let got = out[i * rows + j];
                assert!(close(got, exact, 0.05), "({i},{j}) {got} vs {exact}");
                let scalar = q41_dot_scalar(&w.blocks[j * per..(j + 1) * per], &xq[i * per..(i + 1) * per]);
                assert!(close(got, scalar, 1e-4), "({i},{j}) simd {got} vs scalar {scalar}");
            }
        }
    }

    /// The VNNI kernels are the AVX2 kernels' arithmetic with one
    /// instruction instead of two for the integer products: every output
    /// equal bit for bit, one row and four rows at a time, including the
    /// extremes (Q4 nibbles 15, Q8 values ±127 and the weights' −128).
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn vnni_kernels_equal_avx2_bit_for_bit() {
        if !has_avx512_vnni() {
            veil_tests::skip("this CPU has no AVX512-VNNI: the VNNI kernels were not compared");
            return;
        }
        let (rows, cols) = (24, 256);
        let per = cols / BLOCK;
        let mut extreme_q41 = q41_sample(rows, cols, 3);
        for b in extreme_q41.chunks_exact_mut(Q4_1_BLOCK_BYTES).step_by(3) {
            b[4..].fill(0xFF);
        }
        let mut extreme_q80 = q80_sample(rows, cols, 5);
        for b in extreme_q80.chunks_exact_mut(Q8_0_BLOCK_BYTES).step_by(2) {
            b[2..].fill(0x80);
        }
        let mut x = input(4, cols);
        x[..cols].iter_mut().enumerate().for_each(|(k, v)| *v = if k % 2 == 0 { 8.0 } else { -8.0 });
        let xq41: Vec<BlockQ81> = x.chunks_exact(cols).flat_map(quantize_row_q8_1).collect();
        let xq80: Vec<BlockQ80> = x.chunks_exact(cols).flat_map(quantize_row_q8_0).collect();
        let xr = |xq: &[BlockQ81], i: usize| xq[i * per..(i + 1) * per].to_vec();
        for raw in [q41_sample(rows, cols, 11), extreme_q41] {
            let w = Q41Matrix::from_gguf_bytes(&raw, rows, cols).unwrap();
            for j in 0..rows {
                let wr = &w.blocks[j * per..(j + 1) * per];
                let four = [xr(&xq41, 0), xr(&xq41, 1), xr(&xq41, 2), xr(&xq41, 3)];
                // SAFETY: AVX2, FMA, AVX512-VNNI and AVX512-VL were detected above.
                let (a, b) = unsafe {
                    (
                        q41_dot4_avx2(wr, [&four[0], &four[1], &four[2], &four[3]]),
                        q41_dot4_vnni(wr, [&four[0], &four[1], &four[2], &four[3]]),
                    )
                };
                assert_eq!(a.map(f32::to_bits), b.map(f32::to_bits), "Q4_1 row {j}, four inputs");
                for (i, xi) in four.iter().enumerate() {
                    // SAFETY: as above.
                    let (a, b) = unsafe { (q41_dot_avx2(wr, xi), q41_dot_vnni(wr, xi)) };
                    assert_eq!(a.to_bits(), b.to_bits(), "Q4_1 row {j}, input {i}");
                }
            }
        }
        let xr = |i: usize| xq80[i * per..(i + 1) * per].to_vec();
        for raw in [q80_sample(rows, cols, 13), extreme_q80] {
            let w = Q80Matrix::from_gguf_bytes(&raw, rows, cols).unwrap();
            for j in 0..rows {
                let wr = &w.blocks[j * per..(j + 1) * per];
                let four = [xr(0), xr(1), xr(2), xr(3)];
                // SAFETY: as above.
                let (a, b) = unsafe {
                    (
                        q80_dot4_avx2(wr, [&four[0], &four[1], &four[2], &four[3]]),
                        q80_dot4_vnni(wr, [&four[0], &four[1], &four[2], &four[3]]),
                    )
                };
                assert_eq!(a.map(f32::to_bits), b.map(f32::to_bits), "Q8_0 row {j}, four inputs");
                for (i, xi) in four.iter().enumerate() {
                    // SAFETY: as above.
                    let (a, b) = unsafe { (q80_dot_avx2(wr, xi), q80_dot_vnni(wr, xi)) };
                    assert_eq!(a.to_bits(), b.to_bits(), "Q8_0 row {j}, input {i}");
                }
            }
        }
    }

    #[test]
    fn q80_simd_equals_scalar_and_rows_dequantize() {
        let (rows, cols, m) = (33, 64, 2);
        let w = Q80Matrix::from_gguf_bytes(&q80_sample(rows, cols, 7), rows, cols).unwrap();
        let x = input(m, cols);
        let out = w.matmul(&x, m);
        let xq: Vec<BlockQ80> = x.chunks_exact(cols).flat_map(quantize_row_q8_0).collect();
        let per = cols / BLOCK;
        let mut row = vec![0f32; cols];
        for j in 0..rows {
            w.row_into(j, &mut row);
            for i in 0..m {
                let exact: f32 = (0..cols).map(|k| x[i * cols + k] * row[k]).sum();
                let got = out[i * rows + j];
                assert!(close(got, exact, 0.05), "({i},{j}) {got} vs {exact}");
                let scalar = q80_dot_scalar(&w.blocks[j * per..(j + 1) * per], &xq[i * per..(i + 1) * per]);
                assert!(close(got, scalar, 1e-4), "({i},{j}) simd {got} vs scalar {scalar}");
            }
        }
    }

    #[test]
    fn batching_rows_does_not_change_any_output() {
        let (rows, cols) = (50, 64);
        let w = Q41Matrix::from_gguf_bytes(&q41_sample(rows, cols, 3), rows, cols).unwrap();
        // Both strategies: few rows (split by weight rows) and many (split by input rows).
        for m in [4, 70] {
            let x = input(m, cols);
            let batched = w.matmul(&x, m);
            for i in 0..m {
                let alone = w.matmul(&x[i * cols..(i + 1) * cols], 1);
                assert_eq!(&batched[i * rows..(i + 1) * rows], &alone[..], "m={m} row {i}");
            }
        }
    }

    #[test]
    fn stacked_matrices_give_their_parts_outputs_side_by_side() {
        let cols = 64;
        let a = Q41Matrix::from_gguf_bytes(&q41_sample(8, cols, 4), 8, cols).unwrap();
        let b = Q41Matrix::from_gguf_bytes(&q41_sample(5, cols, 5), 5, cols).unwrap();
        let x = input(1, cols);
        let (ya, yb) = (a.matmul(&x, 1), b.matmul(&x, 1));
        let s = Q41Matrix::stack(vec![a, b]).unwrap();
        assert_eq!(s.rows(), 13);
        assert_eq!(s.matmul(&x, 1), [ya, yb].concat());
    }

    #[test]
    fn f16_attention_primitives_match_scalar() {
        for n in [8, 64, 67] {
            let q: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let k: Vec<f16> = (0..n).map(|i| f16::from_f32((i as f32 * 0.11).cos())).collect();
            let want: f32 = q.iter().zip(&k).map(|(a, b)| a * b.to_f32()).sum();
            assert!(close(dot_f16(&q, &k), want, 1e-5));
            let mut y = q.clone();
            axpy_f16(&mut y, 0.5, &k);
            for i in 0..n {
                assert!(close(y[i], q[i] + 0.5 * k[i].to_f32(), 1e-6));
            }
        }
    }

    #[test]
    fn rejects_wrong_sizes() {
        assert!(Q41Matrix::from_gguf_bytes(&[0; 19], 1, 32).is_err());
        assert!(Q41Matrix::from_gguf_bytes(&[0; 20], 1, 16).is_err());
        assert!(Q80Matrix::from_gguf_bytes(&[0; 33], 1, 32).is_err());
        assert!(Q80Matrix::from_gguf_bytes(&[], 0, 0).is_err());
        assert!(Q41Matrix::stack(vec![]).is_err());
    }

    #[test]
    fn the_resident_digest_sees_one_flipped_weight() {
        use sha2::Digest as _;
        let (rows, cols) = (4, 64);
        let raw: Vec<u8> = (0..rows * cols / 32 * Q4_1_BLOCK_BYTES).map(|i| (i * 7 % 251) as u8).collect();
        let digest = |m: &Q41Matrix| {
            let mut h = sha2::Sha256::new();
            m.digest_into(&mut h);
            h.finalize()
        };
        let mut m = Q41Matrix::from_gguf_bytes(&raw, rows, cols).unwrap();
        let same = Q41Matrix::from_gguf_bytes(&raw, rows, cols).unwrap();
        let before = digest(&m);
        assert_eq!(before, digest(&same));
        for block in [0, 3, 7] {
            m.flip_for_test(block);
            assert_ne!(digest(&m), before, "block {block}");
            m.flip_for_test(block);
            assert_eq!(digest(&m), before);
        }
    }
}
