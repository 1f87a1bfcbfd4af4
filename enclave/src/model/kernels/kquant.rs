//! K-quants (ggml Q2_K, Q3_K, Q4_K, Q5_K, Q6_K; the bulk of `Q4_K_M`,
//! `Q3_K_M` and `Q2_K` files) against activations quantized to Q8_K, as
//! llama.cpp pairs them.
//!
//! Formats (256 weights a block, in the file's little-endian layout):
//! - Q2_K, 84 bytes: `scales: [u8; 16], qs: [u8; 64], d: f16, dmin: f16`;
//!   sixteen sub-blocks of 16 with a 4-bit scale (low nibble) and a 4-bit
//!   min (high nibble) each, `w = d·sc·q − dmin·m`, `q` two bits.
//! - Q3_K, 110 bytes: `hmask: [u8; 32], qs: [u8; 64], scales: [u8; 12], d:
//!   f16`; sixteen sub-blocks of 16 with a 6-bit scale (packed in `scales`,
//!   less 32), `w = d·(sc − 32)·(q − 4)`, `q` two bits of `qs` and a third
//!   from `hmask`.
//! - Q4_K, 144 bytes: `d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128]`;
//!   eight sub-blocks of 32 with a 6-bit scale and a 6-bit min each (packed
//!   in `scales`), `w = d·sc·q − dmin·m`, `q` a nibble of `qs`.
//! - Q5_K, 176 bytes: Q4_K's fields plus `qh: [u8; 32]` (before `qs`), the
//!   fifth bit of each value.
//! - Q6_K, 210 bytes: `ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16`;
//!   sixteen sub-blocks of 16, `w = d·sc·(q − 32)` with `q` six bits.
//!
//! Dequantization follows ggml's `dequantize_row_q*_K` operation by
//! operation (tested bit for bit against candle's port of it). Every dot
//! kernel computes, per block, two exact integers — the values times the
//! activations scaled by their sub-block's scale, and the bias of the mins
//! (Q4_K/Q5_K) or of Q6_K's −32 against the activations' sums — then the
//! same float steps, block after block ([`block_sums`], [`finish`]). The
//! integers do not depend on how a kernel groups its sums, so the scalar,
//! AVX2 and VNNI kernels are equal bit for bit (tested), and every output
//! row is one such sequence whatever the batch.
//!
//! In memory a block keeps its values as stored but its f16 scales as f32
//! and its packed scales and mins as bytes: 104 (Q2_K), 116 (Q3_K), 152
//! (Q4_K), 184 (Q5_K) and 212 (Q6_K) bytes a block, 1–24% more than the
//! file.

use rayon::prelude::*;

use super::{f16_at, par_matmul, Dots, Isa, KernelError};

/// Weights per K-quant block (ggml's `QK_K`).
pub const QK_K: usize = 256;
/// Bytes of one Q2_K block in a GGUF.
pub const Q2_K_BLOCK_BYTES: usize = 84;
/// Bytes of one Q3_K block in a GGUF.
pub const Q3_K_BLOCK_BYTES: usize = 110;
/// Bytes of one Q4_K block in a GGUF.
pub const Q4_K_BLOCK_BYTES: usize = 144;
/// Bytes of one Q5_K block in a GGUF.
pub const Q5_K_BLOCK_BYTES: usize = 176;
/// Bytes of one Q6_K block in a GGUF.
pub const Q6_K_BLOCK_BYTES: usize = 210;

/// One block of 256 activations quantized as llama.cpp's
/// `quantize_row_q8_K` does, with the sums of each 16 values.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct BlockQ8K {
    d: f32,
    qs: [i8; QK_K],
    bsums: [i16; 16],
}

/// Quantizes one row to Q8_K: the scale from the value of largest
/// magnitude (its sign kept, `−127 / max`), each value rounded to nearest
/// with ties to even (ggml's `nearest_int`), capped at 127.
pub(crate) fn quantize_row_q8_k(row: &[f32]) -> impl Iterator<Item = BlockQ8K> + '_ {
    row.chunks_exact(QK_K).map(|x| {
        let (mut max, mut amax) = (0f32, 0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let mut b = BlockQ8K { d: 0.0, qs: [0; QK_K], bsums: [0; 16] };
        if amax == 0.0 {
            return b;
        }
        let iscale = -127.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
        }
        for (s, group) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = group.iter().map(|&q| i16::from(q)).sum();
        }
        b.d = 1.0 / iscale;
        b
    })
}

