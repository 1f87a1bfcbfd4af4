use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::*;

/// Raw GGUF bytes of `rows × cols` values quantized by candle (a port of
/// ggml's quantizers), with the values they came from.
fn sample(dtype: GgmlDType, rows: usize, cols: usize, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let mut s = seed;
    // Rows of different magnitudes and a few large values, so scales and mins vary.
    let mut x = crate::model::synth::uniform(rows * cols, 2.0, &mut s);
    for (i, v) in x.iter_mut().enumerate() {
        *v *= 1.0 + (i / cols) as f32 * 0.37;
        if i % 97 == 0 {
            *v *= 6.0;
        }
    }
    let t = QTensor::quantize(&Tensor::from_vec(x.clone(), (rows, cols), &Device::Cpu).unwrap(), dtype).unwrap();
    (t.data().unwrap().into_owned(), x)
}

fn candle_dequantized(dtype: GgmlDType, raw: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    let t = candle_core::quantized::ggml_file::qtensor_from_ggml(dtype, raw, vec![rows, cols], &Device::Cpu).unwrap();
    t.dequantize(&Device::Cpu).unwrap().flatten_all().unwrap().to_vec1().unwrap()
}

const FORMATS: [GgmlDType; 5] = [GgmlDType::Q2K, GgmlDType::Q3K, GgmlDType::Q4K, GgmlDType::Q5K, GgmlDType::Q6K];

#[test]
fn dequantization_equals_ggmls_bit_for_bit() {
    let (rows, cols) = (6, 512);
    for dtype in FORMATS {
        let (raw, _) = sample(dtype, rows, cols, 3);
        let m = KQuantMatrix::from_gguf_bytes(dtype, &raw, rows, cols).unwrap().unwrap();
        let want = candle_dequantized(dtype, &raw, rows, cols);
        let mut row = vec![0f32; cols];
        for r in 0..rows {
            m.row_into(r, &mut row);
            let same = row.iter().zip(&want[r * cols..]).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{dtype:?} row {r} differs from ggml's dequantization");
        }
    }
}

#[test]
fn activations_round_half_to_even_as_ggmls_nearest_int() {
    // max = −1.0 → iscale 127: 0.5/127 rounds to 0, 1.5/127 to 2, 2.5/127 to 2.
    let mut x = vec![0f32; QK_K];
    x[0] = -1.0;
    x[1] = 0.5 / 127.0;
    x[2] = 1.5 / 127.0;
    x[3] = 2.5 / 127.0;
    let b = quantize_row_q8_k(&x).next().unwrap();
    assert_eq!(&b.qs[..4], &[-127, 0, 2, 2]);
    assert_eq!(b.d, 1.0 / 127.0, "the largest magnitude maps to −127, so d = −max / 127");
    assert_eq!(b.bsums[0], -123);
    let zero = quantize_row_q8_k(&[0f32; QK_K]).next().unwrap();
    assert!(zero.d == 0.0 && zero.qs.iter().all(|&q| q == 0) && zero.bsums.iter().all(|&s| s == 0));
}

