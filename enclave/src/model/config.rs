//! Model hyper-parameters from GGUF metadata, read as llama.cpp reads them.

use super::error::{ModelError, Result};
use super::gguf::GgufFile;

/// Architectures served, as named by `general.architecture`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, SmolLM2 (GGUF q/k weights permuted for interleaved RoPE).
    Llama,
    /// Mistral (as Llama).
    Mistral,
    /// Qwen2/2.5: q/k/v biases, NeoX RoPE.
    Qwen2,
    /// Qwen3: per-head q/k RMSNorm, NeoX RoPE.
    Qwen3,
    /// Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder): Qwen3's
    /// attention, a routed mixture of experts in every block.
    Qwen3Moe,
    /// gpt-oss (20b, 120b): attention sinks, alternating sliding-window and
    /// full attention, YaRN RoPE, biased router and experts, clamped SwiGLU.
    GptOss,
    /// Gemma 3 (dense): embedding scale, pre- and post-norms, GeGLU, q/k
    /// norms, interleaved local (sliding-window) and global attention.
    Gemma3,
}

/// How the chosen experts' weights are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over every expert's logit, then the top k (Mixtral, Qwen3-MoE).
    Softmax,
    /// The top k logits, then a softmax over those k alone (gpt-oss).
    SoftmaxOfChosen,
}

/// YaRN's extension of RoPE past the trained context (ggml's `rope_yarn`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    /// The context the model was trained at before scaling.
    pub orig_ctx: usize,
    /// Dimensions rotating faster than this many turns keep their frequency.
    pub beta_fast: f32,
    /// Dimensions rotating slower than this many turns are interpolated.
    pub beta_slow: f32,
    /// Magnitude scale of cos and sin, before YaRN's own `1 + 0.1 ln(factor)`.
    pub attn_factor: f32,
}

/// RoPE of one kind of layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// Base frequency.
    pub freq_base: f32,
    /// Position scale: `1 / factor` of linear or YaRN scaling, else 1.
    pub freq_scale: f32,
    /// YaRN, when the model scales that way.
    pub yarn: Option<Yarn>,
}

/// Sliding-window attention: which layers see only the last `window` positions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlidingWindow {
    /// Positions a query sees, itself included.
    pub window: usize,
    /// Per layer, whether it is a sliding-window layer.
    pub layers: Vec<bool>,
}

/// A routed mixture-of-experts feed-forward (llama.cpp's softmax gating).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeConfig {
    /// Experts per block (`{arch}.expert_count`).
    pub n_expert: usize,
    /// Experts each position is routed to (`{arch}.expert_used_count`).
    pub n_used: usize,
    /// Whether the chosen experts' weights are renormalised to sum to one.
    pub norm_weights: bool,
    /// How the weights are made.
    pub gating: Gating,
}

/// How RoPE pairs dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (llama.cpp's "normal" RoPE on permuted GGUF weights).
    Interleaved,
    /// First half with second half (NeoX).
    Neox,
}

/// Hyper-parameters of a decoder-only transformer.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Architecture.
    pub arch: Arch,
    /// Number of transformer blocks.
    pub n_layer: usize,
    /// Hidden size.
    pub n_embd: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention).
    pub n_head_kv: usize,
    /// Size of one head.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f64,
    /// RoPE base frequency.
    pub rope_theta: f32,
    /// RoPE pairing.
    pub rope_style: RopeStyle,
    /// RoPE of full-attention layers.
    pub rope: RopeParams,
    /// RoPE of sliding-window layers.
    pub rope_swa: RopeParams,
    /// Sliding-window layers, when the model has them.
    pub swa: Option<SlidingWindow>,
    /// Scale of the attention scores (`1/sqrt(head_dim)` unless the family says).
    pub attn_scale: f32,
    /// Factor on the token embedding (Gemma: `sqrt(n_embd)`).
    pub embed_scale: Option<f32>,
    /// `c · tanh(logit / c)` on the final logits, when set.
    pub final_softcap: Option<f32>,
    /// Context window (positions).
    pub context_length: usize,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// The feed-forward's experts, when it is a mixture.
    pub moe: Option<MoeConfig>,
}

