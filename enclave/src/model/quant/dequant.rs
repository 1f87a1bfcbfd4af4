//! Dequantization of ggml's storage types to f32, equal bit for bit to
//! ggml's `dequantize_row_*` (`ggml-quants.c`) and to gguf-py's
//! `gguf.quants.dequantize`, which the tests compare with
//! (`testdata/dequant/`, made by `scripts/make-dequant-fixtures.py`).
//!
//! This is the load-time path for the types Veil has no kernel for, so it
//! is written plainly: one function per type decodes one block, given as a
//! fixed-size array, into that block's values, with the same f32
//! operations in the same order as ggml's C: Q4_1 is `q·d + m`, Q6_K is
//! `(d·sc)·q`, IQ2_XXS is `(db·grid)·sign`, and so on, each rounded
//! separately (Rust never fuses `a * b + c` into one FMA; gguf-py's numpy
//! does not either). For most types the products are exact anyway (an f16
//! scale has 11 significant bits and the quants a few), so the roundings
//! that decide the last bit are a min's subtraction, Q8_K's f32 scale,
//! F64's narrowing and overflow to infinity. f16 scales widen exactly
//! (`half`; a NaN comes out quiet, as from x86's `vcvtph2ps` and ggml's
//! software conversion).
//!
//! Indexes into a block are constants or loop counters bounded by the
//! block's layout, and indexes into the lookup tables (`tables/`) are
//! masked to the table's size, so no input byte can make an index go out
//! of range: bad bytes only make bad values.

use super::tables::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KMASK_IQ2XS, KSIGNS_IQ2XS, KVALUES_IQ4NL,
    KVALUES_MXFP4,
};
use super::GgmlType;

/// Why bytes cannot be dequantized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DequantError {
    /// A type with no dequantization here (the integer types, and any ggml has no to-float for).
    #[error("ggml type {0} cannot be dequantized")]
    Unsupported(super::GgmlType),
    /// Not a whole number of blocks.
    #[error("{bytes} bytes are not whole {ty} blocks ({block} bytes each)")]
    Length {
        /// The type the bytes were read as.
        ty: super::GgmlType,
        /// How many bytes there were.
        bytes: usize,
        /// Bytes per block of `ty`.
        block: usize,
    },
}

/// `bytes` (whole blocks of `ty`) as f32 values, as ggml's `dequantize_row_*` computes them.
pub fn dequantize(ty: super::GgmlType, bytes: &[u8]) -> Result<Vec<f32>, DequantError> {
    let decode = decoder(ty).ok_or(DequantError::Unsupported(ty))?;
    let block = ty.block_bytes();
    if !bytes.len().is_multiple_of(block) {
        return Err(DequantError::Length { ty, bytes: bytes.len(), block });
    }
    Ok(decode(bytes))
}

/// Whether `dequantize` handles `ty`.
pub fn can_dequantize(ty: super::GgmlType) -> bool {
    decoder(ty).is_some()
}

/// Decodes whole blocks (the caller checked the length).
type Decoder = fn(&[u8]) -> Vec<f32>;

/// The decoder for `ty`. Each block function's array sizes are ggml's
/// block size and value count for its type (a test checks them against
/// `GgmlType`'s table).
fn decoder(ty: GgmlType) -> Option<Decoder> {
    use GgmlType as T;
    let decode: Decoder = match ty {
        T::F32 => |b| blocks(b, f32_value),
        T::F16 => |b| blocks(b, f16_value),
        T::BF16 => |b| blocks(b, bf16_value),
        T::F64 => |b| blocks(b, f64_value),
        T::Q1_0 => |b| blocks(b, q1_0),
        T::Q4_0 => |b| blocks(b, q4_0),
        T::Q4_1 => |b| blocks(b, q4_1),
        T::Q5_0 => |b| blocks(b, q5_0),
        T::Q5_1 => |b| blocks(b, q5_1),
        T::Q8_0 => |b| blocks(b, q8_0),
        T::Q2_K => |b| blocks(b, q2_k),
        T::Q3_K => |b| blocks(b, q3_k),
        T::Q4_K => |b| blocks(b, q4_k),
        T::Q5_K => |b| blocks(b, q5_k),
        T::Q6_K => |b| blocks(b, q6_k),
        T::Q8_K => |b| blocks(b, q8_k),
        T::IQ2_XXS => |b| blocks(b, iq2_xxs),
        T::IQ2_XS => |b| blocks(b, iq2_xs),
        T::IQ2_S => |b| blocks(b, iq2_s),
        T::IQ3_XXS => |b| blocks(b, iq3_xxs),
        T::IQ3_S => |b| blocks(b, iq3_s),
        T::IQ1_S => |b| blocks(b, iq1_s),
        T::IQ1_M => |b| blocks(b, iq1_m),
        T::IQ4_NL => |b| blocks(b, iq4_nl),
        T::IQ4_XS => |b| blocks(b, iq4_xs),
        T::TQ1_0 => |b| blocks(b, tq1_0),
        T::TQ2_0 => |b| blocks(b, tq2_0),
        // The MXFP4 kernel's own block decoder (`kernels::mxfp4`).
        T::MXFP4 => |b| blocks(b, |b: &[u8; 17], y: &mut [f32; 32]| *y = super::mxfp4::dequantize_block(b)),
        T::NVFP4 => |b| blocks(b, nvfp4),
        // Q8_1 is an activation format: ggml has no to-float for it.
        T::Q8_1 | T::I8 | T::I16 | T::I32 | T::I64 => return None,
    };
    Some(decode)
}

