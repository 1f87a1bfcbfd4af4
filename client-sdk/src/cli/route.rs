//! `veil verify URL` and `veil chat URL`: the route behind a Veil host,
//! verified shard by shard, and a streaming chat sealed to its entry.

use std::io::{BufRead, IsTerminal, Write};

use crate::report::{route_json, route_text};
use crate::sdk::{Client, ClientError};

use super::{ChatArgs, Exit, RouteVerifyArgs};

fn policy(args: &super::PolicyArgs) -> Result<veil_attestation::Policy, (Exit, String)> {
    args.load().map_err(|e| (Exit::Unreadable, e.to_string()))
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build()
}

fn connect(
    url: &str,
    policy: &veil_attestation::Policy,
    ca: Option<&std::path::Path>,
) -> Result<(tokio::runtime::Runtime, Client), (Exit, String)> {
    let options = super::connect_options(ca).map_err(|e| (Exit::Unreadable, e.to_string()))?;
    let rt = runtime().map_err(|e| (Exit::Unreadable, e.to_string()))?;
    match rt.block_on(Client::connect_with(url, policy, &options)) {
        Ok(c) => Ok((rt, c)),
        Err(e @ (ClientError::Attestation { .. } | ClientError::RouteRejected(_))) => {
            let table = e.check_table().unwrap_or_default();
            Err((Exit::Rejected, format!("{table}\nREJECTED: {e}")))
        }
        Err(e) => Err((Exit::Unreadable, e.to_string())),
    }
}

/// `--save-route FILE`: the route document as verified, with its nonce and
/// time, for `veil receipt verify` (written only for an accepted route).
fn save_route(path: Option<&std::path::Path>, client: &Client) -> Result<(), (Exit, String)> {
    let Some(path) = path else { return Ok(()) };
    let json = serde_json::to_string_pretty(client.saved_route()).unwrap_or_default();
    std::fs::write(path, json + "\n").map_err(|e| (Exit::Unreadable, format!("--save-route {}: {e}", path.display())))
}

/// `veil verify URL --policy P --json`: the whole verdict for scripts.
fn verify_json(args: &RouteVerifyArgs) -> Exit {
    let policy = match policy(&args.policy) {
        Ok(p) => p,
        Err((exit, message)) => {
            eprintln!("{message}");
            return exit;
        }
    };
    let options = match super::connect_options(args.ca.as_deref()) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return Exit::Unreadable;
        }
    };
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{e}");
            return Exit::Unreadable;
        }
    };
    let (out, exit) = match rt.block_on(Client::connect_with(&args.url, &policy, &options)) {
        Ok(client) => {
            if let Err((exit, message)) = save_route(args.save_route.as_deref(), &client) {
                eprintln!("{message}");
                return exit;
            }
            let json = route_json(client.route());
            (json, Exit::Accepted)
        }
        Err(e) => {
            let (who, checks) = match &e {
                ClientError::Attestation { who, source: veil_attestation::Error::Rejected(r) } => {
                    (Some(who.clone()), serde_json::json!(r.report))
                }
                ClientError::RouteRejected(r) => (None, serde_json::json!(r.report.table)),
                _ => (None, serde_json::Value::Null),
            };
            let exit = if checks.is_null() { Exit::Unreadable } else { Exit::Rejected };
            let json = serde_json::json!({
                "accepted": false,
                "error": e.to_string(),
                "who": who,
                "checks": checks,
            });
            (json, exit)
        }
    };
    println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    exit
}

/// `veil verify URL --policy P`: a check table per shard; exit 0/1/2.
pub fn verify(args: &RouteVerifyArgs) -> Exit {
    use std::fmt::Write as _;
    if args.json {
        return verify_json(args);
    }
    let connected = policy(&args.policy).and_then(|policy| connect(&args.url, &policy, args.ca.as_deref()));
    match connected {
        Err((exit, message)) => {
            eprintln!("{message}");
            exit
        }
        Ok((_, client)) => {
            if let Err((exit, message)) = save_route(args.save_route.as_deref(), &client) {
                eprintln!("{message}");
                return exit;
            }
            let route = client.route();
            let mut out = route_text(route);
            let _ = writeln!(
                out,
                "ACCEPTED{}: {} stage(s), {} shard process(es) on the route of {:?} verified against {}",
                route.simulated_notice().map(|n| format!(" ({n})")).unwrap_or_default(),
                route.shape().stages().len(),
                1 + route.shards().len(),
                route.model(),
                args.policy.path.display()
            );
            // One write, its error ignored: `veil verify URL | head` closing
            // the pipe early is not a failure of the verification.
            let _ = std::io::stdout().lock().write_all(out.as_bytes());
            Exit::Accepted
        }
    }
}