impl Config {
    /// Reads the configuration; refuses architectures we do not serve.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let arch_name = g.meta_str("general.architecture")?.to_owned();
        let (arch, rope_style) = match arch_name.as_str() {
            "llama" => (Arch::Llama, RopeStyle::Interleaved),
            "mistral" => (Arch::Mistral, RopeStyle::Interleaved),
            "qwen2" => (Arch::Qwen2, RopeStyle::Neox),
            "qwen3" => (Arch::Qwen3, RopeStyle::Neox),
            "qwen3moe" => (Arch::Qwen3Moe, RopeStyle::Neox),
            "gpt-oss" => (Arch::GptOss, RopeStyle::Neox),
            "gemma3" => (Arch::Gemma3, RopeStyle::Neox),
            other => {
                return Err(ModelError::Unsupported(format!(
                    "architecture {other:?} (llama with or without experts, mistral, qwen2, qwen3, qwen3moe, \
                     gpt-oss, gemma3 are served)"
                )))
            }
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let usize_of = |k: &str| -> Result<usize> {
            usize::try_from(g.meta_u64(&key(k))?).map_err(|_| ModelError::Malformed(format!("{k} too large")))
        };
        let n_embd = usize_of("embedding_length")?;
        let n_head = usize_of("attention.head_count")?;
        let n_head_kv = usize_of("attention.head_count_kv").unwrap_or(n_head);
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(ModelError::Malformed(format!(
                "head counts {n_head}/{n_head_kv} are not grouped-query compatible"
            )));
        }
        let head_dim = usize_of("attention.key_length").unwrap_or(n_embd / n_head);
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(ModelError::Malformed(format!("head dimension {head_dim} must be even and non-zero")));
        }
        let vocab_size = match usize_of("vocab_size") {
            Ok(v) => v,
            Err(_) => g.meta_strings("tokenizer.ggml.tokens")?.len(),
        };
        let n_expert = usize_of("expert_count").unwrap_or(0);
        let moe = match (arch, n_expert) {
            (Arch::Qwen3Moe | Arch::GptOss, 0) => {
                return Err(ModelError::Malformed(format!("{arch_name} without {arch_name}.expert_count")));
            }
            (Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3, n) if n > 0 => {
                return Err(ModelError::Unsupported(format!("{arch_name} with {n} experts")));
            }
            (_, 0) => None,
            (_, n_expert) => {
                let n_used = usize_of("expert_used_count")?;
                if n_used == 0 || n_used > n_expert {
                    return Err(ModelError::Malformed(format!("{n_used} of {n_expert} experts used per position")));
                }
                Some(match arch {
                    // gpt-oss: a softmax over the chosen logits, which already sum to one.
                    Arch::GptOss => {
                        MoeConfig { n_expert, n_used, norm_weights: false, gating: Gating::SoftmaxOfChosen }
                    }
                    // llama.cpp renormalises the chosen weights for Mixtral and Qwen3-MoE.
                    _ => MoeConfig { n_expert, n_used, norm_weights: true, gating: Gating::Softmax },
                })
            }
        };
        let n_layer = usize_of("block_count")?;
        let rope_theta = g.meta_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0);
        let rope = rope_params(g, &key, rope_theta, usize_of("context_length")?)?;
        let (swa, rope_swa) = sliding_window(g, &key, arch, n_layer, rope)?;
        // Gemma 3 27B scales by its hidden size per head (as llama.cpp, by layer count).
        let attn_scale = match (arch, n_layer) {
            (Arch::Gemma3, 62) => 1.0 / ((n_embd / n_head) as f32).sqrt(),
            _ => 1.0 / (head_dim as f32).sqrt(),
        };
        let embed_scale = (arch == Arch::Gemma3).then(|| (n_embd as f32).sqrt());
        let final_softcap = g.meta_f32(&key("final_logit_softcapping"))?.filter(|c| *c > 0.0);
        Ok(Self {
            arch,
            n_layer,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            rms_eps: f64::from(g.meta_f32(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5)),
            rope_theta,
            rope_style,
            rope,
            rope_swa,
            swa,
            attn_scale,
            embed_scale,
            final_softcap,
            context_length: usize_of("context_length")?,
            vocab_size,
            moe,
        })
    }
}

