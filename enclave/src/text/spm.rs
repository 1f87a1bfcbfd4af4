//! The sentencepiece-style tokenizer of GGUF files whose
//! `tokenizer.ggml.model` is `llama` (Llama 1/2, Mistral, Gemma, and their kin):
//! scored pieces merged greedily, highest score first, with byte fallback
//! (`<0xXX>` tokens) for characters no piece covers, and spaces written as
//! `▁`. The merge order follows llama.cpp's SPM tokenizer, which
//! `scripts/reference/gen_spm_fixtures.py` checks it against.
//!
//! Before merging, text is split at special tokens as llama.cpp's
//! `tokenizer_st_partition` splits it: every special token, longest text
//! first, cuts every occurrence out of the text left over. User-defined
//! tokens are cut out of plain text too — Gemma's runs of spaces, tabs and
//! newlines (`"  "` is one token, not `▁▁`) — while control and unknown
//! tokens are only with special parsing on.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, HashSet};

use crate::model::error::{ModelError, Result};

/// How sentencepiece writes a space.
const SPACE: &str = "\u{2581}";

/// GGUF token types (llama.cpp's `llama_token_type`).
pub mod token_type {
    /// The unknown-token placeholder.
    pub const UNKNOWN: i64 = 2;
    /// BOS, EOS, chat-turn markers: never produced from plain text.
    pub const CONTROL: i64 = 3;
    /// Added tokens matched as wholes.
    pub const USER_DEFINED: i64 = 4;
    /// A `<0xXX>` byte-fallback token.
    pub const BYTE: i64 = 6;
}

/// A sentencepiece vocabulary.
#[derive(Debug)]
pub struct Spm {
    tokens: Vec<String>,
    scores: Vec<f32>,
    types: Vec<i64>,
    by_text: HashMap<String, u32>,
    bytes: [Option<u32>; 256],
    unk: Option<u32>,
    add_space_prefix: bool,
    /// Control, unknown and user-defined tokens, longest text first (ties by
    /// id), cut out of text before merging.
    specials: Vec<Special>,
    /// Each special text, and whether plain text has it cut out (some
    /// token of that text is not control).
    special_texts: HashMap<String, bool>,
    /// For each first byte, the lengths of the special texts starting with
    /// it, to find which special texts a text holds in one pass.
    special_lengths: Vec<Vec<usize>>,
}

/// User-defined token texts that llama.cpp marks control all the same (it
/// takes them for end-of-generation tokens; `llama_vocab::impl::load`, the
/// `special_eog_ids` list), so plain text never holds them as the token.
const END_OF_GENERATION: [&str; 22] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
    "[e~[",
];

/// A token cut out of text as a whole before merging (llama.cpp's special
/// token cache).
#[derive(Debug)]
struct Special {
    text: String,
    id: u32,
    /// Cut out only when special parsing is on: control and unknown tokens.
    control: bool,
    /// Whitespace after it is dropped (llama.cpp's `LLAMA_TOKEN_ATTR_RSTRIP`).
    rstrip: bool,
}

/// A candidate merge of two adjacent symbols.
#[derive(Debug)]
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    len: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Highest score first; among equal scores, the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score).then_with(|| other.left.cmp(&self.left))
    }
}

/// A run of text in the linked list of symbols being merged.
#[derive(Clone, Copy, Debug)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

