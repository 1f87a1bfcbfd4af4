//! MXFP4 (OCP microscaling, ggml type 39; gpt-oss's experts): 32 E2M1
//! values sharing an E8M0 exponent, stored as `e: u8, qs: [u8; 16]` with
//! value `j` in the low nibble of `qs[j]` and value `j + 16` in the high one.
//!
//! ggml decodes a nibble to an integer from `KVALUES` (the E2M1 values
//! doubled) and the exponent to `2^(e - 128)` (half the E8M0 scale,
//! undoing the doubling). So a block is exactly an 8-bit block with that
//! scale, and llama.cpp's MXFP4 × Q8_0 dot (`d = x.d · e8m0_half(e)`, an
//! integer sum of products) is the Q8_0 × Q8_0 kernels' arithmetic on it.
//! [`Mxfp4Matrix`] keeps the 4-bit blocks (20 bytes a block in memory,
//! the scale decoded to f32) and expands each to its 32 integers in
//! registers (a 16-entry table lookup, `pshufb`), then runs the Q8_0
//! kernels' arithmetic: its results equal those of the blocks expanded to
//! Q8_0 at load ([`Q80Matrix::from_mxfp4_bytes`]), bit for bit.

use rayon::prelude::*;

use super::{check_shape, par_matmul, quantize_row_q8_0, BlockQ80, Dots, KernelError, Q80Matrix, BLOCK};

/// Bytes of one MXFP4 block in a GGUF.
pub const MXFP4_BLOCK_BYTES: usize = 17;

/// E2M1 values, doubled (ggml's `kvalues_mxfp4`).
pub const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// [`KVALUES`] plus 128, as unsigned bytes (the VNNI decode kernel's table).
#[cfg(target_arch = "x86_64")]
const KVALUES_U8: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (KVALUES[i] as u8) ^ 0x80;
        i += 1;
    }
    t
};

/// Half the E8M0 scale `e`: `2^(e - 128)`, bit-exact as ggml's
/// `GGML_E8M0_TO_FP32_HALF` (subnormal for `e < 2`).
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { u32::from(e - 1) << 23 };
    f32::from_bits(bits)
}

/// A block's 32 integers (value `j` in the low nibble of `qs[j]`, value
/// `j + 16` in the high one), each looked up in `KVALUES`.
fn decode_qs(qs: &[u8]) -> [i8; BLOCK] {
    let mut out = [0i8; BLOCK];
    for j in 0..16 {
        out[j] = KVALUES[usize::from(qs[j] & 0x0F)];
        out[j + 16] = KVALUES[usize::from(qs[j] >> 4)];
    }
    out
}

/// One MXFP4 block as its 32 values (what ggml's `dequantize_row_mxfp4` gives).
pub fn dequantize_block(b: &[u8]) -> [f32; 32] {
    let d = e8m0_half(b[0]);
    decode_qs(&b[1..17]).map(|q| f32::from(q) * d)
}

/// Quantizes 32 values to one MXFP4 block: the exponent from the largest
/// magnitude (`floor(log2(amax)) - 2`, so it maps near 6, E2M1's top
/// value), each value to its nearest representable one (the lower on a
/// tie), as gguf-py's reference quantizer does.
pub fn quantize_block(x: &[f32]) -> [u8; MXFP4_BLOCK_BYTES] {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let e = if amax > 0.0 { (amax.log2().floor() as i32 - 2 + 127).clamp(0, 255) as u8 } else { 0 };
    let d = e8m0_half(e);
    let nearest = |v: f32| -> u8 {
        let mut best = 0usize;
        for (i, &k) in KVALUES.iter().enumerate() {
            if (d * f32::from(k) - v).abs() < (d * f32::from(KVALUES[best]) - v).abs() {
                best = i;
            }
        }
        best as u8
    };
    let mut out = [0u8; MXFP4_BLOCK_BYTES];
    out[0] = e;
    for j in 0..16 {
        out[1 + j] = nearest(x[j]) | (nearest(x[j + 16]) << 4);
    }
    out
}

/// One MXFP4 block in memory: the scale decoded, the nibbles as stored.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct BlockMxfp4 {
    d: f32,
    qs: [u8; 16],
}

/// An MXFP4 weight matrix of `rows × cols`, kept 4-bit.
#[derive(Debug)]
pub struct Mxfp4Matrix {
    rows: usize,
    cols: usize,
    blocks: Vec<BlockMxfp4>,
}