/// Scale and min `j` (0..8) of a Q4_K/Q5_K block's 12 packed bytes
/// (ggml's `get_scale_min_k4`).
fn scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

fn unpack_scales(packed: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        (sc[j], m[j]) = scale_min(j, packed);
    }
    (sc, m)
}

/// Q4_K/Q5_K: one scale per 32 values.
fn scales_per_32(sc: &[u8; 8]) -> [i32; 16] {
    std::array::from_fn(|i| i32::from(sc[i / 2]))
}

/// Q4_K/Q5_K values as ggml dequantizes them: `(d·sc)·q − dmin·m` per
/// sub-block of 32 (Q5_K's fifth bit, added by ggml as 16 or 0, is in `v`).
fn dequantize_with_mins(d: f32, dmin: f32, sc: &[u8; 8], m: &[u8; 8], v: &[u8; QK_K]) -> [f32; QK_K] {
    std::array::from_fn(|i| {
        let j = i / 32;
        let (d1, m1) = (d * f32::from(sc[j]), dmin * f32::from(m[j]));
        d1 * f32::from(v[i]) - m1
    })
}

/// A Q4_K block in memory.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct BlockQ4K {
    d: f32,
    dmin: f32,
    sc: [u8; 8],
    m: [u8; 8],
    qs: [u8; 128],
}

/// A Q5_K block in memory.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct BlockQ5K {
    d: f32,
    dmin: f32,
    sc: [u8; 8],
    m: [u8; 8],
    qh: [u8; 32],
    qs: [u8; 128],
}

/// A Q6_K block in memory.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct BlockQ6K {
    d: f32,
    sc: [i8; 16],
    ql: [u8; 128],
    qh: [u8; 64],
}

/// A Q2_K block in memory.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct BlockQ2K {
    d: f32,
    dmin: f32,
    sc: [u8; 16],
    m: [u8; 16],
    qs: [u8; 64],
}

/// A Q3_K block in memory: its scales unpacked, less 32.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct BlockQ3K {
    d: f32,
    sc: [i8; 16],
    hmask: [u8; 32],
    qs: [u8; 64],
}

/// Q3_K's sixteen 6-bit scales from its 12 packed bytes (ggml's
/// `kmask1`/`kmask2` unpacking), less 32.
fn unpack_q3_scales(p: &[u8]) -> [i8; 16] {
    std::array::from_fn(|i| {
        let low = if i < 8 { p[i % 8] & 0x0F } else { p[i % 8] >> 4 };
        let high = (p[8 + i % 4] >> (2 * (i / 4))) & 3;
        ((low | (high << 4)) as i8) - 32
    })
}

/// What the formats share: decoding, the values as unsigned
/// integers with their per-16 scales (the lanes' inputs), and the bytes
/// the resident digest covers.
pub(crate) trait KBlock: Copy + Send + Sync + Sized + 'static {
    const NAME: &'static str;
    const FILE_BYTES: usize;
    fn decode(b: &[u8]) -> Self;
    /// The 256 values, unsigned (Q6_K's before its −32), in weight order.
    fn values(&self) -> [u8; QK_K];
    /// The scale of each 16 values.
    fn scales16(&self) -> [i32; 16];
    /// Appends the resident fields to `out`.
    fn bytes_into(&self, out: &mut Vec<u8>);
    /// Dequantized, as ggml's `dequantize_row_*` computes each value.
    fn dequantize(&self) -> [f32; QK_K];
}

