//! The answer to one generation call, sans IO: generation events in, what
//! to seal out ([`Step`]s), as `SessionCore` is for a session. The gateway's
//! driver (`server.rs`) only spawns the sessions, feeds their events and the
//! routes they ran on, and pumps the steps into the sealer, signing the
//! receipt where a step says the answer is whole.
//!
//! ```text
//!  start()                ─▶ Head (a stream's, at once)
//!  event(i, Text | Logprobs) ─▶ Body chunks (stream) | nothing (complete)
//!  event(i, Done)         ─▶ choice i's end chunks (stream); after the last
//!                            choice: usage, [DONE] or the body, then Finish
//!  event(i, Error | Refused), ended() before every choice is done
//!                         ─▶ the error (an event, or a whole error answer),
//!                            then Finish
//! ```
//!
//! A stream is a 200 answer once its head is out: one that ends in an error
//! event is complete too, and signed for. A complete answer that failed is an
//! error answer with no receipt.

use veil_wire::http::{DRAFTER_FIELD, EVENT_STREAM_TYPE, JSON_TYPE, ROUTE_FIELD};
use veil_wire::Blame;

use super::openai::{self, ApiError, Call, Ids, Kind, Usage};
use crate::generate::{Generation, TokenLogprob};
use crate::pipeline::entry::{Failure, GenerateEvent};
use crate::text::harmony::Delta;
use crate::text::reasoning::{Reader, ReasoningFormat};
use crate::text::tokenizer::Tokenizer;
use crate::text::tools::Parsed;

/// What the driver does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Seal the response head.
    Head {
        /// HTTP status.
        status: u16,
        /// Header fields.
        fields: Vec<(&'static str, String)>,
    },
    /// Seal this piece of the body.
    Body(Vec<u8>),
    /// The answer is whole: end the sealed response. With `receipt`, sign
    /// one over the body sealed so far and add it to `trailer`.
    Finish {
        /// What the receipt records, when the answer is signed for.
        receipt: Option<Signed>,
        /// Trailer fields before the receipt.
        trailer: Vec<(&'static str, String)>,
    },
}

/// What a receipt records besides the request and the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    /// Prompt and completion tokens.
    pub tokens: (usize, usize),
    /// The drafter that ran (`none`, or per choice with `|` between).
    pub drafter: String,
    /// Every route a session ran on, in order, `;` between.
    pub route: String,
}

/// The answer to one call, between its sessions and the sealer.
#[derive(Debug)]
pub struct AnswerCore<'t> {
    kind: Kind,
    stream: bool,
    include_usage: bool,
    tools: Option<openai::Tools>,
    reasoning: Option<ReasoningFormat>,
    echo: Option<String>,
    prompt_tokens: usize,
    max_tokens: usize,
    tokenizer: &'t Tokenizer,
    ids: Ids,
    choices: Vec<ChoiceState>,
    routes: Vec<String>,
    finished: bool,
}

impl<'t> AnswerCore<'t> {
    /// The answer to `call` (its sessions not started here), named `ids`.
    pub fn new(call: &Call, ids: Ids, tokenizer: &'t Tokenizer) -> Self {
        let reader = || call.reasoning.map(|f| f.reader(call.tools.is_some()));
        Self {
            kind: call.kind,
            stream: call.stream,
            include_usage: call.include_usage,
            tools: call.tools.clone(),
            reasoning: call.reasoning,
            echo: call.echo.clone(),
            prompt_tokens: call.request.prompt_ids.len(),
            max_tokens: call.request.max_tokens,
            tokenizer,
            ids,
            choices: (0..call.n).map(|_| ChoiceState { reader: reader(), ..ChoiceState::default() }).collect(),
            routes: Vec::new(),
            finished: false,
        }
    }

    /// What goes out before any event: a stream's head.
    pub fn start(&self) -> Vec<Step> {
        match self.stream {
            true => vec![Step::Head {
                status: 200,
                fields: vec![("content-type", EVENT_STREAM_TYPE.into()), ("cache-control", "no-cache".into())],
            }],
            false => Vec::new(),
        }
    }

    /// A route a session ran on (a re-route or another choice adds one);
    /// named inside the seal, so the client learns which attested shards
    /// served it.
    pub fn route(&mut self, route: String) {
        self.routes.push(route);
    }

    /// Whether the answer is whole (a [`Step::Finish`] went out).
    pub fn finished(&self) -> bool {
        self.finished
    }

