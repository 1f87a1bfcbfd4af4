//! Self-speculation picked per model: which of the target's own blocks a
//! derived draft keeps (an early exit after the first blocks, or the target
//! with every m-th middle block skipped), chosen from acceptance and cost
//! measured on the target itself.
//!
//! Acceptance is measured exactly for greedy speculation: the target writes
//! its greedy continuation of each calibration prompt, and each candidate
//! reads the same sequence teacher-forced. A round starting at position `j`
//! keeps drafted tokens while the candidate's argmax equals the target's next
//! token, which is what a greedy round would keep (the draft's own proposals
//! are the target's tokens for as long as they are accepted). Cost is the
//! median wall time of one single-token decode step, target and candidate
//! timed alike in the same run.
//!
//! A candidate's score is the expected speedup over plain decoding of
//! sequential rounds that each cost `round` (network and the ring's compute)
//! plus `k` draft steps: `(E[kept | k] + 1) · round / (round + k · t_draft)`,
//! at its best `k`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::derive::{derive_draft, format_layers};
use crate::local_model::LocalModel;
use crate::model::error::{ModelError, Result};
use crate::text::sampler::argmax;
use crate::text::template::ChatMessage;
use crate::text::tokenizer::Tokenizer;

/// Calibration requests, unlike the prompts the benches measure with: a
/// question, an explanation, a list and code.
pub const CALIBRATION_PROMPTS: [&str; 4] = [
    "Explain why the sky is blue in three sentences.",
    "What are the main differences between a list and a tuple in Python?",
    "Give me five tips for sleeping better.",
    "Write a JavaScript function that returns the largest number in an array.",
];

/// Tokens the target continues each calibration prompt with.
pub const CALIBRATION_TOKENS: usize = 48;

/// Single-token steps timed per model (the median is kept).
const TIMED_STEPS: usize = 12;

/// Most drafted tokens per round considered.
const SCORE_K_MAX: usize = 8;

/// One set of blocks a draft could keep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// How it was made (`early exit`, `skip every 3rd`).
    pub kind: String,
    /// The target's blocks kept, ascending.
    pub layers: Vec<usize>,
}

/// The candidates for a target of `n_layer` blocks: early exits after one
/// block and after a quarter, half and three quarters of the blocks, and layer skipping that
/// keeps the first and last two blocks and drops every 2nd, 3rd or 4th
/// block between them.
pub fn candidates(n_layer: usize) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = Vec::new();
    let mut push = |kind: String, layers: Vec<usize>| {
        if !layers.is_empty() && layers.len() < n_layer && !out.iter().any(|c| c.layers == layers) {
            out.push(Candidate { kind, layers });
        }
    };
    // One block: what the embedding, final norm and head alone cost.
    push("early exit".into(), vec![0]);
    for quarters in 1..=3 {
        let n = (n_layer * quarters / 4).max(1);
        push("early exit".into(), (0..n).collect());
    }
    if n_layer >= 8 {
        for m in 2..=4 {
            let layers = (0..n_layer).filter(|&l| l < 2 || l >= n_layer - 2 || (l - 2) % m != m - 1).collect();
            push(format!("skip every {}", ordinal(m)), layers);
        }
    }
    out
}

fn ordinal(m: usize) -> String {
    match m {
        2 => "2nd".into(),
        3 => "3rd".into(),
        n => format!("{n}th"),
    }
}

/// What was measured of one candidate.
#[derive(Clone, Debug)]
pub struct Measured {
    /// The candidate.
    pub candidate: Candidate,
    /// Fraction of positions where its argmax is the target's next token.
    pub agreement: f64,
    /// Mean drafted tokens kept per round, for `k = 1..=8` (index `k − 1`).
    pub kept: Vec<f64>,
    /// Median single-token step.
    pub step: Duration,
}

/// The outcome of [`select`].
#[derive(Clone, Debug)]
pub struct Selection {
    /// The target's median single-token step.
    pub target_step: Duration,
    /// The round cost the scores assume.
    pub round: Duration,
    /// The most a picked draft's step may cost, in target steps.
    pub max_cost: f64,
    /// Positions measured (continuation tokens over all prompts).
    pub positions: usize,
    /// Every candidate, in the order of [`candidates`].
    pub measured: Vec<Measured>,
    /// Index into `measured` of the best, with its `k`; `None` when no
    /// candidate beats plain decoding.
    pub best: Option<(usize, usize)>,
}

impl Measured {
    /// Draft cost per token as a fraction of the target's step.
    pub fn cost(&self, target_step: Duration) -> f64 {
        self.step.as_secs_f64() / target_step.as_secs_f64().max(1e-9)
    }

    /// Expected speedup over plain decoding at `k`, rounds costing `round`.
    pub fn speedup(&self, k: usize, round: Duration) -> f64 {
        let r = round.as_secs_f64();
        (self.kept[k - 1] + 1.0) * r / (r + k as f64 * self.step.as_secs_f64())
    }