/// Runs `block` over each `B`-byte block of `bytes`, each giving `V` values.
fn blocks<const B: usize, const V: usize>(bytes: &[u8], block: impl Fn(&[u8; B], &mut [f32; V])) -> Vec<f32> {
    let (input, _rest) = bytes.as_chunks::<B>();
    let mut out = vec![0.0f32; input.len() * V];
    let (values, _) = out.as_chunks_mut::<V>();
    for (b, y) in input.iter().zip(values) {
        block(b, y);
    }
    out
}

/// An IEEE half (little-endian bytes) widened to f32: exact, as ggml's
/// `GGML_FP16_TO_FP32`.
fn f16(lo: u8, hi: u8) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([lo, hi])).to_f32()
}

/// Bit `bit` of `byte` set: the sign ggml multiplies by, `-1.0` or `1.0`.
fn sign(byte: u8, bit: usize) -> f32 {
    if byte & KMASK_IQ2XS[bit] != 0 {
        -1.0
    } else {
        1.0
    }
}

/// F32: the 4 bytes as they are (a NaN keeps its payload).
fn f32_value(b: &[u8; 4], y: &mut [f32; 1]) {
    y[0] = f32::from_le_bytes(*b);
}

/// F16: IEEE half, widened exactly.
fn f16_value(b: &[u8; 2], y: &mut [f32; 1]) {
    y[0] = f16(b[0], b[1]);
}

/// BF16: the top 16 bits of an f32 (`ggml_compute_bf16_to_fp32`: a shift,
/// so a NaN keeps its payload).
fn bf16_value(b: &[u8; 2], y: &mut [f32; 1]) {
    y[0] = f32::from_bits(u32::from(u16::from_le_bytes(*b)) << 16);
}

/// F64: rounded to the nearest f32 (ties to even), as numpy's
/// `astype(float32)`; ggml has no F64 to-float.
fn f64_value(b: &[u8; 8], y: &mut [f32; 1]) {
    y[0] = f64::from_le_bytes(*b) as f32;
}

/// Q1_0: `block_q1_0` (18 bytes, 128 values) = `d: f16`, `qs: [u8; 16]`;
/// value j is `d` where bit j%8 of `qs[j/8]` is set, `-d` where not.
fn q1_0(b: &[u8; 18], y: &mut [f32; 128]) {
    let d = f16(b[0], b[1]);
    let neg_d = -d;
    for (j, v) in y.iter_mut().enumerate() {
        *v = if (b[2 + j / 8] >> (j % 8)) & 1 != 0 { d } else { neg_d };
    }
}

/// Q4_0: `block_q4_0` (18 bytes, 32 values) = `d: f16`, `qs: [u8; 16]`;
/// value j is the low nibble of `qs[j]`, value j+16 the high one, each
/// `(q - 8)·d`.
fn q4_0(b: &[u8; 18], y: &mut [f32; 32]) {
    let d = f16(b[0], b[1]);
    for j in 0..16 {
        let q = b[2 + j];
        y[j] = (i32::from(q & 0x0F) - 8) as f32 * d;
        y[j + 16] = (i32::from(q >> 4) - 8) as f32 * d;
    }
}

/// Q4_1: `block_q4_1` (20 bytes, 32 values) = `d: f16`, `m: f16`,
/// `qs: [u8; 16]` (nibbles as Q4_0); each value `q·d + m`.
fn q4_1(b: &[u8; 20], y: &mut [f32; 32]) {
    let d = f16(b[0], b[1]);
    let m = f16(b[2], b[3]);
    for j in 0..16 {
        let q = b[4 + j];
        y[j] = f32::from(q & 0x0F) * d + m;
        y[j + 16] = f32::from(q >> 4) * d + m;
    }
}

