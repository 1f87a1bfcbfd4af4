//! Model families and quantisations against llama.cpp on the same file.
//!
//! Each case is a random-weight model written by `synth::write_with` with a
//! real vocabulary from llama.cpp's reference files; llama.cpp's answers on
//! that very file (checked by SHA-256) are in `testdata/family_fixtures.json`
//! (`scripts/reference/gen_family_fixtures.py`). Without the reference
//! files these tests print SKIP, unless `VEIL_REQUIRE_LLAMACPP_REF=1`.

use std::path::{Path, PathBuf};

use sha2::Digest as _;
use veil_enclave::model::gguf::TensorType;
use veil_enclave::model::synth::{write_with, Options, Shape};
use veil_enclave::model::{BatchItem, ComputeDevice, GgufFile, LayerSlice, Logits, ModelError, Rows, SliceOutput};
use veil_enclave::text::sampler::argmax;

/// Below this llama.cpp top-2 gap another engine may pick the runner-up.
const NEAR_TIE: f32 = 0.5;
/// Teacher-forced logits of llama.cpp's top 5 at every position agree within
/// this fraction of the largest |logit| at that position. Both engines
/// quantise activations to 8 bits before each quantised matmul; llama.cpp
/// also rounds the query and the attention probabilities to f16 for its
/// products with the f16 cache, which Veil does not (measured: 0.7–3.5% of
/// scale over these cases; with that rounding added, the first positions
/// of qwen3moe-q8_0 came out bit-equal, but the reference model's own
/// llama.cpp agreement fell, so it is not done yet).
const LOGIT_TOLERANCE: f32 = 0.04;
/// A mixture of experts routes discontinuously: where a position's k-th
/// and (k+1)-th router logits are closer than the two engines' rounding
/// differences, each may choose a different expert there. One such position
/// per case may differ by up to this much (measured: gpt-oss-mxfp4 at
/// prompt position 11 differs by 10.6% of scale; its last layer's router
/// margin there is 0.18, and forcing Veil to take the other expert brings
/// that position to 0.3%). Any systematic error shows at many positions.
const ROUTING_OUTLIER: f32 = 0.16;
/// The device path (candle's ops on its CPU backend) against the fused CPU
/// path, as a fraction of the prompt's largest |logit|: candle's matmuls
/// and GELU round otherwise than Veil's kernels, and differently again on
/// AVX-512 CPUs, where its gemm takes other code (measured on an AMD Zen 4:
/// Gemma 3 4.6%, the other cases under 4%).
const DEVICE_TOLERANCE: f32 = 0.06;

#[derive(serde::Deserialize)]
struct Doc {
    cases: Vec<Case>,
}

#[derive(serde::Deserialize)]
struct Case {
    name: String,
    shape: String,
    dtype: String,
    vocab: String,
    sharpen: f32,
    seed: u64,
    layers: Option<usize>,
    #[serde(default)]
    rope_freqs: bool,
    sha256: String,
    prompt_ids: Vec<u32>,
    forced_top5: Vec<Vec<(u32, f32)>>,
    greedy_ids: Vec<u32>,
    top2_gaps: Vec<f32>,
}

pub(crate) fn vocab_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("VEIL_LLAMACPP_REF")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/llamacpp-reference"))
        .join("vocab");
    if dir.is_dir() {
        return Some(dir);
    }
    assert_ne!(
        std::env::var("VEIL_REQUIRE_LLAMACPP_REF").as_deref(),
        Ok("1"),
        "VEIL_REQUIRE_LLAMACPP_REF=1 but no llama.cpp vocabularies at {}",
        dir.display()
    );
    veil_tests::skip("llama.cpp reference vocabularies not found (set VEIL_LLAMACPP_REF)");
    None
}