    /// The `k` with the highest [`speedup`](Self::speedup), and that speedup.
    pub fn best_k(&self, round: Duration) -> (usize, f64) {
        (1..=self.kept.len()).map(|k| (k, self.speedup(k, round))).fold((1, 0.0), |a, b| if b.1 > a.1 { b } else { a })
    }
}

/// Mean of `min(run_j, k)` over start positions `j`, where `run_j` counts the
/// consecutive agreements from `j` on, for `k = 1..=k_max`.
pub fn kept_per_round(agree: &[Vec<bool>], k_max: usize) -> Vec<f64> {
    let mut sums = vec![0.0; k_max];
    let mut starts = 0usize;
    for seq in agree {
        for j in 0..seq.len() {
            let run = seq[j..].iter().take_while(|&&a| a).count();
            for (k, s) in sums.iter_mut().enumerate() {
                *s += run.min(k + 1) as f64;
            }
            starts += 1;
        }
    }
    sums.into_iter().map(|s| s / starts.max(1) as f64).collect()
}

fn median_step(model: &LocalModel, prompt: &[u32]) -> Result<Duration> {
    let mut session = model.session(64 << 20);
    let mut logits = model.step_last(&mut session, prompt)?;
    let mut times = Vec::with_capacity(TIMED_STEPS);
    for _ in 0..TIMED_STEPS {
        let token = argmax(logits.row(0));
        let t = Instant::now();
        logits = model.step_last(&mut session, &[token])?;
        times.push(t.elapsed());
    }
    times.sort();
    Ok(times[times.len() / 2])
}

/// The target's greedy continuation of each of [`CALIBRATION_PROMPTS`] (as a
/// user turn of its chat template), up to [`CALIBRATION_TOKENS`] tokens or a
/// stop token: `(prompt length, prompt and continuation)` per prompt.
pub fn calibration(model: &LocalModel, tokenizer: &Tokenizer) -> Result<Vec<(usize, Vec<u32>)>> {
    let mut seqs = Vec::new();
    for prompt in CALIBRATION_PROMPTS {
        let ids = tokenizer.encode_chat(&[ChatMessage::new("user", prompt)])?;
        let mut session = model.session(64 << 20);
        let mut seq = ids.clone();
        let mut logits = model.step_last(&mut session, &ids)?;
        for _ in 0..CALIBRATION_TOKENS {
            let token = argmax(logits.row(0));
            seq.push(token);
            if tokenizer.stop_ids().contains(&token) {
                break;
            }
            logits = model.step_last(&mut session, &[token])?;
        }
        seqs.push((ids.len(), seq));
    }
    Ok(seqs)
}

/// Per calibration sequence, whether `model`'s argmax at each continuation
/// position is the next token of `seq` (its first `prompt_len` tokens are the
/// prompt). The target itself agrees everywhere on its own continuations.
pub fn agreement(model: &LocalModel, seqs: &[(usize, Vec<u32>)]) -> Result<Vec<Vec<bool>>> {
    let mut out = Vec::with_capacity(seqs.len());
    for (prompt_len, seq) in seqs {
        let mut session = model.session(64 << 20);
        let logits = model.step(&mut session, &seq[..seq.len() - 1])?;
        out.push((prompt_len - 1..seq.len() - 1).map(|j| argmax(logits.row(j)) == seq[j + 1]).collect());
    }
    Ok(out)
}

/// Measures every candidate of `target` (derived into `scratch`, removed
/// afterwards) and picks the one with the highest expected speedup for
/// rounds costing `round`, among those whose step costs at most `max_cost`
/// target steps (the entry's budget for drafting).
pub fn select(target: &Path, scratch: &Path, round: Duration, max_cost: f64) -> Result<Selection> {
    let (model, tokenizer) = LocalModel::load(target, &[])?;
    let n_layer = model.slices().iter().map(|s| s.config().n_layer).next().unwrap_or(0);
    let seqs = calibration(&model, &tokenizer)?;
    let positions = seqs.iter().map(|(p, s)| s.len() - p).sum();
    let target_step = median_step(&model, &seqs[0].1[..seqs[0].0])?;
    drop(model);
    let mut measured = Vec::new();
    for (i, candidate) in candidates(n_layer).into_iter().enumerate() {
        let path: PathBuf = scratch.join(format!(".veil-draft-candidate-{}-{i}.gguf", std::process::id()));
        derive_draft(target, &path, &candidate.layers, None)?;
        let loaded = LocalModel::load(&path, &[]);
        let _ = std::fs::remove_file(&path);
        let (draft, _) = loaded?;
        let agree = agreement(&draft, &seqs)?;
        let total: usize = agree.iter().map(Vec::len).sum();
        let hits: usize = agree.iter().flatten().filter(|&&a| a).count();
        measured.push(Measured {
            candidate,
            agreement: hits as f64 / total.max(1) as f64,
            kept: kept_per_round(&agree, SCORE_K_MAX),
            step: median_step(&draft, &seqs[0].1[..seqs[0].0])?,
        });
    }
    if measured.is_empty() {
        return Err(ModelError::Invalid(format!("a target of {n_layer} blocks has no smaller draft to pick")));
    }
    let mut sel = Selection { target_step, round, max_cost, positions, measured, best: None };
    sel.best = sel.best_within(max_cost);
    Ok(sel)
}

