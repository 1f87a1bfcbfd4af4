//! Turning logits into the next token: greedy, or temperature with top-k,
//! top-p, min-p and repetition penalty; seeded and reproducible.

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
    /// Seed of the random stream.
    pub seed: u64,
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

    /// The post-transform distribution for `logits` given the `history`.
    /// Greedy returns the single argmax with probability 1.
    pub fn distribution(&self, logits: &[f32], history: &[u32]) -> Result<Distribution> {
        if logits.is_empty() {
            return Err(ModelError::Invalid("no logits".into()));
        }
        let mut logits = logits.to_vec();
        let p = &self.params;
        if p.repetition_penalty != 1.0 {
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
        Ok(order.into_iter().zip(probs).map(|(t, x)| (t, (x / total) as f32)).collect())
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
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<u32> {
        let d = self.distribution(logits, history)?;
        Ok(self.draw(&d))
    }
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
        assert_eq!(s.distribution(&[0.0, 2.0, 2.0, 1.0], &[]).unwrap(), vec![(1, 1.0)]);
    }

    #[test]
    fn same_seed_same_draws() {
        let p = SamplingParams { temperature: 1.0, seed: 7, ..Default::default() };
        let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.3).collect();
        let mut a = Sampler::new(p.clone()).unwrap();
        let mut b = Sampler::new(p).unwrap();
        let xs: Vec<u32> = (0..100).map(|_| a.sample(&logits, &[]).unwrap()).collect();
        let ys: Vec<u32> = (0..100).map(|_| b.sample(&logits, &[]).unwrap()).collect();
        assert_eq!(xs, ys);
        assert!(xs.iter().collect::<std::collections::HashSet<_>>().len() > 3);
    }

    #[test]
    fn filters_apply_and_renormalise() {
        let logits = [3.0, 2.0, 1.0, 0.0, -1.0];
        let d = Sampler::new(SamplingParams { temperature: 1.0, top_k: 2, ..Default::default() })
            .unwrap()
            .distribution(&logits, &[])
            .unwrap();
        assert_eq!(d.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1]);
        assert!((d.iter().map(|x| x.1).sum::<f32>() - 1.0).abs() < 1e-6);
        let d = Sampler::new(SamplingParams { temperature: 1.0, top_p: 0.5, ..Default::default() })
            .unwrap()
            .distribution(&logits, &[])
            .unwrap();
        assert_eq!(d.len(), 1);
        let d = Sampler::new(SamplingParams { temperature: 1.0, min_p: 0.3, ..Default::default() })
            .unwrap()
            .distribution(&logits, &[])
            .unwrap();
        assert_eq!(d.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1]);
    }

    #[test]
    fn repetition_penalty_pushes_seen_tokens_down() {
        let s = Sampler::new(SamplingParams { repetition_penalty: 2.0, ..Default::default() }).unwrap();
        assert_eq!(s.distribution(&[1.0, 1.5], &[1]).unwrap()[0].0, 0);
    }

    #[test]
    fn empirical_frequencies_follow_the_distribution() {
        let logits = [1.0f32, 0.0, -1.0];
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, seed: 3, ..Default::default() }).unwrap();
        let d = s.distribution(&logits, &[]).unwrap();
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
        ] {
            assert!(Sampler::new(p).is_err());
        }
    }
}