impl KBlock for BlockQ2K {
    const NAME: &'static str = "Q2_K";
    const FILE_BYTES: usize = Q2_K_BLOCK_BYTES;
    fn decode(b: &[u8]) -> Self {
        let (mut sc, mut m, mut qs) = ([0u8; 16], [0u8; 16], [0u8; 64]);
        for (i, &byte) in b[..16].iter().enumerate() {
            (sc[i], m[i]) = (byte & 0x0F, byte >> 4);
        }
        qs.copy_from_slice(&b[16..80]);
        Self { d: f16_at(b, 80), dmin: f16_at(b, 82), sc, m, qs }
    }
    fn values(&self) -> [u8; QK_K] {
        // Values 128n + 32t + l: bits 2t of qs[32n + l].
        std::array::from_fn(|i| {
            let (n, t, l) = (i / 128, (i / 32) % 4, i % 32);
            (self.qs[32 * n + l] >> (2 * t)) & 3
        })
    }
    fn scales16(&self) -> [i32; 16] {
        self.sc.map(i32::from)
    }
    fn bytes_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.d.to_bits().to_le_bytes());
        out.extend_from_slice(&self.dmin.to_bits().to_le_bytes());
        out.extend_from_slice(&self.sc);
        out.extend_from_slice(&self.m);
        out.extend_from_slice(&self.qs);
    }
    fn dequantize(&self) -> [f32; QK_K] {
        let v = self.values();
        // ggml: `dl = d·sc`, `ml = dmin·m`, `dl·q − ml`.
        std::array::from_fn(|i| {
            let (dl, ml) = (self.d * f32::from(self.sc[i / 16]), self.dmin * f32::from(self.m[i / 16]));
            dl * f32::from(v[i]) - ml
        })
    }
}

impl KBlock for BlockQ3K {
    const NAME: &'static str = "Q3_K";
    const FILE_BYTES: usize = Q3_K_BLOCK_BYTES;
    fn decode(b: &[u8]) -> Self {
        let (mut hmask, mut qs) = ([0u8; 32], [0u8; 64]);
        hmask.copy_from_slice(&b[..32]);
        qs.copy_from_slice(&b[32..96]);
        Self { d: f16_at(b, 108), sc: unpack_q3_scales(&b[96..108]), hmask, qs }
    }
    fn values(&self) -> [u8; QK_K] {
        // Values 128n + 32t + l: bits 2t of qs[32n + l], and bit 4n + t of hmask[l] as 4.
        std::array::from_fn(|i| {
            let (n, t, l) = (i / 128, (i / 32) % 4, i % 32);
            ((self.qs[32 * n + l] >> (2 * t)) & 3) | (((self.hmask[l] >> (4 * n + t)) & 1) << 2)
        })
    }
    fn scales16(&self) -> [i32; 16] {
        self.sc.map(i32::from)
    }
    fn bytes_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.d.to_bits().to_le_bytes());
        out.extend(self.sc.iter().map(|s| s.to_le_bytes()[0]));
        out.extend_from_slice(&self.hmask);
        out.extend_from_slice(&self.qs);
    }
    fn dequantize(&self) -> [f32; QK_K] {
        let v = self.values();
        // ggml: `dl = d·(sc − 32)`, then `dl·(q − 4)`.
        std::array::from_fn(|i| self.d * f32::from(self.sc[i / 16]) * f32::from(i16::from(v[i]) - 4))
    }
}

impl KBlock for BlockQ4K {
    const NAME: &'static str = "Q4_K";
    const FILE_BYTES: usize = Q4_K_BLOCK_BYTES;
    fn decode(b: &[u8]) -> Self {
        let (sc, m) = unpack_scales(&b[4..16]);
        let mut qs = [0u8; 128];
        qs.copy_from_slice(&b[16..144]);
        Self { d: f16_at(b, 0), dmin: f16_at(b, 2), sc, m, qs }
    }
    fn values(&self) -> [u8; QK_K] {
        let mut v = [0u8; QK_K];
        for c in 0..4 {
            for l in 0..32 {
                let q = self.qs[32 * c + l];
                v[64 * c + l] = q & 0x0F;
                v[64 * c + 32 + l] = q >> 4;
            }
        }
        v
    }
    fn scales16(&self) -> [i32; 16] {
        scales_per_32(&self.sc)
    }
    fn bytes_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.d.to_bits().to_le_bytes());
        out.extend_from_slice(&self.dmin.to_bits().to_le_bytes());
        out.extend_from_slice(&self.sc);
        out.extend_from_slice(&self.m);
        out.extend_from_slice(&self.qs);
    }
    fn dequantize(&self) -> [f32; QK_K] {
        dequantize_with_mins(self.d, self.dmin, &self.sc, &self.m, &self.values())
    }
}

