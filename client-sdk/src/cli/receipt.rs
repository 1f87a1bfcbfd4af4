//! `veil receipt verify RECEIPTS --route ROUTES --policy P`: checks answers'
//! receipts offline against the route documents they were answered on.
//!
//! Both files may be one JSON document or JSON lines:
//! - a receipt (`veil_attestation::receipt::Receipt`), or lines
//!   `{"receipt": …}` (what `veil proxy --receipts FILE` appends);
//! - a saved route (`veil verify --save-route FILE`, Python's
//!   `Client.saved_route()`), or lines `{"route": …}` (the proxy's file again).
//!
//! Every saved route is verified again against the policy, as of the
//! `verified_at` it holds; each receipt is then checked against the route
//! its `route` names (or, with a single saved route, that one, so a receipt
//! for another route fails on `route`).
//!
//! A saved route is not authenticated: its nonce and `verified_at` are the
//! file's word, and the host can build one with evidence it asked for with a
//! nonce of its own. An accepted receipt shows the attested entry signed it
//! on a route that passes the policy; not that this client verified that
//! route, nor when (the `veil receipt verify --help` text and THREAT_MODEL
//! §4.11 say what it proves and what it does not).

use std::io::Write as _;
use std::path::Path;

use serde_json::Value;
use veil_attestation::receipt::{
    Receipt, ReceiptCheck, ReceiptExpectation, ReceiptFailure, SavedRoute, MAX_RECEIPT_BYTES,
};
use veil_attestation::route::MAX_DOC_BYTES;

use super::{Exit, ReceiptVerifyArgs};

/// Most receipts or routes read from one file.
pub const MAX_ENTRIES: usize = 100_000;

/// The JSON values in `text`: one document, or one per non-empty line.
fn values(text: &str) -> Result<Vec<Value>, String> {
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        return Ok(vec![v]);
    }
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        if out.len() == MAX_ENTRIES {
            return Err(format!("more than {MAX_ENTRIES} entries"));
        }
        out.push(serde_json::from_str(line).map_err(|e| format!("line {}: {e}", i + 1))?);
    }
    Ok(out)
}

fn read(path: &Path, limit: u64) -> Result<String, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.len() > limit {
        return Err(format!("{}: {} bytes, more than {limit}", path.display(), meta.len()));
    }
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Receipts in `text`; a malformed one is kept as its failure.
fn receipts(text: &str) -> Result<Vec<Result<Receipt, ReceiptFailure>>, String> {
    Ok(values(text)?
        .into_iter()
        // A receipt names its route too; a saved-route line has no signature.
        .filter(|v| v.get("route").is_none() || v.get("signature").is_some())
        .map(|v| {
            let v = v.get("receipt").cloned().unwrap_or(v);
            let bytes = serde_json::to_vec(&v).unwrap_or_default();
            Receipt::from_json(&bytes)
        })
        .collect())
}

fn routes(text: &str) -> Result<Vec<SavedRoute>, String> {
    values(text)?
        .into_iter()
        .filter(|v| v.get("receipt").is_none())
        .map(|v| {
            let v = v.get("route").filter(|_| v.get("doc").is_none()).cloned().unwrap_or(v);
            serde_json::from_value::<SavedRoute>(v).map_err(|e| format!("not a saved route: {e}"))
        })
        .collect()
}

/// Runs the command.
pub fn verify(args: &ReceiptVerifyArgs) -> Exit {
    let policy = match args.policy.load() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("veil receipt verify: policy {e}");
            return Exit::Unreadable;
        }
    };
    let limit = (MAX_ENTRIES * MAX_RECEIPT_BYTES) as u64;
    let parsed = read(&args.receipts, limit).and_then(|t| receipts(&t)).and_then(|r| {
        let routes = read(&args.route, (MAX_DOC_BYTES * 64) as u64).and_then(|t| routes(&t))?;
        Ok((r, routes))
    });
    let (receipts, routes) = match parsed {
        Ok((r, _)) if r.is_empty() => {
            eprintln!("veil receipt verify: {}: no receipt", args.receipts.display());
            return Exit::Unreadable;
        }
        Ok((_, s)) if s.is_empty() => {
            eprintln!("veil receipt verify: {}: no saved route", args.route.display());
            return Exit::Unreadable;
        }
        Ok(p) => p,
        Err(e) => {
            eprintln!("veil receipt verify: {e}");
            return Exit::Unreadable;
        }
    };
    // Each saved route verified once: what its receipts must carry, or why
    // it does not verify.
    let verified: Vec<Result<ReceiptExpectation, ReceiptFailure>> =
        routes.iter().map(|s| s.expectation(&policy).map(|(_, expect)| expect)).collect();
    let mut out = std::io::stdout().lock();
    let mut failed = 0usize;
    for receipt in &receipts {
        let verdict = receipt.clone().and_then(|r| {
            let expect = verified
                .iter()
                .find(|e| e.as_ref().is_ok_and(|e| e.route == r.route))
                .or(if verified.len() == 1 { verified.first() } else { None })
                .ok_or_else(|| ReceiptFailure {
                    check: ReceiptCheck::Route,
                    expected: format!("one of the {} saved route(s) that verify", verified.len()),
                    actual: r.route.to_string(),
                })?
                .as_ref()
                .map_err(Clone::clone)?;
            r.check(expect)?;
            Ok(r)
        });
        let line = match verdict {
            Ok(r) => format!(
                "OK    receipt {} at {}: {} prompt + {} completion tokens, drafter {}, route {}",
                r.id, r.time, r.prompt_tokens, r.completion_tokens, r.drafter, r.route
            ),
            Err(e) => {
                failed += 1;
                let id = receipt.as_ref().map(|r| r.id.as_str()).unwrap_or("?");
                format!("FAIL  receipt {id}: check `{}` failed: expected {}, got {}", e.check, e.expected, e.actual)
            }
        };
        let _ = writeln!(out, "{line}");
    }
    let _ = writeln!(
        out,
        "{}: {} of {} receipt(s) verified against {} saved route(s) and {}",
        if failed == 0 { "ACCEPTED" } else { "REJECTED" },
        receipts.len() - failed,
        receipts.len(),
        routes.len(),
        args.policy.path.display()
    );
    if failed == 0 {
        Exit::Accepted
    } else {
        Exit::Rejected
    }
}
