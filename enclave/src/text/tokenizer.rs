//! The tokenizer and chat template a GGUF carries: byte-level BPE
//! (`gpt2`) rebuilt on the `tokenizers` crate with llama.cpp's pre-tokenizer
//! for `tokenizer.ggml.pre` ([`PreType`]), sentencepiece-style vocabularies
//! (`llama`) on [`super::spm::Spm`], templates on `minijinja`. Both are checked
//! against llama.cpp's own vocabulary tests (`tests/all/vocab.rs`).

use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer as HfTokenizer};

use super::grammar::{GrammarError, Grammars, Vocabulary};
use super::spm::{token_type, Spm};
use crate::model::error::{ModelError, Result};
use crate::model::GgufFile;

/// The English contractions, case-insensitive, as llama.cpp spells `(?i:'s|…)`.
macro_rules! contractions {
    () => {
        r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
    };
}

/// GPT-2's split (llama.cpp `LLAMA_VOCAB_PRE_TYPE_GPT2`).
const REGEX_GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama 3's split: digits in groups of up to three (`LLAMA3`, `DBRX`, `SMAUG`, `CHATGLM4`).
const REGEX_LLAMA3: &str = concat!(
    contractions!(),
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
/// Qwen2's split: single digits (`QWEN2`).
const REGEX_QWEN2: &str =
    concat!(contractions!(), r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+");
/// Qwen3.5's split: Qwen2's, with combining marks kept in words (`QWEN35`).
const REGEX_QWEN35: &str = concat!(
    contractions!(),
    r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
/// o200k (`GPT4O`): words split at case changes, as llama.cpp writes the
/// upper/lower classes for its regex engine (a letter that is not `a-z`, a
/// letter that is not `A-Z`).
const REGEX_GPT4O: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+",
    contractions!(),
    r"?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*",
    contractions!(),
    r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
/// DeepSeek V3's three splits (`DEEPSEEK3_LLM`): digits by three, CJK and kana runs, then words.
const REGEX_DEEPSEEK3: [&str; 3] = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];
/// Code points llama.cpp counts as Han for Kimi K2 (`unicode_cpt_is_han`).
macro_rules! han {
    () => {
        r"[\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2B73F}\x{2B740}-\x{2B81F}\x{2B820}-\x{2CEAF}\x{2CEB0}-\x{2EBEF}\x{F900}-\x{FAFF}\x{2F800}-\x{2FA1F}]"
    };
}
/// Kimi K2 (`KIMI_K2`), as llama.cpp's hand-written splitter runs it: Han
/// runs, then letter runs without Han (no case split) with a contraction,
/// then Llama 3's digits, punctuation and spaces.
const REGEX_KIMI_K2: &str = concat!(
    han!(),
    r"+|[^\r\n\p{L}\p{N}]?(?:(?!",
    han!(),
    r")\p{L})+",
    contractions!(),
    r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
/// DeepSeek Coder (`deepseek-coder`): newlines alone, letter and punctuation
/// runs each with one leading space, CJK runs, digits one a piece.
const REGEX_DEEPSEEK_CODER: [&str; 5] =
    ["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+", r"\p{N}"];
/// DeepSeek LLM and V2 (`deepseek-llm`): newlines alone, runs of the cased
/// letters of llama.cpp's list (Latin, Greek, Cyrillic, Armenian, Georgian,
/// Cherokee, Glagolitic, Coptic, Deseret, …) and of ASCII and full-width
/// punctuation, each with one leading space, trailing spaces, CJK runs,
/// digit runs. (Written as code points: several of these letters have
/// canonical equivalents, and an editor that normalises text would change
/// them.)
#[rustfmt::skip]
const REGEX_DEEPSEEK_LLM: [&str; 6] = [
    "[\r\n]",
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+",
    "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
    "\\s+$",
    "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+",
    "\\p{N}+",
];
/// Falcon (`falcon`): punctuation runs, GPT-2's split, then digits in threes.
const REGEX_FALCON: [&str; 3] = [r"[\p{P}\$\+<=>\^~\|`]+", REGEX_GPT2, "[0-9][0-9][0-9]"];
/// llama.cpp's fallback for `default` (and a missing `tokenizer.ggml.pre`).
const REGEX_DEFAULT: [&str; 4] = [
    r"[\p{P}\$\+<=>\^~\|]+",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
];

/// The BPE pre-tokenizers Veil serves: llama.cpp's `llama_vocab_pre_type`s,
/// chosen by `tokenizer.ggml.pre` with llama.cpp's names, each splitting text
/// with llama.cpp's regexes (in order, every piece of one split split again
/// by the next) before byte-level BPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreType {
    /// GLM-4 (`glm4`, `chatglm-bpe`): Llama 3's split, no BOS.
    ChatGlm4,
    /// DBRX and Smaug (`dbrx`, `smaug-bpe`): Llama 3's split, merges applied.
    Dbrx,
    /// DeepSeek V3 / R1 (`deepseek-v3`).
    DeepseekV3,
    /// DeepSeek Coder (`deepseek-coder`).
    DeepseekCoder,
    /// DeepSeek LLM and DeepSeek V2 (`deepseek-llm`).
    DeepseekLlm,
    /// Falcon (`falcon`).
    Falcon,
    /// llama.cpp's fallback (`default`, or no `tokenizer.ggml.pre`).
    Default,
    /// GPT-2 and its kin (`gpt-2`, `gpt2`, `phi-2`, `mpt`, `olmo`, …).
    Gpt2,
    /// o200k: gpt-oss, Llama 4, MiniMax M2 (`gpt-4o`, `llama4`, `minimax-m2`, …).
    Gpt4o,
    /// Kimi K2 (`kimi-k2`).
    KimiK2,
    /// Llama 3.x (`llama-bpe`, `llama3`, `falcon3`, …): a word in the
    /// vocabulary is one token (merges ignored), BOS added by default.
    Llama3,
    /// Qwen2, Qwen2.5, Qwen3 (`qwen2`, `deepseek-r1-qwen`, `megrez`, `stablelm2`).
    Qwen2,
    /// Qwen3.5 (`qwen35`).
    Qwen35,
    /// GPT-2's split after one digit a piece (`starcoder`, `smollm`, `refact`, `command-r`, …).
    Starcoder,
}

impl PreType {
    /// The type llama.cpp gives `tokenizer.ggml.pre` = `name` (`None`: not served).
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "glm4" | "chatglm-bpe" => Self::ChatGlm4,
            "dbrx" | "smaug-bpe" => Self::Dbrx,
            "deepseek-v3" | "hunyuan-dense" | "joyai-llm" => Self::DeepseekV3,
            "deepseek-coder" => Self::DeepseekCoder,
            "deepseek-llm" => Self::DeepseekLlm,
            "falcon" => Self::Falcon,
            "default" => Self::Default,
            // `gpt2` is no llama.cpp name; older Veil fixtures write it.
            "gpt-2" | "gpt2" | "phi-2" | "mpt" | "olmo" | "jais" | "trillion" | "granite-docling" | "exaone4" => {
                Self::Gpt2
            }
            "gpt-4o" | "llama4" | "minimax-m2" | "kanana2" | "talkie" => Self::Gpt4o,
            "kimi-k2" => Self::KimiK2,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2" => {
                Self::Llama3
            }
            "qwen2" | "deepseek-r1-qwen" | "megrez" | "stablelm2" => Self::Qwen2,
            "qwen35" => Self::Qwen35,
            "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
                Self::Starcoder
            }
            _ => return None,
        })
    }

    /// The regexes llama.cpp splits with, in order.
    fn regexes(self) -> &'static [&'static str] {
        match self {
            Self::ChatGlm4 | Self::Dbrx | Self::Llama3 => &[REGEX_LLAMA3],
            Self::DeepseekV3 => &REGEX_DEEPSEEK3,
            Self::DeepseekCoder => &REGEX_DEEPSEEK_CODER,
            Self::DeepseekLlm => &REGEX_DEEPSEEK_LLM,
            Self::Falcon => &REGEX_FALCON,
            Self::Default => &REGEX_DEFAULT,
            Self::Gpt2 => &[REGEX_GPT2],
            Self::Gpt4o => &[REGEX_GPT4O],
            Self::KimiK2 => &[REGEX_KIMI_K2],
            Self::Qwen2 => &[REGEX_QWEN2],
            Self::Qwen35 => &[REGEX_QWEN35],
            Self::Starcoder => &[r"\p{N}", REGEX_GPT2],
        }
    }

    /// Whether a pre-token that is itself in the vocabulary becomes that
    /// token without merging (llama.cpp's `ignore_merges`).
    fn ignore_merges(self) -> bool {
        self == Self::Llama3
    }

    /// Whether BOS is prepended when the GGUF does not say (`add_bos`).
    fn add_bos_default(self) -> bool {
        self == Self::Llama3
    }

    /// Whether the vocabulary's BOS id is used at all (GLM-4 has none).
    fn has_bos(self) -> bool {
        self != Self::ChatGlm4
    }

    /// The `tokenizers` pre-tokenizer: each split, then bytes to GPT-2's
    /// printable alphabet.
    fn pre_tokenizer(self) -> Result<PreTokenizerWrapper> {
        let mut steps = self.regexes().iter().map(|r| split(r)).collect::<Result<Vec<_>>>()?;
        steps.push(ByteLevel::new(false, false, false).into());
        Ok(Sequence::new(steps).into())
    }
}