/// Writes the case's model into `dir` and checks it is the file llama.cpp ran.
fn build(case: &Case, vocab: &Path, dir: &Path) -> PathBuf {
    let mut shape = Shape::named(&case.shape).unwrap();
    if let Some(n) = case.layers {
        shape.n_layer = n;
    }
    let path = dir.join(format!("{}.gguf", case.name));
    let opts = Options {
        dtype: veil_enclave::model::synth::dtype_named(&case.dtype).unwrap(),
        seed: case.seed,
        vocab_from: Some(vocab.join(&case.vocab)),
        sharpen: case.sharpen,
        rope_freqs: case.rope_freqs,
        files: 1,
        chat_template: None,
        specials: Vec::new(),
    };
    write_with(&path, shape, &opts).unwrap();
    let digest = hex::encode(sha2::Sha256::digest(std::fs::read(&path).unwrap()));
    assert_eq!(
        digest, case.sha256,
        "{}: the model written today is not the one llama.cpp answered on; rerun the fixture script",
        case.name
    );
    path
}

/// A fresh directory for one test's model files, removed when dropped.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("veil-families-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

fn fixtures() -> Doc {
    serde_json::from_str(include_str!("../../testdata/family_fixtures.json")).unwrap()
}

fn logits(out: SliceOutput) -> Rows {
    match out {
        SliceOutput::Logits(r) => r,
        other => panic!("expected logits, got {other:?}"),
    }
}

#[test]
fn every_family_and_quantisation_agrees_with_llama_cpp() {
    let Some(vocab) = vocab_dir() else { return };
    let tmp = TempDir::new("llamacpp");
    println!(
        "{:<16} {:>5} {:>12} {:>14} {:>10} {:>14} {:>10}",
        "case", "pos", "max |Δ|/max", "routing flips", "argmax eq", "greedy equal", "compared"
    );
    let cases = fixtures().cases;
    assert!(cases.len() >= 8, "the fixtures hold {} cases", cases.len());
    for case in cases {
        let path = build(&case, &vocab, tmp.path());
        let mut g = GgufFile::open(&path).unwrap();
        let n_layer = veil_enclave::model::Config::from_gguf(&g).unwrap().n_layer;
        let slice = LayerSlice::from_gguf(&mut g, 0..n_layer).unwrap();
        // Teacher-forced over the prompt.
        let mut kv = slice.new_session(1 << 28);
        let out = logits(slice.forward(slice.embed(&case.prompt_ids).unwrap(), &mut kv, 0, Logits::All).unwrap());
        let (mut worst, mut compared, mut outliers) = (0f32, 0, Vec::new());
        for (pos, top5) in case.forced_top5.iter().enumerate() {
            let row = out.row(pos);
            let scale = top5.iter().map(|(_, l)| l.abs()).fold(1f32, f32::max);
            let mut here = 0f32;
            for &(id, l) in top5 {
                here = here.max((row[id as usize] - l).abs() / scale);
            }
            if here > LOGIT_TOLERANCE {
                outliers.push((pos, here));
            } else {
                worst = worst.max(here);
            }
            if top5[0].1 - top5[1].1 >= NEAR_TIE {
                compared += 1;
                assert_eq!(argmax(row), top5[0].0, "{}: argmax at prompt position {pos}", case.name);
            }
        }
        assert!(
            outliers.len() <= 1 && outliers.iter().all(|&(_, d)| d <= ROUTING_OUTLIER),
            "{}: logits differ by more than {LOGIT_TOLERANCE} of their scale at (position, difference) {outliers:?}",
            case.name
        );
        assert!(
            outliers.is_empty()
                || case.shape.contains("oss")
                || case.shape.contains("moe")
                || case.shape.contains("mixtral"),
            "{}: only a mixture's routing may differ at a position: {outliers:?}",
            case.name
        );
        // llama.cpp's greedy path, one decode step at a time: every step's
        // choice must be llama.cpp's unless llama.cpp itself saw a near-tie
        // there (then its choice is still fed, so the paths stay together).
        let mut next = argmax(out.last());
        let (mut equal, mut steps) = (0, 0);
        for (step, (&want, &gap)) in case.greedy_ids.iter().zip(&case.top2_gaps).enumerate() {
            if gap >= NEAR_TIE {
                assert_eq!(next, want, "{}: greedy step {step} (llama.cpp's top-2 gap {gap})", case.name);
                steps += 1;
            }
            equal += usize::from(next == want);
            let at = case.prompt_ids.len() + step;
            let row = logits(slice.forward(slice.embed(&[want]).unwrap(), &mut kv, at, Logits::Last).unwrap());
            next = argmax(row.last());
        }
        assert!(steps >= case.greedy_ids.len() / 2, "{}: only {steps} steps are not near-ties", case.name);
        println!(
            "{:<16} {:>5} {:>12.5} {:>14} {:>10} {:>8}/{:<5} {:>10}",
            case.name,
            case.prompt_ids.len(),
            worst,
            format!("{outliers:.3?}"),
            compared,
            equal,
            case.greedy_ids.len(),
            steps
        );
    }
}

