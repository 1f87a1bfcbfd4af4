use super::*;
use crate::model::kernels::{at_most, Isa};

/// gguf-py's blocks and values for `name` (`scripts/make-dequant-fixtures.py`).
pub(crate) fn gguf_py_fixture(name: &str) -> (Vec<u8>, Vec<f32>) {
    let path = |ext: &str| format!("{}/testdata/dequant/{name}.{ext}", env!("CARGO_MANIFEST_DIR"));
    let read = |ext: &str| std::fs::read(path(ext)).unwrap_or_else(|e| panic!("{}: {e}", path(ext)));
    let values = read("f32").chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    (read("bin"), values)
}

type Load = fn(&[u8], usize, usize) -> Result<ExpandedMatrix, KernelError>;

/// Each format's loader, block bytes and weights per block.
const FORMATS: [(&str, Load, usize, usize); 14] = [
    ("MXFP4", ExpandedMatrix::from_mxfp4_bytes, 17, 32),
    ("IQ4_NL", ExpandedMatrix::from_iq4_nl_bytes, IQ4_NL_BLOCK_BYTES, 32),
    ("IQ4_XS", ExpandedMatrix::from_iq4_xs_bytes, IQ4_XS_BLOCK_BYTES, 256),
    ("Q5_0", ExpandedMatrix::from_q5_0_bytes, Q5_0_BLOCK_BYTES, 32),
    ("IQ2_XXS", ExpandedMatrix::from_iq2_xxs_bytes, grid::IQ2_XXS_BLOCK_BYTES, 256),
    ("IQ2_XS", ExpandedMatrix::from_iq2_xs_bytes, grid::IQ2_XS_BLOCK_BYTES, 256),
    ("IQ3_XXS", ExpandedMatrix::from_iq3_xxs_bytes, grid::IQ3_XXS_BLOCK_BYTES, 256),
    ("IQ3_S", ExpandedMatrix::from_iq3_s_bytes, grid::IQ3_S_BLOCK_BYTES, 256),
    ("IQ2_S", ExpandedMatrix::from_iq2_s_bytes, grid::IQ2_S_BLOCK_BYTES, 256),
    ("IQ1_S", ExpandedMatrix::from_iq1_s_bytes, grid::IQ1_S_BLOCK_BYTES, 256),
    ("IQ1_M", ExpandedMatrix::from_iq1_m_bytes, grid::IQ1_M_BLOCK_BYTES, 256),
    ("TQ1_0", ExpandedMatrix::from_tq1_0_bytes, grid::TQ1_0_BLOCK_BYTES, 256),
    ("TQ2_0", ExpandedMatrix::from_tq2_0_bytes, grid::TQ2_0_BLOCK_BYTES, 256),
    ("NVFP4", ExpandedMatrix::from_nvfp4_bytes, NVFP4_BLOCK_BYTES, 64),
];

/// Random blocks whose scales are finite f16 values near 0.01 (random
/// bytes elsewhere: every code is valid).
fn random_blocks(name: &str, n: usize, block_bytes: usize, seed: &mut u64) -> Vec<u8> {
    let mut next = || {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    };
    let mut raw: Vec<u8> = (0..n * block_bytes).map(|_| next() as u8).collect();
    for b in raw.chunks_exact_mut(block_bytes) {
        let d = half::f16::from_f32(0.004 + f32::from(b[0]) / 25_000.0).to_bits();
        match name {
            "MXFP4" => b[0] = 118 + (b[0] % 8),
            "TQ1_0" => b[52..54].copy_from_slice(&d.to_le_bytes()),
            "TQ2_0" => b[64..66].copy_from_slice(&d.to_le_bytes()),
            // Four UE4M3 scales from 2^-7 to 2^-4 (exponents 4 to 7), each its own.
            "NVFP4" => b[..4].iter_mut().for_each(|s| *s = 0x20 + *s % 0x20),
            // The f16 scale is the top nibbles of the four u16 scale words.
            "IQ1_M" => {
                for k in 0..4 {
                    b[49 + 2 * k] = (b[49 + 2 * k] & 0x0F) | (((d >> (4 * k)) as u8 & 0x0F) << 4);
                }
            }
            _ => b[..2].copy_from_slice(&d.to_le_bytes()),
        }
    }
    raw
}

#[test]
fn dequantization_equals_gguf_py_bit_for_bit() {
    for (name, load, block_bytes, per_block) in FORMATS {
        let (raw, want) = gguf_py_fixture(name);
        let n = raw.len() / block_bytes;
        let m = load(&raw, 1, n * per_block).unwrap();
        assert_eq!(m.format(), name);
        let mut row = vec![0f32; n * per_block];
        m.row_into(0, &mut row);
        for (i, (g, w)) in row.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{name} value {i}: {g} vs gguf-py {w}");
        }
    }
}

