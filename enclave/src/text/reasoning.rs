//! Reasoning set apart from the answer, as OpenAI-compatible servers return
//! it (`reasoning_content`): gpt-oss's harmony `analysis` channel
//! ([`super::harmony`]), and the `<think>…</think>` block that Qwen 3, QwQ,
//! DeepSeek R1, GLM 4.x, Kimi K2 Thinking, MiniMax M2 and others write
//! before their answer.
//!
//! A `<think>` model's answer is read by [`ThinkReader`]: what comes before
//! `</think>` is reasoning, what follows is the answer (its leading blanks
//! dropped). When the chat template's generation prompt already opened the
//! block (DeepSeek R1, Qwen 3.5, GLM 4.7 end it with `<think>`), the answer
//! starts inside it; otherwise an answer that begins with `<think>` opens
//! one, and any other is all content.

use super::calls::Parsed;
use super::harmony::{Delta, HarmonyReader};
use super::tokenizer::Tokenizer;

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// How a model sets its reasoning apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// gpt-oss's harmony channels.
    Harmony,
    /// A `<think>…</think>` block first; `open`: the prompt opened it.
    Think {
        /// The generation prompt ends inside an open `<think>` block.
        open: bool,
    },
}

impl ReasoningFormat {
    /// How a chat answer of `tokenizer`'s model to `prompt_ids` (the
    /// rendered conversation) sets its reasoning apart, if it does: by
    /// harmony channel, or in a `<think>` block, open already when the
    /// prompt ends with `<think>`; `constrained`: a grammar (a response
    /// format, a forced call) holds from the first token, so the answer
    /// does not think first even where the prompt opened the block.
    pub fn of(tokenizer: &Tokenizer, prompt_ids: &[u32], constrained: bool) -> Option<Self> {
        if tokenizer.harmony() {
            return Some(Self::Harmony);
        }
        if !tokenizer.thinks() {
            return None;
        }
        let tail = &prompt_ids[prompt_ids.len().saturating_sub(8)..];
        let opened = tokenizer.decode_with_special(tail).is_ok_and(|t| t.trim_end().ends_with(OPEN));
        Some(Self::Think { open: opened && !constrained })
    }

    /// A reader for one answer; `calls_offered`: the request offered tools
    /// (harmony reads its calls itself).
    pub fn reader(self, calls_offered: bool) -> Reader {
        match self {
            Self::Harmony => Reader::Harmony(HarmonyReader::new(calls_offered)),
            Self::Think { open } => Reader::Think(ThinkReader::new(open)),
        }
    }
}

/// Reads one answer by [`ReasoningFormat`].
#[derive(Debug)]
pub enum Reader {
    /// Harmony messages.
    Harmony(HarmonyReader),
    /// A `<think>` block.
    Think(ThinkReader),
}

impl Reader {
    /// Reads one more piece of the answer's text; returns what is ready.
    pub fn push(&mut self, piece: &str) -> Delta {
        match self {
            Self::Harmony(r) => r.push(piece),
            Self::Think(r) => r.push(piece),
        }
    }

    /// Ends the answer: what was still held, and the whole answer sorted.
    pub fn finish(self) -> (Delta, Parsed) {
        match self {
            Self::Harmony(r) => r.finish(),
            Self::Think(r) => r.finish(),
        }
    }
}

/// Reads the answer as one piece (see [`Reader`]).
pub fn parse(format: ReasoningFormat, text: &str, calls_offered: bool) -> Parsed {
    let mut r = format.reader(calls_offered);
    r.push(text);
    r.finish().1
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing but blanks yet: a `<think>` may open the answer.
    Start,
    /// Inside the block.
    Thinking,
    /// After `</think>`, before the answer's first non-blank.
    Blank,
    /// The answer.
    Answer,
}

/// Reads a `<think>…</think>` answer as it streams.
#[derive(Debug)]
pub struct ThinkReader {
    state: State,
    /// Text not yet sorted.
    buf: String,
    whole: Parsed,
}

impl ThinkReader {
    /// A reader; `open`: the prompt ended inside a `<think>` block.
    pub fn new(open: bool) -> Self {
        Self { state: if open { State::Thinking } else { State::Start }, buf: String::new(), whole: Parsed::default() }
    }