/// A sliding-window layer's cache keeps only its window and the rollback
/// slack at any length: decoding far past the window gives the same logits,
/// bit for bit, as a cache that keeps every position, in bounded bytes; a
/// speculation-sized rollback works there, one past what is kept is refused
/// with nothing changed, and starting over is always possible.
#[test]
fn sliding_window_caches_keep_only_their_window_and_decode_the_same() {
    use candle_core::quantized::GgmlDType;
    use veil_enclave::model::kv_cache::ROLLBACK_SLACK;
    use veil_enclave::model::SessionKv;
    let tmp = TempDir::new("swa-kv");
    for (name, shape, dtype) in [
        ("gpt-oss", Shape::GPT_OSS_SMOKE, TensorType::Mxfp4),
        ("gemma3", Shape::GEMMA3_SMOKE, TensorType::Ggml(GgmlDType::Q8_0)),
    ] {
        let path = tmp.path().join(format!("{name}.gguf"));
        write_with(&path, shape, &Options { sharpen: 8.0, ..Options::new(dtype) }).unwrap();
        let slice = LayerSlice::load(&path, 0..shape.n_layer).unwrap();
        let c = slice.config();
        let width = c.n_head_kv * c.head_dim;
        let keep = shape.window + ROLLBACK_SLACK;
        let tokens: Vec<u32> = (0..keep * 4).map(|i| (i as u32 * 37 + 5) % 500).collect();
        let mut trimmed = slice.new_session(1 << 28);
        let mut full = SessionKv::new(shape.n_layer, width, 1 << 28);
        let run = |kv: &mut SessionKv, from: usize, to: usize| {
            logits(slice.forward(slice.embed(&tokens[from..to]).unwrap(), kv, from, Logits::All).unwrap())
        };
        assert_eq!(run(&mut trimmed, 0, 8), run(&mut full, 0, 8), "{name}: prefill");
        for t in 8..tokens.len() {
            assert_eq!(run(&mut trimmed, t, t + 1), run(&mut full, t, t + 1), "{name}: position {t}");
        }
        let swa = (0..shape.n_layer).filter(|&l| c.is_swa(l)).count();
        assert!(swa > 0, "{name}: the shape has sliding-window layers");
        let row = 2 * width * 2;
        let bound = ((shape.n_layer - swa) * tokens.len() + swa * 2 * keep) * row;
        assert!(trimmed.bytes() <= bound, "{name}: {} bytes held, bound {bound}", trimmed.bytes());
        assert!(trimmed.bytes() < full.bytes(), "{name}: nothing was dropped");
        // A speculation round's rollback, then other tokens.
        let len = tokens.len();
        let back = len - 17;
        trimmed.truncate(back).unwrap();
        full.truncate(back).unwrap();
        assert_eq!(run(&mut trimmed, back, len), run(&mut full, back, len), "{name}: after a rollback");
        // Past what is kept: refused, nothing changed, decoding goes on.
        let floor = trimmed.min_rollback();
        assert!(floor > 0 && floor <= len - ROLLBACK_SLACK, "{name}: rollback floor {floor} of {len}");
        assert!(matches!(trimmed.truncate(floor - 1), Err(ModelError::Invalid(_))), "{name}");
        assert_eq!(trimmed.len(), len);
        trimmed.truncate(floor).unwrap();
        full.truncate(floor).unwrap();
        assert_eq!(run(&mut trimmed, floor, floor + 3), run(&mut full, floor, floor + 3), "{name}: at the floor");
        // Starting over.
        trimmed.truncate(0).unwrap();
        assert_eq!((trimmed.len(), trimmed.bytes()), (0, 0));
        let mut fresh = SessionKv::new(shape.n_layer, width, 1 << 28);
        assert_eq!(run(&mut trimmed, 0, 5), run(&mut fresh, 0, 5), "{name}: after starting over");
    }
}