/// RoPE of full-attention layers, read as llama.cpp reads it: `none` and
/// `linear` scaling (`rope.scaling.factor`), or YaRN with its attention
/// factor cancelled as `llama-context.cpp` does (ggml multiplies
/// `1 + 0.1 ln(factor)` back in).
fn rope_params(g: &GgufFile, key: &dyn Fn(&str) -> String, base: f32, ctx: usize) -> Result<RopeParams> {
    let kind = match g.meta(&key("rope.scaling.type")) {
        None => "linear".to_owned(),
        Some(_) => g.meta_str(&key("rope.scaling.type"))?.to_owned(),
    };
    let factor = g.meta_f32(&key("rope.scaling.factor"))?.filter(|f| *f != 0.0).unwrap_or(1.0);
    let freq_scale = 1.0 / factor;
    let attn = g.meta_f32(&key("rope.scaling.attn_factor"))?.unwrap_or(1.0);
    match kind.as_str() {
        "none" => Ok(RopeParams { freq_base: base, freq_scale: 1.0, yarn: None }),
        "linear" => Ok(RopeParams { freq_base: base, freq_scale, yarn: None }),
        "yarn" => {
            if g.meta(&key("rope.scaling.yarn_log_multiplier")).is_some() {
                return Err(ModelError::Unsupported("YaRN with a log multiplier (DeepSeek's mscale)".into()));
            }
            let orig_ctx = match g.meta(&key("rope.scaling.original_context_length")) {
                Some(_) => usize::try_from(g.meta_u64(&key("rope.scaling.original_context_length"))?)
                    .map_err(|_| ModelError::Malformed("rope.scaling.original_context_length too large".into()))?,
                None => ctx,
            };
            let mscale = if factor <= 1.0 { 1.0 } else { 0.1 * factor.ln() + 1.0 };
            let attn_factor = mscale * (1.0 / (1.0 + 0.1 * factor.ln())) * attn;
            let beta_fast = g.meta_f32(&key("rope.scaling.yarn_beta_fast"))?.unwrap_or(32.0);
            let beta_slow = g.meta_f32(&key("rope.scaling.yarn_beta_slow"))?.unwrap_or(1.0);
            Ok(RopeParams {
                freq_base: base,
                freq_scale,
                yarn: Some(Yarn { orig_ctx, beta_fast, beta_slow, attn_factor }),
            })
        }
        other => Err(ModelError::Unsupported(format!("RoPE scaling {other:?}"))),
    }
}

/// Sliding-window layers and their RoPE, as llama.cpp sets them per
/// family: gpt-oss every other layer from the first (pattern 2), Gemma 3
/// five of every six (pattern 6, local RoPE base 10 000 unscaled unless
/// `rope.freq_base_swa` says), each overridable by
/// `attention.sliding_window_pattern` (a period, or one flag per layer).
fn sliding_window(
    g: &GgufFile,
    key: &dyn Fn(&str) -> String,
    arch: Arch,
    n_layer: usize,
    rope: RopeParams,
) -> Result<(Option<SlidingWindow>, RopeParams)> {
    let (period, swa_rope) = match arch {
        Arch::GptOss => (2, rope),
        Arch::Gemma3 => (6, RopeParams { freq_base: 10_000.0, freq_scale: 1.0, yarn: None }),
        _ => return Ok((None, rope)),
    };
    let window = match g.meta(&key("attention.sliding_window")) {
        Some(_) => usize::try_from(g.meta_u64(&key("attention.sliding_window"))?).unwrap_or(usize::MAX),
        None if arch == Arch::GptOss => {
            return Err(ModelError::Malformed("gpt-oss without attention.sliding_window".into()))
        }
        None => 0,
    };
    if window == 0 {
        return Ok((None, rope));
    }
    let layers = match g.meta(&key("attention.sliding_window_pattern")) {
        Some(candle_core::quantized::gguf_file::Value::Array(flags)) => {
            let flags: Vec<bool> = flags.iter().map(|f| f.to_bool().unwrap_or(false)).collect();
            if flags.len() != n_layer {
                return Err(ModelError::Malformed(format!(
                    "attention.sliding_window_pattern has {} flags for {n_layer} layers",
                    flags.len()
                )));
            }
            flags
        }
        Some(_) => {
            let p = usize::try_from(g.meta_u64(&key("attention.sliding_window_pattern"))?).unwrap_or(0);
            (0..n_layer).map(|il| p == 0 || il % p < p - 1).collect()
        }
        None => (0..n_layer).map(|il| il % period < period - 1).collect(),
    };
    let base = g.meta_f32(&key("rope.freq_base_swa"))?.unwrap_or(swa_rope.freq_base);
    Ok((Some(SlidingWindow { window, layers }), RopeParams { freq_base: base, ..swa_rope }))
}

impl Config {
    /// Whether layer `il` attends within a sliding window.
    pub fn is_swa(&self, il: usize) -> bool {
        self.swa.as_ref().is_some_and(|s| s.layers.get(il).copied().unwrap_or(false))
    }
}