    /// Reads one more piece; returns what is ready.
    pub fn push(&mut self, piece: &str) -> Delta {
        self.buf.push_str(piece);
        let mut out = Delta::default();
        loop {
            match self.state {
                State::Start => {
                    let t = self.buf.trim_start();
                    if let Some(rest) = t.strip_prefix(OPEN) {
                        self.buf = rest.to_owned();
                        self.state = State::Thinking;
                    } else if OPEN.starts_with(t) {
                        return out;
                    } else {
                        self.state = State::Answer;
                    }
                }
                State::Thinking => match self.buf.find(CLOSE) {
                    Some(at) => {
                        let text: String = self.buf.drain(..at + CLOSE.len()).take(at).collect();
                        self.emit(true, &text, &mut out);
                        self.state = State::Blank;
                    }
                    None => {
                        let keep = (1..CLOSE.len()).rev().find(|&k| self.buf.ends_with(&CLOSE[..k])).unwrap_or(0);
                        let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                        self.emit(true, &text, &mut out);
                        return out;
                    }
                },
                State::Blank => {
                    let t = self.buf.trim_start().to_owned();
                    if t.is_empty() {
                        self.buf.clear();
                        return out;
                    }
                    self.buf = t;
                    self.state = State::Answer;
                }
                State::Answer => {
                    let text = std::mem::take(&mut self.buf);
                    self.emit(false, &text, &mut out);
                    return out;
                }
            }
        }
    }

    /// Ends the answer: what was held (an answer that was only blanks or
    /// the beginning of `<think>` is content; an unclosed block is
    /// reasoning), and the whole answer sorted.
    pub fn finish(mut self) -> (Delta, Parsed) {
        let mut out = Delta::default();
        let text = std::mem::take(&mut self.buf);
        match self.state {
            State::Thinking => self.emit(true, &text, &mut out),
            State::Start | State::Answer => self.emit(false, &text, &mut out),
            State::Blank => {}
        }
        (out, self.whole)
    }

    fn emit(&mut self, reasoning: bool, text: &str, out: &mut Delta) {
        let (delta, whole) = if reasoning {
            (&mut out.reasoning, &mut self.whole.reasoning)
        } else {
            (&mut out.content, &mut self.whole.content)
        };
        delta.push_str(text);
        whole.push_str(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn think(text: &str, open: bool) -> (String, String) {
        let p = parse(ReasoningFormat::Think { open }, text, false);
        (p.reasoning, p.content)
    }

    #[test]
    fn the_block_is_reasoning_and_what_follows_the_answer() {
        let s = |a: &str, b: &str| (a.to_owned(), b.to_owned());
        assert_eq!(think("<think>\nHmm.\n</think>\n\nParis.", false), s("\nHmm.\n", "Paris."));
        // The prompt opened the block.
        assert_eq!(think("Hmm.</think>Paris.", true), s("Hmm.", "Paris."));
        // No block: all answer; an unclosed one: all reasoning.
        assert_eq!(think("Paris, <think> is a word.", false), s("", "Paris, <think> is a word."));
        assert_eq!(think("<think>Still thinking", false), s("Still thinking", ""));
        assert_eq!(think("<thi", false), s("", "<thi"));
        assert_eq!(think("<think>a</think>  ", false), s("a", ""));
    }

    #[test]
    fn streamed_pieces_say_what_the_whole_answer_says() {
        let answer = "  <think>\nWeigh it.</thin </think>\n\nIt is </think> here.";
        for open in [false, true] {
            let text = if open { &answer[9..] } else { answer };
            for step in 1..=6 {
                let mut r = ThinkReader::new(open);
                let mut got = Delta::default();
                let chars: Vec<char> = text.chars().collect();
                for piece in chars.chunks(step) {
                    let d = r.push(&piece.iter().collect::<String>());
                    got.reasoning.push_str(&d.reasoning);
                    got.content.push_str(&d.content);
                }
                let (rest, whole) = r.finish();
                got.reasoning.push_str(&rest.reasoning);
                got.content.push_str(&rest.content);
                assert_eq!((&got.reasoning, &got.content), (&whole.reasoning, &whole.content), "step {step}");
                assert_eq!(whole.reasoning, "\nWeigh it.</thin ");
                assert_eq!(whole.content, "It is </think> here.");
            }
        }
    }
}
