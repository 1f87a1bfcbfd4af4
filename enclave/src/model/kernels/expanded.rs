//! Blocks of 32 weights that are, exactly, 32 signed 8-bit integers and
//! one scale once unpacked: MXFP4 (a 16-entry E2M1 table and an E8M0
//! scale), IQ4_NL (a 16-entry non-linear table and an f16 scale), IQ4_XS
//! (IQ4_NL's table in super-blocks of 256 with a 6-bit scale per 32, here
//! folded into each block's f32 scale exactly as ggml's dequantisation
//! computes it) and Q5_0 (five bits less 16, an f16 scale).
//!
//! The blocks stay packed in memory (20 bytes a block for the table types,
//! 24 for Q5_0) and expand in registers to their integers (`pshufb` table
//! lookups; Q5_0's fifth bits spread to bytes), then run the Q8_0 × Q8_0
//! kernels' arithmetic against Q8_0 activations: per block the exact
//! integer dot, times `w.d · x.d`. That is llama.cpp's arithmetic for
//! MXFP4, IQ4_NL and Q5_0, which it pairs with Q8_0; llama.cpp pairs IQ4_XS
//! with Q8_K (one activation scale per 256), so Veil's IQ4_XS products use
//! a finer activation scale than llama.cpp's. Every kernel (scalar, AVX2,
//! VNNI) gives the results of the blocks expanded to Q8_0 at load, bit for
//! bit (tested).

use std::marker::PhantomData;

use rayon::prelude::*;

pub(crate) use super::expand::Expand;
use super::{check_shape, f16_at, grid, par_matmul, quantize_row_q8_0, BlockQ80, Dots, KernelError, BLOCK};

/// Bytes of one IQ4_NL block in a GGUF.
pub const IQ4_NL_BLOCK_BYTES: usize = 18;
/// Bytes of one IQ4_XS super-block (256 weights) in a GGUF.
pub const IQ4_XS_BLOCK_BYTES: usize = 136;
/// Bytes of one Q5_0 block in a GGUF.
pub const Q5_0_BLOCK_BYTES: usize = 22;

/// IQ4_NL's and IQ4_XS's values (ggml's `kvalues_iq4nl`).
pub const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// A 16-entry table of integers that 4-bit codes index.
pub(crate) trait Codebook: Copy + Send + Sync + std::fmt::Debug + 'static {
    const TABLE: [i8; 16];
    /// [`Codebook::TABLE`]'s bits, as bytes (the `pshufb` table).
    const TABLE_BITS: [u8; 16] = {
        let mut t = [0u8; 16];
        let mut i = 0;
        while i < 16 {
            t[i] = Self::TABLE[i] as u8;
            i += 1;
        }
        t
    };
    /// [`Codebook::TABLE`] plus 128, as unsigned bytes (VNNI's unsigned side).
    const TABLE_U8: [u8; 16] = {
        let mut t = [0u8; 16];
        let mut i = 0;
        while i < 16 {
            t[i] = (Self::TABLE[i] as u8) ^ 0x80;
            i += 1;
        }
        t
    };
}

/// MXFP4's E2M1 values, doubled.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mxfp4Code;
impl Codebook for Mxfp4Code {
    const TABLE: [i8; 16] = super::mxfp4::KVALUES;
}

/// IQ4_NL's and IQ4_XS's non-linear values.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Iq4Code;
impl Codebook for Iq4Code {
    const TABLE: [i8; 16] = KVALUES_IQ4NL;
}

/// A block of 32 table codes: value `j` in the low nibble of `qs[j]`,
/// value `j + 16` in the high one; the scale decoded to f32.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
struct Nib<C> {
    d: f32,
    qs: [u8; 16],
    code: PhantomData<C>,
}

impl<C: Codebook> Nib<C> {
    fn new(d: f32, qs: &[u8]) -> Self {
        let mut q = [0u8; 16];
        q.copy_from_slice(qs);
        Self { d, qs: q, code: PhantomData }
    }
}