/// Every kernel family this CPU runs (AVX2; VNNI's panels of four weight
/// rows and one, against full and padded groups of sixteen input rows, and
/// the 512-bit one-row kernel for decode) equals the scalar
/// kernel bit for bit, whatever the batch; all approximate the dot of the
/// dequantized weights with the activations.
#[test]
fn simd_equals_scalar_bit_for_bit_and_approximates_the_dequantized_product() {
    // Five blocks a row: four summed together by the one-row AVX2 kernel, one alone.
    let (rows, cols) = (21, 1280);
    let isas = [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni];
    let runnable: Vec<Isa> = isas.into_iter().filter(|&isa| super::super::at_most(isa) == isa).collect();
    eprintln!("K-quant kernels checked against scalar: {runnable:?}");
    for (dtype, isa) in FORMATS.into_iter().flat_map(|d| runnable.iter().map(move |&i| (d, i))) {
        let (raw, _) = sample(dtype, rows, cols, 9);
        let m = KQuantMatrix::from_gguf_bytes(dtype, &raw, rows, cols).unwrap().unwrap();
        let dq = candle_dequantized(dtype, &raw, rows, cols);
        let mut seed = 17u64;
        // 150 rows: several input chunks (at most 64 rows each), the last one
        // partial; 29 = a group of 16 and a padded one; 21 weight rows = five
        // panels of four and one row alone.
        for n in [1usize, 3, 4, 9, 29, 40, 150] {
            let x = crate::model::synth::uniform(n * cols, 3.0, &mut seed);
            let out = m.matmul_on(&x, n, isa);
            let xq: Vec<BlockQ8K> = x.chunks_exact(cols).flat_map(quantize_row_q8_k).collect();
            let per = cols / QK_K;
            for i in 0..n {
                let xr = &xq[i * per..(i + 1) * per];
                for j in 0..rows {
                    let scalar = match &m.0 {
                        Blocks::Q2K(w) => dot_scalar(&w.blocks[j * per..(j + 1) * per], xr),
                        Blocks::Q3K(w) => dot_scalar(&w.blocks[j * per..(j + 1) * per], xr),
                        Blocks::Q4K(w) => dot_scalar(&w.blocks[j * per..(j + 1) * per], xr),
                        Blocks::Q5K(w) => dot_scalar(&w.blocks[j * per..(j + 1) * per], xr),
                        Blocks::Q6K(w) => dot_scalar(&w.blocks[j * per..(j + 1) * per], xr),
                    };
                    let got = out[i * rows + j];
                    assert_eq!(got.to_bits(), scalar.to_bits(), "{dtype:?} {isa:?} ({i},{j}) {got} vs scalar {scalar}");
                    let exact: f32 = (0..cols).map(|k| x[i * cols + k] * dq[j * cols + k]).sum();
                    let scale: f32 = (0..cols).map(|k| (x[i * cols + k] * dq[j * cols + k]).abs()).sum();
                    assert!((got - exact).abs() <= 0.02 * scale, "{dtype:?} ({i},{j}) {got} vs {exact}");
                }
            }
        }
    }
}

/// Against candle's K-quant dot (llama.cpp's arithmetic in another lane
/// order): the same products to float rounding.
#[test]
fn the_product_agrees_with_candles_k_quant_matmul() {
    use candle_core::Module as _;
    let (rows, cols, n) = (33, 512, 5);
    for dtype in FORMATS {
        let (raw, _) = sample(dtype, rows, cols, 21);
        let m = KQuantMatrix::from_gguf_bytes(dtype, &raw, rows, cols).unwrap().unwrap();
        let t =
            candle_core::quantized::ggml_file::qtensor_from_ggml(dtype, &raw, vec![rows, cols], &Device::Cpu).unwrap();
        let mm = candle_core::quantized::QMatMul::from_qtensor(t).unwrap();
        let mut seed = 4u64;
        let x = crate::model::synth::uniform(n * cols, 2.0, &mut seed);
        let theirs: Vec<f32> = mm
            .forward(&Tensor::from_slice(&x, (n, cols), &Device::Cpu).unwrap())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        for (k, (a, b)) in m.matmul(&x, n).iter().zip(&theirs).enumerate() {
            assert!((a - b).abs() <= 2e-3 * b.abs().max(1.0), "{dtype:?} output {k}: {a} vs candle {b}");
        }
    }
}