impl Spm {
    /// Builds the vocabulary from GGUF token texts, scores and types.
    pub fn new(
        tokens: Vec<String>,
        scores: Vec<f32>,
        types: Vec<i64>,
        unk: Option<u32>,
        add_space_prefix: bool,
    ) -> Result<Self> {
        if scores.len() != tokens.len() || (!types.is_empty() && types.len() != tokens.len()) {
            return Err(ModelError::Malformed("sentencepiece scores or types do not match the token list".into()));
        }
        let types = if types.is_empty() { vec![1; tokens.len()] } else { types };
        let mut by_text = HashMap::with_capacity(tokens.len());
        let mut bytes = [None; 256];
        let mut specials = Vec::new();
        for (i, (t, kind)) in tokens.iter().zip(&types).enumerate() {
            let id = i as u32;
            match *kind {
                token_type::BYTE => {
                    let hex = t.strip_prefix("<0x").and_then(|h| h.strip_suffix('>'));
                    match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                        Some(b) => bytes[usize::from(b)] = Some(id),
                        None => return Err(ModelError::Malformed(format!("byte token {t:?} is not <0xXX>"))),
                    }
                }
                // An empty special token would match everywhere: never cut.
                token_type::CONTROL | token_type::UNKNOWN | token_type::USER_DEFINED if !t.is_empty() => {
                    let control = *kind != token_type::USER_DEFINED || END_OF_GENERATION.contains(&t.as_str());
                    specials.push(Special { text: t.clone(), id, control, rstrip: false });
                }
                _ => {}
            }
            by_text.entry(t.clone()).or_insert(id);
        }
        // llama.cpp sorts by length alone (`std::sort`, so equal lengths
        // fall in no set order); here they fall in id order.
        specials.sort_by(|a, b| b.text.len().cmp(&a.text.len()).then(a.id.cmp(&b.id)));
        let mut special_texts = HashMap::with_capacity(specials.len());
        let mut special_lengths = vec![Vec::new(); 256];
        for s in &specials {
            *special_texts.entry(s.text.clone()).or_insert(false) |= !s.control;
            // Not empty (above), so it has a first byte.
            let lengths: &mut Vec<usize> = &mut special_lengths[usize::from(s.text.as_bytes()[0])];
            if !lengths.contains(&s.text.len()) {
                lengths.push(s.text.len());
            }
        }
        let unk = unk.or_else(|| types.iter().position(|&k| k == token_type::UNKNOWN).map(|i| i as u32));
        Ok(Self {
            tokens,
            scores,
            types,
            by_text,
            bytes,
            unk,
            add_space_prefix,
            specials,
            special_texts,
            special_lengths,
        })
    }

    /// Drops the whitespace after every special token but those named, as
    /// llama.cpp does for Phi-3 (`LLAMA_TOKEN_ATTR_RSTRIP`, set by model name).
    pub fn strip_whitespace_after_specials(&mut self, except: &[&str]) {
        for s in &mut self.specials {
            s.rstrip = !except.contains(&s.text.as_str());
        }
    }

    /// Text to ids (no BOS). User-defined tokens are cut out of the text
    /// first; with `parse_special`, control tokens too. A fragment after a
    /// special token (or at the start) gets the space prefix, as llama.cpp
    /// does.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        let mut prev_special = true;
        for fragment in self.fragments(text, parse_special) {
            match fragment {
                Fragment::Special(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(t) => {
                    let mut s = String::with_capacity(t.len() + 3);
                    if self.add_space_prefix && prev_special {
                        s.push(' ');
                    }
                    s.push_str(t);
                    self.encode_piece(&s.replace(' ', SPACE), &mut out)?;
                    prev_special = false;
                }
            }
        }
        Ok(out)
    }

    /// `text` split at special tokens as llama.cpp's `tokenizer_st_partition`
    /// splits it: each special token in turn, longest first, cuts all its
    /// (non-overlapping, leftmost-first) occurrences out of the text
    /// fragments the longer ones left.
    fn fragments<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        let mut out = Vec::new();
        if text.is_empty() {
            return out;
        }
        out.push(Fragment::Text(text));
        let present = self.specials_in(text, parse_special);
        if present.is_empty() {
            return out;
        }
        for s in self.specials.iter().filter(|s| present.contains(s.text.as_str())) {
            if s.control && !parse_special {
                continue;
            }
            let mut next = Vec::with_capacity(out.len() + 2);
            for fragment in out {
                let Fragment::Text(mut rest) = fragment else {
                    next.push(fragment);
                    continue;
                };
                while let Some(at) = rest.find(s.text.as_str()) {
                    if at > 0 {
                        next.push(Fragment::Text(&rest[..at]));
                    }
                    next.push(Fragment::Special(s.id));
                    rest = &rest[at + s.text.len()..];
                    if s.rstrip {
                        // C's `isspace`, as llama.cpp tests it.
                        rest = rest.trim_start_matches([' ', '\t', '\n', '\r', '\x0B', '\x0C']);
                    }
                }
                if !rest.is_empty() {
                    next.push(Fragment::Text(rest));
                }
            }
            out = next;
        }
        out
    }

    /// The texts of the special tokens that occur in `text` (control ones
    /// only with `parse_special`), found in one pass over it.
    fn specials_in<'s>(&'s self, text: &str, parse_special: bool) -> HashSet<&'s str> {
        let mut found = HashSet::new();
        for (at, &b) in text.as_bytes().iter().enumerate() {
            for &len in &self.special_lengths[usize::from(b)] {
                let Some(candidate) = text.get(at..at + len) else { continue };
                if let Some((s, &plain)) = self.special_texts.get_key_value(candidate) {
                    if parse_special || plain {
                        found.insert(s.as_str());
                    }
                }
            }
        }
        found
    }

    /// Merges one escaped piece of text and appends its ids.
    fn encode_piece(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        let mut symbols: Vec<Symbol> = Vec::new();
        for (start, c) in text.char_indices() {
            let at = symbols.len();
            symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: at.checked_sub(1),
                next: (start + c.len_utf8() < text.len()).then_some(at + 1),
            });
        }
        let mut queue = BinaryHeap::new();
        let bigram = |symbols: &[Symbol], left: Option<usize>, right: Option<usize>| -> Option<Bigram> {
            let (l, r) = (left?, right?);
            let (a, b) = (symbols[l], symbols[r]);
            let id = *self.by_text.get(&text[a.start..b.start + b.len])?;
            Some(Bigram { left: l, right: r, score: self.scores[id as usize], len: a.len + b.len })
        };
        for i in 1..symbols.len() {
            queue.extend(bigram(&symbols, Some(i - 1), Some(i)));
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (symbols[b.left], symbols[b.right]);
            // Stale: one side has merged since this pair was queued.
            if l.len == 0 || r.len == 0 || l.len + r.len != b.len {
                continue;
            }
            symbols[b.left].len += r.len;
            symbols[b.right].len = 0;
            symbols[b.left].next = r.next;
            if let Some(n) = r.next {
                symbols[n].prev = Some(b.left);
            }
            queue.extend(bigram(&symbols, l.prev, Some(b.left)));
            queue.extend(bigram(&symbols, Some(b.left), r.next));
        }
        let mut at = if symbols.is_empty() { None } else { Some(0) };
        while let Some(i) = at {
            let s = symbols[i];
            let piece = &text[s.start..s.start + s.len];
            match self.by_text.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for byte in piece.bytes() {
                        let id = self.bytes[usize::from(byte)].or(self.unk).ok_or_else(|| {
                            ModelError::Unsupported("text needs a byte token the vocabulary lacks".into())
                        })?;
                        out.push(id);
                    }
                }
            }
            at = s.next;
        }
        Ok(())
    }

    /// Ids to text as llama.cpp's pieces concatenate: `▁` becomes a space,
    /// byte tokens their byte; control tokens are dropped.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let mut bytes = Vec::new();
        for &id in ids {
            let i = id as usize;
            let text = self
                .tokens
                .get(i)
                .ok_or_else(|| ModelError::Invalid(format!("token id {id} is outside the vocabulary")))?;
            match self.types[i] {
                token_type::BYTE => bytes.extend(self.bytes.iter().position(|b| *b == Some(id)).map(|b| b as u8)),
                token_type::CONTROL | token_type::UNKNOWN => {}
                _ => bytes.extend_from_slice(text.replace(SPACE, " ").as_bytes()),
            }
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

enum Fragment<'t> {
    Text(&'t str),
    Special(u32),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab() -> Spm {
        let mut tokens = vec!["<unk>".to_owned(), "<s>".into(), "</s>".into()];
        let mut scores = vec![0.0; 3];
        let mut types = vec![token_type::UNKNOWN, token_type::CONTROL, token_type::CONTROL];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            scores.push(0.0);
            types.push(token_type::BYTE);
        }
        for (t, s) in [("▁", -1.0), ("a", -2.0), ("b", -2.0), ("ab", -3.0), ("▁ab", -4.0), ("ba", -2.5)] {
            tokens.push(t.into());
            scores.push(s);
            types.push(1);
        }
        Spm::new(tokens, scores, types, Some(0), true).unwrap()
    }

    #[test]
    fn merges_by_score_and_falls_back_to_bytes() {
        let v = vocab();
        let id = |t: &str| v.by_text[t];
        // "▁ab": ▁+a has no piece; a+b (−3) merges, then ▁+ab (−4).
        assert_eq!(v.encode("ab", false).unwrap(), vec![id("▁ab")]);
        // "▁aba": b+a (−2.5) beats a+b (−3), leaving ▁ a ba.
        assert_eq!(v.encode("aba", false).unwrap(), vec![id("▁"), id("a"), id("ba")]);
        // 'z' has no piece: its byte token.
        assert_eq!(v.encode("z", false).unwrap(), vec![id("▁"), v.bytes[b'z' as usize].unwrap()]);
        assert_eq!(v.decode(&v.encode("ab z", false).unwrap()).unwrap(), " ab z");
    }

    #[test]
    fn specials_only_when_asked() {
        let v = vocab();
        assert_eq!(v.encode("</s>", true).unwrap(), vec![2]);
        assert!(v.encode("</s>", false).unwrap().len() > 1);
        assert!(Spm::new(vec!["<0xZZ>".into()], vec![0.0], vec![token_type::BYTE], None, true).is_err());
    }

    /// [`vocab`] with user-defined tokens: runs of spaces written with
    /// spaces (as Gemma's are), two that overlap, and one with the text of
    /// an end-of-generation token.
    fn with_user_defined() -> Spm {
        let v = vocab();
        let (mut tokens, mut scores, mut types) = (v.tokens, v.scores, v.types);
        for t in ["  ", "   ", "<b", "b>x", "</s2>", "<|im_end|>"] {
            tokens.push(t.into());
            scores.push(-1000.0);
            types.push(token_type::USER_DEFINED);
        }
        Spm::new(tokens, scores, types, Some(0), false).unwrap()
    }

    #[test]
    fn user_defined_tokens_are_cut_out_of_plain_text() {
        let v = with_user_defined();
        let id = |t: &str| v.by_text[t];
        // Gemma: "a  b" is a, "  ", b, not a ▁▁ b.
        assert_eq!(v.encode("a  b", false).unwrap(), vec![id("a"), id("  "), id("b")]);
        // Longest first: five spaces are "   " then "  ".
        assert_eq!(v.encode("a     b", false).unwrap(), vec![id("a"), id("   "), id("  "), id("b")]);
        // One space stays ▁ (no space prefix here).
        assert_eq!(v.encode("a b", false).unwrap(), vec![id("a"), id("▁"), id("b")]);
        // Longest text first, not leftmost first: "b>x" before "<b".
        assert_eq!(v.encode("<b>x", false).unwrap()[1..], [id("b>x")]);
        // An end-of-generation text counts as control: only with special parsing.
        assert_ne!(v.encode("<|im_end|>", false).unwrap(), vec![id("<|im_end|>")]);
        assert_eq!(v.encode("<|im_end|>", true).unwrap(), vec![id("<|im_end|>")]);
        assert_eq!(v.encode("</s2>", false).unwrap(), vec![id("</s2>")]);
        // Control tokens only with special parsing.
        assert_eq!(v.encode("a</s>", true).unwrap(), vec![id("a"), 2]);
        assert!(!v.encode("a</s>", false).unwrap().contains(&2));
    }

    #[test]
    fn whitespace_after_specials_is_dropped_when_asked() {
        let mut v = with_user_defined();
        let id = |v: &Spm, t: &str| v.by_text[t];
        let before = v.encode("</s> \n a", true).unwrap();
        assert_eq!(before[0], 2);
        assert!(before.len() > 2);
        v.strip_whitespace_after_specials(&["<s>"]);
        assert_eq!(v.encode("</s> \n a", true).unwrap(), vec![2, id(&v, "a")]);
        assert_eq!(v.encode("<s> a", true).unwrap()[..2], [1, id(&v, "▁")]);
    }

    #[test]
    fn an_empty_special_token_does_not_hang_the_encoder() {
        let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into(), String::new()];
        let mut types = vec![token_type::CONTROL; 4];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(token_type::BYTE);
        }
        let scores = vec![0.0; tokens.len()];
        let v = Spm::new(tokens, scores, types, Some(0), true).unwrap();
        // Special parsing with an empty control token in the vocabulary:
        // finishes, and the text round-trips through byte tokens.
        let ids = v.encode("hi</s>", true).unwrap();
        assert_eq!(ids.last(), Some(&2));
        assert!(v.decode(&ids[..ids.len() - 1]).unwrap().ends_with("hi"));
    }
}
