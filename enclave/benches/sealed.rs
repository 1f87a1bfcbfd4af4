//! What sealing costs: time to first token and inter-token latency of a
//! streamed chat through host relay → entry gateway (sealed, 3 shards on
//! loopback), by the SDK and by a plain HTTP client through `veil proxy`,
//! next to the same generation on the entry's internal plaintext endpoint,
//! measured in the same run; and the seal's own cost per request and per
//! chunk, in process (a receipt's cost: `cargo bench -p veil-tests --bench trust`).
//!
//! `cargo bench -p veil-enclave --bench sealed` (needs `scripts/fetch-model.sh`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

#[path = "../tests/support/cluster.rs"]
mod cluster;

use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use cluster::{free_port, greedy, model_path, Cluster};
use veil_enclave::gateway::seal::SealKey;
use veil_enclave::pipeline::entry::GenerateEvent;

const QUESTION: &str = "Write a short story about a lighthouse keeper.";
const TOKENS: usize = 64;
const RUNS: usize = 5;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// (time to first piece, mean gap between pieces) in ms over a stream of arrival times.
fn latencies(start: Instant, arrivals: &[Instant]) -> (f64, f64) {
    let ttft = (arrivals[0] - start).as_secs_f64() * 1000.0;
    let gaps: Vec<f64> = arrivals.windows(2).map(|w| (w[1] - w[0]).as_secs_f64() * 1000.0).collect();
    (ttft, gaps.iter().sum::<f64>() / gaps.len().max(1) as f64)
}

/// Takes every sealed chunk produced so far and opens the response whole.
async fn open_all(opener: veil_client::seal::ResponseOpener, out: &mut tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>) {
    let mut bytes = Vec::new();
    while let Ok(b) = out.try_recv() {
        bytes.extend(b);
    }
    let resp = opener.open(Box::pin(futures::io::Cursor::new(bytes))).await.unwrap();
    resp.collect().await.unwrap();
}