/// Nibble `j` of `qs` (low nibbles, then high) looked up in `table`.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn lookup(qs: &[u8; 16], table: &[u8; 16]) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    // SAFETY: `table` and `qs` are 16 bytes; each load reads exactly them.
    let (t, q) = (_mm_loadu_si128(table.as_ptr().cast()), _mm_loadu_si128(qs.as_ptr().cast()));
    let low = _mm_set1_epi8(0x0F);
    let lo = _mm_shuffle_epi8(t, _mm_and_si128(q, low));
    let hi = _mm_shuffle_epi8(t, _mm_and_si128(_mm_srli_epi16(q, 4), low));
    _mm256_set_m128i(hi, lo)
}

impl<C: Codebook> Expand for Nib<C> {
    fn scale(&self) -> f32 {
        self.d
    }
    fn ints(&self) -> [i8; BLOCK] {
        std::array::from_fn(|j| C::TABLE[usize::from(if j < 16 { self.qs[j] & 0x0F } else { self.qs[j - 16] >> 4 })])
    }
    fn bytes_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.d.to_bits().to_le_bytes());
        out.extend_from_slice(&self.qs);
    }
}

/// A Q5_0 block in memory: `qh` holds the fifth bit of value `j` at bit `j`.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
struct BlockQ50 {
    d: f32,
    qh: u32,
    qs: [u8; 16],
}

impl Expand for BlockQ50 {
    fn scale(&self) -> f32 {
        self.d
    }
    fn ints(&self) -> [i8; BLOCK] {
        std::array::from_fn(|j| {
            let nibble = if j < 16 { self.qs[j] & 0x0F } else { self.qs[j - 16] >> 4 };
            let fifth = ((self.qh >> j) & 1) as u8;
            (nibble | (fifth << 4)) as i8 - 16
        })
    }
    fn bytes_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.d.to_bits().to_le_bytes());
        out.extend_from_slice(&self.qh.to_le_bytes());
        out.extend_from_slice(&self.qs);
    }
}

#[cfg(target_arch = "x86_64")]
impl<C: Codebook> super::I8Block for Nib<C> {
    fn scale(&self) -> f32 {
        self.d
    }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn weights(&self) -> std::arch::x86_64::__m256i {
        // SAFETY: AVX2 and FMA are enabled here.
        unsafe { lookup(&self.qs, &C::TABLE_BITS) }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn weights_u8(&self) -> std::arch::x86_64::__m256i {
        // SAFETY: AVX2 and FMA are enabled here.
        unsafe { lookup(&self.qs, &C::TABLE_U8) }
    }
}

#[cfg(target_arch = "x86_64")]
impl super::I8Block for BlockQ50 {
    fn scale(&self) -> f32 {
        self.d
    }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn weights(&self) -> std::arch::x86_64::__m256i {
        use std::arch::x86_64::*;
        // SAFETY: AVX2 and FMA are enabled here.
        let (nibbles, set) = unsafe { (super::nibbles_avx2(&self.qs), super::bits_to_bytes(self.qh)) };
        // q − 16: the nibble where the fifth bit is set, else the nibble − 16
        // (its high four bits set, as an i8).
        _mm256_or_si256(nibbles, _mm256_andnot_si256(set, _mm256_set1_epi8(0xF0u8 as i8)))
    }
}

/// A `rows × cols` matrix of expanding blocks.
#[derive(Debug)]
struct Expanded<B> {
    rows: usize,
    cols: usize,
    blocks: Vec<B>,
}

#[cfg(target_arch = "x86_64")]
trait Kernel: Expand + super::I8Block {}
#[cfg(target_arch = "x86_64")]
impl<B: Expand + super::I8Block> Kernel for B {}
#[cfg(not(target_arch = "x86_64"))]
trait Kernel: Expand {}
#[cfg(not(target_arch = "x86_64"))]
impl<B: Expand> Kernel for B {}

impl<B: Kernel> Expanded<B> {
    fn matmul_on(&self, x: &[f32], m: usize, isa: super::Isa) -> Vec<f32> {
        assert_eq!(x.len(), m * self.cols, "input of {} values for {m} rows of {}", x.len(), self.cols);
        let xq: Vec<BlockQ80> = x.chunks_exact(self.cols).flat_map(quantize_row_q8_0).collect();
        #[cfg(target_arch = "x86_64")]
        if isa == super::Isa::Avx512Vnni && !B::HALVED {
            return super::q80_matmul_vnni(&self.blocks, self.rows, self.cols / BLOCK, &xq, m);
        }
        #[cfg(target_arch = "x86_64")]
        if isa == super::Isa::Avx2 && !B::HALVED && m >= EXPAND_ROWS_FROM {
            return matmul_expanding_rows(&self.blocks, self.rows, self.cols / BLOCK, &xq, m);
        }
        par_matmul(&self.blocks, self.rows, self.cols / BLOCK, &xq, m, dots(isa))
    }