/// Q5_0: `block_q5_0` (22 bytes, 32 values) = `d: f16`, `qh: u32` (bit j:
/// the fifth bit of value j), `qs: [u8; 16]` (nibbles as Q4_0); each value
/// `(q - 16)·d`.
fn q5_0(b: &[u8; 22], y: &mut [f32; 32]) {
    let d = f16(b[0], b[1]);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    for j in 0..16 {
        let q = b[6 + j];
        let h0 = (((qh >> j) << 4) & 0x10) as i32;
        let h1 = ((qh >> (j + 12)) & 0x10) as i32;
        y[j] = ((i32::from(q & 0x0F) | h0) - 16) as f32 * d;
        y[j + 16] = ((i32::from(q >> 4) | h1) - 16) as f32 * d;
    }
}

/// Q5_1: `block_q5_1` (24 bytes, 32 values) = `d: f16`, `m: f16`,
/// `qh: u32`, `qs: [u8; 16]` (bits as Q5_0); each value `q·d + m`.
fn q5_1(b: &[u8; 24], y: &mut [f32; 32]) {
    let d = f16(b[0], b[1]);
    let m = f16(b[2], b[3]);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    for j in 0..16 {
        let q = b[8 + j];
        let h0 = (((qh >> j) << 4) & 0x10) as i32;
        let h1 = ((qh >> (j + 12)) & 0x10) as i32;
        y[j] = (i32::from(q & 0x0F) | h0) as f32 * d + m;
        y[j + 16] = (i32::from(q >> 4) | h1) as f32 * d + m;
    }
}

/// Q8_0: `block_q8_0` (34 bytes, 32 values) = `d: f16`, `qs: [i8; 32]`;
/// each value `q·d`.
fn q8_0(b: &[u8; 34], y: &mut [f32; 32]) {
    let d = f16(b[0], b[1]);
    for j in 0..32 {
        y[j] = f32::from(b[2 + j] as i8) * d;
    }
}

/// Q2_K: `block_q2_K` (84 bytes, 256 values) = `scales: [u8; 16]` (low
/// nibble scale, high nibble min, per 16 values), `qs: [u8; 64]` (2 bits a
/// value), `d: f16`, `dmin: f16`. Per 128 values n, shift 2j and 16-value
/// half h: value `128n + 32j + 16h + l` is bits `2j..2j+2` of
/// `qs[32n + 16h + l]`, as `(d·sc)·q − dmin·m` with `scales[8n + 2j + h]`.
fn q2_k(b: &[u8; 84], y: &mut [f32; 256]) {
    let d = f16(b[80], b[81]);
    let min = f16(b[82], b[83]);
    for n in 0..2 {
        for j in 0..4 {
            for h in 0..2 {
                let sc = b[8 * n + 2 * j + h];
                let dl = d * f32::from(sc & 0x0F);
                let ml = min * f32::from(sc >> 4);
                for l in 0..16 {
                    let q = (b[16 + 32 * n + 16 * h + l] >> (2 * j)) & 3;
                    y[128 * n + 32 * j + 16 * h + l] = dl * f32::from(q) - ml;
                }
            }
        }
    }
}

/// Q3_K: `block_q3_K` (110 bytes, 256 values) = `hmask: [u8; 32]` (the
/// high bit, set meaning no −4), `qs: [u8; 64]` (low 2 bits), `scales:
/// [u8; 12]` (16 six-bit scales: low nibbles in bytes 0–7, high pairs in
/// 8–11), `d: f16`. Value `128n + 32j + 16h + l` is bits `2j..2j+2` of
/// `qs[32n + 16h + l]`, minus 4 unless bit `4n + j` of `hmask[16h + l]`,
/// times `d·(scale[8n + 2j + h] − 32)`.
fn q3_k(b: &[u8; 110], y: &mut [f32; 256]) {
    let d = f16(b[108], b[109]);
    let sc = &b[96..108];
    for n in 0..2 {
        for j in 0..4 {
            for h in 0..2 {
                let s = 8 * n + 2 * j + h;
                let low = if s < 8 { sc[s] & 0x0F } else { sc[s - 8] >> 4 };
                let high = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
                let dl = d * f32::from(((low | (high << 4)) as i8) - 32);
                for l in 0..16 {
                    let q = ((b[32 + 32 * n + 16 * h + l] >> (2 * j)) & 3) as i8;
                    let hm = if b[16 * h + l] & (1 << (4 * n + j)) != 0 { 0 } else { 4 };
                    y[128 * n + 32 * j + 16 * h + l] = dl * f32::from(q - hm);
                }
            }
        }
    }
}

/// The six-bit scale and min of sub-block `j` (of 8) in a Q4_K/Q5_K
/// `scales: [u8; 12]` (ggml's `get_scale_min_k4`).
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// Q4_K: `block_q4_K` (144 bytes, 256 values) = `d: f16`, `dmin: f16`,
/// `scales: [u8; 12]` (8 six-bit scales and mins), `qs: [u8; 128]`. Per 64
/// values j: value `64j + l` is the low nibble of `qs[32j + l]`, `64j + 32
/// + l` the high one, as `(d·sc)·q − dmin·m` with sub-blocks `2j`, `2j+1`.
fn q4_k(b: &[u8; 144], y: &mut [f32; 256]) {
    k_with_mins(b, &b[16..144], None, y);
}

