//! Speculative decoding through a 3-shard cluster (separate processes on
//! loopback): greedy output is token-identical to plain decoding for every
//! drafter and every k, including an oracle and an adversary; sampling
//! keeps the target's distribution; after rejections every shard's KV
//! length is the committed length plus the positions just verified (checked
//! by the entry on every round from the lengths the shards report); a
//! useless drafter is backed off to k = 0.
//!
//! Needs the reference model (`scripts/fetch-model.sh`); SKIP without it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use crate::cluster;

use std::collections::BTreeMap;

use cluster::{greedy, local, model_path, Cluster};
use veil_enclave::generate::{Generation, LocalModel};
use veil_enclave::pipeline::entry::{GenerateWire, SpeculationRequest};
use veil_enclave::speculate::SpecStats;

fn fixture_prompts() -> Vec<Vec<u32>> {
    let v: serde_json::Value = serde_json::from_str(include_str!("../../testdata/llamacpp_fixtures.json")).unwrap();
    v["cases"].as_array().unwrap().iter().map(|c| serde_json::from_value(c["prompt_ids"].clone()).unwrap()).collect()
}

fn with(req: &GenerateWire, drafter: &str, k: Option<usize>, script: Option<Vec<u32>>) -> GenerateWire {
    GenerateWire {
        speculation: SpeculationRequest {
            enabled: Some(true),
            drafter: Some(drafter.parse().unwrap()),
            k,
            depth: None,
            script,
        },
        ..req.clone()
    }
}

/// [`with`], keeping exactly `depth` rounds in flight (pipelined speculation).
fn pipelined(
    req: &GenerateWire,
    depth: usize,
    drafter: &str,
    k: Option<usize>,
    script: Option<Vec<u32>>,
) -> GenerateWire {
    let mut r = with(req, drafter, k, script);
    r.speculation.depth = Some(depth);
    r
}

fn stats(g: &Generation) -> SpecStats {
    g.speculation.clone().expect("the session did not speculate")
}

/// A three-stage cluster whose entry holds a draft model derived from the
/// target (the first 24 of 30 layers), started under `name`.
fn speculating_cluster(name: &str, path: &std::path::Path) -> Cluster {
    let mut c = Cluster::new(name, path, &[10, 20], &[1, 1, 1]);
    let draft = c.dir.join("draft24.gguf");
    veil_enclave::speculate::derive::derive_draft(path, &draft, &(0..24).collect::<Vec<_>>(), None).unwrap();
    c.set_draft_model(&draft, 8);
    c.start_all();
    c
}

/// Greedy answers through the cluster, for every drafter and k. Its own
/// cluster, so that the harness runs it beside [`speculation_through_three_shards`]
/// (together they took 226 s on one thread of the test run).
#[test]
fn greedy_speculation_through_three_shards() {
    let Some(path) = model_path() else { return };
    let (model, tok) = LocalModel::load(&path, &[]).unwrap();
    let c = speculating_cluster("speculation-greedy", &path);
    greedy_is_token_identical_for_every_drafter_and_k(&c, &model, &tok);
}

/// Back-off, sampling and the attested drafter, through one cluster.
#[test]
fn speculation_through_three_shards() {
    let Some(path) = model_path() else { return };
    let c = speculating_cluster("speculation", &path);
    a_useless_drafter_backs_off_to_plain_decoding(&c);
    sampling_keeps_the_target_distribution(&c);
    the_sealed_answer_names_the_attested_drafter(&c);
}

/// Issue 23: the route attests the entry's drafter (kind, the draft model's
/// manifest root, k settings) and the sealed answer names the one that ran;
/// `"speculate": false` runs none.
fn the_sealed_answer_names_the_attested_drafter(c: &Cluster) {
    let policy = veil_enclave::pipeline::shard::load_policy(&c.route.policy).unwrap();
    let url = format!("http://{}", c.route.sealed_listen.unwrap());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let client = veil_client::sdk::Client::connect(&url, &policy).await.unwrap();
        let d = client.route().drafter().expect("the entry commits to its drafter").clone();
        assert_eq!((d.kind.as_str(), d.k_max, d.k), ("ngram", 8, None));
        assert!(d.draft_manifest.is_some(), "the draft model's manifest is attested");
        let body = |speculate: bool| {
            serde_json::json!({
                "messages": [{"role": "user", "content": "Repeat exactly: the quick brown fox jumps over the lazy dog."}],
                "max_tokens": 16, "temperature": 0, "speculate": speculate,
            })
        };
        let resp = client.call("POST", "/v1/chat/completions", &body(true)).await.unwrap();
        let ran = resp.drafter_used().unwrap_or_default().to_owned();
        assert!(ran.starts_with("ngram; ") && ran.ends_with("rounds drafted"), "{ran}");
        let resp = client.call("POST", "/v1/chat/completions", &body(false)).await.unwrap();
        assert_eq!(resp.drafter_used(), Some("none"));
        // A policy that pins another drafter refuses this route before anything is sealed.
        let other = veil_attestation::route::DrafterInfo { kind: "none".into(), ..d.clone() };
        let pinned = veil_attestation::Policy { drafters: vec![other.digest()], ..policy.clone() };
        match veil_client::sdk::Client::connect(&url, &pinned).await {
            Err(veil_client::sdk::ClientError::RouteRejected(r)) => {
                assert_eq!(r.check, veil_attestation::route::RouteCheckId::Drafter)
            }
            other => panic!("a route with an unpinned drafter was accepted: {:?}", other.map(|_| ())),
        }
    });
}