/// Every kernel this CPU runs (scalar, AVX2, and VNNI where present)
/// equals the Q8_0 kernels on the blocks expanded at load, bit for bit,
/// for every batch size the matmul splits differently; and approximates
/// the dot of the dequantized weights. IQ2_XS, IQ2_S and IQ1_M, whose
/// blocks carry a multiplier per half and so are not Q8_0 blocks, are held to the scalar
/// kernel (the same integer per half; sums in another order) and the
/// dequantized dot.
#[test]
fn kernels_equal_the_blocks_expanded_to_q8_0_bit_for_bit() {
    let runnable: Vec<Isa> =
        [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni].into_iter().filter(|&isa| at_most(isa) == isa).collect();
    eprintln!("expanded kernels checked: {runnable:?}");
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for (name, load, block_bytes, per_block) in FORMATS {
        let (rows, cols) = (37, 512);
        let raw = random_blocks(name, rows * cols / per_block, block_bytes, &mut seed);
        let native = load(&raw, rows, cols).unwrap();
        let mut dq = vec![0f32; rows * cols];
        for (r, out) in dq.chunks_exact_mut(cols).enumerate() {
            native.row_into(r, out);
        }
        let halved = native.halved();
        let expanded = (!halved).then(|| each!(native, m => m.to_q80()));
        for n in [1usize, 3, 4, 9, 40] {
            let mut s = seed ^ n as u64;
            let x = crate::model::synth::uniform(n * cols, 3.0, &mut s);
            let scalar = native.matmul_on(&x, n, Isa::Scalar);
            // Per output: the dot of the dequantized weights, and the sum of
            // its products' magnitudes (what float rounding scales with).
            let (exact, magnitude): (Vec<f32>, Vec<f32>) = (0..n * rows)
                .map(|k| {
                    let (i, r) = (k / rows, k % rows);
                    let (xr, wr) = (&x[i * cols..(i + 1) * cols], &dq[r * cols..(r + 1) * cols]);
                    let exact: f32 = xr.iter().zip(wr).map(|(a, b)| a * b).sum();
                    (exact, xr.iter().zip(wr).map(|(a, b)| (a * b).abs()).sum::<f32>())
                })
                .unzip();
            for &isa in &runnable {
                let got = native.matmul_on(&x, n, isa);
                match &expanded {
                    Some(q80) => assert_eq!(got, q80.matmul_on(&x, n, isa), "{name} {} {n} rows", isa.name()),
                    None => {
                        for (i, (g, s)) in got.iter().zip(&scalar).enumerate() {
                            assert!(
                                (g - s).abs() <= 1e-6 * magnitude[i].max(1.0),
                                "{name} {} [{i}]: {g} vs {s}",
                                isa.name()
                            );
                        }
                    }
                }
                for (k, g) in got.iter().enumerate() {
                    assert!((g - exact[k]).abs() <= 0.02 * magnitude[k], "{name} [{k}]: {g} vs {}", exact[k]);
                }
            }
        }
    }
}

#[test]
fn the_resident_digest_covers_every_byte_that_matters() {
    use sha2::Digest as _;
    let mut seed = 3u64;
    for (name, load, block_bytes, per_block) in FORMATS {
        let raw = random_blocks(name, 2 * 256 / per_block, block_bytes, &mut seed);
        let digest = |raw: &[u8]| {
            let mut h = sha2::Sha256::new();
            load(raw, 2, 256).unwrap().digest_into(&mut h);
            h.finalize()
        };
        let base = digest(&raw);
        for at in [2, 7, block_bytes - 1, raw.len() - 1] {
            let mut changed = raw.clone();
            changed[at] ^= 0x10;
            assert_ne!(digest(&changed), base, "{name} byte {at}");
        }
    }
}

#[test]
fn malformed_tensors_are_refused_with_the_format_named() {
    let e = ExpandedMatrix::from_iq4_nl_bytes(&[0u8; 17], 1, 32).unwrap_err();
    assert_eq!(e.to_string(), "IQ4_NL tensor has 17 bytes, expected 18");
    let e = ExpandedMatrix::from_iq4_xs_bytes(&[0u8; 136], 1, 128).unwrap_err();
    assert_eq!(e.to_string(), "IQ4_XS row length 128 is not a positive multiple of 256");
    let e = ExpandedMatrix::from_iq4_xs_bytes(&[0u8; 135], 1, 256).unwrap_err();
    assert_eq!(e.to_string(), "IQ4_XS tensor has 135 bytes, expected 136");
    assert!(ExpandedMatrix::from_iq4_xs_bytes(&[0u8; 136], usize::MAX, 256).is_err());
    let e = ExpandedMatrix::from_q5_0_bytes(&[0u8; 22], 1, 16).unwrap_err();
    assert_eq!(e.to_string(), "Q5_0 row length 16 is not a positive multiple of 32");
    assert!(ExpandedMatrix::from_mxfp4_bytes(&[0u8; 33], 1, 64).is_err());
}