impl KBlock for BlockQ5K {
    const NAME: &'static str = "Q5_K";
    const FILE_BYTES: usize = Q5_K_BLOCK_BYTES;
    fn decode(b: &[u8]) -> Self {
        let (sc, m) = unpack_scales(&b[4..16]);
        let (mut qh, mut qs) = ([0u8; 32], [0u8; 128]);
        qh.copy_from_slice(&b[16..48]);
        qs.copy_from_slice(&b[48..176]);
        Self { d: f16_at(b, 0), dmin: f16_at(b, 2), sc, m, qh, qs }
    }
    fn values(&self) -> [u8; QK_K] {
        let mut v = [0u8; QK_K];
        for c in 0..4 {
            for l in 0..32 {
                let (q, h) = (self.qs[32 * c + l], self.qh[l] >> (2 * c));
                v[64 * c + l] = (q & 0x0F) | ((h & 1) << 4);
                v[64 * c + 32 + l] = (q >> 4) | (((h >> 1) & 1) << 4);
            }
        }
        v
    }
    fn scales16(&self) -> [i32; 16] {
        scales_per_32(&self.sc)
    }
    fn bytes_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.d.to_bits().to_le_bytes());
        out.extend_from_slice(&self.dmin.to_bits().to_le_bytes());
        out.extend_from_slice(&self.sc);
        out.extend_from_slice(&self.m);
        out.extend_from_slice(&self.qh);
        out.extend_from_slice(&self.qs);
    }
    fn dequantize(&self) -> [f32; QK_K] {
        dequantize_with_mins(self.d, self.dmin, &self.sc, &self.m, &self.values())
    }
}

impl KBlock for BlockQ6K {
    const NAME: &'static str = "Q6_K";
    const FILE_BYTES: usize = Q6_K_BLOCK_BYTES;
    fn decode(b: &[u8]) -> Self {
        let (mut ql, mut qh, mut sc) = ([0u8; 128], [0u8; 64], [0i8; 16]);
        ql.copy_from_slice(&b[..128]);
        qh.copy_from_slice(&b[128..192]);
        for (s, &byte) in sc.iter_mut().zip(&b[192..208]) {
            *s = byte as i8;
        }
        Self { d: f16_at(b, 208), sc, ql, qh }
    }
    fn values(&self) -> [u8; QK_K] {
        let mut v = [0u8; QK_K];
        for n in 0..2 {
            let (ql, qh) = (&self.ql[64 * n..], &self.qh[32 * n..]);
            for l in 0..32 {
                let at = 128 * n + l;
                v[at] = (ql[l] & 0x0F) | ((qh[l] & 3) << 4);
                v[at + 32] = (ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4);
                v[at + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                v[at + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
            }
        }
        v
    }
    fn scales16(&self) -> [i32; 16] {
        self.sc.map(i32::from)
    }
    fn bytes_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.d.to_bits().to_le_bytes());
        out.extend(self.sc.iter().map(|s| s.to_le_bytes()[0]));
        out.extend_from_slice(&self.ql);
        out.extend_from_slice(&self.qh);
    }
    fn dequantize(&self) -> [f32; QK_K] {
        let v = self.values();
        // ggml: `d * sc[is] * q`, left to right.
        std::array::from_fn(|i| self.d * f32::from(self.sc[i / 16]) * (i32::from(v[i]) - 32) as f32)
    }
}

/// One weight block against one activation block, in integers (exact):
/// `Σ sc·w·x` over the 256 values with each value's sub-block scale, and
/// the bias `Σ b_s·bsums[s]` over the sixteen groups of 16 with
/// [`Finish::bias16`]'s weights — the mins (Q2_K/Q4_K/Q5_K, scaled by
/// `dmin` in [`finish`]), or the scales times the values' offset (Q3_K 4,
/// Q6_K 32, taken off in [`finish`]). Integer sums do not depend on their
/// order, so every kernel gets these same two numbers.
fn block_sums<B: Finish>(b: &B, a: &BlockQ8K) -> (i32, i32) {
    let (v, s) = (b.values(), b.scales16());
    let sumi = v.iter().zip(&a.qs).enumerate().map(|(i, (&w, &x))| s[i / 16] * i32::from(w) * i32::from(x)).sum();
    let bias: i32 = b.bias16().iter().zip(&a.bsums).map(|(&w, &x)| w * i32::from(x)).sum();
    (sumi, if B::MINS { bias } else { bias << B::OFFSET_SHIFT })
}