/// Q5_K: `block_q5_K` (176 bytes, 256 values) = `d: f16`, `dmin: f16`,
/// `scales: [u8; 12]`, `qh: [u8; 32]` (fifth bits), `qs: [u8; 128]`. As
/// Q4_K, with 16 added to value `64j + l` where bit `2j` of `qh[l]` is set
/// and to `64j + 32 + l` where bit `2j + 1` is.
fn q5_k(b: &[u8; 176], y: &mut [f32; 256]) {
    k_with_mins(b, &b[48..176], Some(&b[16..48]), y);
}

/// Q4_K and Q5_K: `d`, `dmin` and the packed scales at the block's start,
/// four bits of each value in `qs`, the fifth (Q5_K) in `qh`.
fn k_with_mins(b: &[u8], qs: &[u8], qh: Option<&[u8]>, y: &mut [f32; 256]) {
    let d = f16(b[0], b[1]);
    let min = f16(b[2], b[3]);
    let scales = &b[4..16];
    for j in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * j, scales);
        let (sc2, m2) = scale_min_k4(2 * j + 1, scales);
        let (d1, m1) = (d * f32::from(sc1), min * f32::from(m1));
        let (d2, m2) = (d * f32::from(sc2), min * f32::from(m2));
        for l in 0..32 {
            let q = qs[32 * j + l];
            let (h1, h2) = match qh {
                Some(qh) => {
                    (if qh[l] & (1 << (2 * j)) != 0 { 16 } else { 0 }, if qh[l] & (2 << (2 * j)) != 0 { 16 } else { 0 })
                }
                None => (0, 0),
            };
            y[64 * j + l] = d1 * f32::from((q & 0x0F) + h1) - m1;
            y[64 * j + 32 + l] = d2 * f32::from((q >> 4) + h2) - m2;
        }
    }
}

