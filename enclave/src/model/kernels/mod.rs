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

/// Output rows handed to one task: enough work to amortise a steal.
const ROWS_PER_TASK: usize = 16;

/// Bytes of quantized input rows one prefill task holds: well inside the
/// smallest per-core L2 of the CPUs Veil targets (512 KiB on AMD Zen 3; Zen 4
/// has 1 MiB), the weight rows streaming past beside them.
const TASK_INPUT_BYTES: usize = 192 << 10;

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

/// `out[i][j] = dot(w row j, x row i)` for `m` input rows of `row_bytes`
/// each, `one` giving a single input row's dot and `sweep(w row, first, n,
/// out, stride)` those of input rows `first..first + n` (`first` a multiple
/// of 8), written at `out[i * stride]`. Few input rows (decode): weight rows
/// are split across threads. Many (prefill, batches): input rows are, and
/// each task sweeps the whole weight, every weight row staying in L1 while
/// the task's input rows pass it. Every output is one sequential dot, so
/// results do not depend on the thread count or on batching.
fn par_tiles<W: Sync>(
    w: &[W],
    rows: usize,
    per_row: usize,
    m: usize,
    row_bytes: usize,
    one: impl Fn(&[W]) -> f32 + Sync,
    sweep: impl Fn(&[W], usize, usize, &mut [f32], usize) + Sync,
) -> Vec<f32> {
    let wrow = |j: usize| &w[j * per_row..(j + 1) * per_row];
    let mut out = vec![0f32; m * rows];
    let threads = rayon::current_num_threads();
    if m < 4 * threads {
        if m == 1 {
            out.par_chunks_mut(ROWS_PER_TASK).enumerate().for_each(|(c, o)| {
                for (r, v) in o.iter_mut().enumerate() {
                    *v = one(wrow(c * ROWS_PER_TASK + r));
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
    // Tasks are tiles: a chunk of input rows (as many as stay in L2 while
    // they are swept once per weight row: wide matrices, 8192 inputs at
    // 9 KiB a row, get fewer) times a range of weight rows. Chunks as large
    // as that allows keep the weights streamed the fewest times; ranges of
    // weight rows give every thread several tasks.
    let most = (TASK_INPUT_BYTES / row_bytes.max(1)).clamp(8, 64) / 8 * 8;
    let chunk = m.next_multiple_of(8).min(most);
    let chunks = m.div_ceil(chunk);
    let ranges = (4 * threads).div_ceil(chunks).clamp(1, rows.div_ceil(ROWS_PER_TASK));
    let per_range = rows.div_ceil(ranges);
    let tiles: Vec<(usize, usize)> =
        (0..chunks).flat_map(|c| (0..rows.div_ceil(per_range)).map(move |r| (c, r))).collect();
    let parts: Vec<Vec<f32>> = tiles
        .par_iter()
        .map(|&(c, r)| {
            let (first, n) = (c * chunk, chunk.min(m - c * chunk));
            let js = r * per_range..((r + 1) * per_range).min(rows);
            let mut o = vec![0f32; n * js.len()];
            for (k, j) in js.clone().enumerate() {
                sweep(wrow(j), first, n, &mut o[k..], js.len());
            }
            o
        })
        .collect();
    for (&(c, r), o) in tiles.iter().zip(&parts) {
        let j0 = r * per_range;
        let width = o.len() / chunk.min(m - c * chunk);
        for (i, vals) in o.chunks_exact(width).enumerate() {
            out[(c * chunk + i) * rows + j0..][..width].copy_from_slice(vals);
        }
    }
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

/// AVX-512 VNNI (EPYC Genoa/Turin, Xeon Sapphire Rapids and later; every
/// CPU with it has AVX-512F, BW and VL, checked all the same): `vpdpbusd`
/// does the u8×i8 products and their sums to i32 in one instruction where
/// AVX2 needs two. The grouped kernels run it on 256-bit vectors; the
/// K-quants' one-row kernel on 512-bit ones.
#[cfg(target_arch = "x86_64")]
fn has_avx512_vnni() -> bool {
    has_avx2_fma()
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

/// The kernels a weight format runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Portable Rust: the arithmetic the SIMD kernels are tested against.
    Scalar,
    /// AVX2 and FMA.
    Avx2,
    /// AVX-512 VNNI on 256-bit vectors (with AVX2 and FMA).
    Avx512Vnni,
}

impl Isa {
    /// The name `VEIL_KERNELS` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Scalar => "scalar",
            Self::Avx2 => "avx2",
            Self::Avx512Vnni => "avx512-vnni",
        }
    }
}

/// What `VEIL_KERNELS` asks for, read once: unset gives each format its
/// fastest kernels on this CPU; `avx512-vnni`, `avx2` or `scalar` force
/// that family wherever a format has it and the CPU can run it (the
/// benchmark's A/B). Any other value is warned about, once, and means unset.
fn wanted() -> Option<Isa> {
    static WANTED: std::sync::OnceLock<Option<Isa>> = std::sync::OnceLock::new();
    *WANTED.get_or_init(|| {
        let asked = std::env::var("VEIL_KERNELS").ok()?;
        let isa = parse_isa(&asked);
        if isa.is_none() {
            tracing::warn!(
                value = %asked.escape_debug(),
                "VEIL_KERNELS is not one of avx512-vnni, avx2, scalar; each format runs its default kernels"
            );
        }
        isa
    })
}

/// An [`Isa`] by the name `VEIL_KERNELS` takes.
fn parse_isa(name: &str) -> Option<Isa> {
    [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni].into_iter().find(|isa| isa.name() == name)
}

/// The most this CPU runs of `best`: VNNI needs AVX-512 VNNI and VL, AVX2
/// needs AVX2 and FMA, scalar runs anywhere.
fn at_most(best: Isa) -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if best == Isa::Avx512Vnni && has_avx512_vnni() {
            return Isa::Avx512Vnni;
        }
        if best != Isa::Scalar && has_avx2_fma() {
            return Isa::Avx2;
        }
    }
    let _ = best;
    Isa::Scalar
}

/// Q8_0's kernels, and MXFP4's (its blocks are 8-bit blocks with a
/// 4-bit code, so the two formats share one arithmetic: see [`mxfp4`]).
/// VNNI by default where the CPU has it: its grouped kernel
/// ([`q80_matmul_vnni`]) prefilled a Q8_0 model of Llama-3.2-1B's shape
/// 1.6–1.9× faster than the AVX2 kernels on an AMD EPYC (Zen 4) and
/// decoded it as fast. Its arithmetic is the scalar kernel's (each
/// block's exact integer sum, then the float steps of [`sum4`]), not the
/// AVX2 kernels' (eight lanes of fused multiply-adds, summed at the end:
/// fewer instructions a block where a horizontal sum per block costs more
/// than it saves), so a CPU without VNNI rounds Q8_0 and MXFP4 products
/// differently (within float rounding), and replicas of one stage on CPUs
/// of different kinds may differ in the last bits.
pub fn q80_isa() -> Isa {
    at_most(wanted().unwrap_or(Isa::Avx512Vnni))
}

/// Q4_1's kernels: AVX2 unless VNNI is asked for by name. Its VNNI kernels
/// are the AVX2 ones' arithmetic with `vpdpbusd` for the integer products
/// (bit-identical, tested), and prefilled the reference model about 11%
/// slower on Zen 4.
pub fn q41_isa() -> Isa {
    at_most(wanted().unwrap_or(Isa::Avx2))
}

/// The K-quants' kernels (Q4_K, Q5_K, Q6_K): VNNI by default where the
/// CPU has it. Its grouped kernel ([`kquant`]'s `vnni`) and its one-row
/// kernel on 512-bit vectors (`wide`, decode) compute the same exact
/// integers and float steps as the scalar and AVX2 kernels, so all give
/// equal outputs bit for bit (tested).
pub fn kquant_isa() -> Isa {
    at_most(wanted().unwrap_or(Isa::Avx512Vnni))
}

/// Which kernels each format runs, for logs and the benchmark, e.g.
/// `Q8_0/MXFP4 avx512-vnni, Q4_1 avx2, K-quants avx2`.
pub fn kernel_name() -> &'static str {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        format!("Q8_0/MXFP4 {}, Q4_1 {}, K-quants {}", q80_isa().name(), q41_isa().name(), kquant_isa().name())
    })
}

