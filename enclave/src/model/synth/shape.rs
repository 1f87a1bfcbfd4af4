//! The shapes random models are written in: the family
//! (`general.architecture`) and the dimensions, with presets of real
//! models' shapes.

/// The family a random model is written as (`general.architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `llama`: dense, or Mixtral-style experts when the shape has them.
    Llama,
    /// `qwen3moe`: q/k norms and experts in every block.
    Qwen3Moe,
    /// `gpt-oss`: biases, sinks, alternating sliding windows, YaRN (factor
    /// 32 over 4096 positions), biased router and experts.
    GptOss,
    /// `gemma3`: q/k norms, post-norms, GeGLU, five local blocks to one global.
    Gemma3,
}

impl Family {
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen3Moe => "qwen3moe",
            Self::GptOss => "gpt-oss",
            Self::Gemma3 => "gemma3",
        }
    }
}

/// The dimensions of a model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// Architecture written.
    pub family: Family,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Hidden size.
    pub n_embd: usize,
    /// Feed-forward size (of each expert, in a mixture).
    pub n_ff: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Size of one head (`n_embd / n_head` in Llama; Qwen3 sets it apart).
    pub head_dim: usize,
    /// Experts per block (0: a dense feed-forward).
    pub n_expert: usize,
    /// Experts per position.
    pub n_used: usize,
    /// Vocabulary (replaced by a real vocabulary's size when one is given).
    pub vocab: usize,
    /// Context window.
    pub context: usize,
    /// RoPE base.
    pub rope_theta: f32,
    /// Sliding window of the local layers (0: none).
    pub window: usize,
}

impl Shape {
    /// Llama-3-8B (and 3.1-8B): 32 × 4096, FFN 14336, 32/8 heads, 128256 tokens.
    pub const LLAMA3_8B: Self = Self {
        family: Family::Llama,
        n_layer: 32,
        n_embd: 4096,
        n_ff: 14336,
        n_head: 32,
        n_head_kv: 8,
        head_dim: 128,
        n_expert: 0,
        n_used: 0,
        vocab: 128_256,
        context: 8192,
        rope_theta: 500_000.0,
        window: 0,
    };
    /// Llama-3.2-1B: 16 × 2048, FFN 8192, 32/8 heads of 64, 128256 tokens.
    pub const LLAMA32_1B: Self = Self {
        family: Family::Llama,
        n_layer: 16,
        n_embd: 2048,
        n_ff: 8192,
        n_head: 32,
        n_head_kv: 8,
        head_dim: 64,
        n_expert: 0,
        n_used: 0,
        vocab: 128_256,
        context: 8192,
        rope_theta: 500_000.0,
        window: 0,
    };
    /// Qwen3-30B-A3B: 48 × 2048, 32/4 heads of 128, 128 experts of 768, 8 used.
    pub const QWEN3_30B_A3B: Self = Self {
        family: Family::Qwen3Moe,
        n_layer: 48,
        n_embd: 2048,
        n_ff: 768,
        n_head: 32,
        n_head_kv: 4,
        head_dim: 128,
        n_expert: 128,
        n_used: 8,
        vocab: 151_936,
        context: 40_960,
        rope_theta: 1_000_000.0,
        window: 0,
    };
    /// Qwen3-235B-A22B: 94 × 4096, 64/4 heads of 128, 128 experts of 1536, 8 used.
    pub const QWEN3_235B_A22B: Self = Self {
        family: Family::Qwen3Moe,
        n_layer: 94,
        n_embd: 4096,
        n_ff: 1536,
        n_head: 64,
        n_head_kv: 4,
        head_dim: 128,
        n_expert: 128,
        n_used: 8,
        vocab: 151_936,
        context: 40_960,
        rope_theta: 1_000_000.0,
        window: 0,
    };
    /// A small shape for checking the tooling in seconds.
    pub const SMOKE: Self = Self {
        family: Family::Llama,
        n_layer: 2,
        n_embd: 256,
        n_ff: 512,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_expert: 0,
        n_used: 0,
        vocab: 512,
        context: 1024,
        rope_theta: 10_000.0,
        window: 0,
    };
    /// A small Qwen3-MoE: 8 experts of 256, 2 used (256 wide: K-quant blocks).
    pub const QWEN3MOE_SMOKE: Self = Self {
        family: Family::Qwen3Moe,
        n_layer: 3,
        n_embd: 256,
        n_ff: 256,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_expert: 8,
        n_used: 2,
        vocab: 512,
        context: 2048,
        rope_theta: 1_000_000.0,
        window: 0,
    };
    /// A small Mixtral-style `llama` with experts: 4 experts of 512, 2 used, 4/2 heads.
    pub const MIXTRAL_SMOKE: Self = Self {
        family: Family::Llama,
        n_layer: 3,
        n_embd: 256,
        n_ff: 512,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_expert: 4,
        n_used: 2,
        vocab: 512,
        context: 2048,
        rope_theta: 1_000_000.0,
        window: 0,
    };

