//! The sharded pipeline as separate processes on loopback: equality with
//! one process, concurrency, a killed shard with and without a replica,
//! a neighbour with the wrong weights, malformed frames.
//!
//! Needs the reference model (`scripts/fetch-model.sh`); without it these
//! tests print SKIP unless `VEIL_REQUIRE_MODEL=1`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use crate::cluster;

use std::io::{BufRead, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use cluster::{greedy, local, model_path, Cluster};
use veil_enclave::generate::{Generation, LocalModel};
use veil_enclave::pipeline::entry::{Failure, GenerateEvent, GenerateWire};

fn fixture_prompts() -> Vec<Vec<u32>> {
    let v: serde_json::Value = serde_json::from_str(include_str!("../../testdata/llamacpp_fixtures.json")).unwrap();
    v["cases"].as_array().unwrap().iter().map(|c| serde_json::from_value(c["prompt_ids"].clone()).unwrap()).collect()
}

#[test]
fn three_and_five_shard_clusters_equal_one_process() {
    let Some(path) = model_path() else { return };
    let (model, tok) = LocalModel::load(&path, &[]).unwrap();
    let mut requests: Vec<GenerateWire> = fixture_prompts().iter().map(|p| greedy(p, 32)).collect();
    let mut sampled = greedy(&fixture_prompts()[2], 32);
    (
        sampled.sampling.temperature,
        sampled.sampling.top_p,
        sampled.sampling.top_k,
        sampled.sampling.repetition_penalty,
        sampled.sampling.seed,
    ) = (0.8, 0.95, 40, 1.1, 7);
    requests.push(sampled);
    let expected: Vec<Generation> = requests.iter().map(|r| local(&model, &tok, r)).collect();
    for (name, cuts) in [("three", vec![10, 20]), ("five", vec![6, 12, 18, 24])] {
        let mut c = Cluster::new(name, &path, &cuts, &vec![1; cuts.len() + 1]);
        c.start_all();
        for (req, want) in requests.iter().zip(&expected) {
            assert_eq!(&c.generate(req).unwrap(), want, "{name}-shard cluster");
        }
        println!("{name}-shard cluster: {} requests token-identical to one process", requests.len());
    }
}

/// The node library (what `veil-shard serve` runs) started in-process, as
/// tests and benchmarks can: a 3-stage route equals one process.
#[test]
fn an_in_process_route_of_nodes_equals_one_process() {
    let Some(path) = model_path() else { return };
    let (model, tok) = LocalModel::load(&path, &[]).unwrap();
    let c = Cluster::new("in-process", &path, &[10, 20], &[1, 1, 1]);
    let _rt = c.start_in_process();
    for prompt in fixture_prompts().iter().take(2) {
        let req = greedy(prompt, 24);
        // The entry answers once every stage has a verified link; it waits for them.
        assert_eq!(c.generate(&req).unwrap(), local(&model, &tok, &req));
    }
}

/// A scored prompt (`echo` with `logprobs`) over a 3-stage route: every
/// prompt token's log-probability equals one process's log-softmax at the
/// position before it, prefill chunks and all, and scoring leaves the
/// answer unchanged.
#[test]
fn a_prompt_scored_over_a_route_equals_one_process() {
    let Some(path) = model_path() else { return };
    let (model, _) = LocalModel::load(&path, &[]).unwrap();
    let c = Cluster::new("scored", &path, &[10, 20], &[1, 1, 1]);
    let _rt = c.start_in_process();
    let prompt = fixture_prompts().concat();
    assert!(prompt.len() > 64, "longer than one prefill chunk");
    let mut session = model.session(1 << 40);
    let logits = model.step(&mut session, &prompt).unwrap();
    let want: Vec<f32> = (0..prompt.len() - 1)
        .map(|j| {
            let row = logits.row(j);
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let lse = f64::from(max) + row.iter().map(|&v| f64::from(v - max).exp()).sum::<f64>().ln();
            (f64::from(row[prompt[j + 1] as usize]) - lse) as f32
        })
        .collect();
    let plain = c.generate(&greedy(&prompt, 8)).unwrap();
    for max_tokens in [0, 8] {
        let mut req = greedy(&prompt, max_tokens);
        req.score_prompt = true;
        req.sampling.logprobs = Some(2);
        let g = c.generate(&req).unwrap();
        let scores = g.prompt_logprobs.expect("scored");
        assert_eq!(scores.len(), prompt.len() - 1);
        for (j, (s, w)) in scores.iter().zip(&want).enumerate() {
            assert_eq!(s.token, prompt[j + 1], "position {j}");
            assert!((s.logprob - w).abs() < 1e-3, "position {j}: {} against one process's {w}", s.logprob);
            assert_eq!(s.top.len(), 2);
        }
        match max_tokens {
            0 => assert!(g.ids.is_empty(), "max_tokens 0 generates nothing"),
            _ => assert_eq!(g.ids, plain.ids, "scoring changed the answer"),
        }
    }
}

/// A route whose middle stage computes on the device path (what a CUDA
/// shard runs; candle's CPU backend here) equals one process with the same
/// slice on the same path: the link, sessions and speculation-free decode
/// loop are the same code whatever the device.
#[test]
fn a_route_with_a_device_stage_equals_one_process_with_the_same_devices() {
    use veil_enclave::model::{ComputeDevice, GgufFile};
    let Some(path) = model_path() else { return };
    let devices = [ComputeDevice::Cpu, ComputeDevice::CandleCpu, ComputeDevice::Cpu];
    let (model, tok) = LocalModel::from_gguf_on(&mut GgufFile::open(&path).unwrap(), &[10, 20], &devices).unwrap();
    let mut c = Cluster::new("device-stage", &path, &[10, 20], &[1, 1, 1]);
    c.route.stages[1].device = ComputeDevice::CandleCpu;
    // The device is not part of what the route pins: the same manifest roots.
    assert_eq!(
        c.route.stages[1].manifest_root,
        Cluster::new("device-stage-2", &path, &[10, 20], &[1, 1, 1]).route.stages[1].manifest_root
    );
    let _rt = c.start_in_process();
    for prompt in fixture_prompts().iter().take(2) {
        let req = greedy(prompt, 16);
        assert_eq!(c.generate(&req).unwrap(), local(&model, &tok, &req));
    }
}

#[test]
fn sixteen_concurrent_sessions_each_equal_running_alone() {
    let Some(path) = model_path() else { return };
    let (model, tok) = LocalModel::load(&path, &[]).unwrap();
    let prompts = fixture_prompts();
    let requests: Vec<GenerateWire> = (0..16)
        .map(|i| {
            let mut r = greedy(&prompts[i % prompts.len()], 24 + i);
            if i % 2 == 1 {
                (r.sampling.temperature, r.sampling.top_p, r.sampling.seed) = (0.9, 0.9, i as u64);
            }
            r
        })
        .collect();
    let expected: Vec<Generation> = requests.iter().map(|r| local(&model, &tok, r)).collect();
    let mut c = Cluster::new("concurrent", &path, &[10, 20], &[1, 1, 1]);
    c.start_all();
    let c = &c;
    std::thread::scope(|scope| {
        let handles: Vec<_> = requests.iter().map(|r| scope.spawn(move || c.generate(r))).collect();
        for (h, want) in handles.into_iter().zip(&expected) {
            assert_eq!(&h.join().unwrap().unwrap(), want);
        }
    });
}

#[test]
fn a_killed_shard_with_a_replica_is_routed_around_without_changing_the_stream() {
    let Some(path) = model_path() else { return };
    let (model, tok) = LocalModel::load(&path, &[]).unwrap();
    let req = greedy(&fixture_prompts()[0], 160);
    let want = local(&model, &tok, &req);
    let mut c = Cluster::new("replica", &path, &[10, 20], &[1, 2, 1]);
    // Only the first replica of the middle stage at first, so the session uses it.
    c.spawn(2, 0);
    c.spawn(1, 0);
    c.spawn(0, 0);
    c.wait_log(0, 0, "ready", 1);
    let got = c.stream_across_a_kill(&req, 1);
    assert_eq!(got.unwrap(), want, "the stream changed across the re-route");
    let log = std::fs::read_to_string(c.log(0, 0)).unwrap();
    assert!(log.contains("re-routed"), "the session was not re-routed:\n{log}");
}

/// `base` with pipelined speculation (3 rounds in flight, k = 3) by a
/// scripted drafter right except at every fifth token of `want`: accepted
/// chains and cancelled rounds both.
fn pipelined_mixed(base: &GenerateWire, want: &Generation) -> GenerateWire {
    let script: Vec<u32> = want.ids.iter().enumerate().map(|(i, &t)| if i % 5 == 4 { t ^ 1 } else { t }).collect();
    cluster::scripted(base, script, 3, 3)
}

/// Issue 29: logit bias, presence and frequency penalties and
/// log-probabilities through three shards are one process's, token for
/// token and value for value, with and without pipelined speculation; and
/// through the sealed OpenAI API, streamed and not, in OpenAI's shape, as
/// are n > 1 seeded choices.
#[test]
fn penalties_bias_and_logprobs_through_three_shards_equal_one_process() {
    use veil_enclave::text::sampler::logprobs;
    let Some(path) = model_path() else { return };
    let (model, tok) = LocalModel::load(&path, &[]).unwrap();
    let mut c = Cluster::new("sampling-surface", &path, &[10, 20], &[1, 1, 1]);
    c.start_all();
    let prompt = &fixture_prompts()[1];
    let plain = local(&model, &tok, &greedy(prompt, 24));
    let mut banned = greedy(prompt, 24);
    banned.sampling.logit_bias = vec![(plain.ids[0], -100.0)];
    let mut penalised = greedy(prompt, 24);
    (penalised.sampling.temperature, penalised.sampling.seed) = (0.8, 11);
    (penalised.sampling.presence_penalty, penalised.sampling.frequency_penalty) = (0.7, 0.9);
    let mut repeats = greedy(prompt, 24);
    repeats.sampling.frequency_penalty = 2.0;
    for (name, req) in
        [("banned first token", &banned), ("sampled, penalised", &penalised), ("greedy, frequency", &repeats)]
    {
        let want = local(&model, &tok, req);
        assert_eq!(c.generate(req).unwrap().ids, want.ids, "{name}: the pipeline differs from one process");
        assert_ne!(want.ids, plain.ids, "{name}: changed nothing, so it tests nothing");
    }
    assert_ne!(local(&model, &tok, &banned).ids[0], plain.ids[0]);
    // Penalties under pipelined speculation: the last stage penalises each
    // position with the drafts before it, in its own frame and in the
    // rounds in flight before it, so greedy output is one process's.
    // Drafted by the unpenalised path of a prompt that cycles, every draft
    // repeats a token a few positions back, so the counts a penalty reads
    // differ from position to position inside one frame.
    let cycle = tok.encode(&"1, 2, ".repeat(12), true).unwrap();
    let mut cycled = greedy(&cycle, 24);
    (cycled.sampling.presence_penalty, cycled.sampling.frequency_penalty) = (0.5, 1.0);
    let unpenalised = local(&model, &tok, &greedy(&cycle, 24)).ids;
    let want = local(&model, &tok, &cycled);
    assert_ne!(want.ids, unpenalised, "the penalty changed nothing");
    let mut runs = vec![(
        "frequency 2, mixed drafts, k = 3".to_owned(),
        pipelined_mixed(&repeats, &local(&model, &tok, &repeats)),
    )];
    // Every frame alignment: k = 1 to 8, three rounds in flight.
    runs.extend(
        (1..=8).map(|k| (format!("cycling prompt, k = {k}"), cluster::scripted(&cycled, unpenalised.clone(), k, 3))),
    );
    for (name, spec) in runs {
        let want = local(&model, &tok, &spec);
        let got = c.generate(&spec).unwrap();
        assert_eq!(got.ids, want.ids, "{name}: differs from one process");
        let s = got.speculation.expect("penalties leave speculation on");
        assert!(s.accepted > 0 && s.accepted < s.drafted && s.pipelined_rounds > 0, "{name}: {s:?}");
    }
    // Sampled: as lossless in distribution as without penalties, and the
    // same seed gives the same answer.
    let sampled = pipelined_mixed(&penalised, &local(&model, &tok, &penalised));
    let (a, b) = (c.generate(&sampled).unwrap(), c.generate(&sampled).unwrap());
    assert_eq!(a.ids, b.ids, "seeded, penalised and speculating: not repeatable");
    assert!(a.speculation.is_some_and(|s| s.drafted > 0));

    // Log-probabilities: the raw log-softmax of one process's logits at the
    // position that chose each token (tolerance 1e-4; the CPU path is
    // bit-identical, so they agree exactly in practice).
    let mut asked = greedy(prompt, 24);
    asked.sampling.logprobs = Some(3);
    let mut session = model.session(64 << 20);
    let rows = model.step(&mut session, &[prompt.as_slice(), &plain.ids[..plain.ids.len() - 1]].concat()).unwrap();
    let check = |g: &Generation, case: &str| {
        assert_eq!(g.ids, plain.ids, "{case}: logprobs changed the output");
        let lp = g.logprobs.as_ref().expect("asked for");
        assert_eq!(lp.len(), g.ids.len(), "{case}");
        for (j, e) in lp.iter().enumerate() {
            let row = rows.row(prompt.len() - 1 + j);
            let z: f64 = row.iter().map(|&l| f64::from(l).exp()).sum();
            let want = (f64::from(row[e.token as usize]) - z.ln()) as f32;
            assert_eq!(e.token, g.ids[j], "{case}: token {j}");
            assert!((e.logprob - want).abs() < 1e-4, "{case}: token {j}: {} vs {want}", e.logprob);
            assert_eq!(e.top, logprobs(row, 3, &[]), "{case}: top alternatives of token {j}");
            assert_eq!(e.top[0].0, e.token, "{case}: greedy takes the most likely");
        }
    };
    check(&c.generate(&asked).unwrap(), "plain");
    check(&c.generate(&pipelined_mixed(&asked, &plain)).unwrap(), "pipelined speculation");
    let mut biased_spec = pipelined_mixed(&banned, &local(&model, &tok, &banned));
    biased_spec.speculation.k = Some(4);
    assert_eq!(c.generate(&biased_spec).unwrap().ids, local(&model, &tok, &banned).ids, "bias under speculation");

    // The sealed API: OpenAI's shapes, the same values, streamed or not.
    let url = format!("http://{}", c.route.sealed_listen.unwrap());
    let policy = veil_enclave::pipeline::shard::load_policy(&c.route.policy).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let question = "Name three colours.";
    let mut wire = greedy(&[], 12);
    wire.prompt_ids =
        Some(tok.encode_chat(&[veil_enclave::text::tokenizer::ChatMessage::new("user", question)]).unwrap());
    wire.sampling.logprobs = Some(2);
    let want = c.generate(&wire).unwrap();
    let want_lp = want.logprobs.clone().unwrap();
    rt.block_on(async {
        let client = veil_client::sdk::Client::connect(&url, &policy).await.unwrap();
        let chat = serde_json::json!({
            "messages": [{"role": "user", "content": question}], "max_tokens": 12, "temperature": 0,
            "logprobs": true, "top_logprobs": 2,
        });
        let body = client.call("POST", "/v1/chat/completions", &chat).await.unwrap().collect().await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap().clone();
        assert_eq!(content.len(), want_lp.len());
        let mut joined = String::new();
        for (e, w) in content.iter().zip(&want_lp) {
            assert_eq!(e["token"], tok.piece(w.token).unwrap());
            assert_eq!(e["logprob"].as_f64().unwrap() as f32, w.logprob);
            assert_eq!(e["top_logprobs"].as_array().unwrap().len(), 2);
            joined.push_str(e["token"].as_str().unwrap());
        }
        assert_eq!(joined, v["choices"][0]["message"]["content"].as_str().unwrap());
        let mut stream = chat.clone();
        stream["stream"] = true.into();
        let sse = client.call("POST", "/v1/chat/completions", &stream).await.unwrap().collect().await.unwrap();
        let sse = String::from_utf8(sse).unwrap();
        let streamed: Vec<serde_json::Value> = sse
            .split("\n\n")
            .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
            .filter(|e| *e != "[DONE]")
            .flat_map(|e| {
                let v: serde_json::Value = serde_json::from_str(e).unwrap();
                v["choices"][0]["logprobs"]["content"].as_array().cloned().unwrap_or_default()
            })
            .collect();
        assert_eq!(streamed, content, "streamed log-probabilities differ from the whole answer's");
        // n = 3 seeded choices: each is one process's sampled answer with
        // seed + i; asked again, the same three; streamed, the same texts
        // chunk by chunk under their indices.
        let many = serde_json::json!({
            "messages": [{"role": "user", "content": question}], "max_tokens": 8, "temperature": 0.9,
            "seed": 5, "n": 3,
        });
        let texts = |body: &[u8]| -> Vec<String> {
            let v: serde_json::Value = serde_json::from_slice(body).unwrap();
            let choices = v["choices"].as_array().unwrap();
            assert!(choices.iter().enumerate().all(|(i, c)| c["index"] == i));
            assert_eq!(v["usage"]["completion_tokens"].as_u64(), Some(choices.len() as u64 * 8), "{v}");
            choices.iter().map(|c| c["message"]["content"].as_str().unwrap().to_owned()).collect()
        };
        let first = texts(&client.call("POST", "/v1/chat/completions", &many).await.unwrap().collect().await.unwrap());
        let again = texts(&client.call("POST", "/v1/chat/completions", &many).await.unwrap().collect().await.unwrap());
        assert_eq!(first, again, "seeded choices repeat");
        for (i, text) in first.iter().enumerate() {
            let mut one = greedy(wire.prompt_ids.as_ref().unwrap(), 8);
            (one.sampling.temperature, one.sampling.seed) = (0.9, 5 + i as u64);
            assert_eq!(text, &local(&model, &tok, &one).text, "choice {i}");
        }
        assert!(first.iter().collect::<std::collections::BTreeSet<_>>().len() > 1, "the choices differ: {first:?}");
        let mut many_stream = many.clone();
        many_stream["stream"] = true.into();
        let sse = client.call("POST", "/v1/chat/completions", &many_stream).await.unwrap().collect().await.unwrap();
        let mut streamed = vec![String::new(); 3];
        for ev in String::from_utf8(sse)
            .unwrap()
            .split("\n\n")
            .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")).map(str::to_owned))
            .filter(|e| e != "[DONE]")
        {
            let v: serde_json::Value = serde_json::from_str(&ev).unwrap();
            if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
                streamed[v["choices"][0]["index"].as_u64().unwrap() as usize].push_str(t);
            }
        }
        assert_eq!(streamed, first);
        // The legacy completions shape.
        let legacy =
            serde_json::json!({"prompt": "The capital of France is", "max_tokens": 5, "temperature": 0, "logprobs": 1});
        let body = client.call("POST", "/v1/completions", &legacy).await.unwrap().collect().await.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let lp = &v["choices"][0]["logprobs"];
        let tokens: Vec<&str> = lp["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
        assert_eq!(tokens.concat(), v["choices"][0]["text"].as_str().unwrap());
        assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), tokens.len());
        let offsets: Vec<u64> = lp["text_offset"].as_array().unwrap().iter().map(|o| o.as_u64().unwrap()).collect();
        assert_eq!(offsets[0], 0);
        assert_eq!(offsets[1], tokens[0].chars().count() as u64);
    });
}