fn split(pattern: &str) -> Result<PreTokenizerWrapper> {
    let s = Split::new(SplitPattern::Regex(pattern.to_owned()), SplitDelimiterBehavior::Isolated, false)
        .map_err(|e| ModelError::Unsupported(format!("tokenizer regex: {e}")))?;
    Ok(s.into())
}

/// The text ↔ ids engine of a vocabulary type.
enum Engine {
    Bpe {
        /// Parses special-token text (`<|im_start|>`) into its id.
        with_special: Box<HfTokenizer>,
        /// Treats all text as text.
        plain: Box<HfTokenizer>,
        /// GPT-2's byte-to-character spelling (`gpt2`); otherwise raw UTF-8
        /// with `▁` for a space and `<0xNN>` byte tokens (`gemma4`).
        byte_level: bool,
    },
    Spm(Box<Spm>),
}

/// A model's tokenizer: text ↔ ids, special tokens, BOS/EOS.
pub struct Tokenizer {
    engine: Engine,
    eos: u32,
    bos: Option<u32>,
    add_bos: bool,
    stop_ids: Vec<u32>,
    special_ids: Vec<u32>,
    /// The user-defined ones among them (sorted): written as their text in
    /// decoded output, as llama.cpp does (Qwen's `<think>`, `<tool_call>`).
    user_defined: Vec<u32>,
    vocab: usize,
    chat_template: Option<String>,
    tokens: Vec<String>,
    /// The vocabulary's grammar engine, built on first use.
    grammars: std::sync::OnceLock<std::result::Result<std::sync::Arc<Grammars>, GrammarError>>,
    /// How the chat template writes tool calls, found on first use.
    tool_format: std::sync::OnceLock<std::result::Result<super::tools::ToolFormat, super::tools::ToolsError>>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer").field("vocab", &self.vocab).field("eos", &self.eos).finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer from GGUF metadata.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let model = g.meta_str("tokenizer.ggml.model")?;
        let tokens = g.meta_strings("tokenizer.ggml.tokens")?;
        let types = g.meta_ints("tokenizer.ggml.token_type").unwrap_or_default();
        let id = |k: &str| g.meta_u64(k).ok().and_then(|v| u32::try_from(v).ok());
        // Control and user-defined tokens are matched as wholes when special
        // parsing is on; decoded text leaves control tokens out and writes
        // user-defined ones as their text, as llama.cpp does.
        let special_ids: Vec<u32> = types
            .iter()
            .enumerate()
            .filter(|(_, t)| matches!(**t, token_type::CONTROL | token_type::USER_DEFINED))
            .map(|(i, _)| i as u32)
            .collect();
        let user_defined: Vec<u32> =
            types.iter().enumerate().filter(|(_, t)| **t == token_type::USER_DEFINED).map(|(i, _)| i as u32).collect();
        // What llama.cpp assumes when the GGUF does not say: sentencepiece
        // vocabularies and Llama 3 prepend BOS; GLM-4 has none.
        let (engine, add_bos_default, has_bos) = match model {
            "gpt2" => {
                let pre = match g.meta("tokenizer.ggml.pre") {
                    Some(_) => g.meta_str("tokenizer.ggml.pre")?,
                    None => "default",
                };
                let pre = PreType::from_name(pre)
                    .ok_or_else(|| ModelError::Unsupported(format!("tokenizer pre-type {pre:?}")))?;
                (Self::bpe(g, Some(pre), &tokens, &special_ids, &user_defined)?, pre.add_bos_default(), pre.has_bos())
            }
            // Gemma 4: BPE over raw UTF-8 (llama.cpp's `gemma4` vocabulary,
            // BOS only where the GGUF asks).
            "gemma4" => (Self::bpe(g, None, &tokens, &special_ids, &user_defined)?, false, true),
            "llama" => {
                let scores = g.meta_f32s("tokenizer.ggml.scores")?;
                let space_prefix = g.meta_bool("tokenizer.ggml.add_space_prefix").unwrap_or(true);
                let unk = id("tokenizer.ggml.unknown_token_id");
                let mut spm = Spm::new(tokens.clone(), scores, types, unk, space_prefix)?;
                // llama.cpp drops the whitespace after Phi-3's special tokens,
                // which it knows by `general.name`.
                let name = g.meta_str("general.name").unwrap_or("").to_lowercase();
                if name.contains("phi-3") || name.contains("phi3") {
                    spm.strip_whitespace_after_specials(&["<unk>", "<s>", "<|endoftext|>"]);
                }
                (Engine::Spm(Box::new(spm)), true, true)
            }
            other => {
                return Err(ModelError::Unsupported(format!(
                    "tokenizer model {other:?} (gpt2 byte-level BPE, gemma4 BPE and llama sentencepiece are served)"
                )))
            }
        };
        let eos = id("tokenizer.ggml.eos_token_id").ok_or_else(|| ModelError::Malformed("no EOS token id".into()))?;
        let mut stop_ids = vec![eos];
        if let Some(eot) = id("tokenizer.ggml.eot_token_id") {
            stop_ids.push(eot);
        }
        // Chat models end a turn with <|im_end|> / <|eot_id|>; stop there too.
        // gpt-oss's harmony ends a message with <|end|> and the answer with
        // <|return|> or <|call|>: a vocabulary with those two stops there
        // only (as llama.cpp does), so the reasoning is followed by the answer.
        let position = |name: &str| tokens.iter().position(|t| t == name);
        let harmony = [position("<|return|>"), position("<|call|>")];
        let harmony = harmony.iter().all(Option::is_some);
        let ends: &[&str] = match harmony {
            true => &["<|im_end|>", "<|eot_id|>", "<|return|>", "<|call|>"],
            false => &["<|im_end|>", "<|eot_id|>", "<|end|>"],
        };
        for name in ends {
            if let Some(i) = position(name) {
                if !stop_ids.contains(&(i as u32)) {
                    stop_ids.push(i as u32);
                }
            }
        }
        if harmony {
            // Even where the file names it its end of turn.
            stop_ids.retain(|&i| position("<|end|>") != Some(i as usize));
        }
        let chat_template = match g.meta("tokenizer.chat_template") {
            Some(_) => Some(g.meta_str("tokenizer.chat_template")?.to_owned()),
            None => None,
        };
        Ok(Self {
            engine,
            eos,
            bos: id("tokenizer.ggml.bos_token_id").filter(|_| has_bos),
            add_bos: g.meta_bool("tokenizer.ggml.add_bos_token").unwrap_or(add_bos_default),
            stop_ids,
            user_defined,
            special_ids,
            vocab: tokens.len(),
            chat_template,
            tokens,
            grammars: std::sync::OnceLock::new(),
            tool_format: std::sync::OnceLock::new(),
        })
    }

    /// How the chat template writes tool calls, found on first use
    /// ([`super::tools::ToolFormat::detect`]).
    pub fn tool_format(&self) -> std::result::Result<super::tools::ToolFormat, super::tools::ToolsError> {
        self.tool_format.get_or_init(|| super::tools::ToolFormat::detect(self)).clone()
    }

    /// The grammar engine for this vocabulary (response formats), built on
    /// first use (about a tenth of a second for 50,000 tokens) and shared.
    pub fn grammars(&self) -> std::result::Result<std::sync::Arc<Grammars>, GrammarError> {
        self.grammars.get_or_init(|| Grammars::from_vocabulary(&self.vocabulary()).map(std::sync::Arc::new)).clone()
    }

    /// The vocabulary as the grammar engine reads it: every token's bytes,
    /// the end-of-sequence token and the other stop tokens.
    pub fn vocabulary(&self) -> Vocabulary {
        Vocabulary { words: self.token_bytes(), eos: self.eos(), stop_ids: self.stop_ids().to_vec() }
    }

    /// Byte-level BPE (`pre`: its split), or with `pre` `None` Gemma 4's
    /// BPE over raw UTF-8: spaces written `▁`, text split only at runs of
    /// newlines, characters outside the vocabulary as `<0xNN>` byte tokens.
    fn bpe(
        g: &GgufFile,
        pre: Option<PreType>,
        tokens: &[String],
        special_ids: &[u32],
        user_defined: &[u32],
    ) -> Result<Engine> {
        // llama.cpp splits a merge at its first space after the first byte.
        let merges: Vec<(String, String)> = g
            .meta_strings("tokenizer.ggml.merges")?
            .into_iter()
            .map(|m| {
                m.char_indices()
                    .skip(1)
                    .find(|&(_, c)| c == ' ')
                    .map(|(at, _)| (m[..at].to_owned(), m[at + 1..].to_owned()))
                    .ok_or_else(|| ModelError::Malformed(format!("merge {m:?} has no space")))
            })
            .collect::<Result<_>>()?;
        let vocab: tokenizers::models::bpe::Vocab =
            tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(pre.is_some_and(PreType::ignore_merges))
            .byte_fallback(pre.is_none())
            .build()
            .map_err(|e| ModelError::Malformed(format!("BPE: {e}")))?;
        let mut plain = HfTokenizer::new(bpe);
        let byte_level = pre.is_some();
        match pre {
            Some(pre) => {
                plain.with_pre_tokenizer(Some(pre.pre_tokenizer()?));
                plain.with_decoder(Some(ByteLevel::default()));
            }
            None => {
                use tokenizers::decoders::{byte_fallback::ByteFallback, fuse::Fuse, sequence::Sequence as Decoders};
                use tokenizers::normalizers::replace::Replace;
                let replace = |a: &str, b: &str| {
                    Replace::new(a, b).map_err(|e| ModelError::Malformed(format!("tokenizer normalizer: {e}")))
                };
                plain
                    .with_normalizer(Some(replace(" ", "\u{2581}")?))
                    .map_err(|e| ModelError::Malformed(format!("tokenizer normalizer: {e}")))?;
                plain.with_pre_tokenizer(Some(split("[^\n]+|[\n]+")?));
                plain.with_decoder(Some(Decoders::new(vec![
                    replace("\u{2581}", " ")?.into(),
                    ByteFallback::new().into(),
                    Fuse::new().into(),
                ])));
            }
        }
        let mut with_special = plain.clone();
        let specials: Vec<AddedToken> = special_ids
            .iter()
            .filter_map(|&i| tokens.get(i as usize))
            // An empty special token would match everywhere (never advance).
            .filter(|t| !t.is_empty())
            .map(|t| AddedToken::from(t.clone(), true))
            .collect();
        with_special.add_special_tokens(specials).map_err(|e| ModelError::Malformed(format!("special tokens: {e}")))?;
        // User-defined tokens are cut out of plain text too (llama.cpp skips
        // only control and unknown tokens when special parsing is off): MPT's
        // runs of spaces, Qwen's `<think>`.
        let user: Vec<AddedToken> = user_defined
            .iter()
            .filter_map(|&i| tokens.get(i as usize))
            .filter(|t| !t.is_empty())
            .map(|t| AddedToken::from(t.clone(), false))
            .collect();
        plain.add_tokens(user).map_err(|e| ModelError::Malformed(format!("user-defined tokens: {e}")))?;
        Ok(Engine::Bpe { with_special: Box::new(with_special), plain: Box::new(plain), byte_level })
    }

    /// Text to ids. `parse_special` matches special-token text as the
    /// token (for template text); user text alone should not.
    /// BOS is prepended when the GGUF asks for it. An empty text is refused.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        if text.is_empty() {
            return Err(ModelError::Invalid("empty prompt".into()));
        }
        self.tokenize(text, true, parse_special)
    }

    /// The BOS token, when the model puts one before every text.
    pub fn bos_added(&self) -> Option<u32> {
        self.bos.filter(|_| self.add_bos)
    }

    /// Text to ids as llama.cpp's `llama_tokenize` gives them: BOS first when
    /// `add_special` and the vocabulary adds one; special-token text parsed
    /// as the token when `parse_special`. An empty text is no tokens.
    pub fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        if add_special && self.add_bos {
            ids.extend(self.bos);
        }
        if !text.is_empty() {
            ids.extend(self.encode_piece(text, parse_special)?);
        }
        Ok(ids)
    }

    fn encode_piece(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        match &self.engine {
            Engine::Bpe { with_special, plain, .. } => {
                let t = if parse_special { with_special } else { plain };
                let enc = t.encode(text, false).map_err(|e| ModelError::Invalid(format!("tokenize: {e}")))?;
                Ok(enc.get_ids().to_vec())
            }
            Engine::Spm(spm) => spm.encode(text, parse_special),
        }
    }

    /// A conversation as ids for generation: the chat template's own text
    /// with special tokens parsed, every message's content as plain text —
    /// so a user who types `<|im_start|>` gets those characters, not a
    /// control token.
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        self.encode_chat_with(messages, None)
    }

    /// [`encode_chat`](Self::encode_chat) with `tools` in the template's
    /// context. Tool definitions and an assistant's tool calls are rendered
    /// by the template as JSON inside its own text, where special-token text
    /// would be parsed as the token: they are refused when they hold the
    /// text of a control token.
    pub fn encode_chat_with(&self, messages: &[ChatMessage], tools: Option<&serde_json::Value>) -> Result<Vec<u32>> {
        self.encode_chat_in(messages, tools, None)
    }

    /// [`encode_chat_with`](Self::encode_chat_with) with `extra` variables
    /// in the template's context (checked for control-token text too).
    pub fn encode_chat_in(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        extra: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<Vec<u32>> {
        let extra_text = extra.map(|e| serde_json::Value::Object(e.clone()).to_string());
        if let Some(t) = extra_text.as_deref().and_then(|e| self.control_text_in(e)) {
            return Err(ModelError::Invalid(format!("a template variable holds the text of the control token {t:?}")));
        }
        let structured = tools.into_iter().chain(messages.iter().filter_map(|m| m.tool_calls.as_ref()));
        let named = messages.iter().flat_map(|m| m.tool_call_id.iter().chain(m.name.iter()));
        for text in structured.map(|v| v.to_string()).chain(named.cloned()) {
            if let Some(t) = self.control_text_in(&text) {
                return Err(ModelError::Invalid(format!(
                    "a tool definition, call or id holds the text of the control token {t:?}"
                )));
            }
        }
        if messages.is_empty() {
            return Err(ModelError::Invalid("no messages".into()));
        }
        // Render with a marker per message, then tokenize around the markers.
        let marker = |i: usize| format!("\u{F8FF}veil-message-{i}\u{F8FF}");
        if messages.iter().any(|m| m.content.contains('\u{F8FF}')) {
            return Err(ModelError::Invalid("message content holds U+F8FF, which is reserved".into()));
        }
        let marked: Vec<ChatMessage> =
            // An empty content stays empty (a tool-call message's): the
            // template may treat it differently, and it holds nothing.
            messages
                .iter()
                .enumerate()
                .map(|(i, m)| ChatMessage {
                    content: if m.content.is_empty() { String::new() } else { marker(i) },
                    ..m.clone()
                })
                .collect();
        let rendered = self.render_chat_in(&marked, tools, extra)?;
        let mut ids = Vec::new();
        if self.add_bos {
            ids.extend(self.bos);
        }
        // One left-to-right scan (linear in the rendered text): each marker
        // names its message, whatever order the template put them in.
        const OPEN: &str = "\u{F8FF}veil-message-";
        let mut rest = rendered.as_str();
        while let Some(at) = rest.find(OPEN) {
            let after = &rest[at + OPEN.len()..];
            let i = after
                .find('\u{F8FF}')
                .and_then(|end| after[..end].parse::<usize>().ok().map(|i| (i, end)))
                .filter(|(i, _)| *i < messages.len());
            let Some((i, end)) = i else {
                return Err(ModelError::Invalid("the chat template mangled a message marker".into()));
            };
            if at > 0 {
                ids.extend(self.encode_piece(&rest[..at], true)?);
            }
            if !messages[i].content.is_empty() {
                ids.extend(self.encode_piece(&messages[i].content, false)?);
            }
            rest = &after[end + '\u{F8FF}'.len_utf8()..];
        }
        if !rest.is_empty() {
            ids.extend(self.encode_piece(rest, true)?);
        }
        Ok(ids)
    }

    /// Ids to text: control tokens left out, user-defined ones written as
    /// their text (llama.cpp's `token_to_piece` without `special`).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= self.vocab) {
            return Err(ModelError::Invalid(format!("token id {bad} is outside the vocabulary of {}", self.vocab)));
        }
        self.decode_keeping(ids, |id| self.user_defined.binary_search(&id).is_ok())
    }

    /// Ids to text: runs of ordinary tokens through the engine's decoder,
    /// and of the special tokens those `keep` says, their text.
    fn decode_keeping(&self, ids: &[u32], keep: impl Fn(u32) -> bool) -> Result<String> {
        let mut out = String::new();
        let mut run = Vec::new();
        for &id in ids {
            if self.special_ids.binary_search(&id).is_ok() {
                out.push_str(&self.decode_ordinary(&run)?);
                run.clear();
                if keep(id) {
                    out.push_str(&self.tokens[id as usize]);
                }
            } else {
                run.push(id);
            }
        }
        out.push_str(&self.decode_ordinary(&run)?);
        Ok(out)
    }

    /// Ordinary (not control or user-defined) ids to text.
    fn decode_ordinary(&self, ids: &[u32]) -> Result<String> {
        if ids.is_empty() {
            return Ok(String::new());
        }
        match &self.engine {
            Engine::Bpe { plain, .. } => {
                plain.decode(ids, false).map_err(|e| ModelError::Invalid(format!("detokenize: {e}")))
            }
            Engine::Spm(spm) => spm.decode(ids),
        }
    }

    /// The text one token stands for, as llama.cpp's `token_to_piece` with
    /// special tokens rendered: a control token's own text; otherwise its
    /// bytes, lossily as UTF-8 (a token may hold part of a character).
    pub fn piece(&self, id: u32) -> Result<String> {
        match self.tokens.get(id as usize) {
            Some(text) if self.special_ids.contains(&id) => Ok(text.clone()),
            Some(_) => self.decode(&[id]),
            None => Err(ModelError::Invalid(format!("token id {id} is outside the vocabulary of {}", self.vocab))),
        }
    }

    /// Every token's bytes, as a grammar engine matches them: a byte-level
    /// BPE token's characters through GPT-2's byte-to-character table, a
    /// sentencepiece token's text with `▁` as a space and `<0xNN>` as that
    /// byte; control and user-defined tokens as `0xFF` and their text, which
    /// no text matches.
    pub fn token_bytes(&self) -> Vec<Vec<u8>> {
        let byte_level = matches!(self.engine, Engine::Bpe { byte_level: true, .. });
        self.tokens
            .iter()
            .enumerate()
            .map(|(id, text)| {
                if self.special_ids.contains(&(id as u32)) {
                    return [&[0xFF][..], text.as_bytes()].concat();
                }
                if byte_level {
                    return text.chars().map(gpt2_byte).collect::<Option<Vec<u8>>>().unwrap_or_else(|| {
                        // Not a byte-level spelling: match it as special.
                        [&[0xFF][..], text.as_bytes()].concat()
                    });
                }
                let hex = text.strip_prefix("<0x").and_then(|h| h.strip_suffix('>'));
                match hex.filter(|h| h.len() == 2).and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => vec![b],
                    None => text.replace('\u{2581}', " ").into_bytes(),
                }
            })
            .collect()
    }

    /// Whether `id` is a user-defined token (written as its text when
    /// decoded, cut out of plain text as a whole when encoding).
    pub fn is_user_defined(&self, id: u32) -> bool {
        self.user_defined.binary_search(&id).is_ok()
    }

    /// The end-of-sequence id.
    pub fn eos(&self) -> u32 {
        self.eos
    }

    /// Ids that end generation (EOS, end-of-turn).
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.vocab
    }

    /// The longest text one token stands for, in bytes (at least 1): a text
    /// of more than `n × this` bytes cannot encode to `n` tokens or fewer, so
    /// it can be refused before tokenizing it.
    pub fn max_token_bytes(&self) -> usize {
        // Byte-level BPE spells a byte as up to 2 chars, sentencepiece a space as 3 bytes.
        self.tokens.iter().map(String::len).max().unwrap_or(1).max(1)
    }

    /// Renders the GGUF's chat template for `messages` with a generation
    /// prompt, as HF's `apply_chat_template` would ([`super::template`]).
    pub fn render_chat(&self, messages: &[ChatMessage]) -> Result<String> {
        self.render_chat_with(messages, None)
    }

    /// Whether the chat template names the variable `name`.
    pub fn template_reads(&self, name: &str) -> bool {
        self.chat_template.as_deref().is_some_and(|t| super::template::reads(t, name))
    }

    /// Whether the model answers in gpt-oss's harmony messages
    /// ([`super::harmony`]): `<|channel|>` and `<|message|>` are special
    /// tokens and the chat template writes them.
    pub fn harmony(&self) -> bool {
        self.special_id("<|channel|>").is_some()
            && self.special_id("<|message|>").is_some()
            && self.chat_template.as_deref().is_some_and(|t| t.contains("<|channel|>"))
    }

    /// Whether the model thinks in a `<think>…</think>` block first
    /// ([`super::reasoning`]): its chat template writes both tags.
    pub fn thinks(&self) -> bool {
        self.chat_template.as_deref().is_some_and(|t| t.contains("<think>") && t.contains("</think>"))
    }

    /// The id of the control or user-defined token whose text is `text`.
    pub fn special_id(&self, text: &str) -> Option<u32> {
        self.special_ids.iter().copied().find(|&i| self.tokens.get(i as usize).is_some_and(|t| t == text))
    }

    /// The first control or user-defined token whose text occurs in `text`.
    pub fn control_text_in(&self, text: &str) -> Option<&str> {
        self.special_ids
            .iter()
            .filter_map(|&i| self.tokens.get(i as usize))
            .find(|t| !t.is_empty() && text.contains(t.as_str()))
            .map(String::as_str)
    }

    /// Ids to text with control and user-defined tokens written as their
    /// own text (`<tool_call>`), as a tool-call parser reads the output.
    pub fn decode_with_special(&self, ids: &[u32]) -> Result<String> {
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= self.vocab) {
            return Err(ModelError::Invalid(format!("token id {bad} is outside the vocabulary of {}", self.vocab)));
        }
        self.decode_keeping(ids, |_| true)
    }

    /// [`render_chat`](Self::render_chat) with `tools` in the context.
    pub fn render_chat_with(&self, messages: &[ChatMessage], tools: Option<&serde_json::Value>) -> Result<String> {
        self.render_chat_in(messages, tools, None)
    }

    /// [`render_chat_with`](Self::render_chat_with) with `extra` variables.
    pub fn render_chat_in(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        extra: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<String> {
        use super::template::{render, RenderRequest, TemplateError};
        let template = self
            .chat_template
            .as_deref()
            .ok_or_else(|| ModelError::Unsupported("the model has no chat template".into()))?;
        let tok = |i: Option<u32>| i.and_then(|i| self.tokens.get(i as usize)).map(String::as_str).unwrap_or("");
        let request = RenderRequest {
            messages,
            add_generation_prompt: true,
            bos_token: tok(self.bos),
            eos_token: tok(Some(self.eos)),
            tools,
            now: std::time::SystemTime::now(),
            extra,
        };
        render(template, &request).map_err(|e| match e {
            TemplateError::Malformed(_) | TemplateError::Unsupported { .. } => ModelError::Unsupported(e.to_string()),
            _ => ModelError::Invalid(e.to_string()),
        })
    }
}