    fn digest_into(&self, h: &mut sha2::Sha256) {
        use sha2::Digest as _;
        let mut buf = Vec::with_capacity(24 * 4096);
        for chunk in self.blocks.chunks(4096) {
            buf.clear();
            chunk.iter().for_each(|b| b.bytes_into(&mut buf));
            h.update(&buf);
        }
    }

    fn row_into(&self, r: usize, out: &mut [f32]) {
        let per = self.cols / BLOCK;
        for (b, o) in self.blocks[r * per..(r + 1) * per].iter().zip(out.chunks_exact_mut(BLOCK)) {
            o.copy_from_slice(&b.dequantize());
        }
    }

    /// The blocks expanded to Q8_0 (the reference the kernels equal).
    #[cfg(test)]
    fn to_q80(&self) -> super::Q80Matrix {
        let blocks = self.blocks.iter().map(|b| BlockQ80 { d: Expand::scale(b), qs: b.ints() }).collect();
        super::Q80Matrix { rows: self.rows, cols: self.cols, blocks }
    }
}

/// A weight matrix whose blocks expand to 8-bit integers in registers.
#[derive(Debug)]
pub struct ExpandedMatrix(Kind);

#[derive(Debug)]
enum Kind {
    Mxfp4(Expanded<Nib<Mxfp4Code>>),
    /// IQ4_NL or IQ4_XS (`xs`).
    Iq4 {
        m: Expanded<Nib<Iq4Code>>,
        xs: bool,
    },
    Q50(Expanded<BlockQ50>),
    Iq2Xxs(Expanded<grid::BlockIq2Xxs>),
    Iq2Xs(Expanded<grid::BlockIq2Xs>),
    Iq3Xxs(Expanded<grid::BlockIq3Xxs>),
    Iq3S(Expanded<grid::BlockIq3S>),
    Iq2S(Expanded<grid::BlockIq2S>),
    Iq1S(Expanded<grid::BlockIq1S>),
    Iq1M(Expanded<grid::BlockIq1M>),
    /// TQ1_0 or TQ2_0 (`tq2`).
    Ternary {
        m: Expanded<grid::BlockTernary>,
        tq2: bool,
    },
    Nvfp4(Expanded<nvfp4::BlockNvfp4>),
}

/// A `rows × cols` matrix of file blocks of `32·N` weights (`bytes` each in
/// the file: super-blocks of 256, or NVFP4's 64), each split into its `N`
/// blocks of 32 by `split`.
fn super_blocks<B: Send, const N: usize>(
    raw: &[u8],
    rows: usize,
    cols: usize,
    bytes: usize,
    format: &'static str,
    split: impl Fn(&[u8]) -> [B; N] + Sync + Send,
) -> Result<Expanded<B>, KernelError> {
    let qk = BLOCK * N;
    if cols == 0 || !cols.is_multiple_of(qk) {
        return Err(KernelError::RowLength { format, cols, block: qk });
    }
    let expected =
        rows.checked_mul(cols / qk).and_then(|n| n.checked_mul(bytes)).ok_or(KernelError::SizeOverflow { format })?;
    if raw.len() != expected {
        return Err(KernelError::ByteCount { format, actual: raw.len(), expected });
    }
    let blocks = raw.par_chunks_exact(bytes).flat_map_iter(split).collect();
    Ok(Expanded { rows, cols, blocks })
}

macro_rules! each {
    ($self:expr, $m:ident => $e:expr) => {
        match &$self.0 {
            Kind::Mxfp4($m) => $e,
            Kind::Iq4 { m: $m, .. } => $e,
            Kind::Q50($m) => $e,
            Kind::Iq2Xxs($m) => $e,
            Kind::Iq2Xs($m) => $e,
            Kind::Iq3Xxs($m) => $e,
            Kind::Iq3S($m) => $e,
            Kind::Iq2S($m) => $e,
            Kind::Iq1S($m) => $e,
            Kind::Iq1M($m) => $e,
            Kind::Ternary { m: $m, .. } => $e,
            Kind::Nvfp4($m) => $e,
        }
    };
}

impl ExpandedMatrix {
    /// Decodes raw GGUF bytes of a `rows × cols` MXFP4 tensor.
    pub fn from_mxfp4_bytes(raw: &[u8], rows: usize, cols: usize) -> Result<Self, KernelError> {
        check_shape(raw, rows, cols, super::mxfp4::MXFP4_BLOCK_BYTES, "MXFP4")?;
        let blocks = raw.par_chunks_exact(17).map(|b| Nib::new(super::mxfp4::e8m0_half(b[0]), &b[1..17])).collect();
        Ok(Self(Kind::Mxfp4(Expanded { rows, cols, blocks })))
    }