/// A mixture of experts (and Gemma 3's sliding windows) batched with other
/// sessions, and split into three slices, equals each session run alone in
/// one slice, bit for bit; one prompt is longer than the sliding window.
#[test]
fn experts_batched_and_split_equal_each_session_alone() {
    use candle_core::quantized::GgmlDType;
    let tmp = TempDir::new("batch");
    let q8 = TensorType::Ggml(GgmlDType::Q8_0);
    for (name, shape, dtype) in [
        // K-quant experts: gate and up stacked, the chosen experts side by side on the threads.
        ("qwen3moe", Shape::QWEN3MOE_SMOKE, TensorType::Ggml(GgmlDType::Q4K)),
        ("mixtral", Shape::MIXTRAL_SMOKE, q8),
        ("gpt-oss", Shape::GPT_OSS_SMOKE, TensorType::Mxfp4),
        ("gemma3", Shape::GEMMA3_SMOKE, q8),
    ] {
        let path = tmp.path().join(format!("{name}.gguf"));
        write_with(&path, shape, &Options { sharpen: 8.0, ..Options::new(dtype) }).unwrap();
        let whole = LayerSlice::load(&path, 0..shape.n_layer).unwrap();
        let long: Vec<u32> = (0..shape.window as u32 + 9).map(|i| (i * 37 + 5) % 500).collect();
        let prompts: [&[u32]; 4] = [&[1, 2, 3, 4, 5, 6, 7], &[9, 8], &[100, 200, 300, 400], &long];
        let alone: Vec<Rows> = prompts
            .iter()
            .map(|p| {
                let mut kv = whole.new_session(1 << 26);
                logits(whole.forward(whole.embed(p).unwrap(), &mut kv, 0, Logits::All).unwrap())
            })
            .collect();
        // Batched: every session's rows in one forward (rows grouped by expert across sessions).
        let mut kvs: Vec<_> = prompts.iter().map(|_| whole.new_session(1 << 26)).collect();
        let mut items: Vec<BatchItem<'_>> = prompts
            .iter()
            .zip(kvs.iter_mut())
            .map(|(p, kv)| BatchItem { hidden: whole.embed(p).unwrap(), kv, start: 0, logits: Logits::All })
            .collect();
        let batched = whole.forward_batch(&mut items).unwrap();
        for (b, a) in batched.into_iter().zip(&alone) {
            assert_eq!(&logits(b), a, "{name}: a batch differs from the session alone");
        }
        // Split into three slices.
        let per = shape.n_layer / 3;
        let slices: Vec<LayerSlice> =
            (0..3).map(|i| LayerSlice::load(&path, i * per..(i + 1) * per).unwrap()).collect();
        for (p, a) in prompts.iter().zip(&alone) {
            let mut h = slices[0].embed(p).unwrap();
            let mut out = None;
            for s in &slices {
                let mut kv = s.new_session(1 << 26);
                match s.forward(h.clone(), &mut kv, 0, Logits::All).unwrap() {
                    SliceOutput::Hidden(next) => h = next,
                    SliceOutput::Logits(l) => out = Some(l),
                    SliceOutput::CacheOnly => unreachable!(),
                }
            }
            assert_eq!(&out.unwrap(), a, "{name}: three slices differ from one");
        }
        // candle's ops (the device path, on its CPU backend: sliding-window
        // masks, sinks, post-norms, biases, MXFP4 as BF16) route the same and
        // agree within rounding, the prompt past the window included.
        let mut g = GgufFile::open(&path).unwrap();
        let dev = LayerSlice::from_gguf_on(&mut g, 0..shape.n_layer, ComputeDevice::CandleCpu).unwrap();
        for (p, a) in prompts.iter().zip(&alone) {
            let mut kv = dev.new_session(1 << 26);
            let d = logits(dev.forward(dev.embed(p).unwrap(), &mut kv, 0, Logits::All).unwrap());
            // Relative to the largest logit. As against llama.cpp, a mixture
            // may route one position differently where its router saw a
            // near-tie (measured on an AMD Zen 4: gpt-oss, one row at 11%):
            // that row may differ up to ROUTING_OUTLIER, every other row
            // within DEVICE_TOLERANCE.
            let scale = a.as_slice().iter().fold(1f32, |m, v| m.max(v.abs()));
            let mut outliers = Vec::new();
            for r in 0..a.n() {
                let worst = d.row(r).iter().zip(a.row(r)).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                if worst > DEVICE_TOLERANCE * scale {
                    outliers.push((r, worst / scale));
                }
            }
            let mixture = name != "gemma3";
            assert!(
                outliers.len() <= usize::from(mixture) && outliers.iter().all(|&(_, d)| d <= ROUTING_OUTLIER),
                "{name}: device path differs beyond {DEVICE_TOLERANCE} of the logits' scale at (row, difference) {outliers:?}"
            );
            for r in 0..a.n() {
                if outliers.iter().any(|&(o, _)| o == r) {
                    continue;
                }
                let mut top: Vec<f32> = a.row(r).to_vec();
                top.sort_by(|x, y| y.total_cmp(x));
                if top[0] - top[1] >= NEAR_TIE {
                    assert_eq!(argmax(d.row(r)), argmax(a.row(r)), "{name}: device path argmax at row {r}");
                }
            }
        }
    }
}