/// The float steps of one block, shared by every kernel: with mins
/// `acc + (d·x.d)·sumi − (dmin·x.d)·bias`, else `acc + (d·x.d)·(sumi −
/// bias)`, each product and sum rounded on its own (no fused multiply-add).
#[inline]
fn finish<B: Finish>(b: &B, a: &BlockQ8K, sumi: i32, bias: i32, acc: f32) -> f32 {
    let (d, dmin) = b.factors();
    let (d, dm) = (d * a.d, dmin * a.d);
    if B::MINS {
        acc + d * sumi as f32 - dm * bias as f32
    } else {
        acc + d * (sumi - bias) as f32
    }
}

/// The float side of a block, shared by the scalar and SIMD kernels.
trait Finish: KBlock {
    /// Whether the format has mins (`w = d·sc·q − dmin·m`): Q2_K, Q4_K,
    /// Q5_K. Without, its values are offset by `1 << OFFSET_SHIFT` (`w =
    /// d·sc·(q − offset)`): Q3_K, Q6_K.
    const MINS: bool;
    /// log2 of the values' offset, for a format without mins.
    const OFFSET_SHIFT: u32 = 0;
    /// The weight of each group of 16 activations' sum in the bias: its
    /// min (with mins), or its scale (without).
    fn bias16(&self) -> [i32; 16];
    /// `(d, dmin)` (`dmin` 0, unused, without mins).
    fn factors(&self) -> (f32, f32);
}

impl Finish for BlockQ2K {
    const MINS: bool = true;
    fn bias16(&self) -> [i32; 16] {
        self.m.map(i32::from)
    }
    fn factors(&self) -> (f32, f32) {
        (self.d, self.dmin)
    }
}
impl Finish for BlockQ3K {
    const MINS: bool = false;
    const OFFSET_SHIFT: u32 = 2;
    fn bias16(&self) -> [i32; 16] {
        self.scales16()
    }
    fn factors(&self) -> (f32, f32) {
        (self.d, 0.0)
    }
}
impl Finish for BlockQ4K {
    const MINS: bool = true;
    fn bias16(&self) -> [i32; 16] {
        std::array::from_fn(|i| i32::from(self.m[i / 2]))
    }
    fn factors(&self) -> (f32, f32) {
        (self.d, self.dmin)
    }
}
impl Finish for BlockQ5K {
    const MINS: bool = true;
    fn bias16(&self) -> [i32; 16] {
        std::array::from_fn(|i| i32::from(self.m[i / 2]))
    }
    fn factors(&self) -> (f32, f32) {
        (self.d, self.dmin)
    }
}
impl Finish for BlockQ6K {
    const MINS: bool = false;
    const OFFSET_SHIFT: u32 = 5;
    fn bias16(&self) -> [i32; 16] {
        self.scales16()
    }
    fn factors(&self) -> (f32, f32) {
        (self.d, 0.0)
    }
}

/// The arithmetic every kernel computes: [`block_sums`] and [`finish`],
/// block after block.
fn dot_scalar<B: Finish>(w: &[B], x: &[BlockQ8K]) -> f32 {
    w.iter().zip(x).fold(0.0, |acc, (b, a)| {
        let (sumi, bias) = block_sums(b, a);
        finish(b, a, sumi, bias, acc)
    })
}

/// A K-quant weight matrix of `rows × cols`.
#[derive(Debug)]
struct KMatrix<B> {
    rows: usize,
    cols: usize,
    blocks: Vec<B>,
}

/// A Q2_K, Q3_K, Q4_K, Q5_K or Q6_K matrix (a `Q4_K_M` file holds the
/// last three, a `Q3_K_M` the middle three).
#[derive(Debug)]
pub struct KQuantMatrix(Blocks);