    /// Decodes raw GGUF bytes of a `rows × cols` IQ4_NL tensor (`d: f16, qs: [u8; 16]`).
    pub fn from_iq4_nl_bytes(raw: &[u8], rows: usize, cols: usize) -> Result<Self, KernelError> {
        check_shape(raw, rows, cols, IQ4_NL_BLOCK_BYTES, "IQ4_NL")?;
        let blocks = raw.par_chunks_exact(IQ4_NL_BLOCK_BYTES).map(|b| Nib::new(f16_at(b, 0), &b[2..18])).collect();
        Ok(Self(Kind::Iq4 { m: Expanded { rows, cols, blocks }, xs: false }))
    }

    /// Decodes raw GGUF bytes of a `rows × cols` IQ4_XS tensor (`d: f16,
    /// scales_h: u16, scales_l: [u8; 4], qs: [u8; 128]` per 256 weights)
    /// into eight blocks per super-block, block `b`'s scale `d·(ls − 32)`
    /// with `ls` its 6-bit scale, as ggml's `dequantize_row_iq4_xs` computes it.
    pub fn from_iq4_xs_bytes(raw: &[u8], rows: usize, cols: usize) -> Result<Self, KernelError> {
        let m = super_blocks::<_, 8>(raw, rows, cols, IQ4_XS_BLOCK_BYTES, "IQ4_XS", |b| {
            let d = f16_at(b, 0);
            let scales_h = u16::from_le_bytes([b[2], b[3]]);
            std::array::from_fn(|ib| {
                let low = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0x0F;
                let high = ((scales_h >> (2 * ib)) & 3) as u8;
                let ls = i32::from(low | (high << 4));
                Nib::new(d * (ls - 32) as f32, &b[8 + 16 * ib..8 + 16 * ib + 16])
            })
        })?;
        Ok(Self(Kind::Iq4 { m, xs: true }))
    }

    /// Decodes raw GGUF bytes of a `rows × cols` IQ2_XXS tensor.
    pub fn from_iq2_xxs_bytes(raw: &[u8], rows: usize, cols: usize) -> Result<Self, KernelError> {
        Ok(Self(Kind::Iq2Xxs(super_blocks(raw, rows, cols, grid::IQ2_XXS_BLOCK_BYTES, "IQ2_XXS", grid::iq2_xxs)?)))
    }

