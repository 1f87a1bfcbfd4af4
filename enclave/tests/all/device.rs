//! The device path (candle's tensor ops, what a CUDA GPU runs) checked on
//! the CPU against Veil's fused kernels, with the reference model: the same
//! manifest, logits within a stated tolerance, greedy tokens equal except at
//! near-ties, and exact equality among the device path's own
//! configurations (split vs whole, batched vs alone, rollback vs never
//! having gone further), which is what the GPU must show too.

use veil_enclave::generate::{LocalModel, DEFAULT_KV_BUDGET_BYTES};
use veil_enclave::model::reference::NEAR_TIE;
use veil_enclave::model::{BatchItem, ComputeDevice, GgufFile, LayerSlice, Logits, Rows, SliceOutput};
use veil_enclave::text::sampler::argmax;

use crate::cluster::model_path;

/// Largest |logit difference| from llama.cpp on its first-position top 5
/// (the fused kernels are held to 0.5 and measure 0.46; the device path
/// measures 0.53: candle's kernels round in other places).
const TOP5_TOLERANCE: f32 = 0.75;
/// Largest |logit difference| anywhere in the vocabulary between the device
/// path and the fused kernels (measured 1.9 over the fixtures; a wrong layer,
/// mask or rotation moves logits by far more and flips non-tie tokens).
const VOCAB_TOLERANCE: f32 = 2.5;
/// Share of teacher-forced tokens that must equal the reference's (the
/// fused path agrees with llama.cpp on 97.4%, the device path on 96.6%;
/// every difference must also sit at a near-tie, checked separately).
const MIN_AGREEMENT: f64 = 0.95;

fn load(path: &std::path::Path, cuts: &[usize], devices: &[ComputeDevice]) -> LocalModel {
    LocalModel::from_gguf_on(&mut GgufFile::open(path).unwrap(), cuts, devices).unwrap().0
}

fn rows(r: &Rows) -> Vec<Vec<f32>> {
    (0..r.n()).map(|i| r.row(i).to_vec()).collect()
}

const PROMPT: [u32; 12] = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 30, 2, 198];

#[test]
fn the_device_path_agrees_with_llamacpp_and_the_fused_kernels() {
    let Some(path) = model_path() else { return };
    let fused = load(&path, &[], &[]);
    let device = load(&path, &[], &[ComputeDevice::CandleCpu]);
    assert_eq!(device.slices()[0].device(), ComputeDevice::CandleCpu);
    // The same tensors, read in the same order: the same manifest root.
    assert_eq!(fused.slices()[0].manifest().root(), device.slices()[0].manifest().root());
    // The resident digest covers what each path holds (decoded blocks vs
    // candle's quantized tensors), so it differs between them; it is stable.
    let resident = device.slices()[0].resident_digest().unwrap();
    assert_eq!(resident, device.slices()[0].resident_digest().unwrap());

    // Teacher-forced over llama.cpp's greedy continuations (the fixtures the
    // fused path is held to): agreement with llama.cpp's tokens, logits of
    // its first-position top 5, and agreement with the fused kernels.
    let fixtures = veil_enclave::model::reference::llamacpp().unwrap();
    assert!(!fixtures.cases.is_empty());
    let (mut agree, mut with_fused, mut total) = (0usize, 0usize, 0usize);
    let (mut vs_llamacpp, mut vs_fused) = (0f32, 0f32);
    for c in fixtures.cases {
        let mut seq = c.prompt_ids.clone();
        seq.extend_from_slice(&c.greedy_ids[..c.greedy_ids.len() - 1]);
        let d = rows(&device.step(&mut device.session(DEFAULT_KV_BUDGET_BYTES), &seq).unwrap());
        let f = rows(&fused.step(&mut fused.session(DEFAULT_KV_BUDGET_BYTES), &seq).unwrap());
        let p = c.prompt_ids.len();
        for (t, &want) in c.greedy_ids.iter().enumerate() {
            let (got, fu) = (argmax(&d[p - 1 + t]), argmax(&f[p - 1 + t]));
            total += 1;
            agree += usize::from(got == want);
            with_fused += usize::from(got == fu);
            assert!(
                got == want || c.top2_gaps[t] < NEAR_TIE,
                "a non-tie differs from llama.cpp: gap {}",
                c.top2_gaps[t]
            );
        }
        for &(id, logit) in &c.first_top5 {
            vs_llamacpp = vs_llamacpp.max((d[p - 1][id as usize] - logit).abs());
        }
        for (x, y) in d.iter().zip(&f) {
            vs_fused = x.iter().zip(y).fold(vs_fused, |m, (a, b)| m.max((a - b).abs()));
        }
    }
    println!(
        "device path: teacher-forced agreement with llama.cpp {agree}/{total}, with the fused kernels \
         {with_fused}/{total}; first-position top-5 max |logit diff| vs llama.cpp {vs_llamacpp:.3}; \
         max |logit diff| vs fused over every position {vs_fused:.3}"
    );
    assert!(agree as f64 / total as f64 >= MIN_AGREEMENT, "agreement with llama.cpp {agree}/{total}");
    assert!(with_fused as f64 / total as f64 >= MIN_AGREEMENT, "agreement with the fused kernels {with_fused}/{total}");
    assert!(vs_llamacpp < TOP5_TOLERANCE, "first-position logits differ from llama.cpp by {vs_llamacpp}");
    assert!(vs_fused < VOCAB_TOLERANCE, "logits differ from the fused kernels by {vs_fused}");
}