    /// Choice `i`'s next event. Events after the answer is whole, or for a
    /// choice the call did not ask for, are ignored.
    pub fn event(&mut self, i: usize, ev: GenerateEvent) -> Vec<Step> {
        if self.finished || i >= self.choices.len() {
            return Vec::new();
        }
        let (kind, tokenizer, ids) = (self.kind, self.tokenizer, &self.ids);
        let c = &mut self.choices[i];
        match ev {
            // Offered tools, the text streams up to a call (the entry
            // holds the rest back).
            GenerateEvent::Text(t) if self.stream => {
                if let Some(r) = c.reader.as_mut() {
                    let d = r.push(&t);
                    c.fed += t.len();
                    return c.delta_chunks(kind, tokenizer, ids, i, d).into_iter().map(Step::Body).collect();
                }
                let lp = c.take_logprobs(kind, tokenizer, usize::MAX);
                let chunk = openai::sse_chunk(kind, ids, i, Some(&t), None, c.first, lp);
                c.first = false;
                if self.tools.is_some() {
                    c.streamed.push_str(&t);
                }
                vec![Step::Body(chunk)]
            }
            GenerateEvent::Text(_) => Vec::new(),
            GenerateEvent::Logprobs(lp) => {
                c.pending.get_or_insert_with(Vec::new).extend(lp);
                Vec::new()
            }
            GenerateEvent::Done(g) => {
                let mut out = Vec::new();
                if self.stream {
                    let lp = c.take_logprobs(kind, tokenizer, g.ids.len());
                    let reason = finish_reason(g.ids.len(), self.max_tokens);
                    let end = c.end_chunks((kind, self.tools.as_ref()), tokenizer, ids, i, &g, lp, reason);
                    out.extend(end.into_iter().map(Step::Body));
                }
                c.done = Some(*g);
                if self.choices.iter().all(|c| c.done.is_some()) {
                    out.extend(self.whole());
                }
                out
            }
            GenerateEvent::Error(f) => self.failed(&server_error(&f)),
            GenerateEvent::Refused(e) => self.failed(&ApiError::invalid("request", e)),
        }
    }

    /// Every session's events have ended: the answer, or, when a choice
    /// never finished, the pipeline's error.
    pub fn ended(&mut self) -> Vec<Step> {
        if self.finished {
            return Vec::new();
        }
        if self.choices.iter().all(|c| c.done.is_some()) {
            return self.whole();
        }
        self.failed(&server_error(&Failure { message: "generation ended".into(), blame: Blame::Pipeline }))
    }

    fn route_list(&self) -> String {
        self.routes.join(";")
    }

    /// The answer failed: an error event ending the stream (signed for), or
    /// a whole error answer.
    fn failed(&mut self, e: &ApiError) -> Vec<Step> {
        self.finished = true;
        if !self.stream {
            return vec![
                Step::Head { status: e.status, fields: vec![("content-type", JSON_TYPE.into())] },
                Step::Body(openai::pad_body(e.body())),
                Step::Finish { receipt: None, trailer: Vec::new() },
            ];
        }
        let receipt = Signed { tokens: (self.prompt_tokens, 0), drafter: "none".into(), route: self.route_list() };
        vec![Step::Body(openai::sse_error(e)), Step::Finish { receipt: Some(receipt), trailer: Vec::new() }]
    }

    /// Every choice is done: the stream's end, or the complete body.
    fn whole(&mut self) -> Vec<Step> {
        self.finished = true;
        let done: Vec<Generation> = self.choices.iter_mut().filter_map(|c| c.done.take()).collect();
        let completion_tokens: usize = done.iter().map(|g| g.ids.len()).sum();
        let usage = Usage::new(self.prompt_tokens, completion_tokens);
        let signed = Signed {
            tokens: (self.prompt_tokens, completion_tokens),
            drafter: done.iter().map(drafter_ran).collect::<Vec<_>>().join(" | "),
            route: self.route_list(),
        };
        if self.stream {
            let mut out = Vec::new();
            if self.include_usage {
                out.push(Step::Body(openai::sse_usage(self.kind, &self.ids, usage)));
            }
            out.push(Step::Body(openai::sse_done()));
            let trailer = vec![(ROUTE_FIELD, signed.route.clone()), (DRAFTER_FIELD, signed.drafter.clone())];
            out.push(Step::Finish { receipt: Some(signed), trailer });
            return out;
        }
        let body = self.complete_body(&done, usage);
        let fields = vec![
            ("content-type", JSON_TYPE.into()),
            (ROUTE_FIELD, signed.route.clone()),
            (DRAFTER_FIELD, signed.drafter.clone()),
        ];
        vec![
            Step::Head { status: 200, fields },
            Step::Body(openai::pad_body(body)),
            Step::Finish { receipt: Some(signed), trailer: Vec::new() },
        ]
    }