fn main() {
    let Some(path) = model_path() else { return };
    let mut c = Cluster::new("sealedbench", &path, &[10, 20], &[1, 1, 1]);
    c.start_all();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let host = free_port();
    let relay = veil_host::relay::Relay::new(veil_host::relay::RelayConfig::new(c.route.sealed_listen.unwrap()));
    let listener = rt.block_on(tokio::net::TcpListener::bind(host)).unwrap();
    rt.spawn(relay.serve(listener));
    let policy = veil_enclave::pipeline::shard::load_policy(&c.route.policy).unwrap();

    // Plaintext reference: the entry's internal endpoint, same prompt and tokens.
    let plain = |c: &Cluster| -> (f64, f64) {
        let mut req = greedy(&[], TOKENS);
        (req.prompt, req.prompt_ids, req.chat) = (Some(QUESTION.into()), None, true);
        let start = Instant::now();
        let mut tcp = std::net::TcpStream::connect(c.route.generate_listen).unwrap();
        tcp.write_all(format!("{}\n", serde_json::to_string(&req).unwrap()).as_bytes()).unwrap();
        let mut arrivals = Vec::new();
        for line in std::io::BufReader::new(tcp).lines() {
            match serde_json::from_str::<GenerateEvent>(&line.unwrap()).unwrap() {
                GenerateEvent::Text(_) => arrivals.push(Instant::now()),
                _ => break,
            }
        }
        latencies(start, &arrivals)
    };
    let sealed = |client: &veil_client::sdk::Client| -> (f64, f64) {
        let body = serde_json::json!({
            "messages": [{"role": "user", "content": QUESTION}], "max_tokens": TOKENS, "temperature": 0, "stream": true
        });
        rt.block_on(async {
            let start = Instant::now();
            let mut resp = client.call("POST", "/v1/chat/completions", &body).await.unwrap();
            let mut arrivals = Vec::new();
            while let Some(p) = resp.next().await.unwrap() {
                if String::from_utf8_lossy(&p).contains("\"content\"") {
                    arrivals.push(Instant::now());
                }
            }
            latencies(start, &arrivals)
        })
    };
    // `veil proxy` in front of the host, driven by a plain HTTP/1.1 client
    // reading the server-sent events line by line.
    let proxy_listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let proxy_addr = proxy_listener.local_addr().unwrap();
    rt.spawn(veil_client::cli::proxy::serve_on(
        proxy_listener,
        format!("http://{host}"),
        policy.clone(),
        veil_client::sdk::ConnectOptions::default(),
        None,
    ));
    let proxied = || -> (f64, f64) {
        let body = serde_json::json!({
            "messages": [{"role": "user", "content": QUESTION}], "max_tokens": TOKENS, "temperature": 0, "stream": true
        })
        .to_string();
        let start = Instant::now();
        let mut tcp = loop {
            match std::net::TcpStream::connect(proxy_addr) {
                Ok(t) => break t,
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: {proxy_addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        tcp.write_all(format!("{head}{body}").as_bytes()).unwrap();
        let mut arrivals = Vec::new();
        for line in std::io::BufReader::new(tcp).lines() {
            let line = line.unwrap();
            if line.starts_with("data:") && line.contains("\"content\"") {
                arrivals.push(Instant::now());
            }
        }
        latencies(start, &arrivals)
    };
    let client = rt.block_on(veil_client::sdk::Client::connect(&format!("http://{host}"), &policy)).unwrap();
    plain(&c);
    sealed(&client);
    proxied();
    let (mut p_ttft, mut p_itl, mut s_ttft, mut s_itl, mut x_ttft, mut x_itl) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..RUNS {
        let (t, i) = plain(&c);
        p_ttft.push(t);
        p_itl.push(i);
        let (t, i) = sealed(&client);
        s_ttft.push(t);
        s_itl.push(i);
        let (t, i) = proxied();
        x_ttft.push(t);
        x_itl.push(i);
    }
    let (pt, pi, st, si) = (median(p_ttft), median(p_itl), median(s_ttft), median(s_itl));
    let (xt, xi) = (median(x_ttft), median(x_itl));

    // The seal alone, in process: per request (seal, open, head, finish, open
    // the response) and per chunk (seal a ~100-byte event, open it).
    let key = SealKey::generate(1).unwrap();
    let (per_request, per_chunk) = rt.block_on(async {
        let message = || {
            let mut m = bhttp::Message::request(
                b"POST".to_vec(),
                b"https".to_vec(),
                b"e".to_vec(),
                b"/v1/chat/completions".to_vec(),
            );
            m.write_content(br#"{"messages":[{"role":"user","content":"hello"}]}"#);
            m
        };
        let n = 200;
        let t = Instant::now();
        for _ in 0..n {
            let (sealed, opener) = veil_client::seal::seal_unverified(key.config(), message()).await.unwrap();
            let mut opened = key.open(sealed).await.unwrap();
            let mut out = opened.response.take_output().unwrap();
            opened.response.head(200, &[("content-type", "application/json")]).await.unwrap();
            opened.response.body(b"{}").await.unwrap();
            opened.response.finish().await.unwrap();
            open_all(opener, &mut out).await;
        }
        let per_request = t.elapsed() / n;
        let chunks = 2000u32;
        let (sealed, opener) = veil_client::seal::seal_unverified(key.config(), message()).await.unwrap();
        let mut opened = key.open(sealed).await.unwrap();
        let mut out = opened.response.take_output().unwrap();
        opened.response.head(200, &[]).await.unwrap();
        let event = vec![b'x'; 100];
        let t = Instant::now();
        for _ in 0..chunks {
            opened.response.body(&event).await.unwrap();
        }
        opened.response.finish().await.unwrap();
        open_all(opener, &mut out).await;
        (per_request, t.elapsed() / chunks)
    });
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!("\nSmolLM2-135M-Instruct Q4_1, 3 shards on loopback, streamed chat of {TOKENS} tokens, median of {RUNS}");
    println!("{:<48} {:>12} {:>14} {:>10}", "", "sealed", "plaintext ref", "added");
    println!("{:<48} {:>10.2}ms {:>12.2}ms {:>8.2}ms", "time to first token (client → host → entry)", st, pt, st - pt);
    println!("{:<48} {:>10.2}ms {:>12.2}ms {:>8.2}ms", "inter-token latency", si, pi, si - pi);
    println!(
        "{:<48} {:>10.2}ms {:>12.2}ms {:>8.2}ms",
        "time to first token (veil proxy → host → entry)",
        xt,
        pt,
        xt - pt
    );
    println!("{:<48} {:>10.2}ms {:>12.2}ms {:>8.2}ms", "inter-token latency (veil proxy)", xi, pi, xi - pi);
    println!("{:<48} {:>10.1}µs", "seal cost per request (both ends, in process)", ms(per_request) * 1000.0);
    println!("{:<48} {:>10.1}µs", "seal cost per chunk (both ends, in process)", ms(per_chunk) * 1000.0);
}
