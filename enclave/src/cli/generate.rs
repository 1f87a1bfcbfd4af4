//! `veil-shard generate`: the model in one process, or through an entry.

use anyhow::Context;

use super::GenerateArgs;

pub(super) fn generate(args: GenerateArgs) -> anyhow::Result<()> {
    use crate::generate::{generate_with, GenerateRequest, LocalModel, TextStream};
    use crate::text::harmony::Delta;
    use crate::text::reasoning::ReasoningFormat;
    use crate::text::sampler::Sampler;
    use crate::text::tools::CallMarkers;
    use std::io::Write;

    let path = args.model.clone().context("--model is required")?;
    let (model, tokenizer) = LocalModel::load(&path, &args.split)?;
    let prompt_ids = wire(&args).prompt_ids(&tokenizer)?;
    let mut sampler = Sampler::new(wire(&args).sampling)?;
    // A chat answer that sets its reasoning apart (harmony channels, a
    // `<think>` block) prints it on standard error, the answer on standard
    // output, as the gateway returns them apart; `--json` keeps the text
    // as generated.
    let reasoning = (args.chat && !args.json).then(|| ReasoningFormat::of(&tokenizer, &prompt_ids, false)).flatten();
    let mut text = TextStream::new(&tokenizer, args.stop.clone());
    if reasoning == Some(ReasoningFormat::Harmony) {
        // Its channels are special tokens: read them written out.
        text = text.with_calls(Some(CallMarkers::default()));
    }
    let mut reader = reasoning.map(|f| f.reader(false));
    let req = GenerateRequest { prompt_ids, max_tokens: args.max_tokens, stop: args.stop.clone() };
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    let mut show = |d: Delta| {
        let _ = err.write_all(d.reasoning.as_bytes());
        let _ = out.write_all(d.content.as_bytes());
        let _ = (err.flush(), out.flush());
    };
    let result = generate_with(&model, &mut sampler, &req, text, |piece| match reader.as_mut() {
        _ if args.json => {}
        Some(r) => show(r.push(piece)),
        None => show(Delta { reasoning: String::new(), content: piece.to_owned() }),
    })?;
    if let Some(r) = reader {
        show(r.finish().0);
    }
    if args.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        println!();
    }
    Ok(())
}

pub(super) fn generate_remote(addr: std::net::SocketAddr, args: &GenerateArgs) -> anyhow::Result<()> {
    use crate::pipeline::entry::GenerateEvent;
    use std::io::{BufRead, Write};

    if !addr.ip().is_loopback() {
        anyhow::bail!("--entry must be a loopback address: the internal endpoint carries plaintext");
    }
    let req = wire(args);
    let mut tcp = std::net::TcpStream::connect(addr).with_context(|| format!("connecting to the entry at {addr}"))?;
    tcp.write_all(format!("{}\n", serde_json::to_string(&req)?).as_bytes())?;
    let mut out = std::io::stdout();
    for line in std::io::BufReader::new(tcp).lines() {
        match serde_json::from_str::<GenerateEvent>(&line?).context("reading the entry's answer")? {
            GenerateEvent::Text(piece) => {
                if !args.json {
                    out.write_all(piece.as_bytes())?;
                    out.flush()?;
                }
            }
            GenerateEvent::Done(g) => {
                if args.json {
                    println!("{}", serde_json::to_string(&g)?);
                } else {
                    println!();
                    if let Some(s) = &g.speculation {
                        eprintln!(
                            "speculation ({}): {} rounds for {} tokens, {} of {} drafted tokens kept ({:.0}%); \
                             {} rounds pipelined, {} cancelled, at most {} in flight",
                            s.drafter,
                            s.rounds,
                            g.ids.len(),
                            s.accepted,
                            s.drafted,
                            100.0 * s.acceptance(),
                            s.pipelined_rounds,
                            s.cancelled_rounds,
                            s.max_depth
                        );
                    }
                }
                return Ok(());
            }
            // `--json` prints them with the generation.
            GenerateEvent::Logprobs(_) => {}
            GenerateEvent::Error(e) => anyhow::bail!("the pipeline failed: {e}"),
            GenerateEvent::Refused(e) => anyhow::bail!("the entry refused the request: {e}"),
        }
    }
    anyhow::bail!("the entry closed the connection before finishing")
}

/// The request the flags describe.
fn wire(args: &GenerateArgs) -> crate::pipeline::entry::GenerateWire {
    crate::pipeline::entry::GenerateWire {
        prompt: args.prompt.clone(),
        prompt_ids: args.prompt_ids.clone(),
        chat: args.chat,
        max_tokens: args.max_tokens,
        sampling: crate::text::sampler::SamplingParams {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            min_p: args.min_p,
            repetition_penalty: args.repeat_penalty,
            seed: args.seed,
            ..Default::default()
        },
        stop: args.stop.clone(),
        score_prompt: false,
        speculation: crate::pipeline::entry::SpeculationRequest {
            enabled: args.drafter.map(|d| d != veil_wire::route::Drafter::None),
            drafter: args.drafter,
            k: args.draft_k,
            depth: args.draft_depth,
            script: None,
        },
    }
}
