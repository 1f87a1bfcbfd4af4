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
            other => {
                return Err(ModelError::Unsupported(format!(
                    "architecture {other:?} (llama with or without experts, mistral, qwen2, qwen3, qwen3moe are served)"
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
            (Arch::Qwen3Moe, 0) => {
                return Err(ModelError::Malformed("qwen3moe without qwen3moe.expert_count".into()));
            }
            (Arch::Qwen2 | Arch::Qwen3, n) if n > 0 => {
                return Err(ModelError::Unsupported(format!("{arch_name} with {n} experts")));
            }
            (_, 0) => None,
            (_, n_expert) => {
                let n_used = usize_of("expert_used_count")?;
                if n_used == 0 || n_used > n_expert {
                    return Err(ModelError::Malformed(format!("{n_used} of {n_expert} experts used per position")));
                }
                // llama.cpp renormalises the chosen weights for both (Mixtral, Qwen3-MoE).
                Some(MoeConfig { n_expert, n_used, norm_weights: true })
            }
        };
        Ok(Self {
            arch,
            n_layer: usize_of("block_count")?,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            rms_eps: f64::from(g.meta_f32(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5)),
            rope_theta: g.meta_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0),
            rope_style,
            context_length: usize_of("context_length")?,
            vocab_size,
            moe,
        })
    }
}