fn greedy_is_token_identical_for_every_drafter_and_k(
    c: &Cluster,
    model: &LocalModel,
    tok: &veil_enclave::text::tokenizer::Tokenizer,
) {
    let mut prompts = fixture_prompts()[..3].to_vec();
    // A draftable prompt: the answer repeats the prompt's text.
    prompts.push(
        tok.encode("Repeat exactly: the quick brown fox jumps over the lazy dog. The quick brown", false).unwrap(),
    );
    let vocab = tok.vocab_size() as u32;
    let mut totals: BTreeMap<String, SpecStats> = BTreeMap::new();
    for prompt in &prompts {
        let base = greedy(prompt, 40);
        let plain = GenerateWire {
            speculation: SpeculationRequest { enabled: Some(false), ..Default::default() },
            ..base.clone()
        };
        let want = local(model, tok, &base);
        let got = c.generate(&plain).unwrap();
        assert_eq!(got, want, "plain decoding through the pipeline");
        assert!(got.speculation.is_none());
        let right = want.ids.clone();
        let wrong: Vec<u32> = want.ids.iter().map(|t| (t + 1) % vocab).collect();
        let mut cases = vec![
            ("ngram adaptive".to_owned(), with(&base, "ngram", None, None)),
            ("ngram k=4".to_owned(), with(&base, "ngram", Some(4), None)),
            ("model adaptive".to_owned(), with(&base, "model", None, None)),
            ("model k=3".to_owned(), with(&base, "model", Some(3), None)),
            ("ngram+model adaptive".to_owned(), with(&base, "ngram+model", None, None)),
            // The route's default drafter (ngram) when a request only turns speculation on.
            (
                "route default".to_owned(),
                GenerateWire {
                    speculation: SpeculationRequest { enabled: Some(true), ..Default::default() },
                    ..base.clone()
                },
            ),
        ];
        for k in 1..=8 {
            cases.push((format!("oracle k={k}"), with(&base, "script", Some(k), Some(right.clone()))));
        }
        // Every round of an adversary is rejected (one token per round of
        // k + 1 rows): the costliest case, so k at the ends and two between.
        for k in [1, 2, 5, 8] {
            cases.push((format!("adversary k={k}"), with(&base, "script", Some(k), Some(wrong.clone()))));
        }
        // Pipelined: several rounds in flight, every drafter.
        let mixed: Vec<u32> =
            right.iter().enumerate().map(|(i, &t)| if i % 4 == 3 { (t + 1) % vocab } else { t }).collect();
        for (depth, k) in [(2, 3), (3, 2), (4, 5)] {
            cases.push((
                format!("oracle pipelined d={depth} k={k}"),
                pipelined(&base, depth, "script", Some(k), Some(right.clone())),
            ));
        }
        cases.push(("adversary pipelined d=3 k=2".into(), pipelined(&base, 3, "script", Some(2), Some(wrong.clone()))));
        cases.push(("mixed pipelined d=4 k=3".into(), pipelined(&base, 4, "script", Some(3), Some(mixed))));
        cases.push(("model pipelined d=3".into(), pipelined(&base, 3, "model", Some(3), None)));
        cases.push(("ngram pipelined d=2".into(), pipelined(&base, 2, "ngram", Some(4), None)));
        cases.push(("ngram+model pipelined d=3".into(), pipelined(&base, 3, "ngram+model", Some(4), None)));
        for (name, req) in cases {
            let g = c.generate(&req).unwrap();
            assert_eq!((&g.ids, &g.text), (&want.ids, &want.text), "{name}: output differs from plain greedy");
            let s = stats(&g);
            // (Every round's KV lengths are checked by the entry, which fails
            // the session otherwise: `check_kv_lens`, unit-tested. An output
            // equal to plain greedy after rejected drafts shows the rollback.)
            if name.starts_with("oracle") {
                assert_eq!(s.accepted, s.drafted, "{name}: the oracle was rejected: {s:?}");
                assert!(s.spec_rounds > 0 && s.rounds < want.ids.len() as u64, "{name}: {s:?}");
            }
            if name.starts_with("adversary") {
                assert_eq!(s.accepted, 0, "{name}: {s:?}");
                assert!(s.drafted > 0, "{name}: {s:?}");
            }
            if name.contains("pipelined") && !name.starts_with("ngram") {
                // Rounds went out on top of rounds in flight; a rejection cancels those after it.
                assert!(s.pipelined_rounds > 0, "{name}: {s:?}");
                assert_eq!(s.cancelled_rounds > 0, !name.starts_with("oracle"), "{name}: {s:?}");
            }
            let t = totals.entry(name.split(' ').next().unwrap().to_owned()).or_default();
            t.rounds += s.rounds;
            t.drafted += s.drafted;
            t.accepted += s.accepted;
        }
    }
    for (name, t) in &totals {
        println!(
            "{name:>10}: {} rounds, {} drafted, {} kept (acceptance {:.2})",
            t.rounds,
            t.drafted,
            t.accepted,
            t.acceptance()
        );
    }
    // The n-gram drafter found the repeated text; the hybrid drafted
    // everywhere (its model has no prompt to match) and was kept.
    assert!(totals["ngram"].accepted > 0, "{:?}", totals["ngram"]);
    let hybrid = &totals["ngram+model"];
    assert!(hybrid.drafted > totals["ngram"].drafted && hybrid.accepted > 0, "{hybrid:?}");
}