#[derive(Debug)]
enum Blocks {
    Q2K(KMatrix<BlockQ2K>),
    Q3K(KMatrix<BlockQ3K>),
    Q4K(KMatrix<BlockQ4K>),
    Q5K(KMatrix<BlockQ5K>),
    Q6K(KMatrix<BlockQ6K>),
}

impl<B: Finish> KMatrix<B> {
    fn from_gguf_bytes(raw: &[u8], rows: usize, cols: usize) -> Result<Self, KernelError> {
        if cols == 0 || !cols.is_multiple_of(QK_K) {
            return Err(KernelError::RowLength { format: B::NAME, cols, block: QK_K });
        }
        let n = rows.checked_mul(cols / QK_K).ok_or(KernelError::SizeOverflow { format: B::NAME })?;
        let expected = n.checked_mul(B::FILE_BYTES).ok_or(KernelError::SizeOverflow { format: B::NAME })?;
        if raw.len() != expected {
            return Err(KernelError::ByteCount { format: B::NAME, actual: raw.len(), expected });
        }
        let blocks = raw.par_chunks_exact(B::FILE_BYTES).map(B::decode).collect();
        Ok(Self { rows, cols, blocks })
    }

    fn matmul(&self, x: &[f32], m: usize, isa: Isa) -> Vec<f32>
    where
        B: Wide,
    {
        assert_eq!(x.len(), m * self.cols, "input of {} values for {m} rows of {}", x.len(), self.cols);
        let xq: Vec<BlockQ8K> = x.chunks_exact(self.cols).flat_map(quantize_row_q8_k).collect();
        let per_row = self.cols / QK_K;
        #[cfg(target_arch = "x86_64")]
        if isa == Isa::Avx512Vnni {
            return vnni::matmul(&self.blocks, self.rows, per_row, &xq, m);
        }
        par_matmul(&self.blocks, self.rows, per_row, &xq, m, dots(isa))
    }

    fn digest_into(&self, h: &mut sha2::Sha256) {
        use sha2::Digest as _;
        let mut buf = Vec::with_capacity(std::mem::size_of::<B>() * 1024);
        for chunk in self.blocks.chunks(1024) {
            buf.clear();
            chunk.iter().for_each(|b| b.bytes_into(&mut buf));
            h.update(&buf);
        }
    }

    fn row_into(&self, r: usize, out: &mut [f32]) {
        let per = self.cols / QK_K;
        for (b, o) in self.blocks[r * per..(r + 1) * per].iter().zip(out.chunks_exact_mut(QK_K)) {
            o.copy_from_slice(&b.dequantize());
        }
    }
}

macro_rules! each {
    ($self:expr, $m:ident => $e:expr) => {
        match &$self.0 {
            Blocks::Q2K($m) => $e,
            Blocks::Q3K($m) => $e,
            Blocks::Q4K($m) => $e,
            Blocks::Q5K($m) => $e,
            Blocks::Q6K($m) => $e,
        }
    };
}

impl KQuantMatrix {
    /// Decodes raw GGUF bytes of a `rows × cols` tensor of `dtype`; `None`
    /// when `dtype` is not a K-quant these kernels run.
    pub fn from_gguf_bytes(
        dtype: candle_core::quantized::GgmlDType,
        raw: &[u8],
        rows: usize,
        cols: usize,
    ) -> Option<Result<Self, KernelError>> {
        use candle_core::quantized::GgmlDType as T;
        Some(
            match dtype {
                T::Q2K => KMatrix::from_gguf_bytes(raw, rows, cols).map(Blocks::Q2K),
                T::Q3K => KMatrix::from_gguf_bytes(raw, rows, cols).map(Blocks::Q3K),
                T::Q4K => KMatrix::from_gguf_bytes(raw, rows, cols).map(Blocks::Q4K),
                T::Q5K => KMatrix::from_gguf_bytes(raw, rows, cols).map(Blocks::Q5K),
                T::Q6K => KMatrix::from_gguf_bytes(raw, rows, cols).map(Blocks::Q6K),
                _ => return None,
            }
            .map(Self),
        )
    }