impl Mxfp4Matrix {
    /// Decodes raw GGUF bytes of a `rows × cols` MXFP4 tensor.
    pub fn from_gguf_bytes(raw: &[u8], rows: usize, cols: usize) -> Result<Self, KernelError> {
        check_shape(raw, rows, cols, MXFP4_BLOCK_BYTES, "MXFP4")?;
        let blocks = raw
            .par_chunks_exact(MXFP4_BLOCK_BYTES)
            .map(|b| {
                let mut qs = [0u8; 16];
                qs.copy_from_slice(&b[1..17]);
                BlockMxfp4 { d: e8m0_half(b[0]), qs }
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

    /// Bytes the blocks take in memory.
    pub fn resident_bytes(&self) -> usize {
        self.blocks.len() * std::mem::size_of::<BlockMxfp4>()
    }

    /// Feeds the resident weights — exactly what the kernels read — to `h`.
    pub(crate) fn digest_into(&self, h: &mut sha2::Sha256) {
        use sha2::Digest as _;
        let mut buf = Vec::with_capacity(20 * 4096);
        for chunk in self.blocks.chunks(4096) {
            buf.clear();
            for b in chunk {
                buf.extend_from_slice(&b.d.to_bits().to_le_bytes());
                buf.extend_from_slice(&b.qs);
            }
            h.update(&buf);
        }
    }

    /// `x (m × cols) · selfᵀ → (m × rows)`, row-major; activations
    /// quantized to Q8_0 as llama.cpp does for MXFP4.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_on(x, m, super::q80_isa())
    }

    /// [`Self::matmul`] on the kernels of `isa`, which this CPU must run.
    fn matmul_on(&self, x: &[f32], m: usize, isa: super::Isa) -> Vec<f32> {
        assert_eq!(x.len(), m * self.cols, "input of {} values for {m} rows of {}", x.len(), self.cols);
        let xq: Vec<BlockQ80> = x.chunks_exact(self.cols).flat_map(quantize_row_q8_0).collect();
        #[cfg(target_arch = "x86_64")]
        if isa == super::Isa::Avx512Vnni {
            return super::q80_matmul_vnni(&self.blocks, self.rows, self.cols / BLOCK, &xq, m);
        }
        par_matmul(&self.blocks, self.rows, self.cols / BLOCK, &xq, m, dots(isa))
    }
}

/// Q8_0's kernels ([`super::q80_isa`]) on the blocks expanded in registers.
fn dots(isa: super::Isa) -> Dots<BlockMxfp4, BlockQ80> {
    #[cfg(target_arch = "x86_64")]
    if isa != super::Isa::Scalar {
        return Dots {
            // SAFETY (both): `isa` came from `at_most`, which chose AVX2 or
            // VNNI after run-time detection of AVX2 and FMA (pshufb is SSSE3, implied).
            one: |w, x| unsafe { dot_avx2(w, x) },
            four: |w, x| unsafe { dot4_avx2(w, x) },
        };
    }
    let _ = isa;
    Dots { one: dot_scalar, four: |w, x| x.map(|x| dot_scalar(w, x)) }
}

#[cfg(target_arch = "x86_64")]
impl super::I8Block for BlockMxfp4 {
    fn scale(&self) -> f32 {
        self.d
    }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn weights(&self) -> std::arch::x86_64::__m256i {
        // SAFETY: `KVALUES` is 16 bytes; the load reads exactly it. AVX2 and FMA are enabled here.
        unsafe { expand(self, std::arch::x86_64::_mm_loadu_si128(KVALUES.as_ptr().cast())) }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn weights_u8(&self) -> std::arch::x86_64::__m256i {
        // SAFETY: `KVALUES_U8` is 16 bytes; the load reads exactly it. AVX2 and FMA are enabled here.
        unsafe { expand(self, std::arch::x86_64::_mm_loadu_si128(KVALUES_U8.as_ptr().cast())) }
    }
}

/// The arithmetic of `q80_dot_scalar` on the decoded integers.
fn dot_scalar(w: &[BlockMxfp4], x: &[BlockQ80]) -> f32 {
    super::sum4(w.iter().zip(x).map(|(b, a)| {
        let sumi: i32 = decode_qs(&b.qs).iter().zip(&a.qs).map(|(&p, &q)| i32::from(p) * i32::from(q)).sum();
        b.d * a.d * sumi as f32
    }))
}

/// One block's 32 integers: low nibbles (values 0..16) then high (16..32),
/// each looked up in `KVALUES`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn expand(b: &BlockMxfp4, table: std::arch::x86_64::__m128i) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let low = _mm_set1_epi8(0x0F);
    // SAFETY: `b.qs` is 16 bytes; the unaligned load reads exactly it.
    let q = _mm_loadu_si128(b.qs.as_ptr().cast());
    let lo = _mm_shuffle_epi8(table, _mm_and_si128(q, low));
    let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(q, 4), low));
    _mm256_set_m128i(hi, lo)
}