/// The hybrid drafter proposes the prompt lookup's continuation where the
/// context repeats a suffix of three or more tokens, then the draft model's
/// continuation of the context and those tokens; elsewhere the model's
/// alone. Sampled, every token carries the distribution it was drawn from
/// (a looked-up one is certain), so rejection sampling stays lossless.
#[test]
fn the_hybrid_drafter_looks_up_then_continues_with_the_model() {
    use std::sync::Arc;
    use veil_enclave::speculate::model::{DraftModel, ModelDrafter};
    use veil_enclave::speculate::{hybrid::HybridDrafter, ngram::NgramDrafter, DraftMode, Drafter};
    let Some(path) = model_path() else { return };
    let (_, tok) = LocalModel::load(&path, &[]).unwrap();
    let model = Arc::new(DraftModel::load(&path, &tok).unwrap());
    let model_draft =
        |context: &[u32], k: usize| ModelDrafter::new(model.clone()).draft(context, k, &DraftMode::Greedy).unwrap();

    // "… the quick brown fox jumps. Then the quick brown": the suffix "the
    // quick brown" repeats, so " fox jumps." is looked up.
    let repeated = tok.encode("Once the quick brown fox jumps over it. Then the quick brown", false).unwrap();
    let found = NgramDrafter { min_n: 3, max_n: 4 }.lookup(&repeated, 16);
    assert!(!found.is_empty() && found.len() < 16, "the fixture must match, and run out before k = 16: {found:?}");
    let mut hybrid = HybridDrafter::new(model.clone());
    let d = hybrid.draft(&repeated, 16, &DraftMode::Greedy).unwrap();
    assert_eq!(d.tokens[..found.len()], found[..], "the lookup comes first");
    let extended: Vec<u32> = repeated.iter().chain(&found).copied().collect();
    assert_eq!(d.tokens[found.len()..], model_draft(&extended, 16 - found.len()).tokens[..], "then the model");
    assert!(d.q.is_empty(), "greedy drafts carry no distributions");

    // No suffix of three tokens repeats: the model's draft, as the model drafter's.
    let novel = tok.encode("Write a short story about a lighthouse keeper.", false).unwrap();
    assert!(NgramDrafter { min_n: 3, max_n: 4 }.lookup(&novel, 4).is_empty());
    assert_eq!(hybrid.draft(&novel, 4, &DraftMode::Greedy).unwrap(), model_draft(&novel, 4));

    // Sampled: one distribution per token; looked-up tokens are certain.
    let params = veil_enclave::text::sampler::SamplingParams { temperature: 1.0, seed: 7, ..Default::default() };
    let d = hybrid.draft(&repeated, 16, &DraftMode::Sample(params)).unwrap();
    assert_eq!((d.tokens.len(), d.q.len()), (16, 16));
    for (i, &t) in found.iter().enumerate() {
        assert_eq!((d.tokens[i], &d.q[i][..]), (t, &[(t, 1.0)][..]));
    }
    for (&t, q) in d.tokens.iter().zip(&d.q).skip(found.len()) {
        assert!(q.iter().any(|&(u, p)| u == t && p > 0.0), "token {t} not in the distribution it was drawn from");
    }
}

