//! Prompt lookup first, the draft model elsewhere. Where the context repeats
//! itself (a code edit, a quote, a list) the lookup drafts for nothing; where
//! it does not, or where its match runs out before `k`, the draft model
//! continues from the context and the looked-up tokens.

use std::sync::Arc;

use super::model::{DraftModel, ModelDrafter};
use super::ngram::NgramDrafter;
use super::{Draft, DraftMode, Drafter};
use crate::model::error::Result;

/// The shortest repeated suffix the lookup acts on: a two-token match is
/// common in prose by chance, and the model guesses better there.
const MIN_MATCH: usize = 3;

/// Prompt lookup, then a draft model.
#[derive(Debug)]
pub struct HybridDrafter {
    lookup: NgramDrafter,
    model: ModelDrafter,
}

impl HybridDrafter {
    /// A drafter with an empty cache on `model`.
    pub fn new(model: Arc<DraftModel>) -> Self {
        Self { lookup: NgramDrafter { min_n: MIN_MATCH, ..NgramDrafter::default() }, model: ModelDrafter::new(model) }
    }
}

impl Drafter for HybridDrafter {
    fn name(&self) -> &'static str {
        "ngram+model"
    }

    fn prepare(&mut self, context: &[u32]) -> Result<()> {
        self.model.prepare(context)
    }

    fn draft(&mut self, context: &[u32], k: usize, mode: &DraftMode) -> Result<Draft> {
        let found = self.lookup.lookup(context, k);
        // A looked-up token is proposed with certainty: q = 1 for it.
        let q = match mode {
            DraftMode::Greedy => Vec::new(),
            DraftMode::Sample(_) => found.iter().map(|&t| vec![(t, 1.0)]).collect(),
        };
        let mut draft = Draft { tokens: found, q };
        let rest = k - draft.tokens.len();
        if rest > 0 {
            let more = if draft.tokens.is_empty() {
                self.model.draft(context, rest, mode)?
            } else {
                let extended: Vec<u32> = context.iter().chain(&draft.tokens).copied().collect();
                self.model.draft(&extended, rest, mode)?
            };
            draft.tokens.extend(more.tokens);
            draft.q.extend(more.q);
        }
        Ok(draft)
    }
}
