//! llama.cpp's answers for the reference model (SmolLM2-135M-Instruct Q4_1):
//! prompts, greedy continuations, top-2 logit gaps and first-position top 5,
//! recorded with llama-cpp-python (`scripts/reference/`). The model tests and
//! `veil-shard device-check` hold every compute path to them.

/// The recorded cases.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct Fixtures {
    /// One per prompt.
    pub cases: Vec<Case>,
}

/// One prompt and llama.cpp's greedy answer to it.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct Case {
    /// `plain` or `chat`.
    pub kind: String,
    /// The prompt text.
    pub text: String,
    /// The prompt's token ids.
    pub prompt_ids: Vec<u32>,
    /// llama.cpp's greedy continuation.
    pub greedy_ids: Vec<u32>,
    /// Per continuation step, llama.cpp's top-1 minus top-2 logit.
    pub top2_gaps: Vec<f32>,
    /// llama.cpp's five most likely first tokens with their logits.
    pub first_top5: Vec<(u32, f32)>,
}

/// Below this llama.cpp top-2 gap another engine may pick the runner-up
/// (kernels round differently); a differing token above it is a fault.
pub const NEAR_TIE: f32 = 0.5;

/// The fixtures, compiled in.
pub fn llamacpp() -> Result<Fixtures, serde_json::Error> {
    serde_json::from_str(include_str!("../../testdata/llamacpp_fixtures.json"))
}
