//! Prompt lookup: no weights. The longest suffix of the context (up to
//! `max_n` tokens, at least `min_n`) that occurred earlier in the context
//! proposes the tokens that followed its latest earlier occurrence. Strong
//! where the answer repeats the prompt: code edits, summaries, quotes.

use super::{Draft, DraftMode, Drafter};
use crate::model::error::Result;

/// Prompt-lookup drafter.
#[derive(Clone, Debug)]
pub struct NgramDrafter {
    /// Longest suffix tried.
    pub max_n: usize,
    /// Shortest suffix accepted as a match.
    pub min_n: usize,
}

impl Default for NgramDrafter {
    fn default() -> Self {
        Self { max_n: 4, min_n: 2 }
    }
}

impl NgramDrafter {
    /// The proposal for `context`, up to `k` tokens (possibly none).
    pub fn lookup(&self, context: &[u32], k: usize) -> Vec<u32> {
        let len = context.len();
        if k == 0 {
            return Vec::new();
        }
        for n in (self.min_n.max(1)..=self.max_n.min(len.saturating_sub(1))).rev() {
            let suffix = &context[len - n..];
            // The latest earlier occurrence that has a continuation.
            let found = (0..len - n).rev().find(|&j| &context[j..j + n] == suffix);
            if let Some(j) = found {
                let from = j + n;
                return context[from..(from + k).min(len)].to_vec();
            }
        }
        Vec::new()
    }
}

impl Drafter for NgramDrafter {
    fn name(&self) -> &'static str {
        "ngram"
    }

    fn draft(&mut self, context: &[u32], k: usize, _mode: &DraftMode) -> Result<Draft> {
        Ok(Draft { tokens: self.lookup(context, k), q: Vec::new() })
    }

    fn is_cheap(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_what_followed_the_latest_match_of_the_longest_suffix() {
        let d = NgramDrafter::default();
        // "1 2 3 4 9 | 1 2 3 4 7 | 1 2 3" → the suffix 1 2 3 last occurred before "4 7".
        let ctx = [1, 2, 3, 4, 9, 1, 2, 3, 4, 7, 1, 2, 3];
        assert_eq!(d.lookup(&ctx, 3), vec![4, 7, 1]);
        assert_eq!(d.lookup(&ctx, 1), vec![4]);
        assert_eq!(d.lookup(&ctx, 0), Vec::<u32>::new());
        // The continuation stops at the end of the context.
        assert_eq!(d.lookup(&[5, 6, 5, 6], 8), vec![5, 6]);
        // No repeated suffix of two or more tokens: nothing.
        assert!(d.lookup(&[1, 2, 3, 4, 5, 6], 4).is_empty());
        assert!(d.lookup(&[], 4).is_empty());
        assert!(d.lookup(&[7], 4).is_empty());
    }
}