    /// Decodes raw GGUF bytes of a `rows × cols` IQ2_XS tensor.
    pub fn from_iq2_xs_bytes(raw: &[u8], rows: usize, cols: usize) -> Result<Self, KernelError> {
        Ok(Self(Kind::Iq2Xs(super_blocks(raw, rows, cols, grid::IQ2_XS_BLOCK_BYTES, "IQ2_XS", grid::iq2_xs)?)))
    }

    /// Decodes raw GGUF bytes of a `rows × cols` IQ3_XXS tensor.
    pub fn from_iq3_xxs_bytes(raw: &[u8], rows: usize, cols: usize) -> Result<Self, KernelError> {
        Ok(Self(Kind::Iq3Xxs(super_blocks(raw, rows, cols, grid::IQ3_XXS_BLOCK_BYTES, "IQ3_XXS", grid::iq3_xxs)?)))
    }

    /// Decodes raw GGUF bytes of a `rows × cols` IQ3_S tensor.
    pub fn from_iq3_s_bytes(raw: &[u8], rows: usize, cols: usize) -> Result<Self, KernelError> {
        Ok(Self(Kind::Iq3S(super_blocks(raw, rows, cols, grid::IQ3_S_BLOCK_BYTES, "IQ3_S", grid::iq3_s)?)))
    }

    /// Decodes raw GGUF bytes of a `rows × cols` IQ2_S tensor.
    pub fn from_iq2_s_bytes(raw: &[u8], rows: usize, cols: usize) -> Result<Self, KernelError> {
        Ok(Self(Kind::Iq2S(super_blocks(raw, rows, cols, grid::IQ2_S_BLOCK_BYTES, "IQ2_S", grid::iq2_s)?)))
    }

    /// Decodes raw GGUF bytes of a `rows × cols` IQ1_S tensor.
    pub fn from_iq1_s_bytes(raw: &[u8], rows: usize, cols: usize) -> Result<Self, KernelError> {
        Ok(Self(Kind::Iq1S(super_blocks(raw, rows, cols, grid::IQ1_S_BLOCK_BYTES, "IQ1_S", grid::iq1_s)?)))
    }

    /// Decodes raw GGUF bytes of a `rows × cols` IQ1_M tensor.
    pub fn from_iq1_m_bytes(raw: &[u8], rows: usize, cols: usize) -> Result<Self, KernelError> {
        Ok(Self(Kind::Iq1M(super_blocks(raw, rows, cols, grid::IQ1_M_BLOCK_BYTES, "IQ1_M", grid::iq1_m)?)))
    }

    /// Decodes raw GGUF bytes of a `rows × cols` TQ1_0 tensor.
    pub fn from_tq1_0_bytes(raw: &[u8], rows: usize, cols: usize) -> Result<Self, KernelError> {
        let m = super_blocks(raw, rows, cols, grid::TQ1_0_BLOCK_BYTES, "TQ1_0", grid::tq1_0)?;
        Ok(Self(Kind::Ternary { m, tq2: false }))
    }

    /// Decodes raw GGUF bytes of a `rows × cols` TQ2_0 tensor.
    pub fn from_tq2_0_bytes(raw: &[u8], rows: usize, cols: usize) -> Result<Self, KernelError> {
        let m = super_blocks(raw, rows, cols, grid::TQ2_0_BLOCK_BYTES, "TQ2_0", grid::tq2_0)?;
        Ok(Self(Kind::Ternary { m, tq2: true }))
    }

    /// Decodes raw GGUF bytes of a `rows × cols` NVFP4 tensor (`d: [u8; 4],
    /// qs: [u8; 32]` per 64 weights) into two blocks per file block.
    pub fn from_nvfp4_bytes(raw: &[u8], rows: usize, cols: usize) -> Result<Self, KernelError> {
        Ok(Self(Kind::Nvfp4(super_blocks(raw, rows, cols, nvfp4::NVFP4_BLOCK_BYTES, "NVFP4", nvfp4::nvfp4)?)))
    }

