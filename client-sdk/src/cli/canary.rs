//! `veil canary URL --reference FILE`: sends the canary prompts recorded by
//! `veil-shard canary` on the relying party's own copy of the model through
//! the verified route, sealed, and compares the greedy answers (SECURITY-CASES
//! G6). Exit 0 when every answer matches, 1 when one differs, 2 when the
//! reference, the policy or the route cannot be read.
//!
//! The reference file's format (`veil-canary/v1`) is written by
//! `veil_enclave::canary`; the client reads it with its own structs, as it
//! links no enclave code.

use serde::Deserialize;

use crate::sdk::Client;

use super::{CanaryArgs, Exit};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CanarySet {
    format: String,
    model: String,
    max_tokens: usize,
    cases: Vec<CanaryCase>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CanaryCase {
    prompt: String,
    text: String,
}

fn snippet(s: &str, from: usize) -> String {
    let start = (0..=from.min(s.len())).rev().find(|i| s.is_char_boundary(*i)).unwrap_or(0);
    let tail: String = s[start..].chars().take(24).collect();
    format!("{tail:?}")
}

/// Runs the command.
pub fn run(args: &CanaryArgs) -> Exit {
    let reference: CanarySet = match std::fs::read(&args.reference)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("veil canary: {}: {e}", args.reference.display());
            return Exit::Unreadable;
        }
    };
    if reference.format != "veil-canary/v1" {
        eprintln!("veil canary: {}: format {:?} is not veil-canary/v1", args.reference.display(), reference.format);
        return Exit::Unreadable;
    }
    let policy = match args.policy.load() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("veil canary: {e}");
            return Exit::Unreadable;
        }
    };
    let Ok(options) = super::connect_options(args.ca.as_deref()) else { return Exit::Unreadable };
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return Exit::Unreadable };
    let answers = rt.block_on(async {
        let client = Client::connect_with(&args.url, &policy, &options).await?;
        let mut answers = Vec::new();
        for case in &reference.cases {
            let params = serde_json::json!({"max_tokens": reference.max_tokens, "temperature": 0, "stream": false});
            let resp = client.complete(case.prompt.clone().into(), params).await?;
            let status = resp.status;
            let body = resp.collect().await?;
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            if status != 200 {
                let message = v["error"]["message"].as_str().unwrap_or("no message").to_owned();
                return Err(crate::sdk::ClientError::Api { status, message });
            }
            answers.push(v["choices"][0]["text"].as_str().unwrap_or_default().to_owned());
        }
        Ok::<_, crate::sdk::ClientError>(answers)
    });
    let answers = match answers {
        Ok(a) => a,
        Err(e) => {
            if let Some(t) = e.check_table() {
                eprintln!("{t}");
            }
            eprintln!("veil canary: {e}");
            return Exit::Unreadable;
        }
    };
    println!(
        "canary answers of {} ({} prompts, greedy, {} tokens each)",
        reference.model,
        reference.cases.len(),
        reference.max_tokens
    );
    let mut differ = 0;
    for (case, answer) in reference.cases.iter().zip(&answers) {
        if *answer == case.text {
            println!("  match    {:?}", case.prompt);
        } else {
            differ += 1;
            let at = case.text.bytes().zip(answer.bytes()).take_while(|(a, b)| a == b).count();
            println!(
                "  DIFFERS  {:?} at byte {at}: reference {}, route {}",
                case.prompt,
                snippet(&case.text, at),
                snippet(answer, at)
            );
        }
    }
    if differ == 0 {
        println!("every canary answer matches the reference model");
        Exit::Accepted
    } else {
        println!(
            "{differ} of {} canary answers differ: the route does not compute as the reference model does",
            answers.len()
        );
        Exit::Rejected
    }
}