/// Issue 28: a kill -9 while pipelined speculation has several rounds in
/// flight (some of them built on drafts that will be rejected) re-routes
/// and the stream is still token for token plain greedy decoding.
#[test]
fn a_kill_in_the_middle_of_pipelined_rounds_changes_no_output() {
    let Some(path) = model_path() else { return };
    let (model, tok) = LocalModel::load(&path, &[]).unwrap();
    let base = greedy(&fixture_prompts()[2], 120);
    let want = local(&model, &tok, &base);
    let req = pipelined_mixed(&base, &want);
    let mut c = Cluster::new("pipelined-kill", &path, &[10, 20], &[1, 2, 1]);
    c.spawn(2, 0);
    c.spawn(1, 0);
    c.spawn(0, 0);
    c.wait_log(0, 0, "ready", 1);
    let got = c.stream_across_a_kill(&req, 1).unwrap();
    assert_eq!((&got.ids, &got.text), (&want.ids, &want.text), "the stream changed across the re-route");
    let s = got.speculation.expect("speculated");
    assert!(s.pipelined_rounds > 0 && s.cancelled_rounds > 0 && s.max_depth == 3, "{s:?}");
    let log = std::fs::read_to_string(c.log(0, 0)).unwrap();
    assert!(log.contains("re-routed"), "the session was not re-routed:\n{log}");
}