    /// Decodes raw GGUF bytes of a `rows × cols` Q5_0 tensor (`d: f16, qh: [u8; 4], qs: [u8; 16]`).
    pub fn from_q5_0_bytes(raw: &[u8], rows: usize, cols: usize) -> Result<Self, KernelError> {
        check_shape(raw, rows, cols, Q5_0_BLOCK_BYTES, "Q5_0")?;
        let blocks = raw
            .par_chunks_exact(Q5_0_BLOCK_BYTES)
            .map(|b| {
                let mut qs = [0u8; 16];
                qs.copy_from_slice(&b[6..22]);
                BlockQ50 { d: f16_at(b, 0), qh: u32::from_le_bytes([b[2], b[3], b[4], b[5]]), qs }
            })
            .collect();
        Ok(Self(Kind::Q50(Expanded { rows, cols, blocks })))
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        each!(self, m => m.rows)
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        each!(self, m => m.cols)
    }

    /// The format's ggml name.
    pub fn format(&self) -> &'static str {
        match &self.0 {
            Kind::Mxfp4(_) => "MXFP4",
            Kind::Iq4 { xs: false, .. } => "IQ4_NL",
            Kind::Iq4 { xs: true, .. } => "IQ4_XS",
            Kind::Q50(_) => "Q5_0",
            Kind::Iq2Xxs(_) => "IQ2_XXS",
            Kind::Iq2Xs(_) => "IQ2_XS",
            Kind::Iq3Xxs(_) => "IQ3_XXS",
            Kind::Iq3S(_) => "IQ3_S",
            Kind::Iq2S(_) => "IQ2_S",
            Kind::Iq1S(_) => "IQ1_S",
            Kind::Iq1M(_) => "IQ1_M",
            Kind::Ternary { tq2: false, .. } => "TQ1_0",
            Kind::Ternary { tq2: true, .. } => "TQ2_0",
            Kind::Nvfp4(_) => "NVFP4",
        }
    }

    /// Whether the blocks carry a multiplier per half (IQ2_XS, IQ2_S,
    /// IQ1_M), and so are not Q8_0 blocks.
    #[cfg(test)]
    fn halved(&self) -> bool {
        fn halved<B: Expand>(_: &Expanded<B>) -> bool {
            B::HALVED
        }
        each!(self, m => halved(m))
    }

    /// Bytes the blocks take in memory.
    pub fn resident_bytes(&self) -> usize {
        fn bytes<B>(m: &Expanded<B>) -> usize {
            m.blocks.len() * std::mem::size_of::<B>()
        }
        each!(self, m => bytes(m))
    }

    /// `x (m × cols) · selfᵀ → (m × rows)`, row-major; activations
    /// quantized to Q8_0.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_on(x, m, super::q80_isa())
    }

    /// [`Self::matmul`] on the kernels of `isa`, which this CPU must run.
    fn matmul_on(&self, x: &[f32], m: usize, isa: super::Isa) -> Vec<f32> {
        each!(self, w => w.matmul_on(x, m, isa))
    }

    /// Row `r` dequantized into `out` (an embedding lookup).
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        each!(self, m => m.row_into(r, out))
    }

    /// Feeds the resident weights — exactly what the kernels read — to `h`.
    pub(crate) fn digest_into(&self, h: &mut sha2::Sha256) {
        each!(self, m => m.digest_into(h))
    }
}

/// Q8_0's kernels ([`super::q80_isa`]) on the blocks expanded in registers.
fn dots<B: Kernel>(isa: super::Isa) -> Dots<B, BlockQ80> {
    #[cfg(target_arch = "x86_64")]
    if isa != super::Isa::Scalar {
        return Dots {
            // SAFETY (both): `isa` came from `at_most`, which chose AVX2 or
            // VNNI after run-time detection of AVX2 and FMA (pshufb is SSSE3, implied).
            one: |w, x| unsafe { super::q80_dot_avx2(w, x) },
            four: |w, x| unsafe { super::q80_dot4_avx2(w, x) },
        };
    }
    let _ = isa;
    Dots { one: dot_scalar, four: |w, x| x.map(|x| dot_scalar(w, x)) }
}

