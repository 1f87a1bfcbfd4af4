//! Prometheus histograms of durations, shared by the relay and the entry:
//! lock-free (one atomic add per bucket an observation falls into), and
//! rendered in the text exposition format. They hold timings and counts,
//! never content.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of every latency histogram, seconds: from a millisecond
/// (a token between two others) to five minutes (a long answer in all).
pub const LATENCY_BUCKETS: [f64; 16] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];

/// A cumulative histogram over [`LATENCY_BUCKETS`].
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        self.observe_n(d, 1);
    }

    /// Records `n` observations of `d` each (the tokens of one burst, each
    /// given its share of the burst's wait).
    pub fn observe_n(&self, d: Duration, n: u64) {
        if n == 0 {
            return;
        }
        let s = d.as_secs_f64();
        // Cumulative: every bucket whose bound is at or above the value.
        for (bound, c) in LATENCY_BUCKETS.iter().zip(&self.buckets) {
            if s <= *bound {
                c.fetch_add(n, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(n, Ordering::Relaxed);
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros.saturating_mul(n), Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Mean of the observations so far (`None` before the first).
    pub fn mean(&self) -> Option<Duration> {
        let n = self.count();
        (n > 0).then(|| Duration::from_micros(self.sum_micros.load(Ordering::Relaxed) / n))
    }

    /// The histogram as Prometheus text: `# HELP`, `# TYPE`, the buckets,
    /// `_sum` and `_count` of `name`.
    pub fn render(&self, name: &str, help: &str) -> String {
        let mut out = format!("# HELP {name} {help}\n# TYPE {name} histogram\n");
        for (bound, c) in LATENCY_BUCKETS.iter().zip(&self.buckets) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {}", c.load(Ordering::Relaxed));
        }
        let count = self.count();
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {}", self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {count}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_the_text_is_prometheus_shaped() {
        let h = Histogram::default();
        h.observe(Duration::from_millis(3));
        h.observe_n(Duration::from_millis(40), 3);
        h.observe(Duration::from_secs(400));
        let text = h.render("veil_x_seconds", "A test.");
        assert!(text.starts_with("# HELP veil_x_seconds A test.\n# TYPE veil_x_seconds histogram\n"), "{text}");
        // 3 ms: from the 0.005 bucket on; 40 ms (×3): from 0.05; 400 s: only +Inf.
        assert!(text.contains("veil_x_seconds_bucket{le=\"0.0025\"} 0\n"), "{text}");
        assert!(text.contains("veil_x_seconds_bucket{le=\"0.005\"} 1\n"), "{text}");
        assert!(text.contains("veil_x_seconds_bucket{le=\"0.025\"} 1\n"), "{text}");
        assert!(text.contains("veil_x_seconds_bucket{le=\"0.05\"} 4\n"), "{text}");
        assert!(text.contains("veil_x_seconds_bucket{le=\"300\"} 4\n"), "{text}");
        assert!(text.contains("veil_x_seconds_bucket{le=\"+Inf\"} 5\n"), "{text}");
        assert!(text.contains("veil_x_seconds_sum 400.123\n"), "{text}");
        assert!(text.contains("veil_x_seconds_count 5\n"), "{text}");
        assert_eq!(h.count(), 5);
        assert_eq!(Histogram::default().mean(), None);
    }
}