/// Issue 28 (healing): with both replicas of the middle stage up when the
/// session starts, the second shadows the session's KV (the first stage
/// copies every frame to it). Killing the serving replica (kill -9) moves
/// the session to the shadow with no re-prefill, and the stream is still
/// token for token one process's, for plain decoding and for pipelined
/// speculation whose drafts the shadow also took in and rolled back.
#[test]
fn a_warm_shadow_takes_over_a_killed_shard_without_a_rebuild() {
    let Some(path) = model_path() else { return };
    let (model, tok) = LocalModel::load(&path, &[]).unwrap();
    let plain = greedy(&fixture_prompts()[1], 100);
    let want = local(&model, &tok, &plain);
    let pipelined = pipelined_mixed(&plain, &want);
    for (name, req) in [("plain", &plain), ("pipelined", &pipelined)] {
        let mut c = Cluster::new(&format!("shadow-{name}"), &path, &[10, 20], &[1, 2, 1]);
        c.start_all();
        // The session goes to the replica with fewest sessions, the first
        // listed on a tie (replica 0); replica 1 shadows it.
        c.wait_log(0, 0, "control link up", 3);
        let got = c.stream_during(req, 8, |_| {}, |c| c.kill(1, 0)).unwrap();
        assert_eq!((&got.ids, &got.text), (&want.ids, &want.text), "{name}: the stream changed across the fail-over");
        let log = std::fs::read_to_string(c.log(0, 0)).unwrap();
        assert!(log.contains("re-routed to warm replicas"), "{name}: no warm fail-over:\n{log}");
        assert!(!log.contains("rebuilding the session's KV"), "{name}: the session was rebuilt:\n{log}");
    }
}

#[test]
fn a_killed_shard_without_a_replica_ends_the_stream_with_a_clear_error_in_seconds() {
    let Some(path) = model_path() else { return };
    let mut c = Cluster::new("noreplica", &path, &[10, 20], &[1, 1, 1]);
    c.start_all();
    let req = greedy(&fixture_prompts()[0], 400);
    let listen = c.route.generate_listen;
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        let mut tcp = TcpStream::connect(listen).unwrap();
        tcp.write_all(format!("{}\n", serde_json::to_string(&req).unwrap()).as_bytes()).unwrap();
        let mut sent = false;
        for line in std::io::BufReader::new(tcp).lines() {
            match serde_json::from_str::<GenerateEvent>(&line.unwrap()).unwrap() {
                GenerateEvent::Text(_) if !sent => {
                    tx.send(()).unwrap();
                    sent = true;
                }
                GenerateEvent::Text(_) | GenerateEvent::Logprobs(_) => {}
                GenerateEvent::Done(_) => return Err("finished despite the dead shard".to_owned()),
                GenerateEvent::Error(Failure { message: e, .. }) | GenerateEvent::Refused(e) => {
                    return Ok((e, Instant::now()))
                }
            }
        }
        Err("closed without an error".to_owned())
    });
    rx.recv().unwrap();
    let killed = Instant::now();
    c.kill(1, 0);
    let (error, at) = h.join().unwrap().unwrap();
    let took = at.duration_since(killed);
    println!("error after {took:?}: {error}");
    assert!(error.contains("no live replica") && error.contains("layers 10..20"), "{error}");
    assert!(took < Duration::from_secs(5), "error took {took:?}");
    // The entry keeps serving: with the shard back, a new session completes.
    c.spawn(1, 0);
    c.wait_log(0, 0, "control link up", 3);
    assert!(c.generate(&greedy(&fixture_prompts()[1], 8)).is_ok());
}

