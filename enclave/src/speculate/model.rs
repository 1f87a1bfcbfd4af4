//! A draft model: any GGUF with the target's vocabulary, run whole on the
//! entry with its own KV cache per session, rolled back with the target's.
//! `veil-shard derive-draft` makes one from the target itself (its first
//! layers, optionally requantized) when no second model is at hand.

use std::path::Path;
use std::sync::Arc;

use super::{Draft, DraftMode, Drafter};
use crate::local_model::{LocalModel, LocalSession};
use crate::model::error::{ModelError, Result};
use crate::text::sampler::{argmax, Sampler, SamplingParams, Seen};
use crate::text::tokenizer::Tokenizer;

/// KV budget of one drafting session.
const DRAFT_KV_BUDGET: usize = 64 << 20;

/// A loaded draft model, shared by every session's [`ModelDrafter`].
#[derive(Debug)]
pub struct DraftModel {
    model: LocalModel,
    name: String,
}

impl DraftModel {
    /// Loads `path` and checks that its vocabulary is the target's: the same
    /// size and the same text for every token id.
    pub fn load(path: &Path, target: &Tokenizer) -> Result<Self> {
        let (model, tokenizer) = LocalModel::load(path, &[])?;
        if tokenizer.vocab_size() != target.vocab_size() {
            return Err(ModelError::Invalid(format!(
                "draft model {} has {} tokens, the target {}: drafts must share the target's vocabulary",
                path.display(),
                tokenizer.vocab_size(),
                target.vocab_size()
            )));
        }
        for id in 0..target.vocab_size() as u32 {
            if tokenizer.decode(&[id]).ok() != target.decode(&[id]).ok() {
                return Err(ModelError::Invalid(format!(
                    "draft model {} decodes token {id} differently from the target",
                    path.display()
                )));
            }
        }
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        Ok(Self { model, name })
    }

    /// The file name it was loaded from.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The root of its manifest (every tensor and the GGUF metadata it read).
    pub fn manifest_root(&self) -> [u8; 32] {
        self.model.slices()[0].manifest().root()
    }
}

/// One session's drafting state on a [`DraftModel`].
#[derive(Debug)]
pub struct ModelDrafter {
    model: Arc<DraftModel>,
    session: LocalSession,
    /// The tokens whose KV the session holds, in order.
    fed: Vec<u32>,
    /// The drafter's own random stream (sampling targets).
    sampler: Option<Sampler>,
}

impl ModelDrafter {
    /// A drafter with an empty cache.
    pub fn new(model: Arc<DraftModel>) -> Self {
        let session = model.model.session(DRAFT_KV_BUDGET);
        Self { model, session, fed: Vec::new(), sampler: None }
    }

    /// Rolls back to the longest common prefix with `context`, then runs the
    /// rest of `context` (at least its last token, for fresh logits).
    fn catch_up(&mut self, context: &[u32]) -> Result<Vec<f32>> {
        if context.is_empty() {
            return Err(ModelError::Invalid("nothing to draft from".into()));
        }
        let mut common = self.fed.iter().zip(context).take_while(|(a, b)| a == b).count().min(context.len() - 1);
        if self.session.truncate(common).is_err() {
            // Further back than a sliding-window layer keeps: start over.
            common = 0;
            self.session.truncate(0)?;
        }
        self.fed.truncate(common);
        let logits = self.model.model.step_last(&mut self.session, &context[common..])?;
        self.fed.extend_from_slice(&context[common..]);
        Ok(logits.row(0).to_vec())
    }
}

impl Drafter for ModelDrafter {
    fn name(&self) -> &'static str {
        "model"
    }

    fn prepare(&mut self, context: &[u32]) -> Result<()> {
        self.catch_up(context).map(|_| ())
    }

    fn draft(&mut self, context: &[u32], k: usize, mode: &DraftMode) -> Result<Draft> {
        let room = self.model.model.context_length().saturating_sub(context.len() + 1);
        let k = k.min(room);
        let mut draft = Draft::default();
        if k == 0 {
            return Ok(draft);
        }
        let mut logits = self.catch_up(context)?;
        for i in 0..k {
            let token = match mode {
                DraftMode::Greedy => argmax(&logits),
                DraftMode::Sample(params) => {
                    let sampler = match &mut self.sampler {
                        Some(s) => s,
                        None => self.sampler.insert(Sampler::new(SamplingParams {
                            // Independent of the target's stream.
                            seed: params.seed ^ 0x5EC_D4AF_7000_0001,
                            ..params.clone()
                        })?),
                    };
                    let q = sampler.distribution(&logits, Seen::default())?;
                    let token = sampler.draw(&q);
                    draft.q.push(q);
                    token
                }
            };
            draft.tokens.push(token);
            if i + 1 < k {
                logits = self.model.model.step_last(&mut self.session, &[token])?.row(0).to_vec();
                self.fed.push(token);
            }
        }
        Ok(draft)
    }
}
