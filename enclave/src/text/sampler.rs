//! Turning logits into the next token: greedy, or temperature with top-k,
//! top-p and min-p, after logit bias and repetition, presence and frequency
//! penalties; seeded and reproducible. Also the raw log-probabilities
//! (`logprobs`) of chosen and top tokens.

use crate::model::error::{ModelError, Result};

/// Sampling parameters of a request: the one place they are defined. The
/// gateway and the loopback endpoint fill it, the entry's sampler and
/// speculation read it, and the link carries the part the last shard needs
/// ([`SamplingSpec`](crate::link::frame::SamplingSpec), made from it).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// Keep the k most likely tokens (0 = off).
    pub top_k: usize,
    /// Keep the smallest set with cumulative probability ≥ p (1 = off).
    pub top_p: f32,
    /// Drop tokens below `min_p × p(max)` (0 = off).
    pub min_p: f32,
    /// llama.cpp-style penalty on tokens already seen (1 = off).
    pub repetition_penalty: f32,
    /// How many recent tokens the penalty looks at.
    pub repetition_window: usize,
    /// OpenAI's `presence_penalty`: subtracted once from the logit of every
    /// token the output holds so far (`[-2, 2]`, 0 = off).
    pub presence_penalty: f32,
    /// OpenAI's `frequency_penalty`: subtracted from a token's logit once per
    /// time the output holds it so far (`[-2, 2]`, 0 = off).
    pub frequency_penalty: f32,
    /// OpenAI's `logit_bias`: added to a token's logit before every other
    /// transform (`[-100, 100]` each, ascending distinct token ids).
    pub logit_bias: Vec<(u32, f32)>,
    /// Report each generated token's log-probability with this many top
    /// alternatives (0..=[`MAX_TOP_LOGPROBS`]); `None`: none. Changes no
    /// output.
    pub logprobs: Option<u8>,
    /// What the answer must be (JSON, a JSON schema): tokens that cannot
    /// continue it are masked before every other transform.
    pub response_format: Option<super::grammar::ResponseFormat>,
    /// Seed of the random stream.
    pub seed: u64,
}

/// Most `logit_bias` entries a request may carry.
pub const MAX_LOGIT_BIAS: usize = 1024;
/// Output tokens the presence and frequency penalties look back at (longer
/// outputs: the last this many).
pub const PENALTY_WINDOW: usize = 1 << 14;

/// The tokens a distribution's penalties look at.
#[derive(Clone, Copy, Debug, Default)]
pub struct Seen<'a> {
    /// The context's last tokens, prompt included: the repetition penalty
    /// looks at the last `repetition_window` of them.
    pub recent: &'a [u32],
    /// The output so far (at most [`PENALTY_WINDOW`]): the presence and
    /// frequency penalties count these.
    pub output: &'a [u32],
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            repetition_window: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            logprobs: None,
            response_format: None,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Checks ranges.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str| Err(ModelError::Invalid(format!("sampling: {what}")));
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return bad("temperature must be a finite number >= 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p must be in (0, 1]");
        }
        if !(0.0..1.0).contains(&self.min_p) {
            return bad("min_p must be in [0, 1)");
        }
        if !self.repetition_penalty.is_finite() || self.repetition_penalty <= 0.0 {
            return bad("repetition_penalty must be > 0");
        }
        for (name, v) in [("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)] {
            if !(-2.0..=2.0).contains(&v) {
                return bad(&format!("{name} must be between -2 and 2"));
            }
        }
        if self.logit_bias.len() > MAX_LOGIT_BIAS {
            return bad(&format!("at most {MAX_LOGIT_BIAS} logit_bias entries"));
        }
        if self.logit_bias.windows(2).any(|w| w[0].0 >= w[1].0) {
            return bad("logit_bias token ids must ascend without repeats");
        }
        if self.logit_bias.iter().any(|&(_, b)| !(-100.0..=100.0).contains(&b)) {
            return bad("logit_bias values must be between -100 and 100");
        }
        if self.logprobs.is_some_and(|n| usize::from(n) > MAX_TOP_LOGPROBS) {
            return bad(&format!("top_logprobs must be at most {MAX_TOP_LOGPROBS}"));
        }
        Ok(())
    }
}