#[test]
fn a_neighbour_with_other_weights_is_refused_before_any_activation() {
    let Some(path) = model_path() else { return };
    let mut c = Cluster::new("wrongweights", &path, &[10, 20], &[1, 1, 1]);
    // A copy of the model with one byte of layer 15's weights changed.
    let mut bytes = std::fs::read(&path).unwrap();
    let gguf = veil_enclave::model::GgufFile::open(&path).unwrap();
    drop(gguf);
    let tampered = c.dir.join("tampered.gguf");
    // The tensor data sits in the second half of the file for these layers.
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    std::fs::write(&tampered, &bytes).unwrap();
    let mut own = c.route.clone();
    own.model = tampered.clone();
    own.stages[1].manifest_root = None;
    let own = veil_enclave::pipeline::local::prepare(own).unwrap();
    assert_ne!(own.stages[1].manifest_root, c.route.stages[1].manifest_root, "the byte flip missed layers 10..20");
    let own_path = c.dir.join("tampered-route.toml");
    std::fs::write(&own_path, own.to_toml()).unwrap();
    // The entry first finds nothing listening for layers 10..20; when the
    // tampered shard comes up, the entry must say why it is now refused
    // (a second, different warning, not the first one repeated or muted).
    c.spawn(2, 0);
    c.spawn(0, 0);
    let unreachable = format!("cannot reach {}", c.route.stages[1].replicas[0]);
    c.wait_log(0, 0, &unreachable, 1);
    c.spawn_with(1, 0, &own_path);
    c.wait_log(0, 0, "attestation of", 1);
    let err = c.generate(&greedy(&fixture_prompts()[0], 4)).unwrap_err();
    assert!(err.contains("layers 10..20") && err.contains("no live replica"), "{err}");
    let log = std::fs::read_to_string(c.log(0, 0)).unwrap();
    let refused = log.lines().find(|l| l.contains("attestation of")).unwrap();
    assert!(refused.contains("shard not available") && refused.contains("manifest root"), "{log}");
    let shard_log = std::fs::read_to_string(c.log(1, 0)).unwrap();
    assert!(!shard_log.contains("control link from the entry"), "{shard_log}");
}

#[test]
fn malformed_and_out_of_order_frames_drop_only_that_link() {
    use veil_attestation::ratls::{self, RaTlsIdentity, RaTlsVerifier};
    use veil_attestation::{ExpectedClaims, LayerRange, SimulatedAttester};
    use veil_enclave::link::frame::{Frame, Hello, LinkRole, PROTOCOL_VERSION};

    let Some(path) = model_path() else { return };
    let mut c = Cluster::new("malformed", &path, &[10, 20], &[1, 1, 1]);
    c.start_all();
    let sim = SimulatedAttester::load(c.route.simulated_root.as_ref().unwrap()).unwrap();
    let policy = std::sync::Arc::new(veil_enclave::pipeline::shard::load_policy(&c.route.policy).unwrap());
    let stage0 = c.route.stages[0].clone();
    let target = c.route.stages[1].replicas[0];
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // A well-attested stage-0 peer that then misbehaves in three ways.
    let attacks: Vec<Vec<u8>> = vec![
        vec![0, 0, 0, 3, 0xEE, 1, 2],      // unknown frame kind
        [0x7F, 0xFF, 0xFF, 0xFF].to_vec(), // a 2 GiB frame
        [Frame::Ping(1).encode(), Frame::Ping(2).encode(), {
            // A forward frame, then the same sequence number again.
            let f = veil_enclave::link::frame::Forward {
                session: veil_enclave::link::frame::SessionId(9),
                seq: 1,
                start: 0,
                truncate_to: None,
                want: veil_enclave::link::frame::Want::Nothing,
                route: vec![0, 0],
                shadow: Vec::new(),
                mirror: false,
                kv_lens: vec![0],
                sampling: None,
                precision: veil_enclave::link::frame::Precision::F32,
                width: 576,
                hidden: vec![0.0; 576],
            };
            [Frame::Forward(f.clone()).encode(), Frame::Forward(f).encode()].concat()
        }]
        .concat(),
    ];
    for attack in attacks {
        let closed = rt.block_on(async {
            let mut claims = veil_enclave::attest::claims(Some(LayerRange::new(0, 10).unwrap()), None);
            claims.manifest_root = stage0.manifest_root;
            // Attested as the route's entry: same peer policy, same shape.
            claims.peer_policy = Some(policy.digest());
            claims.route_shape = Some(c.route.shape(30).unwrap().digest());
            let id = RaTlsIdentity::new(&sim, claims).unwrap();
            let verifier = std::sync::Arc::new(RaTlsVerifier::new(policy.clone(), ExpectedClaims::default()));
            let tcp = tokio::net::TcpStream::connect(target).await.unwrap();
            let (mut tls, _) = ratls::tokio::connect(tcp, &id, verifier).await.unwrap();
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let hello = Hello {
                version: PROTOCOL_VERSION,
                role: LinkRole::Data,
                layers: stage0.layers,
                manifest_root: stage0.manifest_root.unwrap(),
            };
            tls.write_all(&Frame::Hello(hello).encode()).await.unwrap();
            tls.write_all(&attack).await.unwrap();
            tls.flush().await.unwrap();
            let mut sink = vec![0u8; 1 << 16];
            // The shard answers its hello (and pongs), then closes the link.
            tokio::time::timeout(Duration::from_secs(10), async {
                loop {
                    match tls.read(&mut sink).await {
                        Ok(0) | Err(_) => return true,
                        Ok(_) => {}
                    }
                }
            })
            .await
            .unwrap_or(false)
        });
        assert!(closed, "the shard kept a misbehaving link open");
    }
    // The shard and the pipeline still serve.
    let (model, tok) = LocalModel::load(&path, &[]).unwrap();
    let req = greedy(&fixture_prompts()[3], 12);
    assert_eq!(c.generate(&req).unwrap(), local(&model, &tok, &req));
    let log = std::fs::read_to_string(c.log(1, 0)).unwrap();
    assert!(
        log.contains("unknown frame kind") && log.contains("exceeds the limit") && log.contains("sequence"),
        "{log}"
    );
}

#[test]
fn a_full_kv_budget_is_a_clear_refusal_and_opt_in_f16_activations_still_serve() {
    let Some(path) = model_path() else { return };
    let mut c = Cluster::new("kvfull", &path, &[10, 20], &[1, 1, 1]);
    // 1 MiB per shard holds ~136 positions of ten layers.
    c.route.kv_budget_bytes = 1 << 20;
    c.route.precision = veil_enclave::link::frame::Precision::F16;
    std::fs::write(&c.route_path, c.route.to_toml()).unwrap();
    c.start_all();
    let long: Vec<u32> = (0..150).map(|i| 300 + i).collect();
    let err = c.generate(&greedy(&long, 4)).unwrap_err();
    assert!(err.contains("KvFull") && err.contains("KV memory full"), "{err}");
    // The shard keeps serving what fits, with f16 on the wire.
    let g = c.generate(&greedy(&fixture_prompts()[0], 16)).unwrap();
    assert_eq!(g.ids.len(), 16);
}

