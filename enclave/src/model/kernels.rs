//! A Q4_1 × Q8_1 matrix multiply with an AVX2 dot kernel.
//!
//! candle has SIMD dot kernels for Q4_0, Q8_0 and the K-quants but a scalar
//! loop for Q4_1, which is what the reference model's layers are stored in.
//! This module is the one place in the crate allowed `unsafe` (for
//! `std::arch` intrinsics); everything else here is safe code.
//!
//! Formats (ggml): a Q4_1 block holds 32 weights as `d: f16, m: f16,
//! qs: [u8; 16]` with `w[j] = (qs[j] & 0xF)·d + m` and
//! `w[j + 16] = (qs[j] >> 4)·d + m`. Activations are quantized per row to
//! Q8_1 blocks `d, s = d·Σq, q: [i8; 32]` exactly as llama.cpp does, so
//! `dot = Σ_blocks d4·d8·Σ(q4·q8) + m4·s8`.

#![allow(unsafe_code)]

use half::f16;
use rayon::prelude::*;

/// Weights per block.
pub const BLOCK: usize = 32;
/// Bytes of one Q4_1 block in a GGUF.
pub const Q4_1_BLOCK_BYTES: usize = 20;

/// One Q4_1 block, decoded from the file's little-endian layout.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
struct BlockQ41 {
    d: f32,
    m: f32,
    qs: [u8; 16],
}

/// One Q8_1 block of activations.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
struct BlockQ81 {
    d: f32,
    s: f32,
    qs: [i8; 32],
}

/// A Q4_1 weight matrix of `rows × cols` (each row is one output feature).
#[derive(Debug)]
pub struct Q41Matrix {
    rows: usize,
    cols: usize,
    blocks: Vec<BlockQ41>,
}

impl Q41Matrix {
    /// Decodes raw GGUF bytes of a `rows × cols` Q4_1 tensor.
    pub fn from_gguf_bytes(raw: &[u8], rows: usize, cols: usize) -> Result<Self, String> {
        if cols % BLOCK != 0 {
            return Err(format!("Q4_1 row length {cols} is not a multiple of {BLOCK}"));
        }
        let n_blocks = rows * cols / BLOCK;
        if raw.len() != n_blocks * Q4_1_BLOCK_BYTES {
            return Err(format!("Q4_1 tensor has {} bytes, expected {}", raw.len(), n_blocks * Q4_1_BLOCK_BYTES));
        }
        let blocks = raw
            .chunks_exact(Q4_1_BLOCK_BYTES)
            .map(|b| {
                let mut qs = [0u8; 16];
                qs.copy_from_slice(&b[4..20]);
                BlockQ41 {
                    d: f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
                    m: f16::from_bits(u16::from_le_bytes([b[2], b[3]])).to_f32(),
                    qs,
                }
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

    /// `x (m × cols) · selfᵀ → (m × rows)`, row-major.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        assert_eq!(x.len(), m * self.cols, "input of {} values for {m} rows of {}", x.len(), self.cols);
        let per_row = self.cols / BLOCK;
        let xq: Vec<BlockQ81> = x.chunks_exact(self.cols).flat_map(quantize_row_q8_1).collect();
        let dot = dot_fn();
        const CHUNK: usize = 16;
        let chunks: Vec<Vec<f32>> = (0..self.rows.div_ceil(CHUNK))
            .into_par_iter()
            .map(|c| {
                let rows = c * CHUNK..((c + 1) * CHUNK).min(self.rows);
                let mut local = Vec::with_capacity(rows.len() * m);
                for j in rows {
                    let w = &self.blocks[j * per_row..(j + 1) * per_row];
                    for i in 0..m {
                        local.push(dot(w, &xq[i * per_row..(i + 1) * per_row]));
                    }
                }
                local
            })
            .collect();
        let mut out = vec![0f32; m * self.rows];
        for (c, local) in chunks.iter().enumerate() {
            for (r, vals) in local.chunks_exact(m).enumerate() {
                let j = c * CHUNK + r;
                for (i, v) in vals.iter().enumerate() {
                    out[i * self.rows + j] = *v;
                }
            }
        }
        out
    }
}

/// Quantizes one row to Q8_1 blocks, as llama.cpp's `quantize_row_q8_1`.
fn quantize_row_q8_1(row: &[f32]) -> Vec<BlockQ81> {
    row.chunks_exact(BLOCK)
        .map(|x| {
            let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let mut qs = [0i8; 32];
            let mut sum = 0i32;
            for (q, v) in qs.iter_mut().zip(x) {
                let r = (v * id).round() as i32;
                *q = r as i8;
                sum += r;
            }
            // Stored as f16 in ggml: round through f16 to match.
            let d16 = f16::from_f32(d).to_f32();
            let s16 = f16::from_f32(sum as f32 * d).to_f32();
            BlockQ81 { d: d16, s: s16, qs }
        })
        .collect()
}

type DotFn = fn(&[BlockQ41], &[BlockQ81]) -> f32;

fn dot_fn() -> DotFn {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            return dot_avx2_entry;
        }
    }
    dot_scalar
}

