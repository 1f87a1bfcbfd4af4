//! A routed mixture of experts across a whole batch.
//!
//! Every row (a position of some session) is routed to its top-k experts by
//! llama.cpp's softmax gating. Rows are then grouped by expert across every
//! session in the batch, so each chosen expert's weights are read once per
//! forward and an expert no row chose is never touched. A row's output is
//! the sum, in routing-rank order, of its experts' outputs times their
//! weights: it depends only on the row, so a batch equals each session run
//! alone, bit for bit.

use rayon::prelude::*;

use super::config::{Gating, MoeConfig};
use super::error::{ModelError, Result};
use super::layers::Glu;
use super::weight::{digest_f32s, Projections, Weight};

/// One expert: a gated feed-forward (its gate and up biases, when it has
/// them, are in `gate_up`).
#[derive(Debug)]
pub(crate) struct Expert {
    /// gate, up.
    pub(crate) gate_up: Projections,
    pub(crate) down: Weight,
    pub(crate) down_bias: Option<Vec<f32>>,
}

/// The experts of one block and their router.
#[derive(Debug)]
pub(crate) struct Moe {
    /// `n_expert × n_embd`: one logit per expert.
    pub(crate) router: Weight,
    pub(crate) router_bias: Option<Vec<f32>>,
    pub(crate) experts: Vec<Expert>,
    pub(crate) config: MoeConfig,
    pub(crate) glu: Glu,
}

/// Where one row goes: `(expert, weight)` per routing rank.
pub(crate) type Route = Vec<(usize, f32)>;

/// A routing decision is a near-tie when the last chosen expert's logit
/// is within this of the best unchosen one's: another engine's rounding
/// may choose the other expert there.
pub const NEAR_TIE: f32 = 1e-4;

/// Rows routed, and how many of them were near-ties ([`NEAR_TIE`]), by every
/// mixture of experts in this process since it started (for quality
/// reports: `veil-shard perplexity` prints them).
static ROUTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static NEAR_TIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// `(rows routed, near-ties among them)` so far in this process.
pub fn routing_counts() -> (u64, u64) {
    use std::sync::atomic::Ordering::Relaxed;
    (ROUTED.load(Relaxed), NEAR_TIES.load(Relaxed))
}

/// Whether choosing the top `k` of `logits` is a near-tie: the k-th and
/// (k+1)-th largest logits differ by less than [`NEAR_TIE`].
fn near_tie(logits: &[f32], k: usize) -> bool {
    if k == 0 || k >= logits.len() {
        return false;
    }
    let mut sorted = logits.to_vec();
    sorted.select_nth_unstable_by(k, |a, b| b.total_cmp(a));
    let next = sorted[k];
    let last = sorted[..k].iter().copied().fold(f32::INFINITY, f32::min);
    (last - next).abs() < NEAR_TIE
}

impl Moe {
    /// Builds the block's experts from the gate, up and down matrices of
    /// each, checking every shape against `width` (the hidden size).
    pub(crate) fn new(
        router: Weight,
        gates: Vec<Weight>,
        ups: Vec<Weight>,
        downs: Vec<Weight>,
        config: MoeConfig,
        width: usize,
        glu: Glu,
    ) -> Result<Self> {
        let n = config.n_expert;
        if router.rows() != n || router.cols() != width || gates.len() != n || ups.len() != n || downs.len() != n {
            return Err(ModelError::Malformed(format!(
                "router {}×{} or expert counts ({}, {}, {}) do not match {n} experts of width {width}",
                router.rows(),
                router.cols(),
                gates.len(),
                ups.len(),
                downs.len()
            )));
        }
        let mut experts = Vec::with_capacity(n);
        for ((gate, up), down) in gates.into_iter().zip(ups).zip(downs) {
            if gate.rows() != up.rows() || down.cols() != gate.rows() || down.rows() != width {
                return Err(ModelError::Malformed("an expert's gate, up and down shapes disagree".into()));
            }
            let gate_up = Projections::new(vec![gate, up], vec![None, None], width)?;
            experts.push(Expert { gate_up, down, down_bias: None });
        }
        Ok(Self { router, router_bias: None, experts, config, glu })
    }

