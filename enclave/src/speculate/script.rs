//! A drafter that proposes a given continuation: with the target's own
//! output it is an oracle (every draft right), with that output altered an
//! adversary (every draft wrong). For tests and benchmarks; the output does
//! not depend on it, only the speed does.

use super::{Draft, DraftMode, Drafter};
use crate::model::error::Result;

/// Proposes `tokens[i..i + k]` after `prompt_len + i` context tokens.
#[derive(Clone, Debug)]
pub struct ScriptDrafter {
    prompt_len: usize,
    tokens: Vec<u32>,
}

impl ScriptDrafter {
    /// A drafter for a prompt of `prompt_len` tokens.
    pub fn new(prompt_len: usize, tokens: Vec<u32>) -> Self {
        Self { prompt_len, tokens }
    }
}

impl Drafter for ScriptDrafter {
    fn name(&self) -> &'static str {
        "script"
    }

    fn draft(&mut self, context: &[u32], k: usize, _mode: &DraftMode) -> Result<Draft> {
        let done = context.len().saturating_sub(self.prompt_len).min(self.tokens.len());
        let end = (done + k).min(self.tokens.len());
        Ok(Draft { tokens: self.tokens[done..end].to_vec(), q: Vec::new() })
    }

    fn is_cheap(&self) -> bool {
        true
    }
}
