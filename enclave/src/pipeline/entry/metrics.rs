//! The entry's speculation counters and token timings (counts and
//! durations only, no content), for `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};
use veil_wire::metrics::Histogram;

/// Entry-wide speculation counts (no content): for `/metrics`.
#[derive(Debug, Default)]
pub struct SpecCounters {
    /// Decode rounds of every session.
    pub rounds: AtomicU64,
    /// Rounds that carried drafted tokens.
    pub spec_rounds: AtomicU64,
    /// Tokens drafted.
    pub drafted: AtomicU64,
    /// Drafted tokens kept.
    pub accepted: AtomicU64,
    /// Tokens committed by decode rounds.
    pub committed: AtomicU64,
    /// Rounds sent while another round of the session was in flight.
    pub pipelined_rounds: AtomicU64,
    /// Rounds cancelled in flight because a verdict rejected a draft they
    /// were built on.
    pub cancelled_rounds: AtomicU64,
    /// From a session's start (its prompt sent down the route) to its
    /// first token committed.
    pub ttft: Histogram,
    /// Between a session's committed tokens: a round that commits `k`
    /// tokens after a wait `w` counts `k` tokens of `w / k` each (a
    /// speculative round's tokens arrive together).
    pub inter_token: Histogram,
}

impl SpecCounters {
    /// Prometheus text, with the entry stage's cancelled frames.
    pub fn render_with(&self, stage: &crate::pipeline::worker::WorkerCounters) -> String {
        let (_, _, frames, positions) = stage.snapshot();
        let mut out = self.render();
        out += "# HELP veil_entry_cancelled_frames_total Frames the entry's own stage dropped unrun after a cancel.\n# TYPE veil_entry_cancelled_frames_total counter\n";
        out += &format!("veil_entry_cancelled_frames_total {frames}\n");
        out += "# HELP veil_entry_cancelled_positions_total Positions of those frames.\n# TYPE veil_entry_cancelled_positions_total counter\n";
        out += &format!("veil_entry_cancelled_positions_total {positions}\n");
        out
    }

    /// Prometheus text.
    pub fn render(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut out = String::new();
        out += "# HELP veil_entry_decode_rounds_total Pipeline rounds after the prompt.\n# TYPE veil_entry_decode_rounds_total counter\n";
        out += &format!("veil_entry_decode_rounds_total {}\n", g(&self.rounds));
        out += "# HELP veil_entry_spec_rounds_total Rounds that verified drafted tokens.\n# TYPE veil_entry_spec_rounds_total counter\n";
        out += &format!("veil_entry_spec_rounds_total {}\n", g(&self.spec_rounds));
        out += "# HELP veil_entry_drafted_tokens_total Tokens proposed by drafters.\n# TYPE veil_entry_drafted_tokens_total counter\n";
        out += &format!("veil_entry_drafted_tokens_total {}\n", g(&self.drafted));
        out += "# HELP veil_entry_accepted_tokens_total Drafted tokens the target kept.\n# TYPE veil_entry_accepted_tokens_total counter\n";
        out += &format!("veil_entry_accepted_tokens_total {}\n", g(&self.accepted));
        out += "# HELP veil_entry_committed_tokens_total Tokens committed by decode rounds (tokens per round = this / rounds).\n# TYPE veil_entry_committed_tokens_total counter\n";
        out += &format!("veil_entry_committed_tokens_total {}\n", g(&self.committed));
        out += "# HELP veil_entry_pipelined_rounds_total Rounds sent while an earlier round of the session was in flight.\n# TYPE veil_entry_pipelined_rounds_total counter\n";
        out += &format!("veil_entry_pipelined_rounds_total {}\n", g(&self.pipelined_rounds));
        out += "# HELP veil_entry_cancelled_rounds_total Rounds in flight cancelled because a verdict rejected a draft they built on.\n# TYPE veil_entry_cancelled_rounds_total counter\n";
        out += &format!("veil_entry_cancelled_rounds_total {}\n", g(&self.cancelled_rounds));
        out += &self.ttft.render(
            "veil_entry_time_to_first_token_seconds",
            "From a session's start (prompt sent down the route) to its first token committed.",
        );
        out += &self.inter_token.render(
            "veil_entry_inter_token_seconds",
            "Between a session's committed tokens (a round's wait shared by the tokens it committed).",
        );
        out
    }
}