    /// The non-streamed answer: each choice sorted into reasoning, content
    /// and calls; with `echo`, its text after the prompt and the prompt's
    /// scores first in its log-probabilities.
    fn complete_body(&self, done: &[Generation], usage: Usage) -> Vec<u8> {
        let tools = self.tools.as_ref();
        let parsed: Vec<Option<Parsed>> = done
            .iter()
            .map(|g| match self.reasoning {
                Some(f) => Some(sort_answer(tools, f.reader(tools.is_some()), &g.text)),
                None => tools.map(|tools| read_calls(tools, g)),
            })
            .collect();
        let echoed: Vec<String> = match &self.echo {
            Some(prompt) => done.iter().map(|g| format!("{prompt}{}", g.text)).collect(),
            None => Vec::new(),
        };
        let answers: Vec<openai::Choice<'_>> = done
            .iter()
            .zip(&parsed)
            .enumerate()
            .map(|(i, (g, p))| {
                let calls = p.as_ref().map(|p| p.calls.as_slice()).filter(|c| !c.is_empty());
                let logprobs = g.logprobs.as_deref().map(|lp| match self.echo {
                    Some(_) => openai::echo_logprobs_json(
                        self.tokenizer,
                        &g.prompt_ids,
                        g.prompt_logprobs.as_deref().unwrap_or_default(),
                        lp,
                    ),
                    None => openai::logprobs_json(self.kind, self.tokenizer, lp, &mut 0),
                });
                openai::Choice {
                    text: echoed.get(i).unwrap_or_else(|| p.as_ref().map_or(&g.text, |p| &p.content)),
                    reasoning: p.as_ref().map(|p| p.reasoning.as_str()),
                    finish: if calls.is_some() { "tool_calls" } else { finish_reason(g.ids.len(), self.max_tokens) },
                    logprobs,
                    tool_calls: calls.map(openai::tool_calls_json),
                }
            })
            .collect();
        openai::complete_body(self.kind, &self.ids, &answers, usage)
    }
}

/// `length` when a choice used all of `max_tokens`, else `stop`.
fn finish_reason(tokens: usize, max_tokens: usize) -> &'static str {
    if tokens >= max_tokens {
        "length"
    } else {
        "stop"
    }
}

/// One choice of an answer being generated.
#[derive(Debug)]
struct ChoiceState {
    /// No chunk of it has gone out yet (a chat stream's first carries the role).
    first: bool,
    /// Log-probabilities of tokens whose text has not gone out yet.
    pending: Option<Vec<TokenLogprob>>,
    /// Log-probabilities sent so far.
    sent: usize,
    /// Characters of text before the next token (`text_offset`).
    offset: usize,
    /// The finished generation.
    done: Option<Generation>,
    /// Text streamed so far (read when tools were offered).
    streamed: String,
    /// The reader of an answer whose reasoning is set apart, while it
    /// streams; the bytes of text it was given, and the reasoning sent.
    reader: Option<Reader>,
    fed: usize,
    reasoned: String,
}

impl Default for ChoiceState {
    fn default() -> Self {
        Self {
            first: true,
            pending: None,
            sent: 0,
            offset: 0,
            done: None,
            streamed: String::new(),
            reader: None,
            fed: 0,
            reasoned: String::new(),
        }
    }
}