fn a_useless_drafter_backs_off_to_plain_decoding(c: &Cluster) {
    let prompt = fixture_prompts()[0].clone();
    let base = greedy(&prompt, 64);
    let want = c.generate(&with(&base, "none", None, None)).unwrap();
    let wrong: Vec<u32> = want.ids.iter().map(|t| t ^ 1).collect();
    let g = c.generate(&with(&base, "script", None, Some(wrong))).unwrap();
    assert_eq!(g.ids, want.ids);
    let s = stats(&g);
    assert_eq!(s.accepted, 0);
    // A few rounds to learn, then k = 0 with an occasional one-token probe.
    assert!(s.spec_rounds * 4 < s.rounds, "adaptive k kept drafting with a useless drafter: {s:?}");
    println!("useless drafter: {} of {} rounds drafted ({} tokens)", s.spec_rounds, s.rounds, s.drafted);
}

/// Chi-square critical value at probability 0.999 (Wilson–Hilferty).
fn chi_square_999(df: usize) -> f64 {
    let d = df as f64;
    let z = 3.090_2;
    d * (1.0 - 2.0 / (9.0 * d) + z * (2.0 / (9.0 * d)).sqrt()).powi(3)
}

/// Sampling (temperature 1, top-k 4): the second and third generated tokens
/// — the first decided by rejection sampling against an oracle drafter's
/// proposals, or by plain decoding — have the same distribution with and
/// without speculation. Two-sample chi-square over the (token 2, token 3)
/// pairs, categories with fewer than 10 expected draws pooled, against the
/// 0.999 critical value; the draws use different seeds on each side.
fn sampling_keeps_the_target_distribution(c: &Cluster) {
    let prompt = fixture_prompts()[1].clone();
    let n = 300;
    let greedy_ids = c.generate(&greedy(&prompt, 3)).unwrap().ids;
    let mut counts: BTreeMap<(u32, u32), [u64; 2]> = BTreeMap::new();
    let mut accepted = 0;
    for i in 0..n {
        for (side, spec) in [(0usize, false), (1, true)] {
            let mut req = greedy(&prompt, 3);
            (req.sampling.temperature, req.sampling.top_k, req.sampling.seed) = (1.0, 4, (i * 2 + side) as u64);
            let req = if spec {
                with(&req, "script", Some(2), Some(greedy_ids.clone()))
            } else {
                with(&req, "none", None, None)
            };
            let g = c.generate(&req).unwrap();
            if let Some(s) = &g.speculation {
                accepted += s.accepted;
            }
            if g.ids.len() == 3 {
                counts.entry((g.ids[1], g.ids[2])).or_default()[side] += 1;
            }
        }
    }
    // Pool rare categories.
    let mut cells: Vec<[u64; 2]> = Vec::new();
    let mut other = [0u64; 2];
    for v in counts.values() {
        if v[0] + v[1] >= 20 {
            cells.push(*v);
        } else {
            other[0] += v[0];
            other[1] += v[1];
        }
    }
    if other[0] + other[1] > 0 {
        cells.push(other);
    }
    let totals = [cells.iter().map(|c| c[0]).sum::<u64>() as f64, cells.iter().map(|c| c[1]).sum::<u64>() as f64];
    let all = totals[0] + totals[1];
    let mut chi = 0.0;
    for cell in &cells {
        let row = (cell[0] + cell[1]) as f64;
        for side in 0..2 {
            let e = row * totals[side] / all;
            chi += (cell[side] as f64 - e).powi(2) / e;
        }
    }
    let df = cells.len().saturating_sub(1).max(1);
    println!(
        "sampling: {} categories, chi-square {chi:.1} (critical {:.1} at 0.999), {accepted} drafted tokens kept",
        cells.len(),
        chi_square_999(df)
    );
    assert!(cells.len() >= 3, "too few categories to compare: {counts:?}");
    assert!(accepted > 0, "rejection sampling never accepted a draft");
    assert!(chi < chi_square_999(df), "speculative sampling changed the distribution: {counts:?}");
}