/// Whether this CPU can run the AVX-512 VNNI kernels.
pub fn vnni_available() -> bool {
    at_most(Isa::Avx512Vnni) == Isa::Avx512Vnni
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
        acc = _mm256_fmadd_ps(_mm256_set1_ps(b.scale() * a.d), _mm256_cvtepi32_ps(p32), acc);
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
        let pairs = b.pair_weights();
        for r in 0..4 {
            let a = &x[r][i];
            // SAFETY: `a.qs` is 32 bytes; the load reads exactly it.
            let qx = _mm256_loadu_si256(a.qs.as_ptr().cast());
            let p32 = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(qx, sw)), pairs);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(b.scale() * a.d), _mm256_cvtepi32_ps(p32), acc[r]);
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

/// Eight Q8_0 input rows' block `b`, interleaved for `vpdpbusd`: `q[j]`
/// holds bytes `4j..4j + 4` of each row's block (row `i` in bytes
/// `4i..4i + 4`), offset by +128 to u8 (inputs are quantized to ±127, so
/// 1..=255), and `d` the rows' scales.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Q80x8 {
    q: [[u8; 32]; 8],
    d: [f32; 8],
}

/// Input rows `8g..8g + 8` of `xq` (rows of `per_row` blocks) as
/// [`Q80x8`], group after group, `per_row` blocks each.
#[cfg(target_arch = "x86_64")]
fn interleave_q80(xq: &[BlockQ80], per_row: usize, groups: usize) -> Vec<Q80x8> {
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
fn q80_matmul_vnni<B: I8Block>(w: &[B], rows: usize, per_row: usize, xq: &[BlockQ80], m: usize) -> Vec<f32> {
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
fn sweep_groups(
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
unsafe fn q80_dots8_vnni<B: I8Block, const G: usize>(w: &[B], xs: [&[Q80x8]; G]) -> [[f32; 8]; G] {
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
unsafe fn q80_dot_vnni<B: I8Block>(w: &[B], x: &[BlockQ80], xd: &[f32], xs: &[i32]) -> f32 {
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

pub mod expanded;
pub mod grid;
pub mod kquant;
mod kv;
pub mod mxfp4;
pub mod q5_1;
pub use kv::{axpy_f16, dot_f16};

#[cfg(test)]
mod tests;