/// SplitMix64: small, fast, and the same on every platform.
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A seeded sampler.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
}

/// The distribution the sampler draws from after every transform: sparse
/// (token, probability) pairs, most likely first, summing to 1.
pub type Distribution = Vec<(u32, f32)>;

impl Sampler {
    /// A sampler; fails on out-of-range parameters.
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        let rng = Rng(params.seed);
        Ok(Self { params, rng })
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The post-transform distribution for `logits` given the tokens `seen`.
    /// Greedy returns the single argmax with probability 1.
    pub fn distribution(&self, logits: &[f32], seen: Seen<'_>) -> Result<Distribution> {
        if logits.is_empty() {
            return Err(ModelError::Invalid("no logits".into()));
        }
        let mut logits = logits.to_vec();
        let p = &self.params;
        for &(t, b) in &p.logit_bias {
            if let Some(l) = logits.get_mut(t as usize) {
                *l += b;
            }
        }
        if p.repetition_penalty != 1.0 {
            let history = seen.recent;
            let start = history.len().saturating_sub(p.repetition_window);
            let mut seen: Vec<u32> = history[start..].to_vec();
            seen.sort_unstable();
            seen.dedup();
            for t in seen {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 { *l / p.repetition_penalty } else { *l * p.repetition_penalty };
                }
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            let mut counts: Vec<u32> = seen.output[seen.output.len().saturating_sub(PENALTY_WINDOW)..].to_vec();
            counts.sort_unstable();
            for run in counts.chunk_by(|a, b| a == b) {
                if let Some(l) = logits.get_mut(run[0] as usize) {
                    *l -= run.len() as f32 * p.frequency_penalty + p.presence_penalty;
                }
            }
        }
        if p.temperature == 0.0 {
            return Ok(vec![(argmax(&logits), 1.0)]);
        }
        let mut order: Vec<u32> = (0..logits.len() as u32).collect();
        order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
        if p.top_k > 0 {
            order.truncate(p.top_k);
        }
        let max = logits[order[0] as usize];
        let mut probs: Vec<f64> =
            order.iter().map(|&i| (((logits[i as usize] - max) / p.temperature) as f64).exp()).collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= total);
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            let mut keep = probs.len();
            for (i, x) in probs.iter().enumerate() {
                cum += x;
                if cum >= f64::from(p.top_p) {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep);
            order.truncate(keep);
        }
        if p.min_p > 0.0 {
            let floor = probs[0] * f64::from(p.min_p);
            let keep = probs.iter().take_while(|&&x| x >= floor).count().max(1);
            probs.truncate(keep);
            order.truncate(keep);
        }
        let total: f64 = probs.iter().sum();
        // Masked tokens (−∞) have no probability: they are not in the
        // distribution, so no draw can land on one.
        Ok(order.into_iter().zip(probs).filter(|&(_, x)| x > 0.0).map(|(t, x)| (t, (x / total) as f32)).collect())
    }

    /// A uniform draw in `[0, 1)` from this sampler's random stream (the
    /// acceptance test of speculative verification).
    pub fn uniform(&mut self) -> f64 {
        self.rng.next_f64()
    }

    /// Draws from a distribution with this sampler's random stream.
    pub fn draw(&mut self, dist: &Distribution) -> u32 {
        if dist.len() == 1 {
            return dist[0].0;
        }
        let u = self.rng.next_f64();
        let mut cum = 0.0f64;
        for &(t, p) in dist {
            cum += f64::from(p);
            if u < cum {
                return t;
            }
        }
        dist[dist.len() - 1].0
    }

    /// The next token for `logits`.
    pub fn sample(&mut self, logits: &[f32], seen: Seen<'_>) -> Result<u32> {
        let d = self.distribution(logits, seen)?;
        Ok(self.draw(&d))
    }
}

