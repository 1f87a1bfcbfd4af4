//! Pipelined speculation: how many verification rounds one session keeps in
//! flight around the ring.
//!
//! Round n+1 is drafted and sent while round n travels, on the assumption
//! that every draft still in flight will be kept. Its first token is checked
//! against the last distribution of the round before it, so the drafts of
//! all rounds in flight form one chain, verified as one round over the whole
//! chain would verify it ([`super::verify_drafts`]). A verdict that rejects a
//! draft cancels every round after it.
//!
//! Another round pays when it is likely to survive and the wait for the
//! oldest verdict pays for drafting it:
//!
//! - every draft in flight must be kept for the new round to count: it goes
//!   out only while the tokens it is expected to commit,
//!   `a^(drafts in flight) · (1 − a^(k+1)) / (1 − a)` (`a` the session's
//!   measured per-token acceptance), are at least [`MIN_EXPECTED_TOKENS`],
//!   half the token a plain round commits. The round costs the session
//!   nothing while its draft fits in the wait for the oldest verdict (the
//!   next test); what it costs is the stages' work, which other sessions
//!   could use, so a weak drafter stays at one round per trip. (A threshold
//!   of one token, or a survival probability of 0.5 whatever the round's
//!   size, held a strong drafter at two or three rounds for most of a
//!   32-token answer: 1.4× one round per trip at 50 ms against 1.8× now.)
//! - the wait it fills must pay for the draft: the entry drafts while the
//!   oldest verdict is still on its way (expected after the measured round
//!   time for its k, minus the time it has travelled: the wait `w`), and a
//!   verdict that arrives mid-draft waits for the draft to end. If every
//!   draft in flight is kept (probability `s`, as above), the new round
//!   leaves `w` earlier than it would after the verdict; if one is
//!   rejected, the draft is wasted and the correction leaves up to
//!   `t_draft − w` late. The round goes when `s · w ≥ (1 − s) · (t_draft −
//!   w)`, that is `w ≥ (1 − s) · t_draft`. (Requiring the whole draft to
//!   fit in the wait, `t_draft < w`, held a strong drafter at two or three
//!   rounds of four at 50 ms per hop: the oldest verdict was always within
//!   a draft's time of arriving.) A drafter that is sure (`s` = 1) drafts
//!   through any wait; a weak one only early in a long wait, so on
//!   loopback, where a round takes about as long as drafting, a drafter
//!   that is often wrong is not pipelined.
//!
//! A fixed depth (route `speculation.depth`, a request's `depth`) skips both
//! tests: tests and benchmarks compare depths with it.

use std::time::Duration;

/// Most rounds one session may have in flight.
pub const MAX_DEPTH: usize = 8;
/// Default most rounds in flight for adaptive depth.
pub const DEFAULT_DEPTH_MAX: usize = 4;
/// Least tokens another round on top of those in flight must be expected
/// to commit (a plain round commits one; see the module's notes).
pub const MIN_EXPECTED_TOKENS: f64 = 0.5;

/// How many rounds in flight one session may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Depth {
    /// Most rounds in flight (1 = one round per trip, no pipelining).
    pub max: usize,
    /// Keep exactly `max` rounds in flight whenever drafting is possible,
    /// whatever the acceptance and round time.
    pub fixed: bool,
}

impl Default for Depth {
    fn default() -> Self {
        Self { max: DEFAULT_DEPTH_MAX, fixed: false }
    }
}

/// What the session knows when it could send another round.
#[derive(Clone, Copy, Debug)]
pub struct InFlight {
    /// Rounds in flight.
    pub rounds: usize,
    /// Drafted tokens in flight, not yet verified.
    pub drafts: usize,
    /// Measured per-token acceptance.
    pub acceptance: f64,
    /// Drafts the next round would carry.
    pub k: usize,
    /// How long the oldest round in flight has travelled.
    pub oldest_elapsed: Duration,
    /// Its expected round time (none before any round was measured).
    pub oldest_expected: Option<Duration>,
    /// The expected time to draft the next round.
    pub next_draft: Duration,
}

impl Depth {
    /// Adaptive depth up to `max`, or exactly `fixed`.
    pub fn new(max: usize, fixed: Option<usize>) -> Self {
        match fixed {
            Some(d) => Self { max: d.clamp(1, MAX_DEPTH), fixed: true },
            None => Self { max: max.clamp(1, MAX_DEPTH), fixed: false },
        }
    }