#[test]
fn sealed_openai_calls_end_to_end_through_the_entry_gateway() {
    use veil_client::sdk::{Client, ClientError};
    use veil_enclave::text::tokenizer::ChatMessage;
    let Some(path) = model_path() else { return };
    let (model, tok) = LocalModel::load(&path, &[]).unwrap();
    let mut c = Cluster::new("sealed", &path, &[10, 20], &[1, 1, 1]);
    c.start_all();
    let url = format!("http://{}", c.route.sealed_listen.unwrap());
    let policy = veil_enclave::pipeline::shard::load_policy(&c.route.policy).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let question = "What is the capital of France?";
    let mut want = greedy(&[], 24);
    want.prompt_ids = Some(tok.encode_chat(&[ChatMessage::new("user", question)]).unwrap());
    let expected = local(&model, &tok, &want);
    rt.block_on(async {
        let client = Client::connect(&url, &policy).await.unwrap();
        assert_eq!(client.route().shards().len(), 2);
        let chat = serde_json::json!({
            "model": "SmolLM2-135M-Instruct.Q4_1", "messages": [{"role": "user", "content": question}],
            "max_tokens": 24, "temperature": 0
        });
        let resp = client.call("POST", "/v1/chat/completions", &chat).await.unwrap();
        assert_eq!(resp.status, 200);
        // The route the entry used, inside the seal: exactly the verified shards.
        let mut verified: Vec<_> = client.route().shards().iter().collect();
        verified.sort_by_key(|s| s.stage());
        let want_route = verified
            .iter()
            .map(|s| {
                let key = s.evidence().claims().unwrap().tls_key_hash.unwrap();
                format!("s{}r{}:{}", s.stage(), s.replica(), hex::encode(&key.0[..8]))
            })
            .collect::<Vec<_>>()
            .join(",");
        assert_eq!(resp.route_used(), Some(want_route.as_str()));
        // The drafter: attested in the route (this cluster does not
        // speculate), and named inside the seal as the one that ran.
        assert_eq!(client.route().drafter().map(|d| d.kind.as_str()), Some("none"));
        assert_eq!(resp.drafter_used(), Some("none"));
        let mut resp = resp;
        let mut body = Vec::new();
        while let Some(p) = resp.next().await.unwrap() {
            body.extend(p);
        }
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], expected.text);
        assert_eq!(v["usage"]["completion_tokens"], expected.ids.len());
        // The entry's receipt, checked by the SDK as the answer ended: its
        // counts are the answer's, and it verifies offline against the route
        // document as saved (a file written and read back), which pins it to
        // this route: another policy refuses it, and an edited receipt fails.
        let receipt = resp.receipt().expect("a completed answer carries its checked receipt").clone();
        assert_eq!(receipt.completion_tokens as usize, expected.ids.len());
        assert_eq!(receipt.prompt_tokens, v["usage"]["prompt_tokens"].as_u64().unwrap());
        assert_eq!(receipt.shards, want_route);
        let saved: veil_attestation::receipt::SavedRoute =
            serde_json::from_str(&serde_json::to_string(client.saved_route()).unwrap()).unwrap();
        saved.check_receipt(&receipt, &policy).unwrap();
        let mut edited = receipt.clone();
        edited.completion_tokens += 1;
        let failed = saved.check_receipt(&edited, &policy).unwrap_err();
        assert_eq!(failed.check, veil_attestation::receipt::ReceiptCheck::Signature, "{failed}");
        let mut stricter = policy.clone();
        stricter.allow_simulated = false;
        let failed = saved.check_receipt(&receipt, &stricter).unwrap_err();
        assert_eq!(failed.check, veil_attestation::receipt::ReceiptCheck::RouteDocument, "{failed}");
        // Streamed: the deltas add up to the same text; usage before [DONE].
        let mut stream_req = chat.clone();
        stream_req["stream"] = true.into();
        stream_req["stream_options"] = serde_json::json!({"include_usage": true});
        let mut resp = client.call("POST", "/v1/chat/completions", &stream_req).await.unwrap();
        let mut sse = Vec::new();
        let mut pieces = 0;
        while let Some(p) = resp.next().await.unwrap() {
            sse.extend(p);
            pieces += 1;
        }
        assert_eq!(resp.route_used(), Some(want_route.as_str()), "the stream's trailer names its route");
        assert_eq!(resp.drafter_used(), Some("none"), "the stream's trailer names its drafter");
        let streamed = resp.receipt().expect("the stream's trailer carries its receipt");
        assert_eq!(streamed.completion_tokens as usize, expected.ids.len());
        assert_ne!(streamed.id, receipt.id);
        assert_ne!(streamed.request, receipt.request, "each receipt names its own sealed request");
        saved.check_receipt(streamed, &policy).unwrap();
        let sse = String::from_utf8(sse).unwrap();
        // The last event is the end marker (padded, like every event).
        let last = sse.trim_end_matches('\n').rsplit("\n\n").next().unwrap();
        assert!(last.starts_with("data: [DONE]\n:") && pieces > 3, "{sse}");
        let mut text = String::new();
        for ev in sse
            .split("\n\n")
            .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
            .filter(|e| *e != "[DONE]")
        {
            let v: serde_json::Value = serde_json::from_str(ev).unwrap();
            if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
                text.push_str(t);
            }
        }
        assert_eq!(text, expected.text);
        assert!(sse.contains("\"usage\""));
        // Models, and an OpenAI-shaped error, both sealed.
        let models = client.call("GET", "/v1/models", &serde_json::Value::Null).await.unwrap();
        assert_eq!(models.status, 200);
        let bad = client.call("POST", "/v1/completions", &serde_json::json!({"prompt": "x", "n": 9})).await.unwrap();
        assert_eq!(bad.status, 400);
        let v: serde_json::Value = serde_json::from_slice(&bad.collect().await.unwrap()).unwrap();
        assert_eq!(v["error"]["param"], "n");
        // A policy that pins another measurement refuses the route, with the check table.
        let mut strict = policy.clone();
        strict.measurements = vec![veil_attestation::Measurement([7; 48])];
        let err = Client::connect(&url, &strict).await.unwrap_err();
        assert!(matches!(err, ClientError::Attestation { .. }), "{err}");
        assert!(err.check_table().unwrap().contains("measurement"));
    });
}

/// What a malicious host does to the traffic it relays.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Tamper {
    FlipBit,
    Truncate,
    SwapHalves,
    ReplayOldResponse,
    ReplayRequest,
    SwapKey,
}

