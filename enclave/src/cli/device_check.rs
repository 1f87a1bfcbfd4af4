//! `veil-shard device-check`: the device path against the fused CPU kernels
//! and llama.cpp's greedy fixtures, as one table (speed: `device-bench`). What
//! `scripts/gpu-check.sh` runs on a GPU machine (`--device cuda:0`); with
//! `--device candle-cpu` the same checks run where no GPU is.

use super::DeviceCheckArgs;
use crate::local_model::LocalModel;
use crate::model::reference::{self, NEAR_TIE};
use crate::model::{BatchItem, ComputeDevice, GgufFile, LayerSlice, Logits, SliceOutput};
use crate::text::sampler::argmax;

fn row(label: &str, value: impl std::fmt::Display, verdict: &str) {
    println!("| {label} | {value} | {verdict} |");
}

fn ok(pass: bool) -> &'static str {
    if pass {
        "PASS"
    } else {
        "FAIL"
    }
}

pub(super) fn device_check(args: DeviceCheckArgs) -> anyhow::Result<bool> {
    let device: ComputeDevice = args.device;
    let load = |cuts: &[usize], devices: &[ComputeDevice]| -> anyhow::Result<LocalModel> {
        Ok(LocalModel::from_gguf_on(&mut GgufFile::open(&args.model)?, cuts, devices)?.0)
    };
    let cpu = load(&[], &[])?;
    let dev = load(&[], &[device])?;
    let n_layer = dev.slices()[0].config().n_layer;
    let budget = 1 << 30;
    let mut all_pass = true;
    println!("device check: {} on {device}\n", args.model.display());
    println!("| check | value | verdict |\n|---|---|---|");

    let same_root = cpu.slices()[0].manifest().root() == dev.slices()[0].manifest().root();
    row("manifest root equal to the CPU load", same_root, ok(same_root));
    all_pass &= same_root;

    // Correctness: teacher-forced over llama.cpp's fixtures.
    let fixtures = reference::llamacpp()?;
    anyhow::ensure!(fixtures.cases.len() >= 2, "the compiled-in fixtures hold fewer than two cases");
    let (mut agree, mut with_cpu, mut total, mut non_tie, mut max_diff) = (0, 0, 0, 0, 0f32);
    for c in &fixtures.cases {
        let mut seq = c.prompt_ids.clone();
        seq.extend_from_slice(&c.greedy_ids[..c.greedy_ids.len() - 1]);
        let d = dev.step(&mut dev.session(budget), &seq)?;
        let f = cpu.step(&mut cpu.session(budget), &seq)?;
        let p = c.prompt_ids.len();
        for (t, &want) in c.greedy_ids.iter().enumerate() {
            let got = argmax(d.row(p - 1 + t));
            total += 1;
            agree += usize::from(got == want);
            with_cpu += usize::from(got == argmax(f.row(p - 1 + t)));
            non_tie += usize::from(got != want && c.top2_gaps[t] >= NEAR_TIE);
        }
        max_diff = d.as_slice().iter().zip(f.as_slice()).fold(max_diff, |m, (a, b)| m.max((a - b).abs()));
    }
    row("teacher-forced tokens equal to llama.cpp", format!("{agree}/{total}"), ok(agree * 100 >= total * 95));
    row("teacher-forced tokens equal to the CPU path", format!("{with_cpu}/{total}"), ok(with_cpu * 100 >= total * 95));
    row("differences from llama.cpp at a non-tie (gap ≥ 0.5)", non_tie, ok(non_tie == 0));
    row("largest |logit difference| vs the CPU path", format!("{max_diff:.3}"), ok(max_diff < 2.5));
    all_pass &= agree * 100 >= total * 95 && with_cpu * 100 >= total * 95 && non_tie == 0 && max_diff < 2.5;

    // Exactness among the device path's own configurations.
    let thirds = [n_layer / 3, 2 * n_layer / 3];
    let split = load(&thirds, &[device, device, device])?;
    let mixed = load(&thirds, &[ComputeDevice::Cpu, device, ComputeDevice::Cpu])?;
    let prompt = &fixtures.cases[0].prompt_ids;
    let whole_logits = dev.step(&mut dev.session(budget), prompt)?;
    let split_equal = split.step(&mut split.session(budget), prompt)? == whole_logits;
    row("split in three equals whole, bit for bit", split_equal, ok(split_equal));
    let m = mixed.step(&mut mixed.session(budget), prompt)?;
    let mixed_tokens = (0..m.n()).all(|i| argmax(m.row(i)) == argmax(whole_logits.row(i)));
    row("CPU–device–CPU split: same tokens as the device alone", mixed_tokens, ok(mixed_tokens));
    let slice: &LayerSlice = &dev.slices()[0];
    let other = &fixtures.cases[1].prompt_ids;
    let alone: Vec<SliceOutput> = [prompt, other]
        .iter()
        .map(|ids| slice.forward(slice.embed(ids)?, &mut slice.new_session(budget), 0, Logits::All))
        .collect::<Result<_, _>>()?;
    let (mut k1, mut k2) = (slice.new_session(budget), slice.new_session(budget));
    let batched = slice.forward_batch(&mut [
        BatchItem { hidden: slice.embed(prompt)?, kv: &mut k1, start: 0, logits: Logits::All },
        BatchItem { hidden: slice.embed(other)?, kv: &mut k2, start: 0, logits: Logits::All },
    ])?;
    let batch_equal = batched == alone;
    row("two sessions batched equal each alone, bit for bit", batch_equal, ok(batch_equal));
    all_pass &= split_equal && mixed_tokens && batch_equal;

    println!("\n{}", if all_pass { "device check: PASS" } else { "device check: FAIL" });
    Ok(all_pass)
}