pub use super::template::ChatMessage;

/// A tokenizer from GGUF metadata alone (a file with no tensors), for the
/// unit tests' small vocabularies.
#[cfg(test)]
pub(crate) fn from_metadata(meta: &[(&str, candle_core::quantized::gguf_file::Value)]) -> Result<Tokenizer> {
    use std::io::Cursor;
    let refs: Vec<(&str, &candle_core::quantized::gguf_file::Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let mut bytes = Cursor::new(Vec::new());
    candle_core::quantized::gguf_file::write(&mut bytes, &refs, &[])
        .map_err(|e| ModelError::Invalid(format!("writing test metadata: {e}")))?;
    let bytes = bytes.into_inner();
    let len = bytes.len() as u64;
    Tokenizer::from_gguf(&GgufFile::from_source(std::path::Path::new("test.gguf"), Box::new(Cursor::new(bytes)), len)?)
}

#[cfg(test)]
#[path = "tokenizer_tests.rs"]
mod tests;

/// The byte GPT-2's byte-level encoding spells as `c`: printable bytes
/// (`!`..=`~`, `¡`..=`¬`, `®`..=`ÿ`) as themselves, the other 68 as
/// U+0100 onwards, in byte order.
fn gpt2_byte(c: char) -> Option<u8> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let c = c as u32;
    if c < 256 {
        return printable(c).then_some(c as u8);
    }
    (0u32..256).filter(|&b| !printable(b)).nth((c - 256) as usize).map(|b| b as u8)
}
