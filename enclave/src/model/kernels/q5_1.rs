//! Q5_1 (ggml type 7): 32 weights `w = d·q + m` with `q` five bits, stored
//! as `d: f16, m: f16, qh: [u8; 4], qs: [u8; 16]` (the fifth bit of value
//! `j` at bit `j` of `qh`). A Q5_1 block is a Q4_1 block with a fifth bit,
//! so it runs Q4_1's kernels ([`super::UBlock`]) against Q8_1 activations,
//! llama.cpp's pairing and arithmetic (`d·x.d·Σq·x + m·x.s`); the fifth
//! bits spread to bytes in registers. 28 bytes a block in memory (the
//! scales as f32) against the file's 24.

use rayon::prelude::*;

use super::{check_shape, f16_at, par_matmul, quantize_row_q8_1, BlockQ81, KernelError, UBlock, BLOCK};

/// Bytes of one Q5_1 block in a GGUF.
pub const Q5_1_BLOCK_BYTES: usize = 24;

#[derive(Clone, Copy, Debug)]
#[repr(C)]
struct BlockQ51 {
    d: f32,
    m: f32,
    qh: u32,
    qs: [u8; 16],
}

impl UBlock for BlockQ51 {
    fn dm(&self) -> (f32, f32) {
        (self.d, self.m)
    }
    fn unsigned(&self) -> [u8; 32] {
        std::array::from_fn(|j| {
            let nibble = if j < 16 { self.qs[j] & 0x0F } else { self.qs[j - 16] >> 4 };
            nibble | ((((self.qh >> j) & 1) as u8) << 4)
        })
    }
    #[cfg(target_arch = "x86_64")]
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn unsigned_avx2(&self) -> std::arch::x86_64::__m256i {
        use std::arch::x86_64::*;
        let fifth = _mm256_and_si256(super::bits_to_bytes(self.qh), _mm256_set1_epi8(0x10));
        _mm256_or_si256(super::nibbles_avx2(&self.qs), fifth)
    }
}

/// A Q5_1 weight matrix of `rows × cols`.
#[derive(Debug)]
pub struct Q51Matrix {
    rows: usize,
    cols: usize,
    blocks: Vec<BlockQ51>,
}

impl Q51Matrix {
    /// Decodes raw GGUF bytes of a `rows × cols` Q5_1 tensor.
    pub fn from_gguf_bytes(raw: &[u8], rows: usize, cols: usize) -> Result<Self, KernelError> {
        check_shape(raw, rows, cols, Q5_1_BLOCK_BYTES, "Q5_1")?;
        let blocks = raw
            .par_chunks_exact(Q5_1_BLOCK_BYTES)
            .map(|b| {
                let mut qs = [0u8; 16];
                qs.copy_from_slice(&b[8..24]);
                BlockQ51 { d: f16_at(b, 0), m: f16_at(b, 2), qh: u32::from_le_bytes([b[4], b[5], b[6], b[7]]), qs }
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
        self.blocks.len() * std::mem::size_of::<BlockQ51>()
    }

    /// `x (m × cols) · selfᵀ → (m × rows)`, row-major; activations quantized to Q8_1.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        assert_eq!(x.len(), m * self.cols, "input of {} values for {m} rows of {}", x.len(), self.cols);
        let xq: Vec<BlockQ81> = x.chunks_exact(self.cols).flat_map(quantize_row_q8_1).collect();
        par_matmul(&self.blocks, self.rows, self.cols / BLOCK, &xq, m, super::q41_dots())
    }

    /// Row `r` dequantized into `out`, as ggml's `dequantize_row_q5_1` (`d·q + m`).
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        let per = self.cols / BLOCK;
        for (b, o) in self.blocks[r * per..(r + 1) * per].iter().zip(out.chunks_exact_mut(BLOCK)) {
            for (o, q) in o.iter_mut().zip(b.unsigned()) {
                *o = f32::from(q) * b.d + b.m;
            }
        }
    }

    /// Feeds the resident weights — exactly what the kernels read — to `h`.
    pub(crate) fn digest_into(&self, h: &mut sha2::Sha256) {
        use sha2::Digest as _;
        let mut buf = Vec::with_capacity(28 * 4096);
        for chunk in self.blocks.chunks(4096) {
            buf.clear();
            for b in chunk {
                buf.extend_from_slice(&b.d.to_bits().to_le_bytes());
                buf.extend_from_slice(&b.m.to_bits().to_le_bytes());
                buf.extend_from_slice(&b.qh.to_le_bytes());
                buf.extend_from_slice(&b.qs);
            }
            h.update(&buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dequantization_equals_gguf_py_bit_for_bit() {
        let (raw, want) = crate::model::kernels::expanded::tests::gguf_py_fixture("Q5_1");
        let m = Q51Matrix::from_gguf_bytes(&raw, 1, want.len()).unwrap();
        let mut row = vec![0f32; want.len()];
        m.row_into(0, &mut row);
        for (i, (g, w)) in row.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "value {i}: {g} vs gguf-py {w}");
        }
    }

    /// The unpacked vector equals the scalar unpacking, and the matmul the
    /// dot of the dequantized weights with the activations (to Q8_1's
    /// rounding), for every batch split.
    #[test]
    fn kernels_unpack_the_fifth_bit_and_approximate_the_dequantized_product() {
        let (rows, cols) = (21, 256);
        let mut seed = 0x5151u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut raw: Vec<u8> = (0..rows * cols / BLOCK * Q5_1_BLOCK_BYTES).map(|_| next() as u8).collect();
        for b in raw.chunks_exact_mut(Q5_1_BLOCK_BYTES) {
            let d = half::f16::from_f32(0.002 + f32::from(b[0]) / 50_000.0).to_bits().to_le_bytes();
            let m = half::f16::from_f32(-0.03 + f32::from(b[2]) / 10_000.0).to_bits().to_le_bytes();
            b[..2].copy_from_slice(&d);
            b[2..4].copy_from_slice(&m);
        }
        let w = Q51Matrix::from_gguf_bytes(&raw, rows, cols).unwrap();
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            for b in &w.blocks {
                let mut v = [0u8; 32];
                // SAFETY: AVX2 was detected; `v` is 32 bytes.
                unsafe { std::arch::x86_64::_mm256_storeu_si256(v.as_mut_ptr().cast(), b.unsigned_avx2()) };
                assert_eq!(v, b.unsigned());
            }
        }
        let mut dq = vec![0f32; rows * cols];
        for (r, o) in dq.chunks_exact_mut(cols).enumerate() {
            w.row_into(r, o);
        }
        let mut s = 7u64;
        for n in [1usize, 4, 9] {
            let x = crate::model::synth::uniform(n * cols, 3.0, &mut s);
            let y = w.matmul(&x, n);
            for i in 0..n {
                for r in 0..rows {
                    let (xr, wr) = (&x[i * cols..(i + 1) * cols], &dq[r * cols..(r + 1) * cols]);
                    let exact: f32 = xr.iter().zip(wr).map(|(a, b)| a * b).sum();
                    let scale: f32 = xr.iter().zip(wr).map(|(a, b)| (a * b).abs()).sum();
                    assert!(
                        (y[i * rows + r] - exact).abs() <= 0.02 * scale,
                        "({i},{r}): {} vs {exact}",
                        y[i * rows + r]
                    );
                }
            }
        }
        assert!(Q51Matrix::from_gguf_bytes(&raw[1..], rows, cols).is_err());
    }
}