impl ChoiceState {
    /// The chunks a sorted piece of an answer makes: its reasoning, then
    /// its content with the pending log-probabilities (those of markers
    /// and headers too).
    fn delta_chunks(&mut self, kind: Kind, tokenizer: &Tokenizer, ids: &Ids, index: usize, d: Delta) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        self.reasoned.push_str(&d.reasoning);
        self.streamed.push_str(&d.content);
        if !d.reasoning.is_empty() {
            out.push(openai::sse_reasoning(ids, index, &d.reasoning, self.first));
            self.first = false;
        }
        if !d.content.is_empty() {
            let lp = self.take_logprobs(kind, tokenizer, usize::MAX);
            out.push(openai::sse_chunk(kind, ids, index, Some(&d.content), None, self.first, lp));
            self.first = false;
        }
        out
    }

    /// The chunks that end a streamed choice: what the stream has not said
    /// yet (the text held back at a call, or what the reader still held),
    /// its calls whole, then the end chunk with `reason` (`tool_calls` when
    /// it called). `call`: the endpoint and the tools offered; `lp`: the
    /// log-probabilities not sent yet.
    #[allow(clippy::too_many_arguments)]
    fn end_chunks(
        &mut self,
        (kind, tools): (Kind, Option<&openai::Tools>),
        tokenizer: &Tokenizer,
        ids: &Ids,
        index: usize,
        g: &Generation,
        mut lp: Option<serde_json::Value>,
        reason: &'static str,
    ) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut calls = Vec::new();
        if let Some(r) = self.reader.take() {
            let parsed = sort_answer(tools, r, g.text.get(self.fed..).unwrap_or_default());
            // (A parsed call's content is trimmed: the stream may have said
            // more blanks.)
            let content = (parsed.content.strip_prefix(self.streamed.as_str()))
                .or_else(|| parsed.content.strip_prefix(self.streamed.trim()));
            let d = Delta {
                reasoning: parsed.reasoning.strip_prefix(&self.reasoned).unwrap_or_default().to_owned(),
                content: content.unwrap_or_default().to_owned(),
            };
            out = self.delta_chunks(kind, tokenizer, ids, index, d);
            calls = parsed.calls;
        } else if let Some(tools) = tools {
            let parsed = read_calls(tools, g);
            // The content after the streamed part, or, with no call, the
            // rest of the text.
            let rest = if parsed.calls.is_empty() {
                g.text.strip_prefix(self.streamed.as_str()).unwrap_or_default()
            } else {
                parsed.content.strip_prefix(self.streamed.trim()).unwrap_or_default()
            };
            if !rest.is_empty() || lp.is_some() {
                out.push(openai::sse_chunk(kind, ids, index, Some(rest), None, self.first, lp.take()));
                self.first = false;
            }
            calls = parsed.calls;
        }
        let mut reason = reason;
        if !calls.is_empty() {
            out.push(openai::sse_tool_calls(ids, index, &calls, self.first));
            self.first = false;
            reason = "tool_calls";
        }
        out.push(openai::sse_chunk(kind, ids, index, None, Some(reason), self.first, lp));
        out
    }

    /// The pending log-probabilities in the endpoint's shape, for a chunk;
    /// `answer`: tokens in the answer, when known (those a stop string cut
    /// are not sent).
    fn take_logprobs(&mut self, kind: Kind, tokenizer: &Tokenizer, answer: usize) -> Option<serde_json::Value> {
        let mut lp = self.pending.take()?;
        lp.truncate(answer.saturating_sub(self.sent));
        self.sent += lp.len();
        Some(openai::logprobs_json(kind, tokenizer, &lp, &mut self.offset))
    }
}

/// The tool calls in an answer, read from its text, which for a request
/// that offered tools has special tokens written out (`<tool_call>` is one
/// in Qwen's vocabulary); all of them, or the first when
/// `parallel_tool_calls` is false.
fn read_calls(tools: &openai::Tools, g: &Generation) -> Parsed {
    let mut parsed = tools.format.parse(&g.text, &tools.defs);
    if !tools.parallel {
        parsed.calls.truncate(1);
    }
    parsed
}

/// The whole answer sorted by its reasoning format: `reader` (given the
/// streamed part, or nothing yet) reads `rest`; a `<think>` model's calls
/// are read from its content in the tool format; all of them, or the first
/// when `parallel_tool_calls` is false.
fn sort_answer(tools: Option<&openai::Tools>, mut reader: Reader, rest: &str) -> Parsed {
    reader.push(rest);
    let thinks = matches!(reader, Reader::Think(_));
    let (_, mut whole) = reader.finish();
    if let (true, Some(tools)) = (thinks, tools) {
        let p = tools.format.parse(&whole.content, &tools.defs);
        (whole.content, whole.calls) = (p.content, p.calls);
    }
    if !tools.is_some_and(|t| t.parallel) {
        whole.calls.truncate(1);
    }
    whole
}

/// The drafter that ran for a generation, as the sealed answer names it:
/// `none` when the session did not speculate, else the drafter's name and
/// how many rounds carried drafts.
fn drafter_ran(g: &Generation) -> String {
    match &g.speculation {
        None => "none".to_owned(),
        Some(s) => format!("{}; {} of {} rounds drafted", s.drafter, s.spec_rounds, s.rounds),
    }
}

/// An accepted request that failed, as the OpenAI error its blame calls for.
fn server_error(f: &Failure) -> ApiError {
    let kind = match f.blame {
        Blame::Request => "invalid_request_error",
        Blame::Busy => "rate_limit_error",
        Blame::Timeout => "timeout",
        _ => "server_error",
    };
    ApiError { status: f.blame.status(), kind, param: None, message: f.message.clone() }
}

#[cfg(test)]
#[path = "answer_tests.rs"]
mod tests;