/// A relay between client and entry gateway that tampers with the
/// ciphertext it carries (an in-process test double of a malicious host).
async fn malicious_host(gateway: std::net::SocketAddr, mode: Tamper) -> std::net::SocketAddr {
    struct Malicious {
        mode: Tamper,
        last_response: std::sync::Mutex<Option<Vec<u8>>>,
    }
    impl crate::relay::Tamper for Malicious {
        fn sends(&self, path: &str) -> usize {
            // The entry already answered this request once.
            if self.mode == Tamper::ReplayRequest && path == "/v1/sealed" {
                2
            } else {
                1
            }
        }
        fn answer(&self, path: &str, status: hyper::StatusCode, bytes: &mut Vec<u8>) {
            if path.starts_with("/v1/attestation") && self.mode == Tamper::SwapKey {
                let mut doc: serde_json::Value = serde_json::from_slice(bytes).unwrap();
                let other = veil_enclave::gateway::seal::SealKey::generate(1).unwrap();
                use base64::Engine as _;
                doc["key_config"] = base64::engine::general_purpose::STANDARD.encode(other.config()).into();
                *bytes = serde_json::to_vec(&doc).unwrap();
            }
            if path == "/v1/sealed" && status.is_success() {
                let n = bytes.len();
                match self.mode {
                    Tamper::FlipBit => bytes[n / 2] ^= 0x01,
                    Tamper::Truncate => bytes.truncate(n - 20),
                    Tamper::SwapHalves => bytes.rotate_left(n / 2),
                    Tamper::ReplayOldResponse => {
                        let mut last = self.last_response.lock().unwrap();
                        if let Some(old) = last.replace(bytes.clone()) {
                            *bytes = old;
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    let tamper = Malicious { mode, last_response: Default::default() };
    crate::relay::tampering_host(gateway, std::sync::Arc::new(tamper)).await
}

#[test]
fn a_malicious_host_is_caught_and_tampered_text_never_shown() {
    use veil_client::sdk::{Client, ClientError};
    let Some(path) = model_path() else { return };
    let mut c = Cluster::new("malicious", &path, &[15], &[1, 1]);
    c.start_all();
    let gateway = c.route.sealed_listen.unwrap();
    let policy = veil_enclave::pipeline::shard::load_policy(&c.route.policy).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let body =
        serde_json::json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "temperature": 0});
    rt.block_on(async {
        for mode in [
            Tamper::FlipBit,
            Tamper::Truncate,
            Tamper::SwapHalves,
            Tamper::ReplayOldResponse,
            Tamper::ReplayRequest,
            Tamper::SwapKey,
        ] {
            let host = malicious_host(gateway, mode).await;
            let url = format!("http://{host}");
            let client = match Client::connect(&url, &policy).await {
                Ok(client) => client,
                Err(e) => {
                    assert_eq!(mode, Tamper::SwapKey, "{mode:?}: {e}");
                    assert!(matches!(e, ClientError::Attestation { .. }), "{e}");
                    assert!(e.check_table().unwrap().contains("HPKE key-config hash"), "{e}");
                    continue;
                }
            };
            assert_ne!(mode, Tamper::SwapKey, "a swapped key was accepted");
            let mut shown = Vec::new();
            let mut outcome = Ok(());
            for _ in 0..2 {
                // Twice, so a replayed old response has something to replay.
                let r = async {
                    let mut resp = client.call("POST", "/v1/chat/completions", &body).await?;
                    while let Some(p) = resp.next().await? {
                        shown.extend(p);
                    }
                    Ok::<_, ClientError>(())
                }
                .await;
                if r.is_err() {
                    outcome = r;
                    break;
                }
                if mode != Tamper::ReplayOldResponse {
                    outcome = r;
                    break;
                }
                shown.clear();
            }
            let err = outcome.expect_err(&format!("{mode:?} went unnoticed"));
            match mode {
                Tamper::ReplayRequest => assert!(err.to_string().contains("409"), "{mode:?}: {err}"),
                _ => assert!(matches!(err, ClientError::Seal(_)), "{mode:?}: {err}"),
            }
            // Each chunk is authenticated on its own: a flipped or moved chunk
            // never yields text (the body is one chunk here, tampered in its
            // middle). A truncated stream yields its authentic chunks and then
            // the error, because the chunk marked final never came.
            if matches!(mode, Tamper::FlipBit | Tamper::SwapHalves) {
                assert!(shown.is_empty(), "{mode:?} showed {} bytes", shown.len());
            }
        }
        // The honest path still works.
        let client = Client::connect(&format!("http://{gateway}"), &policy).await.unwrap();
        let resp = client.call("POST", "/v1/chat/completions", &body).await.unwrap();
        assert_eq!(resp.status, 200);
        resp.collect().await.unwrap();
    });
}

/// SECURITY-CASES I2: every event of a streamed answer is padded inside the
/// seal to one size, so the chunks the host relays do not reveal token
/// lengths: two different answers, whose tokens' texts differ in length,
/// reach the host as runs of equal-sized chunks (only the head, the route
/// trailer and the empty final chunk differ). A complete answer is
/// padded to a 1 KiB bucket and still parses to the streamed answer's text.
#[test]
fn streamed_chunks_all_have_one_size_whatever_the_tokens() {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use veil_client::sdk::Client;
    let Some(path) = model_path() else { return };
    let mut c = Cluster::new("padded", &path, &[15], &[1, 1]);
    c.start_all();
    let gateway = c.route.sealed_listen.unwrap();
    let policy = veil_enclave::pipeline::shard::load_policy(&c.route.policy).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let client = Client::connect(&format!("http://{gateway}"), &policy).await.unwrap();
        let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http::<Full<Bytes>>();
        let mut body_sizes = std::collections::BTreeSet::new();
        let mut piece_lengths = std::collections::BTreeSet::new();
        let mut streamed: std::collections::HashMap<&str, String> = Default::default();
        for (question, stream) in [
            ("What is the capital of France?", true),
            ("Name three colours.", true),
            ("What is the capital of France?", false),
        ] {
            let body = serde_json::json!({
                "model": "SmolLM2-135M-Instruct.Q4_1", "messages": [{"role": "user", "content": question}],
                "max_tokens": 16, "temperature": 0, "stream": stream,
            });
            let (sealed, opener) = cluster::seal_chat(client.route(), &body).await;
            let req = hyper::Request::post(format!("http://{gateway}/v1/sealed"))
                .header("content-type", "message/ohttp-chunked-req")
                .body(Full::new(Bytes::from(sealed)))
                .unwrap();
            let raw = http.request(req).await.unwrap().into_body().collect().await.unwrap().to_bytes();
            let sizes: Vec<usize> = veil_tests::ohttp_response_chunks(&raw).iter().map(|c| c.len()).collect();
            let reader: std::pin::Pin<Box<dyn futures::io::AsyncRead + Send>> =
                Box::pin(futures::io::Cursor::new(raw.to_vec()));
            let mut opened = opener.open(reader).await.unwrap();
            assert_eq!(opened.status, 200);
            let mut text = Vec::new();
            while let Some(piece) = opened.next().await.unwrap() {
                if stream {
                    assert_eq!(piece.len() % veil_enclave::gateway::openai::SSE_PAD, 0, "an unpadded event");
                    let event = String::from_utf8_lossy(&piece).into_owned();
                    let data = event.lines().find_map(|l| l.strip_prefix("data: ")).unwrap().to_owned();
                    if let Ok(v) = serde_json::from_str::<serde_json::Value>(&data) {
                        if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
                            piece_lengths.insert(t.len());
                            streamed.entry(question).or_default().push_str(t);
                        }
                    }
                }
                text.extend(piece);
            }
            if stream {
                // The head, the events, the route trailer, the (empty) final chunk.
                assert!(sizes.len() > 5, "{sizes:?}");
                body_sizes.extend(sizes[1..sizes.len() - 2].iter().copied());
                assert!(String::from_utf8_lossy(&text).contains("data: [DONE]"));
            } else {
                assert_eq!(text.len() % veil_enclave::gateway::openai::BODY_PAD, 0);
                let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
                // The same greedy answer as the padded stream gave.
                assert_eq!(v["choices"][0]["message"]["content"].as_str().unwrap(), streamed[question], "{v}");
            }
        }
        assert!(piece_lengths.len() > 1, "the test needs tokens of different lengths: {piece_lengths:?}");
        assert_eq!(body_sizes.len(), 1, "the host saw event chunks of sizes {body_sizes:?}");
    });
}

/// How a host delays what it relays (SECURITY-CASES H3).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Delay {
    /// Never answers the attestation request.
    Attestation,
    /// Takes the sealed request and never answers it.
    DropRequest,
    /// Sends most of the sealed response, then nothing more.
    StallBody,
    /// Answers every sealed request 409 without relaying it (as if the key had rotated).
    Refuse,
    /// Answers every sealed request 400 with an endless chunked body (issue 23).
    ErrorBomb,
    /// Answers every sealed request 400, sends a little body, then stalls.
    ErrorStall,
    /// Answers the first three attestation requests 503 (busy), then relays.
    BusyAttestation,
    /// Answers the first two sealed requests 503 with `Retry-After: 1`
    /// without relaying them (a full queue), then relays.
    Shed,
    /// Answers every sealed request 503 with `Retry-After: 1`, unrelayed.
    ShedAlways,
}

/// A relay that relays honestly except for the one delay it was made for;
/// counts the sealed requests it received (and, for [`Delay::ErrorBomb`],
/// the bytes of error body it managed to send, in [`BOMB_BYTES`]).
async fn delaying_host(
    gateway: std::net::SocketAddr,
    mode: Delay,
) -> (std::net::SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    delaying_host_counting(gateway, mode, std::sync::Arc::default()).await
}