/// `veil chat URL --policy P`: interactive (line editing, per-session
/// history) when stdin is a terminal, otherwise one user turn per input line.
/// A failed turn prints one line and the conversation goes on; when the
/// entry restarted (its attested key changed) the route is verified again and
/// the turn re-sent.
pub fn chat(args: &ChatArgs) -> Exit {
    let policy = match policy(&args.policy) {
        Ok(p) => p,
        Err((exit, message)) => {
            eprintln!("{message}");
            return exit;
        }
    };
    let (rt, mut client) = match connect(&args.url, &policy, args.ca.as_deref()) {
        Ok(c) => c,
        Err((exit, message)) => {
            eprintln!("{message}");
            return exit;
        }
    };
    let Ok(options) = super::connect_options(args.ca.as_deref()) else { return Exit::Unreadable };
    eprintln!(
        "verified {} stage(s) in {} shard process(es); messages are sealed to the attested entry. Ctrl-D ends.",
        client.route().shape().stages().len(),
        1 + client.route().shards().len()
    );
    if let Some(notice) = client.route().simulated_notice() {
        eprintln!("WARNING: {notice}");
    }
    let mut editor = if std::io::stdin().is_terminal() {
        match rustyline::DefaultEditor::new() {
            Ok(e) => Some(e),
            Err(e) => {
                eprintln!("veil chat: no line editing ({e})");
                None
            }
        }
    } else {
        None
    };
    let interactive = editor.is_some();
    let mut lines = std::io::stdin().lock().lines();
    let mut history: Vec<serde_json::Value> = Vec::new();
    let mut unanswered = 0usize;
    loop {
        let line = match &mut editor {
            Some(ed) => match ed.readline("> ") {
                Ok(l) => {
                    let _ = ed.add_history_entry(l.as_str());
                    l
                }
                Err(rustyline::error::ReadlineError::Interrupted) => continue,
                Err(_) => break,
            },
            None => match lines.next() {
                Some(Ok(l)) => l,
                _ => break,
            },
        };
        if line.trim().is_empty() {
            continue;
        }
        history.push(serde_json::json!({"role": "user", "content": line}));
        let mut body = serde_json::json!({
            "messages": history, "stream": true, "max_tokens": args.max_tokens, "temperature": args.temperature,
        });
        if args.repeat_penalty != 1.0 {
            body["repetition_penalty"] = args.repeat_penalty.into();
        }
        let mut answer = String::new();
        let result = rt.block_on(async {
            let turn = async {
                let bytes = serde_json::to_vec(&body).map_err(|e| ClientError::Config(e.to_string()))?;
                let (resp, fresh) = client
                    .call_reverifying(&policy, &options, "POST", veil_wire::http::openai::CHAT_COMPLETIONS_PATH, bytes)
                    .await?;
                if let Some(fresh) = fresh {
                    eprintln!("(the entry restarted: route verified again; sending your message again)");
                    client = fresh;
                }
                stream_answer(resp, &mut answer).await
            };
            // Ctrl-C stops this answer only (dropping the stream closes the
            // request); the conversation goes on.
            tokio::select! {
                ended = turn => ended,
                Ok(()) = tokio::signal::ctrl_c() => Ok(Ending::Interrupted),
            }
        });
        match result {
            Ok(ending) => {
                match ending {
                    Ending::Complete => {}
                    Ending::Length => eprintln!("[cut at --max-tokens {}]", args.max_tokens),
                    Ending::Interrupted => {
                        println!();
                        eprintln!("(stopped; the conversation goes on)");
                    }
                }
                if answer.is_empty() && matches!(ending, Ending::Interrupted) {
                    history.pop(); // stopped before any answer: as if not asked
                } else {
                    // What was shown is what the model said, also when stopped.
                    history.push(serde_json::json!({"role": "assistant", "content": answer}));
                }
            }
            Err(e) => {
                // One line; the turn is dropped and the conversation kept.
                let first = e.to_string();
                eprintln!("\nerror: {}", first.lines().next().unwrap_or_default());
                history.pop();
                unanswered += 1;
            }
        }
    }
    // A script (stdin not a terminal) learns that a turn went unanswered.
    if !interactive && unanswered > 0 {
        return Exit::Unanswered;
    }
    Exit::Accepted
}

/// How an answer ended.
enum Ending {
    /// The model finished (or a stop string).
    Complete,
    /// Cut at `max_tokens`.
    Length,
    /// Ctrl-C.
    Interrupted,
}

async fn stream_answer(resp: crate::seal::OpenedResponse, answer: &mut String) -> Result<Ending, ClientError> {
    let mut stream = crate::sdk::TextStream::new(resp).await?;
    let mut out = std::io::stdout();
    while let Some(t) = stream.next_text().await? {
        answer.push_str(&t);
        let _ = out.write_all(t.as_bytes());
        let _ = out.flush();
    }
    println!();
    Ok(if stream.finish_reason() == Some("length") { Ending::Length } else { Ending::Complete })
}