/// The arithmetic of `q80_dot_avx2` on the expanded block.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(w: &[BlockMxfp4], x: &[BlockQ80]) -> f32 {
    use std::arch::x86_64::*;
    // SAFETY: `KVALUES` is 16 bytes; the load reads exactly it.
    let table = _mm_loadu_si128(KVALUES.as_ptr().cast());
    let mut acc = _mm256_setzero_ps();
    let ones = _mm256_set1_epi16(1);
    for (b, a) in w.iter().zip(x) {
        let qw = expand(b, table);
        // SAFETY: `a.qs` is 32 bytes; the load reads exactly it.
        let qx = _mm256_loadu_si256(a.qs.as_ptr().cast());
        let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qx, qw));
        let p32 = _mm256_madd_epi16(p16, ones);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(b.d * a.d), _mm256_cvtepi32_ps(p32), acc);
    }
    super::hsum(acc)
}

/// [`dot_avx2`] for four input rows (bit-identical per row).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot4_avx2(w: &[BlockMxfp4], x: [&[BlockQ80]; 4]) -> [f32; 4] {
    use std::arch::x86_64::*;
    // SAFETY: `KVALUES` is 16 bytes; the load reads exactly it.
    let table = _mm_loadu_si128(KVALUES.as_ptr().cast());
    let mut acc = [_mm256_setzero_ps(); 4];
    let ones = _mm256_set1_epi16(1);
    let n = x.iter().map(|r| r.len()).min().unwrap_or(0).min(w.len());
    for (i, b) in w[..n].iter().enumerate() {
        let qw = expand(b, table);
        let aw = _mm256_sign_epi8(qw, qw);
        for r in 0..4 {
            let a = &x[r][i];
            // SAFETY: `a.qs` is 32 bytes; the load reads exactly it.
            let qx = _mm256_loadu_si256(a.qs.as_ptr().cast());
            let p32 = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(qx, qw)), ones);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(b.d * a.d), _mm256_cvtepi32_ps(p32), acc[r]);
        }
    }
    [super::hsum(acc[0]), super::hsum(acc[1]), super::hsum(acc[2]), super::hsum(acc[3])]
}