fn dot_scalar(w: &[BlockQ41], x: &[BlockQ81]) -> f32 {
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

#[cfg(target_arch = "x86_64")]
fn dot_avx2_entry(w: &[BlockQ41], x: &[BlockQ81]) -> f32 {
    // SAFETY: only selected by `dot_fn` after runtime detection of AVX2 and FMA.
    unsafe { dot_avx2(w, x) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(w: &[BlockQ41], x: &[BlockQ81]) -> f32 {
    use std::arch::x86_64::*;
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0f32;
    let low = _mm_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    for (b, a) in w.iter().zip(x) {
        summs += b.m * a.s;
        // SAFETY: `b.qs` is 16 bytes and `a.qs` 32 bytes; unaligned loads
        // read exactly those arrays.
        let q = _mm_loadu_si128(b.qs.as_ptr().cast());
        let lo = _mm_and_si128(q, low);
        let hi = _mm_and_si128(_mm_srli_epi16(q, 4), low);
        let q4 = _mm256_set_m128i(hi, lo);
        let q8 = _mm256_loadu_si256(a.qs.as_ptr().cast());
        // u8 × i8 pairs summed to i16 (at most 2·15·128, no saturation), then to i32.
        let p32 = _mm256_madd_epi16(_mm256_maddubs_epi16(q4, q8), ones);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(b.d * a.d), _mm256_cvtepi32_ps(p32), acc);
    }
    let hi = _mm256_extractf128_ps(acc, 1);
    let s = _mm_add_ps(_mm256_castps256_ps128(acc), hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
    _mm_cvtss_f32(s) + summs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(rows: usize, cols: usize, seed: u32) -> Vec<u8> {
        let mut state = seed;
        let mut next = || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            state
        };
        let mut raw = Vec::new();
        for _ in 0..rows * cols / BLOCK {
            raw.extend(f16::from_f32(0.01 + (next() % 100) as f32 / 5000.0).to_bits().to_le_bytes());
            raw.extend(f16::from_f32(-0.1 + (next() % 100) as f32 / 2000.0).to_bits().to_le_bytes());
            raw.extend((0..16).map(|_| (next() >> 8) as u8));
        }
        raw
    }

    fn dequantized(m: &Q41Matrix) -> Vec<f32> {
        m.blocks
            .iter()
            .flat_map(|b| {
                let lo = b.qs.map(|q| f32::from(q & 0x0F) * b.d + b.m);
                let hi = b.qs.map(|q| f32::from(q >> 4) * b.d + b.m);
                lo.into_iter().chain(hi)
            })
            .collect()
    }

    #[test]
    fn avx2_and_scalar_agree_and_match_dequantized_matmul() {
        let (rows, cols, m) = (40, 96, 3);
        let w = Q41Matrix::from_gguf_bytes(&sample(rows, cols, 1), rows, cols).unwrap();
        let x: Vec<f32> = (0..m * cols).map(|i| ((i * 7919) % 200) as f32 / 100.0 - 1.0).collect();
        let out = w.matmul(&x, m);
        let dq = dequantized(&w);
        let xq: Vec<BlockQ81> = x.chunks_exact(cols).flat_map(quantize_row_q8_1).collect();
        for i in 0..m {
            for j in 0..rows {
                let exact: f32 = (0..cols).map(|k| x[i * cols + k] * dq[j * cols + k]).sum();
                let got = out[i * rows + j];
                assert!((got - exact).abs() < 0.05 * exact.abs().max(1.0), "({i},{j}) {got} vs {exact}");
                let per = cols / BLOCK;
                let scalar = dot_scalar(&w.blocks[j * per..(j + 1) * per], &xq[i * per..(i + 1) * per]);
                assert!((got - scalar).abs() < 1e-4 * scalar.abs().max(1.0), "({i},{j}) simd {got} vs scalar {scalar}");
            }
        }
    }

    #[test]
    fn rejects_wrong_sizes() {
        assert!(Q41Matrix::from_gguf_bytes(&[0; 19], 1, 32).is_err());
        assert!(Q41Matrix::from_gguf_bytes(&[0; 20], 1, 16).is_err());
    }
}