async fn delaying_host_counting(
    gateway: std::net::SocketAddr,
    mode: Delay,
    bomb_bytes: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> (std::net::SocketAddr, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use bytes::Bytes;
    use futures::StreamExt as _;
    use http_body_util::{BodyExt, Full, StreamBody};
    type Frames = futures::stream::BoxStream<'static, Result<hyper::body::Frame<Bytes>, std::convert::Infallible>>;
    let listener = tokio::net::TcpListener::bind(veil_tests::free_loopback_port()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let client =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http::<Full<Bytes>>();
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = seen.clone();
    let busy_left = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(3));
    let shed_left = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(2));
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (client, counter) = (client.clone(), counter.clone());
            let (bomb_bytes, busy_left, shed_left) = (bomb_bytes.clone(), busy_left.clone(), shed_left.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let (client, counter) = (client.clone(), counter.clone());
                    let (bomb_bytes, busy_left, shed_left) = (bomb_bytes.clone(), busy_left.clone(), shed_left.clone());
                    async move {
                        use std::sync::atomic::Ordering::SeqCst;
                        let path = req.uri().path_and_query().map(|p| p.to_string()).unwrap_or_default();
                        let sealed = path == "/v1/sealed";
                        if sealed {
                            counter.fetch_add(1, SeqCst);
                        }
                        if mode == Delay::BusyAttestation
                            && !sealed
                            && busy_left.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok()
                        {
                            let frames: Frames = futures::stream::once(async {
                                Ok(hyper::body::Frame::data(Bytes::from_static(b"busy")))
                            })
                            .boxed();
                            let mut r = hyper::Response::new(StreamBody::new(frames));
                            *r.status_mut() = hyper::StatusCode::SERVICE_UNAVAILABLE;
                            return Ok::<_, std::convert::Infallible>(r);
                        }
                        let shed = sealed
                            && match mode {
                                Delay::ShedAlways => true,
                                Delay::Shed => shed_left.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok(),
                                _ => false,
                            };
                        if shed {
                            let frames: Frames = futures::stream::once(async {
                                Ok(hyper::body::Frame::data(Bytes::from_static(b"overloaded: the queue is full\n")))
                            })
                            .boxed();
                            let mut r = hyper::Response::new(StreamBody::new(frames));
                            *r.status_mut() = hyper::StatusCode::SERVICE_UNAVAILABLE;
                            r.headers_mut().insert(hyper::header::RETRY_AFTER, hyper::header::HeaderValue::from(1u64));
                            return Ok::<_, std::convert::Infallible>(r);
                        }
                        if matches!(mode, Delay::ErrorBomb | Delay::ErrorStall) && sealed {
                            let frames: Frames = if mode == Delay::ErrorBomb {
                                let piece = Bytes::from(vec![b'x'; 16 << 10]);
                                futures::stream::repeat_with(move || {
                                    bomb_bytes.fetch_add(piece.len(), SeqCst);
                                    Ok(hyper::body::Frame::data(piece.clone()))
                                })
                                .boxed()
                            } else {
                                futures::stream::once(async {
                                    Ok(hyper::body::Frame::data(Bytes::from_static(b"bad ")))
                                })
                                .chain(futures::stream::pending())
                                .boxed()
                            };
                            let mut r = hyper::Response::new(StreamBody::new(frames));
                            *r.status_mut() = hyper::StatusCode::BAD_REQUEST;
                            return Ok::<_, std::convert::Infallible>(r);
                        }
                        if (mode == Delay::Attestation && !sealed) || (mode == Delay::DropRequest && sealed) {
                            std::future::pending::<()>().await;
                        }
                        if mode == Delay::Refuse && sealed {
                            let frames: Frames = futures::stream::once(async {
                                Ok(hyper::body::Frame::data(Bytes::from_static(b"replayed request")))
                            })
                            .boxed();
                            let mut r = hyper::Response::new(StreamBody::new(frames));
                            *r.status_mut() = hyper::StatusCode::CONFLICT;
                            return Ok::<_, std::convert::Infallible>(r);
                        }
                        let method = req.method().clone();
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let forward = hyper::Request::builder()
                            .method(method)
                            .uri(format!("http://{gateway}{path}"))
                            .body(Full::new(body))
                            .unwrap();
                        let resp = client.request(forward).await.unwrap();
                        let status = resp.status();
                        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
                        let frames: Frames = if sealed && mode == Delay::StallBody {
                            let most = bytes.slice(..bytes.len() - 20);
                            futures::stream::once(async move { Ok(hyper::body::Frame::data(most)) })
                                .chain(futures::stream::pending())
                                .boxed()
                        } else {
                            futures::stream::once(async move { Ok(hyper::body::Frame::data(bytes)) }).boxed()
                        };
                        let mut r = hyper::Response::new(StreamBody::new(frames));
                        *r.status_mut() = status;
                        Ok::<_, std::convert::Infallible>(r)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    (addr, seen)
}

/// SECURITY-CASES H3: a host that never answers the attestation request,
/// swallows a sealed request, or stalls a response mid-way gets a typed
/// timeout naming the stage, within the client's limit, and nothing is re-sent.
#[test]
fn a_host_that_drops_or_delays_is_timed_out_by_stage() {
    use veil_client::sdk::{Client, ClientError, ConnectOptions, TimeoutStage, Timeouts};
    let Some(path) = model_path() else { return };
    let mut c = Cluster::new("delaying", &path, &[15], &[1, 1]);
    c.start_all();
    let gateway = c.route.sealed_listen.unwrap();
    let policy = veil_enclave::pipeline::shard::load_policy(&c.route.policy).unwrap();
    let short = Duration::from_secs(2);
    let options = ConnectOptions {
        timeouts: Timeouts { attest: short, first_byte: Duration::from_secs(20), between_chunks: short },
        ..Default::default()
    };
    let body = serde_json::json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "temperature": 0, "stream": true});
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let (host, _) = delaying_host(gateway, Delay::Attestation).await;
        let started = Instant::now();
        let err = Client::connect_with(&format!("http://{host}"), &policy, &options).await.unwrap_err();
        assert!(matches!(err, ClientError::Timeout { stage: TimeoutStage::Attest, .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());

        let (host, _) = delaying_host(gateway, Delay::DropRequest).await;
        let options =
            ConnectOptions { timeouts: Timeouts { first_byte: short, ..options.timeouts }, ..options.clone() };
        let client = Client::connect_with(&format!("http://{host}"), &policy, &options).await.unwrap();
        let err = client.call("POST", "/v1/chat/completions", &body).await.unwrap_err();
        assert!(matches!(err, ClientError::Timeout { stage: TimeoutStage::FirstByte, .. }), "{err}");
        assert!(!Client::may_be_key_rotation(&err), "a delay must not look like a key rotation (no re-send)");

        // From here the answer's head may take as long as a generation on a
        // loaded machine: only the between-chunk limit is short.
        let options = ConnectOptions {
            timeouts: Timeouts { first_byte: Duration::from_secs(60), ..options.timeouts },
            ..options.clone()
        };
        let (host, _) = delaying_host(gateway, Delay::StallBody).await;
        let client = Client::connect_with(&format!("http://{host}"), &policy, &options).await.unwrap();
        let mut resp = client.call("POST", "/v1/chat/completions", &body).await.unwrap();
        assert_eq!(resp.status, 200);
        let err = loop {
            match resp.next().await {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("a stalled stream ended as if complete"),
                Err(e) => break e,
            }
        };
        assert!(matches!(err, veil_client::seal::SealError::Stalled(_)), "{err}");
        // A host that answers 409 (what a rotated key gets) while the entry's
        // attested key is unchanged: verified again, and not re-sent.
        let (host, sealed_seen) = delaying_host(gateway, Delay::Refuse).await;
        let client = Client::connect_with(&format!("http://{host}"), &policy, &options).await.unwrap();
        let bytes = serde_json::to_vec(&body).unwrap();
        let Err(err) = client.call_reverifying(&policy, &options, "POST", "/v1/chat/completions", bytes).await else {
            panic!("a refusal must not turn into an answer");
        };
        assert!(matches!(err, ClientError::Refused { status: 409, .. }), "{err}");
        assert_eq!(sealed_seen.load(std::sync::atomic::Ordering::SeqCst), 1, "the prompt was sent again");
        // Issue 23, error-body bomb: a host that refuses with an endless
        // error body gets a typed refusal (the client does not hang on it:
        // 10 s is the test's bound, not the client's), after at most 64 KiB of
        // it were read (what it could push is bounded by the socket buffers,
        // not by the client's memory); one that stalls its error body is
        // timed out between chunks.
        let bomb_bytes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (host, _) = delaying_host_counting(gateway, Delay::ErrorBomb, bomb_bytes.clone()).await;
        let client = Client::connect_with(&format!("http://{host}"), &policy, &options).await.unwrap();
        let started = Instant::now();
        let err = tokio::time::timeout(Duration::from_secs(10), client.call("POST", "/v1/chat/completions", &body))
            .await
            .expect("the client hung on an endless error body")
            .unwrap_err();
        match &err {
            ClientError::Refused { status: 400, message } => assert!(message.len() <= 1024, "{}", message.len()),
            other => panic!("an endless error body must be a typed refusal: {other}"),
        }
        println!("endless error body refused after {:?}", started.elapsed());
        tokio::time::sleep(Duration::from_millis(500)).await;
        let sent = bomb_bytes.load(std::sync::atomic::Ordering::SeqCst);
        assert!(sent < 32 << 20, "the client kept reading an endless error body: {sent} bytes");
        let (host, _) = delaying_host(gateway, Delay::ErrorStall).await;
        let client = Client::connect_with(&format!("http://{host}"), &policy, &options).await.unwrap();
        let started = Instant::now();
        let err = client.call("POST", "/v1/chat/completions", &body).await.unwrap_err();
        assert!(matches!(err, ClientError::Timeout { stage: TimeoutStage::BetweenChunks, .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
        // Issue 23, attestation at scale: a busy attestation endpoint (503)
        // is asked again with back-off, within the attestation limit.
        let (host, _) = delaying_host(gateway, Delay::BusyAttestation).await;
        let patient = ConnectOptions {
            timeouts: Timeouts { attest: Duration::from_secs(20), ..options.timeouts },
            ..options.clone()
        };
        Client::connect_with(&format!("http://{host}"), &policy, &patient).await.unwrap();
        // The honest relay still serves: the stalls held nothing on the entry.
        let client = Client::connect(&format!("http://{gateway}"), &policy).await.unwrap();
        assert_eq!(client.call("POST", "/v1/chat/completions", &body).await.unwrap().status, 200);
    });
}

/// Issue 58 (honest overload): a request the host sheds for load (503 with
/// `Retry-After`) is sealed again and re-sent after the advised wait, and
/// answers; a host that sheds every try is given up on after the client's
/// `Retries` (the refusal comes back typed, with its status); a client with
/// `Retries::NONE` sends once. The relay's 503 is unauthenticated, so what
/// is bounded is the number of sends, not whether they happen.
#[test]
fn a_request_shed_for_load_is_sealed_again_after_retry_after_and_a_host_that_always_sheds_is_given_up_on() {
    use std::sync::atomic::Ordering::SeqCst;
    use veil_client::sdk::{Client, ClientError, ConnectOptions, Retries};
    let Some(path) = model_path() else { return };
    let mut c = Cluster::new("shedding", &path, &[15], &[1, 1]);
    c.start_all();
    let gateway = c.route.sealed_listen.unwrap();
    let policy = veil_enclave::pipeline::shard::load_policy(&c.route.policy).unwrap();
    let body =
        serde_json::json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "temperature": 0});
    let quick = Retries { max: 2, first_backoff: Duration::from_millis(50), max_backoff: Duration::from_millis(100) };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        // Shed twice, then relayed: the third send answers, after two
        // advised waits of a second each.
        let (host, seen) = delaying_host(gateway, Delay::Shed).await;
        let options = ConnectOptions { retries: quick, ..Default::default() };
        let client = Client::connect_with(&format!("http://{host}"), &policy, &options).await.unwrap();
        let started = Instant::now();
        let answer = client.call("POST", "/v1/chat/completions", &body).await.unwrap();
        assert_eq!(answer.status, 200);
        let text = String::from_utf8(answer.collect().await.unwrap()).unwrap();
        assert!(text.contains("\"choices\""), "{text}");
        assert_eq!(seen.load(SeqCst), 3, "two shed sends and the one that ran");
        assert!(started.elapsed() >= Duration::from_secs(2), "Retry-After was not waited: {:?}", started.elapsed());

        // Shed every time: 1 + max sends, then the typed refusal.
        let (host, seen) = delaying_host(gateway, Delay::ShedAlways).await;
        let client = Client::connect_with(&format!("http://{host}"), &policy, &options).await.unwrap();
        let err = client.call("POST", "/v1/chat/completions", &body).await.unwrap_err();
        assert!(
            matches!(&err, ClientError::Refused { status: 503, message } if message.contains("overloaded")),
            "{err}"
        );
        assert_eq!(seen.load(SeqCst), 3, "1 + Retries::max sends, no more");

        // No retries: one send.
        let (host, seen) = delaying_host(gateway, Delay::ShedAlways).await;
        let once = ConnectOptions { retries: Retries::NONE, ..Default::default() };
        let client = Client::connect_with(&format!("http://{host}"), &policy, &once).await.unwrap();
        let err = client.call("POST", "/v1/chat/completions", &body).await.unwrap_err();
        assert!(matches!(err, ClientError::Refused { status: 503, .. }), "{err}");
        assert_eq!(seen.load(SeqCst), 1);
    });
}