/// Q6_K: `block_q6_K` (210 bytes, 256 values) = `ql: [u8; 128]` (low
/// nibbles), `qh: [u8; 64]` (high pairs), `scales: [i8; 16]`, `d: f16`. Per
/// 128 values n and quarter k: value `128n + 32k + l` has low nibble
/// `ql[64n + 32(k%2) + l]` (high half when k ≥ 2) and bits `2k..2k+2` of
/// `qh[32n + l]`, as `(d·scale[8n + 2k + l/16])·(q − 32)`.
fn q6_k(b: &[u8; 210], y: &mut [f32; 256]) {
    let d = f16(b[208], b[209]);
    for n in 0..2 {
        let (ql, qh, sc) = (64 * n, 128 + 32 * n, 192 + 8 * n);
        for l in 0..32 {
            let is = l / 16;
            let h = b[qh + l];
            let q1 = ((b[ql + l] & 0x0F) | ((h & 3) << 4)) as i8 - 32;
            let q2 = ((b[ql + l + 32] & 0x0F) | (((h >> 2) & 3) << 4)) as i8 - 32;
            let q3 = ((b[ql + l] >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
            let q4 = ((b[ql + l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
            let scale = |k: usize| f32::from(b[sc + is + k] as i8);
            y[128 * n + l] = d * scale(0) * f32::from(q1);
            y[128 * n + l + 32] = d * scale(2) * f32::from(q2);
            y[128 * n + l + 64] = d * scale(4) * f32::from(q3);
            y[128 * n + l + 96] = d * scale(6) * f32::from(q4);
        }
    }
}

/// Q8_K: `block_q8_K` (292 bytes, 256 values) = `d: f32`, `qs: [i8; 256]`,
/// `bsums: [i16; 16]` (sums for dot products, unused here); each value
/// `d·q`.
fn q8_k(b: &[u8; 292], y: &mut [f32; 256]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for j in 0..256 {
        y[j] = d * f32::from(b[4 + j] as i8);
    }
}

/// IQ2_XXS: `block_iq2_xxs` (66 bytes, 256 values) = `d: f16`, `qs: [u16;
/// 32]`. Per 32 values, two u32s: the first's 4 bytes index
/// `iq2xxs_grid` (8 magnitudes each), the second holds four 7-bit
/// `ksigns_iq2xs` indexes and, in its top 4 bits, the scale `s`: value =
/// `(d·(0.5 + s)·0.25)·grid·sign`.
fn iq2_xxs(b: &[u8; 66], y: &mut [f32; 256]) {
    let d = f16(b[0], b[1]);
    for ib in 0..8 {
        let at = 2 + 8 * ib;
        let aux1 = u32::from_le_bytes([b[at + 4], b[at + 5], b[at + 6], b[at + 7]]);
        let db = d * (0.5 + (aux1 >> 28) as f32) * 0.25;
        for l in 0..4 {
            let grid = IQ2XXS_GRID[usize::from(b[at + l])].to_le_bytes();
            let signs = KSIGNS_IQ2XS[((aux1 >> (7 * l)) & 127) as usize];
            for j in 0..8 {
                y[32 * ib + 8 * l + j] = db * f32::from(grid[j]) * sign(signs, j);
            }
        }
    }
}

/// IQ2_XS: `block_iq2_xs` (74 bytes, 256 values) = `d: f16`, `qs: [u16;
/// 32]` (9-bit `iq2xs_grid` index, 7-bit `ksigns_iq2xs` index),
/// `scales: [u8; 8]` (a nibble per 16 values): value =
/// `(d·(0.5 + s)·0.25)·grid·sign`.
fn iq2_xs(b: &[u8; 74], y: &mut [f32; 256]) {
    let d = f16(b[0], b[1]);
    for ib in 0..8 {
        let s = b[66 + ib];
        let db = [d * (0.5 + f32::from(s & 0x0F)) * 0.25, d * (0.5 + f32::from(s >> 4)) * 0.25];
        for l in 0..4 {
            let at = 2 + 2 * (4 * ib + l);
            let q = u16::from_le_bytes([b[at], b[at + 1]]);
            let grid = IQ2XS_GRID[usize::from(q & 511)].to_le_bytes();
            let signs = KSIGNS_IQ2XS[usize::from(q >> 9)];
            for j in 0..8 {
                y[32 * ib + 8 * l + j] = db[l / 2] * f32::from(grid[j]) * sign(signs, j);
            }
        }
    }
}

/// IQ2_S: `block_iq2_s` (82 bytes, 256 values) = `d: f16`, `qs: [u8; 64]`
/// (32 low bytes of `iq2s_grid` indexes, then 32 sign bytes), `qh: [u8;
/// 8]` (2 high index bits per 8 values), `scales: [u8; 8]`: value =
/// `(d·(0.5 + s)·0.25)·grid·sign`.
fn iq2_s(b: &[u8; 82], y: &mut [f32; 256]) {
    let d = f16(b[0], b[1]);
    for ib in 0..8 {
        let s = b[74 + ib];
        let db = [d * (0.5 + f32::from(s & 0x0F)) * 0.25, d * (0.5 + f32::from(s >> 4)) * 0.25];
        let qh = usize::from(b[66 + ib]);
        for l in 0..4 {
            let index = usize::from(b[2 + 4 * ib + l]) | ((qh << (8 - 2 * l)) & 0x300);
            let grid = IQ2S_GRID[index].to_le_bytes();
            let signs = b[34 + 4 * ib + l];
            for j in 0..8 {
                y[32 * ib + 8 * l + j] = db[l / 2] * f32::from(grid[j]) * sign(signs, j);
            }
        }
    }
}

/// IQ3_XXS: `block_iq3_xxs` (98 bytes, 256 values) = `d: f16`, `qs: [u8;
/// 96]`: 64 `iq3xxs_grid` indexes (4 magnitudes each), then per 32 values
/// a u32 of four 7-bit `ksigns_iq2xs` indexes and a 4-bit scale `s`:
/// value = `(d·(0.5 + s)·0.5)·grid·sign`.
fn iq3_xxs(b: &[u8; 98], y: &mut [f32; 256]) {
    let d = f16(b[0], b[1]);
    for ib in 0..8 {
        let at = 66 + 4 * ib;
        let aux = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for l in 0..4 {
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
            let grid1 = IQ3XXS_GRID[usize::from(b[2 + 8 * ib + 2 * l])].to_le_bytes();
            let grid2 = IQ3XXS_GRID[usize::from(b[2 + 8 * ib + 2 * l + 1])].to_le_bytes();
            for j in 0..4 {
                y[32 * ib + 8 * l + j] = db * f32::from(grid1[j]) * sign(signs, j);
                y[32 * ib + 8 * l + j + 4] = db * f32::from(grid2[j]) * sign(signs, j + 4);
            }
        }
    }
}

/// IQ3_S: `block_iq3_s` (110 bytes, 256 values) = `d: f16`, `qs: [u8;
/// 64]` (low bytes of 9-bit `iq3s_grid` indexes, 4 magnitudes each),
/// `qh: [u8; 8]` (the ninth bits), `signs: [u8; 32]`, `scales: [u8; 4]` (a
/// nibble per 32 values): value = `(d·(1 + 2s))·grid·sign`.
fn iq3_s(b: &[u8; 110], y: &mut [f32; 256]) {
    let d = f16(b[0], b[1]);
    for ib in 0..8 {
        let s = b[106 + ib / 2];
        let s = if ib % 2 == 0 { s & 0x0F } else { s >> 4 };
        let db = d * f32::from(1 + 2 * s);
        let qh = usize::from(b[66 + ib]);
        for l in 0..4 {
            let q = 2 + 8 * ib + 2 * l;
            let grid1 = IQ3S_GRID[usize::from(b[q]) | ((qh << (8 - 2 * l)) & 256)].to_le_bytes();
            let grid2 = IQ3S_GRID[usize::from(b[q + 1]) | ((qh << (7 - 2 * l)) & 256)].to_le_bytes();
            let signs = b[74 + 4 * ib + l];
            for j in 0..4 {
                y[32 * ib + 8 * l + j] = db * f32::from(grid1[j]) * sign(signs, j);
                y[32 * ib + 8 * l + j + 4] = db * f32::from(grid2[j]) * sign(signs, j + 4);
            }
        }
    }
}

/// ggml's `IQ1S_DELTA` (IQ1_M uses the same).
const IQ1S_DELTA: f32 = 0.125;

/// IQ1_S: `block_iq1_s` (50 bytes, 256 values) = `d: f16`, `qs: [u8;
/// 32]` (low bytes of 11-bit `iq1s_grid` indexes, 8 values of −1/0/1
/// each), `qh: [u16; 8]` (per 32 values: four 3-bit high index parts, a
/// 3-bit scale `s`, and the delta's sign in bit 15): value =
/// `(d·(2s + 1))·(grid ± 0.125)`.
fn iq1_s(b: &[u8; 50], y: &mut [f32; 256]) {
    let d = f16(b[0], b[1]);
    for ib in 0..8 {
        let qh = u16::from_le_bytes([b[34 + 2 * ib], b[35 + 2 * ib]]);
        let dl = d * f32::from(2 * ((qh >> 12) & 7) + 1);
        let delta = if qh & 0x8000 != 0 { -IQ1S_DELTA } else { IQ1S_DELTA };
        for l in 0..4 {
            let index = usize::from(b[2 + 4 * ib + l]) | (usize::from((qh >> (3 * l)) & 7) << 8);
            let grid = IQ1S_GRID[index].to_le_bytes();
            for j in 0..8 {
                y[32 * ib + 8 * l + j] = dl * (f32::from(grid[j] as i8) + delta);
            }
        }
    }
}

/// IQ1_M: `block_iq1_m` (56 bytes, 256 values) = `qs: [u8; 32]` (low
/// bytes of `iq1s_grid` indexes), `qh: [u8; 16]` (per 8 values a nibble:
/// 3 high index bits and the delta's sign), `scales: [u8; 8]` (four u16:
/// 3-bit scales `s` per 16 values in bits 0–11, and the f16 `d` spread
/// over the four top nibbles): value = `(d·(2s + 1))·(grid ± 0.125)`.
fn iq1_m(b: &[u8; 56], y: &mut [f32; 256]) {
    let sc: [u16; 4] = std::array::from_fn(|k| u16::from_le_bytes([b[48 + 2 * k], b[49 + 2 * k]]));
    let d_bits = (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000);
    let [lo, hi] = d_bits.to_le_bytes();
    let d = f16(lo, hi);
    for ib in 0..8 {
        let s = sc[ib / 2] >> (6 * (ib % 2));
        let dl = [d * f32::from(2 * (s & 7) + 1), d * f32::from(2 * ((s >> 3) & 7) + 1)];
        for l in 0..4 {
            let qh = b[32 + 2 * ib + l / 2];
            let nibble = if l % 2 == 0 { qh & 0x0F } else { qh >> 4 };
            let index = usize::from(b[4 * ib + l]) | (usize::from(nibble & 7) << 8);
            let delta = if nibble & 0x08 != 0 { -IQ1S_DELTA } else { IQ1S_DELTA };
            let grid = IQ1S_GRID[index].to_le_bytes();
            for j in 0..8 {
                y[32 * ib + 8 * l + j] = dl[l / 2] * (f32::from(grid[j] as i8) + delta);
            }
        }
    }
}

/// IQ4_NL: `block_iq4_nl` (18 bytes, 32 values) = `d: f16`, `qs: [u8;
/// 16]` (nibbles as Q4_0) indexing `kvalues_iq4nl`; each value `d·k`.
fn iq4_nl(b: &[u8; 18], y: &mut [f32; 32]) {
    let d = f16(b[0], b[1]);
    for j in 0..16 {
        let q = b[2 + j];
        y[j] = d * f32::from(KVALUES_IQ4NL[usize::from(q & 0x0F)]);
        y[j + 16] = d * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
    }
}

/// IQ4_XS: `block_iq4_xs` (136 bytes, 256 values) = `d: f16`, `scales_h:
/// u16` (2 high bits per 32 values), `scales_l: [u8; 4]` (a low nibble per
/// 32 values), `qs: [u8; 128]` (per 32 values 16 bytes, nibbles as Q4_0,
/// indexing `kvalues_iq4nl`): value = `(d·(s − 32))·k`.
fn iq4_xs(b: &[u8; 136], y: &mut [f32; 256]) {
    let d = f16(b[0], b[1]);
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    for ib in 0..8 {
        let low = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0x0F;
        let high = ((scales_h >> (2 * ib)) & 3) as u8;
        let dl = d * f32::from(i16::from(low | (high << 4)) - 32);
        for j in 0..16 {
            let q = b[8 + 16 * ib + j];
            y[32 * ib + j] = dl * f32::from(KVALUES_IQ4NL[usize::from(q & 0x0F)]);
            y[32 * ib + j + 16] = dl * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
        }
    }
}

/// One TQ1_0 trit: the top base-3 digit of `q · 3^n` read as a fraction
/// of 256, minus 1 (ggml's `((uint16_t) q * 3) >> 8`).
fn trit(byte: u8, pow3: u8) -> f32 {
    let q = byte.wrapping_mul(pow3);
    ((u16::from(q) * 3) >> 8) as f32 - 1.0
}

/// TQ1_0: `block_tq1_0` (54 bytes, 256 values) = `qs: [u8; 48]` (5 trits
/// a byte), `qh: [u8; 4]` (4 trits a byte), `d: f16`. Trit n of byte m
/// is value `32n + m` for bytes 0–31, `160 + 16n + (m − 32)` for bytes
/// 32–47, and `240 + 4n + j` for `qh[j]`; each value `(t − 1)·d`.
fn tq1_0(b: &[u8; 54], y: &mut [f32; 256]) {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    let d = f16(b[52], b[53]);
    for (n, &p) in POW3.iter().enumerate() {
        for m in 0..32 {
            y[32 * n + m] = trit(b[m], p) * d;
        }
        for m in 0..16 {
            y[160 + 16 * n + m] = trit(b[32 + m], p) * d;
        }
    }
    for (n, &p) in POW3[..4].iter().enumerate() {
        for j in 0..4 {
            y[240 + 4 * n + j] = trit(b[48 + j], p) * d;
        }
    }
}

/// TQ2_0: `block_tq2_0` (66 bytes, 256 values) = `qs: [u8; 64]` (2 bits a
/// value), `d: f16`. Value `128h + 32l + m` is bits `2l..2l+2` of
/// `qs[32h + m]`, as `(q − 1)·d`.
fn tq2_0(b: &[u8; 66], y: &mut [f32; 256]) {
    let d = f16(b[64], b[65]);
    for h in 0..2 {
        for l in 0..4 {
            for m in 0..32 {
                let q = (b[32 * h + m] >> (2 * l)) & 3;
                y[128 * h + 32 * l + m] = (f32::from(q) - 1.0) * d;
            }
        }
    }
}

/// A UE4M3 scale byte (4 exponent bits, bias 7, 3 mantissa bits; bit 7
/// ignored), halved to match the doubled E2M1 values (ggml's
/// `ggml_ue4m3_to_fp32`); 0x00 and 0x7f (the NaN code) are 0. A `const fn`
/// so the NVFP4 kernels' table is this function's values.
pub(crate) const fn ue4m3_half(x: u8) -> f32 {
    if x == 0 || x == 0x7F {
        return 0.0;
    }
    let exp = ((x >> 3) & 0x0F) as i32;
    let man = (x & 0x07) as f32;
    // Every value here is exact in f32, so these products are the numbers
    // ggml's `ldexpf` gives.
    let raw = if exp == 0 { man * pow2(-9) } else { (1.0 + man / 8.0) * pow2(exp - 7) };
    raw * 0.5
}

/// 2^k, for k in f32's normal range (here −9 to 8).
const fn pow2(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

/// NVFP4: `block_nvfp4` (36 bytes, 64 values) = `d: [u8; 4]` (a UE4M3
/// scale per 16 values), `qs: [u8; 32]` (8 bytes per 16 values: value j
/// in the low nibble of byte j, value j+8 in the high one, indexing
/// `kvalues_mxfp4`); each value `k·d`.
fn nvfp4(b: &[u8; 36], y: &mut [f32; 64]) {
    for s in 0..4 {
        let d = ue4m3_half(b[s]);
        for j in 0..8 {
            let q = b[4 + 8 * s + j];
            y[16 * s + j] = f32::from(KVALUES_MXFP4[usize::from(q & 0x0F)]) * d;
            y[16 * s + j + 8] = f32::from(KVALUES_MXFP4[usize::from(q >> 4)]) * d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The types ggml (or, for F64, numpy) has a to-float for: all of them
    /// but the integer types and Q8_1.
    const SUPPORTED: [GgmlType; 29] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ3_XXS,
        GgmlType::IQ1_S,
        GgmlType::IQ4_NL,
        GgmlType::IQ3_S,
        GgmlType::IQ2_S,
        GgmlType::IQ4_XS,
        GgmlType::F64,
        GgmlType::IQ1_M,
        GgmlType::BF16,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
        GgmlType::NVFP4,
        GgmlType::Q1_0,
    ];

    fn fixture(ty: GgmlType, ext: &str) -> Vec<u8> {
        let path = format!("{}/testdata/dequant/{}.{ext}", env!("CARGO_MANIFEST_DIR"), ty.name());
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e} (run scripts/make-dequant-fixtures.py)"))
    }

    #[test]
    fn supports_every_type_but_the_integers_and_q8_1() {
        let supported: Vec<GgmlType> = GgmlType::all().filter(|&t| can_dequantize(t)).collect();
        let mut expected = SUPPORTED.to_vec();
        expected.sort();
        assert_eq!(supported, expected);
    }

    #[test]
    fn each_block_decoder_has_its_types_block_size_and_value_count() {
        for ty in SUPPORTED {
            for n in [0, 1, 3] {
                let values = dequantize(ty, &vec![0u8; n * ty.block_bytes()]).expect("whole blocks");
                assert_eq!(values.len(), n * ty.block_values(), "{ty}, {n} blocks");
            }
        }
    }

    #[test]
    fn matches_gguf_py_bit_for_bit_on_every_supported_type() {
        let mut failures = Vec::new();
        for ty in SUPPORTED {
            let blocks = fixture(ty, "bin");
            let expected: Vec<u32> =
                fixture(ty, "f32").chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            assert!(blocks.len() >= 2 * ty.block_bytes(), "{ty}: fixture has at least two blocks");
            let got = match dequantize(ty, &blocks) {
                Ok(v) => v,
                Err(e) => {
                    failures.push(format!("{ty}: {e}"));
                    continue;
                }
            };
            if got.len() != expected.len() {
                failures.push(format!("{ty}: {} values, expected {}", got.len(), expected.len()));
                continue;
            }
            let wrong: Vec<usize> = (0..got.len()).filter(|&i| got[i].to_bits() != expected[i]).collect();
            if let Some(&i) = wrong.first() {
                failures.push(format!(
                    "{ty}: {} of {} values differ; first at {i}: {:e} ({:#010x}), expected {:e} ({:#010x})",
                    wrong.len(),
                    got.len(),
                    got[i],
                    got[i].to_bits(),
                    f32::from_bits(expected[i]),
                    expected[i],
                ));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn rejects_bytes_that_are_not_whole_blocks() {
        let ty = GgmlType::Q4_K;
        assert_eq!(dequantize(ty, &[0u8; 145]), Err(DequantError::Length { ty, bytes: 145, block: 144 }));
        assert!(matches!(dequantize(GgmlType::F16, &[0u8; 3]), Err(DequantError::Length { .. })));
        assert!(matches!(dequantize(GgmlType::NVFP4, &[0u8; 35]), Err(DequantError::Length { .. })));
        assert_eq!(
            DequantError::Length { ty, bytes: 145, block: 144 }.to_string(),
            "145 bytes are not whole Q4_K blocks (144 bytes each)"
        );
    }

    #[test]
    fn refuses_the_integer_types_and_q8_1() {
        for ty in [GgmlType::I8, GgmlType::I16, GgmlType::I32, GgmlType::I64, GgmlType::Q8_1] {
            assert_eq!(dequantize(ty, &vec![0u8; ty.block_bytes()]), Err(DequantError::Unsupported(ty)));
            assert!(!can_dequantize(ty));
        }
        assert_eq!(DequantError::Unsupported(GgmlType::I32).to_string(), "ggml type I32 cannot be dequantized");
    }

    #[test]
    fn empty_input_is_no_values() {
        assert_eq!(dequantize(GgmlType::IQ2_XXS, &[]), Ok(Vec::new()));
    }

    #[test]
    fn nvfp4_and_mxfp4_scales_decode_as_ggml_documents() {
        // UE4M3: 0x38 is exponent 7, mantissa 0: 1.0, halved.
        assert_eq!(ue4m3_half(0x38), 0.5);
        assert_eq!(ue4m3_half(0x7F), 0.0, "the NaN code is 0");
        assert_eq!(ue4m3_half(0x01), 2f32.powi(-10), "subnormal: 1·2^-9, halved");
        assert_eq!(ue4m3_half(0x7E), 448.0 / 2.0, "the largest finite");
        // E8M0 127 is 1.0, halved: a block of value-index 2 (E2M1 1.0, doubled) is 1.0.
        let mut block = [0x22u8; 17];
        block[0] = 127;
        assert_eq!(dequantize(GgmlType::MXFP4, &block), Ok(vec![1.0; 32]));
    }
}