/// Most alternatives `top_logprobs` may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// The model's own log-probabilities (log-softmax of the raw logits, before
/// bias, penalties and temperature, as OpenAI and vLLM report them) of the
/// `top` most likely tokens, most likely first, then of each of `also` not
/// among them.
pub fn logprobs(logits: &[f32], top: usize, also: &[u32]) -> Vec<(u32, f32)> {
    if logits.is_empty() {
        return Vec::new();
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = f64::from(max) + logits.iter().map(|&l| f64::from(l - max).exp()).sum::<f64>().ln();
    let lp = |t: u32| (t, (f64::from(logits[t as usize]) - lse) as f32);
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    let top = top.min(order.len());
    if top > 0 {
        let by = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
        order.select_nth_unstable_by(top - 1, by);
        order.truncate(top);
        order.sort_by(by);
    } else {
        order.clear();
    }
    let mut out: Vec<(u32, f32)> = order.iter().map(|&t| lp(t)).collect();
    for &t in also {
        if (t as usize) < logits.len() && !out.iter().any(|e| e.0 == t) {
            out.push(lp(t));
        }
    }
    out
}

/// Index of the largest logit (lowest index on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_is_argmax_with_lowest_index_on_ties() {
        let s = Sampler::new(SamplingParams::default()).unwrap();
        assert_eq!(s.distribution(&[0.0, 2.0, 2.0, 1.0], Seen::default()).unwrap(), vec![(1, 1.0)]);
    }

    #[test]
    fn same_seed_same_draws() {
        let p = SamplingParams { temperature: 1.0, seed: 7, ..Default::default() };
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let mut a = Sampler::new(p.clone()).unwrap();
        let mut b = Sampler::new(p).unwrap();
        let xs: Vec<u32> = (0..100).map(|_| a.sample(&logits, Seen::default()).unwrap()).collect();
        let ys: Vec<u32> = (0..100).map(|_| b.sample(&logits, Seen::default()).unwrap()).collect();
        assert_eq!(xs, ys);
        assert!(xs.iter().collect::<std::collections::HashSet<_>>().len() > 3);
    }

    #[test]
    fn filters_apply_and_renormalise() {
        let logits = [3.0, 2.0, 1.0, 0.0, -1.0];
        let d = Sampler::new(SamplingParams { temperature: 1.0, top_k: 2, ..Default::default() })
            .unwrap()
            .distribution(&logits, Seen::default())
            .unwrap();
        assert_eq!(d.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1]);
        assert!((d.iter().map(|x| x.1).sum::<f32>() - 1.0).abs() < 1e-6);
        let d = Sampler::new(SamplingParams { temperature: 1.0, top_p: 0.5, ..Default::default() })
            .unwrap()
            .distribution(&logits, Seen::default())
            .unwrap();
        assert_eq!(d.len(), 1);
        let d = Sampler::new(SamplingParams { temperature: 1.0, min_p: 0.3, ..Default::default() })
            .unwrap()
            .distribution(&logits, Seen::default())
            .unwrap();
        assert_eq!(d.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1]);
    }

    #[test]
    fn repetition_penalty_pushes_seen_tokens_down() {
        let s = Sampler::new(SamplingParams { repetition_penalty: 2.0, ..Default::default() }).unwrap();
        assert_eq!(s.distribution(&[1.0, 1.5], Seen { recent: &[1], output: &[] }).unwrap()[0].0, 0);
    }

    #[test]
    fn empirical_frequencies_follow_the_distribution() {
        let logits = [1.0f32, 0.0, -1.0];
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, seed: 3, ..Default::default() }).unwrap();
        let d = s.distribution(&logits, Seen::default()).unwrap();
        let n = 20_000;
        let mut counts = [0usize; 3];
        for _ in 0..n {
            counts[s.draw(&d) as usize] += 1;
        }
        for &(t, p) in &d {
            let f = counts[t as usize] as f32 / n as f32;
            assert!((f - p).abs() < 0.015, "token {t}: {f} vs {p}");
        }
    }

    #[test]
    fn refuses_bad_parameters() {
        for p in [
            SamplingParams { temperature: -1.0, ..Default::default() },
            SamplingParams { top_p: 0.0, ..Default::default() },
            SamplingParams { min_p: 1.0, ..Default::default() },
            SamplingParams { repetition_penalty: 0.0, ..Default::default() },
            SamplingParams { temperature: f32::NAN, ..Default::default() },
            SamplingParams { presence_penalty: 2.5, ..Default::default() },
            SamplingParams { frequency_penalty: -2.1, ..Default::default() },
            SamplingParams { frequency_penalty: f32::NAN, ..Default::default() },
            SamplingParams { logit_bias: vec![(3, 100.5)], ..Default::default() },
            SamplingParams { logit_bias: vec![(3, 1.0), (3, 2.0)], ..Default::default() },
            SamplingParams { logit_bias: vec![(4, 1.0), (3, 2.0)], ..Default::default() },
            SamplingParams {
                logit_bias: (0..MAX_LOGIT_BIAS as u32 + 1).map(|t| (t, 1.0)).collect(),
                ..Default::default()
            },
        ] {
            assert!(Sampler::new(p).is_err());
        }
    }

    /// OpenAI's documented transform, written out for three tokens:
    /// `mu[j] + bias[j] − c[j]·frequency − [c[j] > 0]·presence`, then softmax.
    #[test]
    fn bias_and_penalties_follow_openais_formula() {
        let logits = [2.0f32, 1.0, 0.5, -1.0];
        let output = [0u32, 0, 2, 0];
        let params = SamplingParams {
            temperature: 1.0,
            presence_penalty: 0.5,
            frequency_penalty: 0.25,
            logit_bias: vec![(1, 1.5), (3, -100.0)],
            ..Default::default()
        };
        // Token 0: seen 3 times: 2 − 3·0.25 − 0.5 = 0.75. Token 1: 1 + 1.5 = 2.5.
        // Token 2: seen once: 0.5 − 0.25 − 0.5 = −0.25. Token 3: −101.
        let want = [0.75f64, 2.5, -0.25, -101.0];
        let z: f64 = want.iter().map(|x| x.exp()).sum();
        let d =
            Sampler::new(params.clone()).unwrap().distribution(&logits, Seen { recent: &[], output: &output }).unwrap();
        assert_eq!(d.iter().map(|e| e.0).collect::<Vec<_>>(), vec![1, 0, 2, 3]);
        for &(t, p) in &d {
            assert!((f64::from(p) - want[t as usize].exp() / z).abs() < 1e-6, "token {t}: {p}");
        }
        // Greedy takes the biased argmax; the recent context alone (the
        // prompt) is not penalised by presence or frequency.
        let greedy = Sampler::new(SamplingParams { temperature: 0.0, ..params }).unwrap();
        assert_eq!(greedy.distribution(&logits, Seen { recent: &[1, 1, 1], output: &[] }).unwrap(), vec![(1, 1.0)]);
        // A bias on an id past the vocabulary changes nothing.
        let far = Sampler::new(SamplingParams { logit_bias: vec![(99, 100.0)], ..Default::default() }).unwrap();
        assert_eq!(far.distribution(&logits, Seen::default()).unwrap(), vec![(0, 1.0)]);
    }

    #[test]
    fn logprobs_are_the_raw_log_softmax() {
        let logits = [1.0f32, 3.0, 2.0, 3.0];
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        let lp = |t: usize| (f64::from(logits[t]) - z.ln()) as f32;
        // Ties keep the lower id first; `also` adds tokens outside the top.
        assert_eq!(logprobs(&logits, 2, &[0, 3]), vec![(1, lp(1)), (3, lp(3)), (0, lp(0))]);
        assert_eq!(logprobs(&logits, 0, &[2]), vec![(2, lp(2))]);
        let all = logprobs(&logits, 10, &[]);
        assert_eq!(all.len(), 4);
        assert!((all.iter().map(|e| f64::from(e.1).exp()).sum::<f64>() - 1.0).abs() < 1e-6);
    }
}
