//! gpt-oss's harmony format: an answer is a sequence of messages, each a
//! header naming its channel (and, for a tool call, its recipient), then
//! `<|message|>` and a body ended by `<|end|>` (or by `<|call|>` /
//! `<|return|>`, which end generation and so are not in the text):
//!
//! ```text
//! <|channel|>analysis<|message|>The user asks…<|end|>
//! <|start|>assistant<|channel|>final<|message|>It is sunny.
//! <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}
//! ```
//!
//! [`HarmonyReader`] reads the text as it streams (special tokens written
//! out) and sorts each body:
//!
//! | message | goes to |
//! |---|---|
//! | `analysis` channel | `reasoning` |
//! | `final`, and `commentary` with no recipient (a preamble) | `content` |
//! | recipient `functions.NAME`, tools offered | a [`ToolCall`] (held until whole) |
//! | recipient `functions.NAME`, no tools offered | `content` (the model's text is not dropped) |
//! | any other recipient (built-in tools, not served) | `reasoning` |
//!
//! Text that does not begin like a header (a model that does not write
//! harmony) is all content. The reader is sans-IO: the gateway feeds it the
//! pieces a session streams and sends what it returns.

use serde_json::Value;

use super::calls::{Parsed, ToolCall};

/// Longest header read before the text is taken as plain content (a real
/// header is `<|start|>assistant<|channel|>commentary to=functions.NAME
/// <|constrain|>json`: under a hundred bytes for a 64-byte name).
pub const MAX_HEADER_BYTES: usize = 256;

/// How a message's header may begin: the first after the prompt's
/// `<|start|>assistant` begins with its channel or recipient, later ones
/// with `<|start|>`.
const OPENERS: [&str; 3] = ["<|channel|>", "<|start|>", " to="];
const MESSAGE: &str = "<|message|>";
/// What ends a body.
const ENDS: [&str; 3] = ["<|end|>", "<|call|>", "<|return|>"];

/// Where a message's body goes.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Body {
    Reasoning,
    Content,
    /// A call to the client's function of this name.
    Call(String),
}

#[derive(Debug)]
enum State {
    /// Reading a header (held until `<|message|>`).
    Header,
    /// Reading a body.
    Body(Body),
}

/// Text one more piece made ready to send.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Delta {
    /// Reasoning (the `analysis` channel).
    pub reasoning: String,
    /// Content for the user.
    pub content: String,
}

impl Delta {
    /// Nothing to send.
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty()
    }
}

/// Reads a harmony answer as it streams.
#[derive(Debug)]
pub struct HarmonyReader {
    state: State,
    /// Text not yet sorted: a header, or a body's ending that may begin an
    /// end marker.
    buf: String,
    /// The body of the call being read.
    args: String,
    /// Tools were offered: calls to `functions.*` are calls.
    calls_offered: bool,
    /// Everything sorted so far.
    whole: Parsed,
}

impl HarmonyReader {
    /// A reader for one answer; `calls_offered`: the request offered tools.
    pub fn new(calls_offered: bool) -> Self {
        Self { state: State::Header, buf: String::new(), args: String::new(), calls_offered, whole: Parsed::default() }
    }

    /// Reads one more piece of the answer's text; returns what is ready.
    pub fn push(&mut self, piece: &str) -> Delta {
        self.buf.push_str(piece);
        let mut out = Delta::default();
        loop {
            match &self.state {
                State::Header => {
                    if let Some(at) = self.buf.find(MESSAGE) {
                        self.state = State::Body(self.classify(&self.buf[..at]));
                        self.buf.drain(..at + MESSAGE.len());
                    } else if !could_be_header(&self.buf) {
                        // Not harmony: this and what follows is content.
                        self.state = State::Body(Body::Content);
                    } else {
                        return out;
                    }
                }
                State::Body(body) => {
                    let body = body.clone();
                    let end = ENDS.iter().filter_map(|m| self.buf.find(m).map(|at| (at, m.len()))).min();
                    if let Some((at, len)) = end {
                        let text: String = self.buf.drain(..at + len).take(at).collect();
                        self.emit(&body, &text, &mut out);
                        self.end_message(&body, &mut out);
                        self.state = State::Header;
                        continue;
                    }
                    let ready = self.buf.len() - held_back(&self.buf);
                    let text: String = self.buf.drain(..ready).collect();
                    self.emit(&body, &text, &mut out);
                    return out;
                }
            }
        }
    }

    /// Ends the answer: what was still held, and the whole answer sorted.
    /// A call's body ends with the text (`<|call|>` ends generation); a
    /// header with no body after it carries nothing and is dropped.
    pub fn finish(mut self) -> (Delta, Parsed) {
        let mut out = Delta::default();
        if let State::Body(body) = std::mem::replace(&mut self.state, State::Header) {
            let text = std::mem::take(&mut self.buf);
            self.emit(&body, &text, &mut out);
            self.end_message(&body, &mut out);
        } else if !could_be_header(&self.buf) {
            let text = std::mem::take(&mut self.buf);
            self.emit(&Body::Content, &text, &mut out);
        }
        (out, self.whole)
    }

    fn classify(&self, header: &str) -> Body {
        let word = |after: &str| {
            header.find(after).map(|at| {
                let rest = &header[at + after.len()..];
                rest[..rest.find(|c: char| c.is_whitespace() || c == '<').unwrap_or(rest.len())].to_owned()
            })
        };
        let channel = word("<|channel|>");
        match word("to=") {
            Some(r) if r.starts_with("functions.") && r.len() > "functions.".len() && self.calls_offered => {
                Body::Call(r["functions.".len()..].to_owned())
            }
            Some(r) if !r.starts_with("functions.") => Body::Reasoning,
            _ if channel.as_deref() == Some("analysis") => Body::Reasoning,
            _ => Body::Content,
        }
    }