/// A Qwen3-MoE model over three `veil-shard` processes equals one process:
/// greedy, seeded sampling, and speculative decoding (prompt-lookup drafts
/// verified k + 1 rows at a time through the experts); and a middle shard
/// killed mid-stream (kill -9) is routed around with the stream unchanged.
#[test]
fn experts_over_three_processes_equal_one_and_survive_a_killed_shard() {
    use crate::cluster::{greedy, local, Cluster};
    use veil_enclave::generate::LocalModel;
    use veil_enclave::pipeline::entry::GenerateWire;
    use veil_enclave::pipeline::route::{DrafterKind, Speculation};

    let Some(vocab) = vocab_dir() else { return };
    let tmp = TempDir::new("cluster");
    let path = tmp.path().join("qwen3moe.gguf");
    let opts = Options {
        vocab_from: Some(vocab.join("ggml-vocab-qwen2.gguf")),
        sharpen: 8.0,
        ..Options::new(TensorType::Ggml(candle_core::quantized::GgmlDType::Q8_0))
    };
    write_with(&path, Shape::QWEN3MOE_SMOKE, &opts).unwrap();
    let (model, tok) = LocalModel::load(&path, &[]).unwrap();
    let prompt: Vec<u32> =
        tok.encode("The history of the printing press begins in the fifteenth century", false).unwrap();
    let mut sampled = greedy(&prompt, 32);
    (sampled.sampling.temperature, sampled.sampling.top_p, sampled.sampling.seed) = (0.8, 0.95, 11);
    let mut speculative = greedy(&prompt, 32);
    speculative.speculation.enabled = Some(true);
    speculative.speculation.k = Some(4);
    let requests: Vec<GenerateWire> = vec![greedy(&prompt, 32), greedy(&prompt[..5], 24), sampled, speculative];
    let expected: Vec<_> = requests.iter().map(|r| local(&model, &tok, r)).collect();

    let mut c = Cluster::with_layers("moe", &path, &[1, 2], &[1, 2, 1], 3);
    c.set_speculation(Speculation { drafter: DrafterKind::Ngram, k_max: 4, ..Speculation::default() });
    // Only the first replica of the middle stage at first, so sessions use it.
    c.spawn(2, 0);
    c.spawn(1, 0);
    c.spawn(0, 0);
    c.wait_log(0, 0, "ready", 1);
    for (req, want) in requests.iter().zip(&expected) {
        let got = c.generate(req).unwrap();
        assert_eq!((&got.ids, &got.text), (&want.ids, &want.text), "three MoE shards differ from one process");
        if req.speculation.enabled == Some(true) {
            let s = got.speculation.expect("speculation stats");
            assert!(s.spec_rounds > 0 && s.accepted > 0, "no draft was verified through the experts: {s:?}");
        }
    }
    // kill -9 one replica of the middle stage while a long stream runs.
    let long = greedy(&prompt, 1500);
    let want = local(&model, &tok, &long);
    let got = c.stream_across_a_kill(&long, 1);
    let got = got.unwrap();
    let first = got.ids.iter().zip(&want.ids).position(|(a, b)| a != b);
    assert!(
        got.ids == want.ids && got.text == want.text,
        "the stream changed across the fail-over (first at {first:?})"
    );
    let log = std::fs::read_to_string(c.log(0, 0)).unwrap();
    assert!(log.contains("re-routed"), "the session was not re-routed:\n{log}");
}