#[test]
fn malformed_tensors_are_refused_with_the_format_named() {
    let e = KQuantMatrix::from_gguf_bytes(GgmlDType::Q4K, &[0u8; 144], 1, 128).unwrap().unwrap_err();
    assert_eq!(e.to_string(), "Q4_K row length 128 is not a positive multiple of 256");
    let e = KQuantMatrix::from_gguf_bytes(GgmlDType::Q6K, &[0u8; 209], 1, 256).unwrap().unwrap_err();
    assert_eq!(e.to_string(), "Q6_K tensor has 209 bytes, expected 210");
    assert!(KQuantMatrix::from_gguf_bytes(GgmlDType::Q5K, &[0u8; 176], usize::MAX, 512).unwrap().is_err());
    assert!(KQuantMatrix::from_gguf_bytes(GgmlDType::Q8_0, &[0u8; 34], 1, 32).is_none());
}

#[test]
fn the_resident_digest_covers_every_block() {
    use sha2::Digest as _;
    let (raw, _) = sample(GgmlDType::Q5K, 2, 256, 5);
    let digest = |raw: &[u8]| {
        let m = KQuantMatrix::from_gguf_bytes(GgmlDType::Q5K, raw, 2, 256).unwrap().unwrap();
        assert_eq!(m.resident_bytes(), 2 * std::mem::size_of::<BlockQ5K>());
        let mut h = sha2::Sha256::new();
        m.digest_into(&mut h);
        h.finalize()
    };
    let base = digest(&raw);
    for at in [0, 5, 20, 100, 175 + 176] {
        let mut changed = raw.clone();
        changed[at] ^= 0x10;
        assert_ne!(digest(&changed), base, "byte {at}");
    }
}

/// Stacked matrices (gate and up of one format) give each part's outputs
/// bit for bit; mixed formats are not stacked.
#[test]
fn stacking_keeps_every_output_and_refuses_mixed_formats() {
    let (cols, n) = (512, 3);
    let (a_raw, _) = sample(GgmlDType::Q4K, 7, cols, 1);
    let (b_raw, _) = sample(GgmlDType::Q4K, 5, cols, 2);
    let load = |raw: &[u8], rows| KQuantMatrix::from_gguf_bytes(GgmlDType::Q4K, raw, rows, cols).unwrap().unwrap();
    let mut seed = 8u64;
    let x = crate::model::synth::uniform(n * cols, 2.0, &mut seed);
    let (ya, yb) = (load(&a_raw, 7).matmul(&x, n), load(&b_raw, 5).matmul(&x, n));
    let both = KQuantMatrix::stack(vec![load(&a_raw, 7), load(&b_raw, 5)]).unwrap().unwrap();
    assert_eq!((both.rows(), both.cols()), (12, cols));
    let y = both.matmul(&x, n);
    for i in 0..n {
        assert_eq!(&y[i * 12..i * 12 + 7], &ya[i * 7..(i + 1) * 7], "row {i}, first part");
        assert_eq!(&y[i * 12 + 7..(i + 1) * 12], &yb[i * 5..(i + 1) * 5], "row {i}, second part");
    }
    let (c_raw, _) = sample(GgmlDType::Q6K, 5, cols, 3);
    let q6 = KQuantMatrix::from_gguf_bytes(GgmlDType::Q6K, &c_raw, 5, cols).unwrap().unwrap();
    assert!(KQuantMatrix::stack(vec![load(&a_raw, 7), q6]).is_none());
}

/// The kernels' blocks dequantize as gguf-py does (`testdata/dequant`),
/// bit for bit, for every K-quant.
#[test]
fn dequantization_equals_gguf_py_bit_for_bit() {
    for (dtype, name) in FORMATS.into_iter().zip(["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]) {
        let (raw, want) = crate::model::kernels::expanded::tests::gguf_py_fixture(name);
        let cols = want.len();
        let m = KQuantMatrix::from_gguf_bytes(dtype, &raw, 1, cols).unwrap().unwrap();
        assert_eq!(m.format(), name);
        let mut row = vec![0f32; cols];
        m.row_into(0, &mut row);
        for (i, (g, w)) in row.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{name} value {i}: {g} vs gguf-py {w}");
        }
    }
}