impl Q80Matrix {
    /// Decodes raw GGUF bytes of a `rows × cols` MXFP4 tensor into exact
    /// 8-bit blocks.
    pub fn from_mxfp4_bytes(raw: &[u8], rows: usize, cols: usize) -> Result<Self, KernelError> {
        check_shape(raw, rows, cols, MXFP4_BLOCK_BYTES, "MXFP4")?;
        let blocks = raw
            .chunks_exact(MXFP4_BLOCK_BYTES)
            .map(|b| BlockQ80 { d: e8m0_half(b[0]), qs: decode_qs(&b[1..17]) })
            .collect();
        Ok(Self { rows, cols, blocks })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scale_is_ggmls_half_e8m0() {
        assert_eq!(e8m0_half(128), 1.0);
        assert_eq!(e8m0_half(127), 0.5);
        assert_eq!(e8m0_half(130), 4.0);
        assert_eq!(e8m0_half(2), 2f32.powi(-126));
        assert_eq!(e8m0_half(1), 2f32.powi(-127), "subnormal");
        assert_eq!(e8m0_half(0), 2f32.powi(-128), "subnormal");
        assert_eq!(e8m0_half(255), 2f32.powi(127));
    }

    #[test]
    fn decoding_to_8_bit_blocks_keeps_every_value() {
        let mut seed = 11u64;
        let x = crate::model::synth::uniform(64 * 4, 3.0, &mut seed);
        let raw: Vec<u8> = x.chunks_exact(32).flat_map(quantize_block).collect();
        let m = Q80Matrix::from_mxfp4_bytes(&raw, 4, 64).unwrap();
        let mut row = vec![0f32; 64];
        for r in 0..4 {
            m.row_into(r, &mut row);
            let want: Vec<f32> = raw[r * 34..(r + 1) * 34].chunks_exact(17).flat_map(dequantize_block).collect();
            assert_eq!(row, want, "row {r}");
            // And the quantizer is near: within half a step of the block's scale.
            for (blk, (got, orig)) in row.chunks(32).zip(x[r * 64..].chunks(32)).enumerate() {
                let amax = orig.iter().fold(0f32, |a, v| a.max(v.abs()));
                for (g, o) in got.iter().zip(orig) {
                    assert!((g - o).abs() <= amax / 3.0, "row {r} block {blk}: {o} became {g}");
                }
            }
        }
    }

    #[test]
    fn a_wrong_length_is_refused() {
        assert!(Q80Matrix::from_mxfp4_bytes(&[0u8; 33], 1, 64).is_err());
        assert!(Q80Matrix::from_mxfp4_bytes(&[0u8; 17], 1, 16).is_err());
        assert!(Mxfp4Matrix::from_gguf_bytes(&[0u8; 33], 1, 64).is_err());
    }

    /// The 4-bit kernels (whichever this CPU runs, the scalar one and,
    /// where the CPU has it, the VNNI path) equal the Q8_0 kernels on the
    /// blocks expanded at load, bit for bit, for every batch size the
    /// matmul splits differently.
    #[test]
    fn the_4_bit_kernels_equal_the_expanded_blocks_bit_for_bit() {
        let (rows, cols) = (37, 224);
        let per = cols / BLOCK;
        let mut seed = 5u64;
        let w = crate::model::synth::uniform(rows * cols, 2.0, &mut seed);
        let raw: Vec<u8> = w.chunks_exact(32).flat_map(quantize_block).collect();
        let native = Mxfp4Matrix::from_gguf_bytes(&raw, rows, cols).unwrap();
        let expanded = Q80Matrix::from_mxfp4_bytes(&raw, rows, cols).unwrap();
        assert_eq!(native.resident_bytes(), rows * cols / 32 * 20);
        let runnable: Vec<super::super::Isa> =
            [super::super::Isa::Scalar, super::super::Isa::Avx2, super::super::Isa::Avx512Vnni]
                .into_iter()
                .filter(|&isa| super::super::at_most(isa) == isa)
                .collect();
        for m in [1, 3, 4, 9, 40] {
            let x = crate::model::synth::uniform(m * cols, 4.0, &mut seed);
            for &isa in &runnable {
                assert_eq!(native.matmul_on(&x, m, isa), expanded.matmul_on(&x, m, isa), "{} {m} rows", isa.name());
            }
        }
        let x = crate::model::synth::uniform(cols, 4.0, &mut seed);
        let xq: Vec<BlockQ80> = quantize_row_q8_0(&x).collect();
        for r in 0..rows {
            let wr = &native.blocks[r * per..(r + 1) * per];
            let er = &expanded.blocks[r * per..(r + 1) * per];
            assert_eq!(dot_scalar(wr, &xq), super::super::q80_dot_scalar(er, &xq), "scalar, row {r}");
        }
        // The VNNI path, whatever `VEIL_KERNELS` chose: groups of eight
        // input rows, rows left over, and decode, against the scalar
        // kernel on the expanded blocks.
        #[cfg(target_arch = "x86_64")]
        if super::super::vnni_available() {
            for m in [1, 5, 21] {
                let x = crate::model::synth::uniform(m * cols, 4.0, &mut seed);
                let xq: Vec<BlockQ80> = x.chunks_exact(cols).flat_map(quantize_row_q8_0).collect();
                let got = super::super::q80_matmul_vnni(&native.blocks, rows, per, &xq, m);
                for i in 0..m {
                    for r in 0..rows {
                        let want = super::super::q80_dot_scalar(
                            &expanded.blocks[r * per..(r + 1) * per],
                            &xq[i * per..(i + 1) * per],
                        );
                        assert_eq!(got[i * rows + r].to_bits(), want.to_bits(), "VNNI, m={m} input {i} row {r}");
                    }
                }
            }
        }
    }
}