/// Storage that records every byte range a loader reads.
struct Recording {
    bytes: std::io::Cursor<Vec<u8>>,
    reads: std::sync::Arc<std::sync::Mutex<Vec<std::ops::Range<u64>>>>,
}

impl std::io::Read for Recording {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let at = self.bytes.position();
        let n = self.bytes.read(buf)?;
        self.reads.lock().unwrap().push(at..at + n as u64);
        Ok(n)
    }
}

impl std::io::Seek for Recording {
    fn seek(&mut self, pos: std::io::SeekFrom) -> std::io::Result<u64> {
        self.bytes.seek(pos)
    }
}

/// A middle stage of a three-stage mixture of experts, given the model's
/// manifest file, reads the header and its own layer's tensors — no byte of
/// another stage's — and proves the model's one root. One changed byte in
/// one of its experts: with the manifest the stage refuses to load, naming
/// the tensor, while the other stages load unchanged; with no manifest file
/// every stage hashes the changed byte into its root (another model).
#[test]
fn a_middle_stage_reads_only_its_own_experts_and_one_changed_byte_is_refused() {
    use candle_core::quantized::gguf_file::Content;
    use veil_enclave::model::gguf::manifest_path;
    use veil_enclave::model::manifest::Proof;
    let tmp = TempDir::new("slice");
    let path = tmp.path().join("qwen3moe.gguf");
    write_with(&path, Shape::QWEN3MOE_SMOKE, &Options::new(TensorType::Ggml(candle_core::quantized::GgmlDType::Q8_0)))
        .unwrap();
    let model = GgufFile::open(&path).unwrap().model_manifest().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let content = Content::read(&mut std::io::Cursor::new(&bytes)).unwrap();
    let range = |name: &str| {
        let info = &content.tensor_infos[name];
        let start = content.tensor_data_offset + info.offset;
        let len = info.shape.elem_count() / info.ggml_dtype.block_size() * info.ggml_dtype.type_size();
        start..start + len as u64
    };
    let reads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let source = Recording { bytes: std::io::Cursor::new(bytes.clone()), reads: reads.clone() };
    let mut g = GgufFile::from_source(&path, Box::new(source), bytes.len() as u64).unwrap();
    let header_end = reads.lock().unwrap().iter().map(|r| r.end).max().unwrap();
    assert!(header_end <= content.tensor_data_offset, "the header read went into tensor data");
    reads.lock().unwrap().clear();
    g.set_manifest(model.clone());
    let middle = LayerSlice::from_gguf(&mut g, 1..2).unwrap();
    let own: Vec<std::ops::Range<u64>> =
        content.tensor_infos.keys().filter(|n| n.starts_with("blk.1.")).map(|n| range(n)).collect();
    let read: u64 = reads.lock().unwrap().iter().map(|r| r.end - r.start).sum();
    let wanted: u64 = own.iter().map(|r| r.end - r.start).sum();
    for r in reads.lock().unwrap().iter().filter(|r| r.start < r.end) {
        assert!(own.iter().any(|o| o.start <= r.start && r.end <= o.end), "read {r:?} outside the stage's tensors");
    }
    assert_eq!(read, wanted, "the stage read {read} bytes for {wanted} bytes of its tensors");
    assert!(middle.manifest().tensors.iter().all(|t| t.name.starts_with("blk.1.")));
    assert_eq!((middle.manifest().root(), middle.manifest().proof), (model.root(), Proof::File));

    // One byte of expert 5's gate in layer 1, with the true model's manifest file beside it.
    let gate = range("blk.1.ffn_gate_exps.weight");
    let per_expert = (gate.end - gate.start) / Shape::QWEN3MOE_SMOKE.n_expert as u64;
    let mut changed = bytes.clone();
    changed[(gate.start + 5 * per_expert + 7) as usize] ^= 0x01;
    let changed_path = tmp.path().join("changed.gguf");
    std::fs::write(&changed_path, &changed).unwrap();
    std::fs::write(manifest_path(&changed_path), model.to_json()).unwrap();
    for layers in [0..1, 2..3] {
        let s = LayerSlice::load(&changed_path, layers.clone()).unwrap();
        assert_eq!((s.manifest().root(), s.manifest().proof), (model.root(), Proof::File), "{layers:?}");
    }
    match LayerSlice::load(&changed_path, 1..2) {
        Err(ModelError::Manifest(m)) => assert!(m.contains("blk.1.ffn_gate_exps.weight"), "{m}"),
        other => panic!("the changed stage loaded: {:?}", other.map(|s| s.manifest().root())),
    }
    // Without the file, every stage hashes the changed expert into its root.
    std::fs::remove_file(manifest_path(&changed_path)).unwrap();
    for layers in [0..1, 1..2, 2..3] {
        let s = LayerSlice::load(&changed_path, layers.clone()).unwrap();
        assert_eq!(s.manifest().proof, Proof::Rehashed);
        assert_ne!(s.manifest().root(), model.root(), "{layers:?}");
    }
}