    /// Stacks matrices of one format and width into one (their outputs side
    /// by side), so that one quantized input feeds them all; `None` when the
    /// formats differ.
    pub fn stack(parts: Vec<Self>) -> Option<Result<Self, KernelError>> {
        fn join<B>(parts: Vec<KMatrix<B>>) -> Result<KMatrix<B>, KernelError> {
            let cols = parts.first().map(|p| p.cols).ok_or(KernelError::NothingToStack)?;
            if parts.iter().any(|p| p.cols != cols) {
                return Err(KernelError::WidthMismatch);
            }
            let rows = parts.iter().map(|p| p.rows).sum();
            Ok(KMatrix { rows, cols, blocks: parts.into_iter().flat_map(|p| p.blocks).collect() })
        }
        macro_rules! all {
            ($v:ident) => {{
                let mut same = Vec::with_capacity(parts.len());
                for p in parts {
                    let Blocks::$v(m) = p.0 else { return None };
                    same.push(m);
                }
                Some(join(same).map(|m| Self(Blocks::$v(m))))
            }};
        }
        match parts.first().map(|p| &p.0) {
            Some(Blocks::Q2K(_)) => all!(Q2K),
            Some(Blocks::Q3K(_)) => all!(Q3K),
            Some(Blocks::Q4K(_)) => all!(Q4K),
            Some(Blocks::Q5K(_)) => all!(Q5K),
            Some(Blocks::Q6K(_)) => all!(Q6K),
            None => Some(Err(KernelError::NothingToStack)),
        }
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        each!(self, m => m.rows)
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        each!(self, m => m.cols)
    }

    /// The format's name (`Q2_K` … `Q6_K`).
    pub fn format(&self) -> &'static str {
        match &self.0 {
            Blocks::Q2K(_) => BlockQ2K::NAME,
            Blocks::Q3K(_) => BlockQ3K::NAME,
            Blocks::Q4K(_) => BlockQ4K::NAME,
            Blocks::Q5K(_) => BlockQ5K::NAME,
            Blocks::Q6K(_) => BlockQ6K::NAME,
        }
    }

    /// Bytes the blocks take in memory.
    pub fn resident_bytes(&self) -> usize {
        fn bytes<B>(m: &KMatrix<B>) -> usize {
            m.blocks.len() * std::mem::size_of::<B>()
        }
        each!(self, m => bytes(m))
    }

    /// `x (m × cols) · selfᵀ → (m × rows)`, row-major; activations
    /// quantized to Q8_K.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_on(x, m, super::kquant_isa())
    }

    /// [`Self::matmul`] on the kernels of `isa`, which this CPU must run
    /// ([`super::at_most`]).
    fn matmul_on(&self, x: &[f32], m: usize, isa: Isa) -> Vec<f32> {
        each!(self, w => w.matmul(x, m, isa))
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

/// The one-row and four-row kernels of `isa` (VNNI's grouped kernel runs
/// these for the rows it does not group).
fn dots<B: Simd>(isa: Isa) -> Dots<B, BlockQ8K> {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        return Dots {
            // SAFETY (both): `isa` came from `at_most`, which chose AVX2 or
            // VNNI after run-time detection of AVX2 and FMA.
            one: |w, x| unsafe { dot_avx2(w, x) },
            four: |w, x| unsafe { dot4_avx2(w, x) },
        };
    }
    let _ = isa;
    Dots { one: dot_scalar, four: |w, x| x.map(|x| dot_scalar(w, x)) }
}

#[cfg(not(target_arch = "x86_64"))]
trait Simd: Finish {}
#[cfg(not(target_arch = "x86_64"))]
impl<B: Finish> Simd for B {}
#[cfg(not(target_arch = "x86_64"))]
trait Wide: Simd {}
#[cfg(not(target_arch = "x86_64"))]
impl<B: Simd> Wide for B {}

#[cfg(target_arch = "x86_64")]
use simd::{dot4_avx2, dot_avx2, Simd};

#[cfg(target_arch = "x86_64")]
mod simd;
#[cfg(target_arch = "x86_64")]
mod vnni;
#[cfg(target_arch = "x86_64")]
use wide::Wide;
#[cfg(target_arch = "x86_64")]
mod wide;

#[cfg(test)]
mod tests;