impl Selection {
    /// The best of the measured candidates whose step costs at most
    /// `max_cost` target steps, with its `k` (what [`select`] picks for
    /// that budget); `None` when none of them beats plain decoding.
    pub fn best_within(&self, max_cost: f64) -> Option<(usize, usize)> {
        self.measured
            .iter()
            .enumerate()
            .filter(|(_, m)| m.cost(self.target_step) <= max_cost)
            .map(|(i, m)| (i, m.best_k(self.round)))
            .filter(|(_, (_, s))| *s > 1.0)
            .max_by(|a, b| a.1 .1.total_cmp(&b.1 .1))
            .map(|(i, (k, _))| (i, k))
    }

    /// The table `derive-draft --auto` prints.
    pub fn table(&self) -> String {
        let mut s = format!(
            "target step {:.1} ms; rounds assumed to cost {} ms; drafts may cost {:.2} target steps; {} positions of the target's greedy continuations\n",
            self.target_step.as_secs_f64() * 1e3,
            self.round.as_millis(),
            self.max_cost,
            self.positions
        );
        s.push_str("| candidate | blocks kept | cost / target step | agreement | kept per round at best k | best k | expected speedup |\n");
        s.push_str("|---|---|---|---|---|---|---|\n");
        for (i, m) in self.measured.iter().enumerate() {
            let (k, speedup) = m.best_k(self.round);
            let mark = if self.best.is_some_and(|(b, _)| b == i) { " (picked)" } else { "" };
            s.push_str(&format!(
                "| {}{mark} | {} ({}) | {:.2} | {:.2} | {:.2} | {k} | {speedup:.2}× |\n",
                m.candidate.kind,
                format_layers(&m.candidate.layers),
                m.candidate.layers.len(),
                m.cost(self.target_step),
                m.agreement,
                m.kept[k - 1],
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_are_proper_subsets_without_repeats() {
        let c = candidates(30);
        assert_eq!(c.len(), 7);
        assert_eq!(c[0].layers, vec![0]);
        assert_eq!(c[1].layers, (0..7).collect::<Vec<_>>());
        assert_eq!(c[3].layers, (0..22).collect::<Vec<_>>());
        // Skip every 2nd: blocks 3, 5, …, 27 go; 0, 1 and 28, 29 stay.
        let skip2 = &c[4].layers;
        assert_eq!(skip2.len(), 30 - 13);
        assert!(skip2.starts_with(&[0, 1, 2, 4]) && skip2.ends_with(&[26, 28, 29]));
        assert!(c.iter().all(|x| x.layers.windows(2).all(|w| w[0] < w[1]) && x.layers.len() < 30));
        // Tiny targets: no skipping, no empty or whole-model draft.
        assert_eq!(candidates(1).len(), 0);
        assert_eq!(candidates(2).iter().map(|c| c.layers.len()).collect::<Vec<_>>(), vec![1]);
    }

    #[test]
    fn kept_per_round_counts_runs_capped_at_k() {
        // Runs from each start: 2,1,0,1,0.
        let agree = vec![vec![true, true, false, true, false]];
        let kept = kept_per_round(&agree, 3);
        assert_eq!(kept, vec![3.0 / 5.0, 4.0 / 5.0, 4.0 / 5.0]);
        assert_eq!(kept_per_round(&[vec![true; 4]], 2), vec![1.0, 7.0 / 4.0]);
    }

    #[test]
    fn speedup_weighs_kept_tokens_against_draft_time() {
        let m = Measured {
            candidate: Candidate { kind: "x".into(), layers: vec![0] },
            agreement: 0.5,
            kept: vec![0.5, 0.75],
            step: Duration::from_millis(10),
        };
        let round = Duration::from_millis(100);
        assert!((m.speedup(1, round) - 1.5 * 100.0 / 110.0).abs() < 1e-9);
        assert!((m.speedup(2, round) - 1.75 * 100.0 / 120.0).abs() < 1e-9);
        assert_eq!(m.best_k(round).0, 2);
        // A slow ring favours drafting more; a fast one less.
        assert_eq!(m.best_k(Duration::from_millis(5)).0, 1);
    }
}