/// A model split into three files as llama.cpp's gguf-split lays them out is
/// the same model: the same root as the one file, the same logits from a
/// whole slice and from stages. Opening any file but the first, a missing
/// file, or files renamed out of order are clear errors.
#[test]
fn a_split_model_is_the_same_model_as_one_file() {
    let tmp = TempDir::new("split");
    let one = tmp.path().join("one.gguf");
    let first = tmp.path().join("big-00001-of-00003.gguf");
    let opts = Options::new(TensorType::Ggml(candle_core::quantized::GgmlDType::Q8_0));
    write_with(&one, Shape::QWEN3MOE_SMOKE, &opts).unwrap();
    write_with(&first, Shape::QWEN3MOE_SMOKE, &Options { files: 3, ..opts }).unwrap();
    let mut g = GgufFile::open(&first).unwrap();
    assert_eq!(g.files(), 3);
    let root = GgufFile::open(&one).unwrap().model_manifest().unwrap().root();
    assert_eq!(g.model_manifest().unwrap().root(), root);
    let ids = [1u32, 7, 42, 3, 99, 5];
    let run = |path: &Path, cuts: &[usize]| {
        let n = Shape::QWEN3MOE_SMOKE.n_layer;
        let bounds: Vec<usize> = [&[0][..], cuts, &[n]].concat();
        let slices: Vec<LayerSlice> = bounds.windows(2).map(|w| LayerSlice::load(path, w[0]..w[1]).unwrap()).collect();
        assert!(slices.iter().all(|s| s.manifest().root() == root));
        let mut h = slices[0].embed(&ids).unwrap();
        for s in &slices {
            let mut kv = s.new_session(1 << 24);
            match s.forward(h.clone(), &mut kv, 0, Logits::All).unwrap() {
                SliceOutput::Hidden(next) => h = next,
                out => return logits(out),
            }
        }
        unreachable!("the last slice gives logits")
    };
    let want = run(&one, &[]);
    assert_eq!(run(&first, &[]), want);
    assert_eq!(run(&first, &[1, 2]), want);

    let second = tmp.path().join("big-00002-of-00003.gguf");
    let third = tmp.path().join("big-00003-of-00003.gguf");
    assert!(matches!(GgufFile::open(&second), Err(ModelError::Invalid(m)) if m.contains("give the first")));
    // The second and third files swapped under each other's names.
    let moved = tmp.path().join("moved.gguf");
    std::fs::rename(&second, &moved).unwrap();
    std::fs::rename(&third, &second).unwrap();
    std::fs::rename(&moved, &third).unwrap();
    assert!(matches!(GgufFile::open(&first), Err(ModelError::Malformed(m)) if m.contains("split.no")));
    std::fs::remove_file(&third).unwrap();
    match GgufFile::open(&first) {
        Err(ModelError::Io(e)) => assert!(e.to_string().contains("big-00003-of-00003.gguf"), "{e}"),
        other => panic!("{other:?}"),
    }
}