    /// The router's bias (one per expert) and each expert's gate, up and
    /// down biases, checked against the shapes.
    pub(crate) fn set_biases(
        &mut self,
        router: Option<Vec<f32>>,
        gate: Vec<Vec<f32>>,
        up: Vec<Vec<f32>>,
        down: Vec<Vec<f32>>,
    ) -> Result<()> {
        let n = self.experts.len();
        if router.as_ref().is_some_and(|r| r.len() != n) || gate.len() != n || up.len() != n || down.len() != n {
            return Err(ModelError::Malformed("expert biases do not match the experts".into()));
        }
        for (((e, g), u), dn) in self.experts.iter_mut().zip(gate).zip(up).zip(down) {
            let ff = e.down.cols();
            if g.len() != ff || u.len() != ff || dn.len() != e.down.rows() {
                return Err(ModelError::Malformed("an expert's bias does not match its matrix".into()));
            }
            e.gate_up.biases = vec![Some(g), Some(u)];
            e.down_bias = Some(dn);
        }
        self.router_bias = router;
        Ok(())
    }

    /// Each row's experts and weights, as llama.cpp's `build_moe_ffn`:
    /// the router's logits (plus its bias), then the gating the model uses
    /// (see [`route_row`]).
    pub(crate) fn route(&self, h: &[f32], m: usize) -> Result<Vec<Route>> {
        let n = self.config.n_expert;
        let mut logits = self.router.matmul(h, m)?;
        if let Some(b) = &self.router_bias {
            for row in logits.chunks_exact_mut(n) {
                row.iter_mut().zip(b).for_each(|(l, b)| *l += b);
            }
        }
        let ties = logits.chunks_exact(n).filter(|row| near_tie(row, self.config.n_used)).count();
        ROUTED.fetch_add(m as u64, std::sync::atomic::Ordering::Relaxed);
        NEAR_TIES.fetch_add(ties as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(logits.chunks_exact(n).map(|row| route_row(row, &self.config)).collect())
    }

    /// The feed-forward of `m` rows `h` (already normed), rows of `width`.
    pub(crate) fn forward(&self, h: &[f32], m: usize, width: usize) -> Result<Vec<f32>> {
        let routes = self.route(h, m)?;
        let k = self.config.n_used;
        // (row, rank) pairs per expert, rows in batch order.
        let mut by_expert: Vec<Vec<(usize, usize)>> = vec![Vec::new(); self.experts.len()];
        for (r, route) in routes.iter().enumerate() {
            for (rank, &(e, _)) in route.iter().enumerate() {
                by_expert[e].push((r, rank));
            }
        }
        // Each chosen expert once, over every row that chose it; the chosen
        // experts side by side on the threads (each output row is still one
        // sequential dot, so the result does not depend on this).
        let chosen: Vec<(&Expert, &[(usize, usize)])> = self
            .experts
            .iter()
            .zip(&by_expert)
            .filter(|(_, rows)| !rows.is_empty())
            .map(|(e, r)| (e, &r[..]))
            .collect();
        let outputs = chosen
            .par_iter()
            .map(|&(expert, rows)| self.expert_forward(expert, h, rows, width))
            .collect::<Result<Vec<_>>>()?;
        let mut ranked = vec![0f32; m * k * width];
        for (&(_, rows), y) in chosen.iter().zip(&outputs) {
            for (&(r, rank), out) in rows.iter().zip(y.chunks_exact(width)) {
                let w = routes[r][rank].1;
                let dst = &mut ranked[(r * k + rank) * width..][..width];
                dst.iter_mut().zip(out).for_each(|(d, o)| *d = o * w);
            }
        }
        // Summed in rank order, as llama.cpp adds its expert views.
        let mut out = vec![0f32; m * width];
        for (r, dst) in out.chunks_exact_mut(width).enumerate() {
            for rank in 0..k {
                let src = &ranked[(r * k + rank) * width..][..width];
                dst.iter_mut().zip(src).for_each(|(d, s)| *d += s);
            }
        }
        Ok(out)
    }

    /// One expert over its rows of `h`: `(rows × width)` out, bias added.
    fn expert_forward(&self, expert: &Expert, h: &[f32], rows: &[(usize, usize)], width: usize) -> Result<Vec<f32>> {
        let x: Vec<f32> = rows.iter().flat_map(|&(r, _)| h[r * width..(r + 1) * width].iter().copied()).collect();
        let mut gu = expert.gate_up.forward(&x, rows.len())?.into_iter();
        let (Some(mut gate), Some(up)) = (gu.next(), gu.next()) else {
            return Err(ModelError::Invalid("expert projections are incomplete".into()));
        };
        self.glu.apply(&mut gate, &up);
        let mut y = expert.down.matmul(&gate, rows.len())?;
        if let Some(b) = &expert.down_bias {
            for row in y.chunks_exact_mut(width) {
                row.iter_mut().zip(b).for_each(|(y, b)| *y += b);
            }
        }
        Ok(y)
    }

    pub(crate) fn digest_into(&self, h: &mut sha2::Sha256) -> Result<()> {
        self.router.digest_into(h)?;
        if let Some(b) = &self.router_bias {
            digest_f32s(h, b);
        }
        for e in &self.experts {
            e.gate_up.digest_into(h)?;
            e.down.digest_into(h)?;
            if let Some(b) = &e.down_bias {
                digest_f32s(h, b);
            }
        }
        digest_f32s(h, &[self.config.n_used as f32]);
        Ok(())
    }
}

/// One row's route under `config`'s gating: softmax over every expert then
/// the top k ([`top_k`]), or the top k logits then a softmax over those k
/// alone (gpt-oss; ggml's `soft_max` sums in double).
pub(crate) fn route_row(logits: &[f32], config: &MoeConfig) -> Route {
    match config.gating {
        Gating::Softmax => top_k(logits, config.n_used, config.norm_weights),
        Gating::SoftmaxOfChosen => {
            let mut order: Vec<usize> = (0..logits.len()).collect();
            order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
            order.truncate(config.n_used);
            let max = order.iter().fold(f32::NEG_INFINITY, |a, &e| a.max(logits[e]));
            let exps: Vec<f32> = order.iter().map(|&e| (logits[e] - max).exp()).collect();
            let inv = (1.0 / exps.iter().map(|&e| f64::from(e)).sum::<f64>()) as f32;
            order.into_iter().zip(exps).map(|(e, x)| (e, x * inv)).collect()
        }
    }
}

/// The top `k` of one row of router logits, as `(expert, weight)`.
pub(crate) fn top_k(logits: &[f32], k: usize, renormalise: bool) -> Route {
    let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let exps: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
    // ggml sums the softmax in double and scales by the rounded inverse.
    let inv = (1.0 / exps.iter().map(|&e| f64::from(e)).sum::<f64>()) as f32;
    let probs: Vec<f32> = exps.iter().map(|&e| e * inv).collect();
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
    order.truncate(k);
    let mut route: Route = order.into_iter().map(|e| (e, probs[e])).collect();
    if renormalise {
        let sum = (route.iter().map(|&(_, w)| f64::from(w)).sum::<f64>() as f32).max(6.103_515_6e-5);
        route.iter_mut().for_each(|(_, w)| *w /= sum);
    }
    route
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_near_tie_is_the_last_chosen_logit_within_1e_4_of_the_next() {
        assert!(near_tie(&[3.0, 1.0, 1.00005, 0.0], 2), "1.00005 against 1.0");
        assert!(!near_tie(&[3.0, 1.0, 1.001, 0.0], 2));
        // Only the boundary counts: two chosen experts tied with each other are not.
        assert!(!near_tie(&[2.0, 2.0, 1.0, 0.0], 2));
        assert!(!near_tie(&[1.0, 1.0], 2) && !near_tie(&[1.0, 1.0], 0));
    }

    use super::*;

    #[test]
    fn top_k_picks_the_largest_and_renormalises() {
        let r = top_k(&[0.1, 3.0, -1.0, 2.0], 2, true);
        assert_eq!(r.iter().map(|e| e.0).collect::<Vec<_>>(), vec![1, 3]);
        let s: f32 = r.iter().map(|e| e.1).sum();
        assert!((s - 1.0).abs() < 1e-6, "{s}");
        let e = (1.0f32).exp();
        assert!((r[0].1 - e / (e + 1.0)).abs() < 1e-6, "{r:?}");
        // Without renormalising, the weights are the softmax over all four.
        let r = top_k(&[0.0, 0.0, 0.0, 0.0], 2, false);
        assert_eq!(r, vec![(0, 0.25), (1, 0.25)], "ties go to the lower index");
    }

    #[test]
    fn gpt_oss_gating_is_a_softmax_over_the_chosen_logits() {
        let config = MoeConfig { n_expert: 4, n_used: 2, norm_weights: false, gating: Gating::SoftmaxOfChosen };
        let r = route_row(&[0.1, 3.0, -1.0, 2.0], &config);
        assert_eq!(r.iter().map(|e| e.0).collect::<Vec<_>>(), vec![1, 3]);
        let e = (1.0f32).exp();
        // Over the two chosen alone: e^3 / (e^3 + e^2), not over all four.
        assert!((r[0].1 - e / (e + 1.0)).abs() < 1e-6, "{r:?}");
        assert!((r[1].1 - 1.0 / (e + 1.0)).abs() < 1e-6, "{r:?}");
        let softmax_all = route_row(&[0.1, 3.0, -1.0, 2.0], &MoeConfig { gating: Gating::Softmax, ..config });
        assert!((softmax_all[0].1 - r[0].1).abs() > 1e-3, "the two gatings must differ here");
    }
}