    /// Whether to draft and send another round on top of those in flight.
    pub fn another(&self, now: InFlight) -> bool {
        if now.rounds == 0 || now.rounds >= self.max {
            return now.rounds == 0;
        }
        if self.fixed {
            return true;
        }
        let a = now.acceptance.clamp(0.0, 1.0);
        let survival = a.powi(now.drafts.min(i32::MAX as usize) as i32);
        let Some(expected) = now.oldest_expected else { return false };
        let wait = expected.saturating_sub(now.oldest_elapsed).as_secs_f64();
        survival * super::expected_tokens(a, now.k) >= MIN_EXPECTED_TOKENS
            && wait >= (1.0 - survival) * now.next_draft.as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now(rounds: usize, drafts: usize, a: f64, elapsed_ms: u64, expected_ms: Option<u64>, draft_ms: u64) -> InFlight {
        InFlight {
            rounds,
            drafts,
            acceptance: a,
            k: 6,
            oldest_elapsed: Duration::from_millis(elapsed_ms),
            oldest_expected: expected_ms.map(Duration::from_millis),
            next_draft: Duration::from_millis(draft_ms),
        }
    }

    #[test]
    fn a_strong_drafter_on_a_slow_ring_fills_it_up_to_the_limit() {
        let d = Depth::new(4, None);
        // 150 ms rounds, 20 ms to draft: room for more rounds.
        assert!(d.another(now(1, 6, 0.98, 0, Some(150), 20)));
        assert!(d.another(now(3, 18, 0.98, 60, Some(150), 20)));
        assert!(!d.another(now(4, 24, 0.98, 60, Some(150), 20)), "the limit holds");
        // With nothing in flight a round always goes (it is not pipelined).
        assert!(d.another(now(0, 0, 0.0, 0, None, 20)));
    }

    #[test]
    fn weak_drafters_fast_rings_and_late_rounds_stay_at_one_round() {
        let d = Depth::new(4, None);
        // Survival 0.6^6 = 0.05.
        assert!(!d.another(now(1, 6, 0.6, 0, Some(150), 20)));
        // Loopback: a round takes 12 ms, drafting 20 ms; a = 0.9 keeps six
        // drafts with 0.53, so the draft risks 9.4 ms and the wait is 12 ms
        // only when the round has just left.
        assert!(d.another(now(1, 6, 0.9, 0, Some(12), 20)));
        assert!(!d.another(now(1, 6, 0.9, 4, Some(12), 20)));
        // The oldest verdict is due in 2 ms; 12 drafts in flight at a = 0.97
        // survive with 0.69, so a 20 ms draft risks 6.2 ms.
        assert!(!d.another(now(2, 12, 0.97, 148, Some(150), 20)));
        // Nothing measured yet.
        assert!(!d.another(now(1, 6, 1.0, 0, None, 20)));
        // Depth 1 never pipelines.
        assert!(!Depth::new(1, None).another(now(1, 1, 1.0, 0, Some(1000), 0)));
    }

    #[test]
    fn a_round_goes_while_it_is_expected_to_commit_half_a_plain_rounds_token() {
        let d = Depth::new(4, None);
        // a = 0.93, 18 drafts in flight: survives with 0.27, commits 5.96
        // if it does, 1.6 expected (a survival threshold of 0.5 refused it).
        assert!(d.another(now(3, 18, 0.93, 0, Some(150), 20)));
        // a = 0.8: 6 in flight gives 0.26 · 3.95 = 1.03, 12 gives 0.27.
        assert!(d.another(now(1, 6, 0.8, 0, Some(150), 20)));
        assert!(!d.another(now(2, 12, 0.8, 0, Some(150), 20)));
        // One draft on one in flight: a = 0.5 gives 0.5 · 1.5 = 0.75, a = 0.3
        // gives 0.3 · 1.3 = 0.39.
        let one = |a| InFlight { k: 1, ..now(1, 1, a, 0, Some(150), 20) };
        assert!(d.another(one(0.5)));
        assert!(!d.another(one(0.3)));
    }

    #[test]
    fn a_round_is_drafted_into_a_wait_shorter_than_the_draft_when_a_rejection_is_unlikely() {
        let d = Depth::new(4, None);
        // At 50 ms per hop: 17 drafts in flight at a = 0.99 survive with
        // 0.84, the oldest verdict is due in 18 ms and drafting takes 30 ms:
        // the draft risks 4.7 ms (requiring it to fit refused it).
        assert!(d.another(now(3, 17, 0.99, 232, Some(250), 30)));
        // At a = 0.9 the same wait does not pay (survival 0.17: 24.9 ms).
        assert!(!d.another(now(3, 17, 0.9, 232, Some(250), 30)));
        // A sure drafter drafts through an overdue verdict.
        assert!(d.another(now(3, 17, 1.0, 300, Some(250), 30)));
    }

    #[test]
    fn a_fixed_depth_is_kept_whatever_the_measurements() {
        let d = Depth::new(4, Some(3));
        assert!(d.another(now(2, 12, 0.0, 0, None, 1000)));
        assert!(!d.another(now(3, 0, 1.0, 0, Some(1000), 0)));
        assert_eq!(Depth::new(4, Some(99)).max, MAX_DEPTH);
        assert_eq!(Depth::new(0, None).max, 1);
    }
}