/// A middle stage's peak RSS stays under the bound docs/models.md states, which
/// `veil-shard stage-memory` computes from the file's header before loading
/// (1.25 × the stage's weight bytes + its largest tensor + 64 MiB over the
/// process before loading), for Q8_0 and MXFP4 experts; and it did load its
/// weights (the peak grew by at least their size). A stage in its own
/// process, as `serve` runs one.
#[test]
fn a_stages_peak_rss_stays_under_the_stated_bound() {
    let tmp = TempDir::new("rss");
    // Qwen3-30B-A3B's layer, with 16 of its 128 experts and a small vocabulary: ~100 MB a layer.
    let shape = Shape { n_layer: 3, n_expert: 16, vocab: 1024, ..Shape::QWEN3_30B_A3B };
    for dtype in ["q8_0", "mxfp4"] {
        let path = tmp.path().join(format!("{dtype}.gguf"));
        let opts = Options::new(veil_enclave::model::synth::dtype_named(dtype).unwrap());
        write_with(&path, shape, &opts).unwrap();
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_veil-shard"))
            .args(["stage-memory", "--layers", "1..2", "--json", "--model"])
            .arg(&path)
            .env("RUST_LOG", "error")
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        let r: serde_json::Value = serde_json::from_str(out.trim())
            .unwrap_or_else(|e| panic!("{e}: {out}{}", String::from_utf8_lossy(&o.stderr)));
        let n = |k: &str| r[k].as_u64().unwrap();
        println!(
            "{dtype}: weights {} MiB, before {} MiB, peak {} MiB, bound {} MiB",
            n("weight_bytes") >> 20,
            n("rss_before") >> 20,
            n("peak_rss") >> 20,
            n("bound") >> 20
        );
        assert!(n("weight_bytes") > 40 << 20, "{r}");
        assert!(n("peak_rss") <= n("bound") && r["within"] == true, "{dtype}: {r}");
        assert!(o.status.success(), "{dtype}: {r}");
        assert!(n("peak_rss") >= n("rss_before") + n("weight_bytes") * 9 / 10, "{dtype}: the stage loaded less: {r}");
    }
}
