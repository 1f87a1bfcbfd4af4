//! `veil-shard device-bench`: prefill and decode speed of a whole model on a
//! device, beside the memory-bandwidth bound measured on the same device in
//! the same run. Works on any Llama-family GGUF, tokenizer or not (the
//! random-weight models of `synth-model` have none).

use std::time::Instant;

use candle_core::{DType, Device, Tensor};

use super::DeviceBenchArgs;
use crate::model::{BatchItem, ComputeDevice, GgufFile, LayerSlice, Logits};

/// Best tokens/s of `reps` runs of `f`, which processes `n` positions.
fn rate(n: usize, reps: usize, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    let mut best = f64::MAX;
    for _ in 0..reps {
        let t = Instant::now();
        f()?;
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(n as f64 / best)
}

/// Copy bandwidth of the device, bytes/s: a 1 GiB buffer copied (read and
/// written) on the device, best of 5 (the CPU: a `Vec` clone).
fn copy_bandwidth(device: ComputeDevice) -> anyhow::Result<f64> {
    const BYTES: usize = 1 << 30;
    let mut best = f64::MAX;
    match device.open()? {
        Device::Cpu => {
            let src = vec![1u8; BYTES];
            for _ in 0..5 {
                let t = Instant::now();
                let copy = std::hint::black_box(src.clone());
                best = best.min(t.elapsed().as_secs_f64());
                drop(copy);
            }
        }
        d => {
            let src = Tensor::ones(BYTES / 4, DType::F32, &d)?;
            d.synchronize()?;
            for _ in 0..5 {
                let t = Instant::now();
                let copy = src.copy()?;
                d.synchronize()?;
                best = best.min(t.elapsed().as_secs_f64());
                drop(copy);
            }
        }
    }
    Ok(2.0 * BYTES as f64 / best)
}

pub(super) fn device_bench(args: DeviceBenchArgs) -> anyhow::Result<()> {
    let mut gguf = GgufFile::open(&args.model)?;
    let n_layer = crate::model::Config::from_gguf(&gguf)?.n_layer;
    // What one decode step reads: every matrix (the embedding only when it is the tied LM head).
    let tied = !gguf.has_tensor("output.weight");
    let weight_bytes: u64 = gguf
        .tensor_names()
        .iter()
        .filter(|n| tied || n.as_str() != "token_embd.weight")
        .filter_map(|n| gguf.tensor_bytes(n))
        .sum();
    let t = Instant::now();
    let slice = LayerSlice::from_gguf_on(&mut gguf, 0..n_layer, args.device)?;
    let load_s = t.elapsed().as_secs_f64();
    let budget = 4usize << 30;
    let prompt: Vec<u32> =
        (0..args.prefill as u32).map(|i| 1 + (i * 7919) % (slice.config().vocab_size as u32 - 1)).collect();
    let prefill = rate(prompt.len(), 3, || {
        let mut kv = slice.new_session(budget);
        slice.forward(slice.embed(&prompt)?, &mut kv, 0, Logits::Last)?;
        Ok(())
    })?;
    let mut decode = Vec::new();
    for &batch in &args.batch {
        let mut kvs: Vec<_> = (0..batch).map(|_| slice.new_session(budget)).collect();
        for kv in &mut kvs {
            slice.forward(slice.embed(&prompt[..16.min(prompt.len())])?, kv, 0, Logits::Last)?;
        }
        let steps = args.decode;
        decode.push((
            batch,
            // Best of three runs (each continues the sessions): the first pays for warm-up.
            rate(steps * batch, 3, || {
                for s in 0..steps {
                    let mut items = Vec::with_capacity(batch);
                    for kv in kvs.iter_mut() {
                        let start = kv.len();
                        items.push(BatchItem {
                            hidden: slice.embed(&[2 + s as u32])?,
                            kv,
                            start,
                            logits: Logits::Last,
                        });
                    }
                    slice.forward_batch(&mut items)?;
                }
                Ok(())
            })?,
        ));
    }
    let bandwidth = copy_bandwidth(args.device)?;
    let bound = bandwidth / weight_bytes as f64;
    println!("model {} on {} (loaded in {load_s:.1} s)", args.model.display(), args.device);
    println!("| row | tokens/s | note |\n|---|---|---|");
    println!("| prefill {} | {prefill:.1} | |", prompt.len());
    let b1 = decode.iter().find(|(b, _)| *b == 1).map(|(_, r)| *r);
    for (batch, r) in &decode {
        let note = match (batch, b1) {
            (1, _) if args.device.is_gpu() => format!("{:.0}% of the bandwidth bound", 100.0 * r / bound),
            (1, _) => String::new(),
            (_, Some(b1)) => format!("{:.1}× batch 1", r / b1),
            _ => String::new(),
        };
        println!("| decode batch {batch} (aggregate) | {r:.1} | {note} |");
    }
    let caveat = if args.device.is_gpu() { "" } else { " (one CPU thread's copy: not a bound on threaded decode)" };
    println!(
        "| bandwidth bound, batch 1 | {bound:.1} | {:.2} GB of weights per token ÷ {:.0} GB/s copy bandwidth{caveat} |",
        weight_bytes as f64 / 1e9,
        bandwidth / 1e9
    );
    Ok(())
}
