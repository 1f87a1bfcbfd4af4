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

/// The Q4_1 VNNI kernels are the AVX2 kernels' arithmetic with one
/// instruction instead of two for the integer products: every output
/// equal bit for bit, one row and four rows at a time; the Q8_0 VNNI path
/// (groups of sixteen interleaved input rows, and single rows) is the
/// scalar kernel's arithmetic: every output equal to it bit for bit, in
/// full and padded groups, including the extremes (Q4 nibbles 15, Q8 values
/// ±127 and the weights' −128).
#[test]
#[cfg(target_arch = "x86_64")]
fn vnni_kernels_equal_their_references_bit_for_bit() {
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
    let mut x = input(4, cols);
    x[..cols].iter_mut().enumerate().for_each(|(k, v)| *v = if k % 2 == 0 { 8.0 } else { -8.0 });
    let xq41: Vec<BlockQ81> = x.chunks_exact(cols).flat_map(quantize_row_q8_1).collect();
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
    // Nine blocks a row: two runs of four and one alone in the single-row
    // kernel; 27 weight rows: decode's tasks of 16 rows, the last one short.
    let (rows, cols, per) = (27, 288, 9);
    let mut extreme_q80 = q80_sample(rows, cols, 5);
    for b in extreme_q80.chunks_exact_mut(Q8_0_BLOCK_BYTES).step_by(2) {
        b[2..].fill(0x80);
    }
    // 150 input rows: tiles of up to 64 rows starting past the first, the
    // last group padded; 29: one group and a padded one; 5 rows: a padded
    // group, on the few-rows path; 1 row: decode. 27 weight rows: panels of
    // four and three rows alone.
    for m in [150, 29, 5, 1] {
        let mut x = input(m, cols);
        x[..cols].iter_mut().enumerate().for_each(|(k, v)| *v = if k % 2 == 0 { 8.0 } else { -8.0 });
        let xq: Vec<BlockQ80> = x.chunks_exact(cols).flat_map(quantize_row_q8_0).collect();
        for raw in [q80_sample(rows, cols, 13), extreme_q80.clone()] {
            let w = Q80Matrix::from_gguf_bytes(&raw, rows, cols).unwrap();
            let got = q80_matmul_vnni(&w.blocks, rows, per, &xq, m);
            for i in 0..m {
                for j in 0..rows {
                    let want = q80_dot_scalar(&w.blocks[j * per..(j + 1) * per], &xq[i * per..(i + 1) * per]);
                    assert_eq!(got[i * rows + j].to_bits(), want.to_bits(), "Q8_0 m={m} input {i} row {j}");
                }
            }
        }
    }
}

/// Every Q8_0 kernel this CPU runs approximates the dequantized product;
/// the scalar and VNNI kernels agree bit for bit and the AVX2 kernels
/// (their own float order) within rounding, for every input-row count the
/// matmul splits differently (decode; four-row passes and leftovers;
/// groups of sixteen and eight), on rows whose block count leaves a
/// remainder after each run of four.
#[test]
fn q80_kernels_on_every_isa_equal_scalar_and_rows_dequantize() {
    let (rows, cols) = (33, 224);
    let per = cols / BLOCK;
    let w = Q80Matrix::from_gguf_bytes(&q80_sample(rows, cols, 7), rows, cols).unwrap();
    let runnable: Vec<Isa> =
        [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni].into_iter().filter(|&isa| at_most(isa) == isa).collect();
    let mut row = vec![0f32; cols];
    for m in [1, 3, 6, 29, 40] {
        let x = input(m, cols);
        let xq: Vec<BlockQ80> = x.chunks_exact(cols).flat_map(quantize_row_q8_0).collect();
        for &isa in &runnable {
            let out = w.matmul_on(&x, m, isa);
            for j in 0..rows {
                w.row_into(j, &mut row);
                for i in 0..m {
                    let got = out[i * rows + j];
                    let scalar = q80_dot_scalar(&w.blocks[j * per..(j + 1) * per], &xq[i * per..(i + 1) * per]);
                    if isa == Isa::Avx2 {
                        assert!(close(got, scalar, 1e-4), "AVX2 m={m} ({i},{j}): {got} vs scalar {scalar}");
                    } else {
                        assert_eq!(
                            got.to_bits(),
                            scalar.to_bits(),
                            "{} m={m} ({i},{j}): {got} vs {scalar}",
                            isa.name()
                        );
                    }
                    let exact: f32 = (0..cols).map(|k| x[i * cols + k] * row[k]).sum();
                    assert!(close(got, exact, 0.05), "({i},{j}) {got} vs {exact}");
                }
            }
        }
    }
}

/// [`sum4`] is four partial sums by block index, added pairwise: not
/// the sum in block order (these terms round differently in the two).
#[test]
fn the_q80_float_steps_are_four_partial_sums() {
    let terms = [1.0f32, 1e8, 1.0, -1e8, 1.0, 0.5, 3.0];
    let s = [1.0f32 + 1.0, 1e8 + 0.5, 1.0 + 3.0, -1e8];
    assert_eq!(sum4(terms.into_iter()).to_bits(), ((s[0] + s[2]) + (s[1] + s[3])).to_bits());
    let in_order: f32 = terms.iter().sum();
    assert_ne!(sum4(terms.into_iter()), in_order);
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

#[test]
fn veil_kernels_names_parse_and_others_do_not() {
    for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni] {
        assert_eq!(parse_isa(isa.name()), Some(isa));
    }
    for other in ["", "AVX2", "avx512", "vnni", "avx2 "] {
        assert_eq!(parse_isa(other), None, "{other:?}");
    }
}