/// `veil proxy` in front of a host that cuts sealed responses: a complete
/// response becomes a 502 with an OpenAI-shaped error; a stream gets an
/// error event and is aborted without its chunked terminator. The official
/// `openai` Python client raises on both (when installed; CI requires it).
#[test]
fn veil_proxy_turns_a_cut_sealed_response_into_an_error_no_client_can_miss() {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    let Some(path) = model_path() else { return };
    let mut c = Cluster::new("proxy-cut", &path, &[15], &[1, 1]);
    c.start_all();
    let gateway = c.route.sealed_listen.unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let host = rt.block_on(malicious_host(gateway, Tamper::Truncate));
    let veil = std::path::PathBuf::from(env!("CARGO_BIN_EXE_veil-shard")).with_file_name("veil");
    if !veil.exists() {
        assert!(std::env::var("VEIL_REQUIRE_MODEL").as_deref() != Ok("1"), "veil is not built next to veil-shard");
        veil_tests::skip("veil is not built next to veil-shard");
        return;
    }
    let listen = cluster::free_port();
    let out = c.dir.join("proxy.out");
    let mut proxy = std::process::Command::new(&veil)
        .args(["proxy", &format!("http://{host}"), "--listen", &listen.to_string(), "--policy"])
        .arg(&c.route.policy)
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(c.dir.join("proxy.err")).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&out).unwrap_or_default().contains("listening on") {
        assert!(Instant::now() < deadline, "proxy did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let body = |stream: bool| {
        serde_json::json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8,
            "temperature": 0, "stream": stream})
        .to_string()
    };
    let client =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http::<Full<Bytes>>();
    rt.block_on(async {
        let req = |stream: bool| {
            hyper::Request::post(format!("http://{listen}/v1/chat/completions"))
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body(stream))))
                .unwrap()
        };
        // Complete: a 502 whose body is an OpenAI-shaped error.
        let resp = client.request(req(false)).await.unwrap();
        assert_eq!(resp.status(), 502);
        let v: serde_json::Value =
            serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
        assert!(v["error"]["message"].as_str().unwrap().contains("did not open"), "{v}");
        // Streamed: the authentic events, an error event, then the body fails
        // (no ordinary end of stream).
        let resp = client.request(req(true)).await.unwrap();
        assert_eq!(resp.status(), 200);
        let mut body = resp.into_body();
        let mut seen = Vec::new();
        let end = loop {
            match body.frame().await {
                Some(Ok(f)) => seen.extend(f.into_data().unwrap_or_default()),
                Some(Err(e)) => break Err(e.to_string()),
                None => break Ok(()),
            }
        };
        let text = String::from_utf8_lossy(&seen);
        assert!(end.is_err(), "the cut stream ended normally:\n{text}");
        assert!(text.contains("did not open"), "no error event:\n{text}");
    });
    let have = std::process::Command::new("python3").args(["-c", "import openai"]).status().is_ok_and(|s| s.success());
    if have {
        let script = format!(
            r#"
import openai, sys
c = openai.OpenAI(base_url="http://{listen}/v1", api_key="unused", max_retries=0)
model = "SmolLM2-135M-Instruct.Q4_1"
for stream in (False, True):
    try:
        r = c.chat.completions.create(model=model, messages=[{{"role": "user", "content": "Hello"}}], max_tokens=8, temperature=0, stream=stream)
        if stream:
            for _ in r:
                pass
    except Exception as e:
        print("raised", stream, type(e).__name__)
        continue
    print("silent", stream)
    sys.exit(1)
"#
        );
        let run = std::process::Command::new("python3").args(["-c", &script]).output().unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
        assert!(run.status.success(), "the openai client did not raise:\n{said}");
        assert_eq!(said.matches("raised").count(), 2, "{said}");
    } else {
        assert!(std::env::var("VEIL_REQUIRE_OPENAI").as_deref() != Ok("1"), "VEIL_REQUIRE_OPENAI=1 but no openai");
        veil_tests::skip("the openai Python package is not installed");
    }
    let _ = proxy.kill();
    let _ = proxy.wait();
}