#[test]
fn the_device_path_split_batched_and_rolled_back_equals_itself_exactly() {
    let Some(path) = model_path() else { return };
    let dev = ComputeDevice::CandleCpu;
    let whole = load(&path, &[], &[dev]);
    // Three slices, the middle one on the device, the others on the fused kernels
    // (a cluster with one GPU shard): hidden states cross at the boundaries.
    let mixed = load(&path, &[10, 20], &[ComputeDevice::Cpu, dev, ComputeDevice::Cpu]);
    let split = load(&path, &[10, 20], &[dev, dev, dev]);
    let (mut w, mut s, mut x) = (
        whole.session(DEFAULT_KV_BUDGET_BYTES),
        split.session(DEFAULT_KV_BUDGET_BYTES),
        mixed.session(DEFAULT_KV_BUDGET_BYTES),
    );
    let lw = rows(&whole.step(&mut w, &PROMPT).unwrap());
    assert_eq!(lw, rows(&split.step(&mut s, &PROMPT).unwrap()), "split device slices differ from the whole");
    let lx = rows(&mixed.step(&mut x, &PROMPT).unwrap());
    let worst = lw.iter().flatten().zip(lx.iter().flatten()).fold(0f32, |m, (p, q)| m.max((p - q).abs()));
    assert!(worst < VOCAB_TOLERANCE, "a CPU–device–CPU cluster differs by {worst}");
    assert!(lw.iter().zip(&lx).all(|(a, b)| argmax(a) == argmax(b)), "a CPU–device–CPU cluster picks other tokens");
    for next in [42u32, 7, 1000] {
        assert_eq!(rows(&whole.step(&mut w, &[next]).unwrap()), rows(&split.step(&mut s, &[next]).unwrap()));
    }

    // Rollback: go three tokens further, truncate, and continue: equals never having gone further.
    let slice = &whole.slices()[0];
    let mut kv = slice.new_session(DEFAULT_KV_BUDGET_BYTES);
    let logits = |kv: &mut veil_enclave::model::SessionKv, ids: &[u32], start: usize| match slice
        .forward(slice.embed(ids).unwrap(), kv, start, Logits::All)
        .unwrap()
    {
        SliceOutput::Logits(r) => r,
        other => panic!("{other:?}"),
    };
    logits(&mut kv, &PROMPT, 0);
    logits(&mut kv, &[5, 6, 7], PROMPT.len());
    kv.truncate(PROMPT.len()).unwrap();
    let after_rollback = logits(&mut kv, &[42], PROMPT.len());
    let mut fresh = slice.new_session(DEFAULT_KV_BUDGET_BYTES);
    logits(&mut fresh, &PROMPT, 0);
    assert_eq!(after_rollback, logits(&mut fresh, &[42], PROMPT.len()), "rollback left a trace");

    // A batch of two sessions at different positions equals each alone.
    let other: Vec<u32> = vec![1, 504, 3458, 282];
    let (mut k1, mut k2) = (slice.new_session(DEFAULT_KV_BUDGET_BYTES), slice.new_session(DEFAULT_KV_BUDGET_BYTES));
    let alone1 = logits(&mut k1, &PROMPT, 0);
    let alone2 = logits(&mut k2, &other, 0);
    let (mut b1, mut b2) = (slice.new_session(DEFAULT_KV_BUDGET_BYTES), slice.new_session(DEFAULT_KV_BUDGET_BYTES));
    let out = slice
        .forward_batch(&mut [
            BatchItem { hidden: slice.embed(&PROMPT).unwrap(), kv: &mut b1, start: 0, logits: Logits::All },
            BatchItem { hidden: slice.embed(&other).unwrap(), kv: &mut b2, start: 0, logits: Logits::All },
        ])
        .unwrap();
    assert_eq!(out, vec![SliceOutput::Logits(alone1), SliceOutput::Logits(alone2)], "batching changed a session");
}

#[test]
fn caches_do_not_cross_between_host_and_device_slices() {
    let Some(path) = model_path() else { return };
    let mut gguf = GgufFile::open(&path).unwrap();
    let host = LayerSlice::from_gguf_on(&mut gguf, 0..2, ComputeDevice::Cpu).unwrap();
    let dev = LayerSlice::from_gguf_on(&mut gguf, 0..2, ComputeDevice::CandleCpu).unwrap();
    let mut host_kv = host.new_session(DEFAULT_KV_BUDGET_BYTES);
    let err = dev.forward(dev.embed(&[1, 2]).unwrap(), &mut host_kv, 0, Logits::None).unwrap_err();
    assert!(err.to_string().contains("another slice"), "{err}");
    assert_eq!(host_kv.len(), 0);
}