    fn emit(&mut self, body: &Body, text: &str, out: &mut Delta) {
        match body {
            Body::Reasoning => {
                out.reasoning.push_str(text);
                self.whole.reasoning.push_str(text);
            }
            Body::Content => {
                out.content.push_str(text);
                self.whole.content.push_str(text);
            }
            Body::Call(_) => self.args.push_str(text),
        }
    }

    /// A call's body is whole: a JSON object is a call; anything else is
    /// the model's text and goes to the content as written.
    fn end_message(&mut self, body: &Body, out: &mut Delta) {
        let Body::Call(name) = body else { return };
        let args = std::mem::take(&mut self.args);
        match serde_json::from_str::<Value>(args.trim()) {
            Ok(v) if v.is_object() => self.whole.calls.push(ToolCall { name: name.clone(), arguments: v.to_string() }),
            _ => self.emit(&Body::Content, &args, out),
        }
    }
}

/// Whether `buf` may still be (the beginning of) a header.
fn could_be_header(buf: &str) -> bool {
    buf.len() <= MAX_HEADER_BYTES && OPENERS.iter().any(|o| buf.starts_with(o) || o.starts_with(buf))
}

/// Bytes at the end of `buf` that begin an end marker.
fn held_back(buf: &str) -> usize {
    ENDS.iter().map(|m| (1..m.len()).rev().find(|&k| buf.ends_with(&m[..k])).unwrap_or(0)).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ANSWER: &str = "<|channel|>analysis<|message|>The user wants weather.<|end|>\
        <|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>\
        <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}";

    fn call(name: &str, args: &str) -> ToolCall {
        ToolCall { name: name.into(), arguments: args.into() }
    }

    /// A whole harmony answer read at once.
    fn parse(text: &str, calls_offered: bool) -> Parsed {
        crate::text::reasoning::parse(crate::text::reasoning::ReasoningFormat::Harmony, text, calls_offered)
    }

    #[test]
    fn channels_are_sorted_and_a_call_is_read() {
        let p = parse(ANSWER, true);
        assert_eq!(p.reasoning, "The user wants weather.");
        assert_eq!(p.content, "Checking.");
        assert_eq!(p.calls, vec![call("get_weather", r#"{"city":"Paris"}"#)]);
        // The recipient may come before the channel, as the template writes
        // earlier calls; a final answer after reasoning.
        let p =
            parse("<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant<|channel|>final<|message|>Sunny.", true);
        assert_eq!((p.reasoning.as_str(), p.content.as_str(), p.calls.len()), ("Hmm.", "Sunny.", 0));
        let p = parse(" to=functions.f<|channel|>commentary json<|message|>{}", true);
        assert_eq!(p.calls, vec![call("f", "{}")]);
    }

    #[test]
    fn what_is_not_a_call_or_not_harmony_stays_text() {
        // No tools offered: the model's call is content, not dropped.
        let p = parse(ANSWER, false);
        assert_eq!(p.content, "Checking.{\"city\": \"Paris\"}");
        assert!(p.calls.is_empty());
        // Arguments that are not a JSON object are content too.
        let p = parse("<|channel|>commentary to=functions.f<|message|>{\"a\": ", true);
        assert_eq!((p.content.as_str(), p.calls.len()), ("{\"a\": ", 0));
        // A built-in tool's call (not served) stays with the reasoning.
        let p = parse("<|channel|>analysis to=browser.search<|message|>{\"q\": 1}", true);
        assert_eq!((p.reasoning.as_str(), p.calls.len()), ("{\"q\": 1}", 0));
        // A model that does not write harmony: all content.
        for text in ["Just an answer.", "<|chann but not really", ""] {
            let p = parse(text, true);
            assert_eq!((p.content.as_str(), p.reasoning.as_str()), (text, ""), "{text:?}");
        }
        // An endless header is content once it is too long to be one.
        let long = format!("<|channel|>{}", "x".repeat(MAX_HEADER_BYTES));
        assert_eq!(parse(&long, true).content, long);
        // A header with nothing after it is dropped.
        assert_eq!(parse("<|channel|>final<|message|>Hi.<|end|><|start|>assistant<|chan", true).content, "Hi.");
    }

    #[test]
    fn streamed_pieces_say_what_the_whole_answer_says() {
        // Cut everywhere, even inside markers: the deltas add up to the
        // parse of the whole text, and a call's body never streams.
        for step in 1..=7 {
            let mut r = HarmonyReader::new(true);
            let mut got = Delta::default();
            let chars: Vec<char> = ANSWER.chars().collect();
            for piece in chars.chunks(step) {
                let d = r.push(&piece.iter().collect::<String>());
                got.reasoning.push_str(&d.reasoning);
                got.content.push_str(&d.content);
                assert!(!d.content.contains("Paris"), "{d:?}");
            }
            let (rest, whole) = r.finish();
            got.reasoning.push_str(&rest.reasoning);
            got.content.push_str(&rest.content);
            assert_eq!(
                (got.reasoning.as_str(), got.content.as_str()),
                (whole.reasoning.as_str(), whole.content.as_str())
            );
            assert_eq!(whole, parse(ANSWER, true));
        }
        // An end marker is not sent in pieces: the part that may begin one waits.
        let mut r = HarmonyReader::new(true);
        assert_eq!(r.push("<|channel|>final<|message|>Hi <|e").content, "Hi ");
        assert_eq!(r.push("nd|>").content, "");
    }
}