    /// gpt-oss-20b: 24 × 2880, 64/8 heads of 64, 32 experts of 2880, 4
    /// used, window 128 on even layers, RoPE base 150 000 (YaRN ×32).
    pub const GPT_OSS_20B: Self = Self {
        family: Family::GptOss,
        n_layer: 24,
        n_embd: 2880,
        n_ff: 2880,
        n_head: 64,
        n_head_kv: 8,
        head_dim: 64,
        n_expert: 32,
        n_used: 4,
        vocab: 201_088,
        context: 131_072,
        rope_theta: 150_000.0,
        window: 128,
    };
    /// gpt-oss-120b: as gpt-oss-20b with 36 layers and 128 experts.
    pub const GPT_OSS_120B: Self = Self { n_layer: 36, n_expert: 128, ..Self::GPT_OSS_20B };
    /// A small gpt-oss: 8 experts of 256, 2 used, window 32.
    pub const GPT_OSS_SMOKE: Self = Self {
        family: Family::GptOss,
        n_layer: 3,
        n_embd: 256,
        n_ff: 256,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_expert: 8,
        n_used: 2,
        vocab: 512,
        context: 4096,
        rope_theta: 150_000.0,
        window: 32,
    };
    /// Gemma-3-1B: 26 × 1152, 4/1 heads of 256, FFN 6912, window 512.
    pub const GEMMA3_1B: Self = Self {
        family: Family::Gemma3,
        n_layer: 26,
        n_embd: 1152,
        n_ff: 6912,
        n_head: 4,
        n_head_kv: 1,
        head_dim: 256,
        n_expert: 0,
        n_used: 0,
        vocab: 262_144,
        context: 32_768,
        rope_theta: 1_000_000.0,
        window: 512,
    };
    /// A small Gemma 3: 6 layers (5 local, 1 global), window 32.
    pub const GEMMA3_SMOKE: Self = Self {
        family: Family::Gemma3,
        n_layer: 6,
        n_embd: 256,
        n_ff: 512,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_expert: 0,
        n_used: 0,
        vocab: 512,
        context: 4096,
        rope_theta: 1_000_000.0,
        window: 32,
    };

    /// The shapes by name.
    pub const NAMED: [(&'static str, Self); 12] = [
        ("llama3-8b", Self::LLAMA3_8B),
        ("llama3.2-1b", Self::LLAMA32_1B),
        ("qwen3-30b-a3b", Self::QWEN3_30B_A3B),
        ("qwen3-235b-a22b", Self::QWEN3_235B_A22B),
        ("gpt-oss-20b", Self::GPT_OSS_20B),
        ("gpt-oss-120b", Self::GPT_OSS_120B),
        ("gemma3-1b", Self::GEMMA3_1B),
        ("smoke", Self::SMOKE),
        ("qwen3moe-smoke", Self::QWEN3MOE_SMOKE),
        ("mixtral-smoke", Self::MIXTRAL_SMOKE),
        ("gpt-oss-smoke", Self::GPT_OSS_SMOKE),
        ("gemma3-smoke", Self::GEMMA3_SMOKE),
    ];

    /// By name (see [`Shape::NAMED`]).
    pub fn named(name: &str) -> Option<Self> {
        Self::NAMED.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
    }

    /// Parameters of the matrices, embedding excluded, and the LM head:
    /// every expert counted (what the file holds).
    pub fn matrix_params(&self) -> usize {
        let attn = self.n_embd * (self.n_head * self.head_dim) * 2 + self.n_embd * (self.n_head_kv * self.head_dim) * 2;
        let ffn = self.n_embd * self.n_ff * 3 * self.n_expert.max(1) + self.n_embd * self.n_expert;
        self.n_layer * (attn + ffn) + self.vocab * self.n_embd
    }
}