/// Input rows from which a weight row is expanded once per sweep rather
/// than once per four input rows.
#[cfg(target_arch = "x86_64")]
const EXPAND_ROWS_FROM: usize = 8;

/// Prefill and batches on AVX2: each weight row, as a sweep reaches it, is
/// expanded once into Q8_0 blocks (in registers, then stored: a few KiB that
/// stay in L1), and Q8_0's own kernels run it against the sweep's input rows.
/// The same results, bit for bit, as expanding every block for every four
/// input rows (what [`dots`] does, and the test's reference: the blocks
/// expanded to Q8_0 at load), with one expansion per weight row and sweep
/// instead of one per four input rows. Not for halved blocks, which are no
/// Q8_0 blocks.
#[cfg(target_arch = "x86_64")]
fn matmul_expanding_rows<B: Kernel>(w: &[B], rows: usize, per_row: usize, xq: &[BlockQ80], m: usize) -> Vec<f32> {
    debug_assert!(!B::HALVED);
    let xrow = |i: usize| &xq[i * per_row..(i + 1) * per_row];
    let sweep = |wr: &[B], first: usize, n: usize, out: &mut [f32], stride: usize| {
        let mut q = Vec::with_capacity(wr.len());
        // SAFETY (all): this path is taken only when `q80_isa()` chose AVX2
        // after run-time detection of AVX2 and FMA.
        unsafe { expand_row(wr, &mut q) };
        let mut i = 0;
        while i + 4 <= n {
            let r = first + i;
            let v = unsafe { super::q80_dot4_avx2(&q, [xrow(r), xrow(r + 1), xrow(r + 2), xrow(r + 3)]) };
            for (k, x) in v.into_iter().enumerate() {
                out[(i + k) * stride] = x;
            }
            i += 4;
        }
        for i in i..n {
            out[i * stride] = unsafe { super::q80_dot_avx2(&q, xrow(first + i)) };
        }
    };
    // SAFETY: as above.
    let one = |wr: &[B]| unsafe { super::q80_dot_avx2(wr, xq) };
    super::par_tiles(w, rows, per_row, m, per_row * std::mem::size_of::<BlockQ80>(), one, sweep)
}

/// `wr`'s blocks expanded to Q8_0 blocks into `out`.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn expand_row<B: Kernel>(wr: &[B], out: &mut Vec<BlockQ80>) {
    use std::arch::x86_64::*;
    out.extend(wr.iter().map(|b| {
        let mut qs = [0i8; BLOCK];
        // SAFETY: AVX2 is enabled here; `qs` is 32 bytes, the store writes exactly them.
        unsafe { _mm256_storeu_si256(qs.as_mut_ptr().cast(), b.weights()) };
        BlockQ80 { d: super::I8Block::scale(b), qs }
    }));
}

/// The arithmetic of `q80_dot_scalar` on the unpacked integers (each
/// half's integer dot times its multiplier, or its own scale).
fn dot_scalar<B: Expand>(w: &[B], x: &[BlockQ80]) -> f32 {
    super::sum4(w.iter().zip(x).map(|(b, a)| {
        let q = b.ints();
        let half = |k: usize| -> i32 { (16 * k..16 * k + 16).map(|j| i32::from(q[j]) * i32::from(a.qs[j])).sum() };
        if B::OWN_HALF_SCALES {
            // ggml's NVFP4 × Q8_0: each group's integer dot times its scale.
            let s = b.half_scales();
            s[0] * a.d * half(0) as f32 + s[1] * a.d * half(1) as f32
        } else {
            let h = b.halves();
            b.scale() * a.d * (half(0) * h[0] + half(1) * h[1]) as f32
        }
    }))
}

mod nvfp4;
pub use nvfp4::NVFP4_BLOCK_BYTES;

#[cfg(test)]
pub(crate) mod tests;
