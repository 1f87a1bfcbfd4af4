//! Honest load and an abusive client against one cluster behind the host
//! relay, shared by the abuse test and the abuse benchmark.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use veil_client::sdk::Client;

/// What the honest clients saw.
#[derive(Debug, Default)]
pub struct Honest {
    /// Latency of every completed request, ms.
    pub latencies_ms: Vec<f64>,
    /// Every failure, as text.
    pub failures: Vec<String>,
}

impl Honest {
    /// The `q` quantile of the latencies (0..=1), ms.
    pub fn quantile(&self, q: f64) -> f64 {
        let mut v = self.latencies_ms.clone();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return f64::NAN;
        }
        v[((v.len() - 1) as f64 * q).round() as usize]
    }
}

/// `sessions` concurrent clients, each sending `per_session` sealed chat
/// requests one after another through the relay at `url`.
pub async fn honest_load(client: Arc<Client>, sessions: usize, per_session: usize, max_tokens: usize) -> Honest {
    let mut tasks = Vec::new();
    for s in 0..sessions {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut out = Honest::default();
            for r in 0..per_session {
                let body = serde_json::json!({
                    "messages": [{"role": "user", "content": format!("Session {s}, question {r}: name a colour.")}],
                    "max_tokens": max_tokens, "temperature": 0,
                });
                let start = Instant::now();
                let result = async {
                    let resp = client.call("POST", "/v1/chat/completions", &body).await?;
                    let status = resp.status;
                    let bytes = resp.collect().await?;
                    Ok::<_, veil_client::sdk::ClientError>((status, bytes))
                }
                .await;
                match result {
                    Ok((200, bytes)) => {
                        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
                        if v["choices"][0]["message"]["content"].is_string() {
                            out.latencies_ms.push(start.elapsed().as_secs_f64() * 1000.0);
                        } else {
                            out.failures.push(format!("session {s} request {r}: {v}"));
                        }
                    }
                    Ok((status, bytes)) => out
                        .failures
                        .push(format!("session {s} request {r}: {status} {}", String::from_utf8_lossy(&bytes))),
                    Err(e) => out.failures.push(format!("session {s} request {r}: {e}")),
                }
            }
            out
        }));
    }
    let mut all = Honest::default();
    for t in tasks {
        let h = t.await.unwrap();
        all.latencies_ms.extend(h.latencies_ms);
        all.failures.extend(h.failures);
    }
    all
}

/// What the abuser managed (counts of each attack sent).
#[derive(Debug, Default)]
pub struct Abuse {
    /// Requests with too many messages.
    pub many_messages: AtomicUsize,
    /// Requests asking for an absurd max_tokens.
    pub huge_max_tokens: AtomicUsize,
    /// Tiny requests (one token each).
    pub tiny: AtomicUsize,
    /// Slow-loris connections opened.
    pub slow_loris: AtomicUsize,
    /// Attestation documents requested.
    pub attestations: AtomicUsize,
    /// Non-streamed requests relayed and then abandoned.
    pub abandoned: AtomicUsize,
    /// Refusals it got (4xx/5xx), all fine.
    pub refused: AtomicUsize,
}

/// The least time between two attestation requests of one flooding
/// connection after a refusal: a network round trip.
const FLOOD_RTT: Duration = Duration::from_millis(50);

/// The abuser's own address on loopback: the relay tells clients apart by
/// address, so the honest clients (127.0.0.1) and the abuser must not share one.
pub const ABUSER_IP: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

/// A TCP connection to `to` from [`ABUSER_IP`].
pub async fn connect_as_abuser(to: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(ABUSER_IP, 0))?;
    socket.connect(to).await
}

/// The abuser's SDK client (it verifies the route like anyone, from
/// [`ABUSER_IP`]); it never retries, so each refusal it meets is counted.
pub async fn abuser_client(url: &str, policy: &veil_attestation::Policy) -> Client {
    let options = veil_client::sdk::ConnectOptions {
        local_address: Some(ABUSER_IP),
        retries: veil_client::sdk::Retries::NONE,
        ..Default::default()
    };
    Client::connect_with(url, policy, &options).await.unwrap()
}

/// `n` valid sealed, non-streamed requests asking for `max_tokens` 2000,
/// sent from [`ABUSER_IP`], each read up to the relay's answer head. Returns
/// the relay's statuses and the open connections: dropping them is the
/// client walking away.
pub async fn abandon(client: &Client, relay: SocketAddr, n: usize) -> (Vec<u16>, Vec<tokio::net::TcpStream>) {
    use tokio::io::AsyncReadExt;
    let mut conns = Vec::new();
    let mut statuses = Vec::new();
    for i in 0..n {
        let body = serde_json::json!({
            "messages": [{"role": "user", "content": format!("Count from {i} to 100000, one number per line.")}],
            "max_tokens": 2000, "temperature": 0,
        });
        let (sealed, _) = super::cluster::seal_chat(client.route(), &body).await;
        let Ok(mut tcp) = connect_as_abuser(relay).await else { continue };
        let head = format!(
            "POST /v1/sealed HTTP/1.1\r\nHost: x\r\nContent-Type: message/ohttp-chunked-req\r\nContent-Length: {}\r\n\r\n",
            sealed.len()
        );
        if tcp.write_all(head.as_bytes()).await.is_err() || tcp.write_all(&sealed).await.is_err() {
            continue;
        }
        let mut buf = [0u8; 12];
        if tcp.read_exact(&mut buf).await.is_ok() {
            statuses.push(std::str::from_utf8(&buf[9..12]).ok().and_then(|s| s.parse().ok()).unwrap_or(0));
        }
        conns.push(tcp);
    }
    (statuses, conns)
}

/// `n` verifications of the route (`Client::connect`, default timeouts),
/// one after another, from the honest address.
pub async fn honest_verifications(url: &str, policy: &veil_attestation::Policy, n: usize) -> Honest {
    let mut out = Honest::default();
    for i in 0..n {
        let start = Instant::now();
        match Client::connect(url, policy).await {
            Ok(_) => out.latencies_ms.push(start.elapsed().as_secs_f64() * 1000.0),
            Err(e) => out.failures.push(format!("verification {i}: {e}")),
        }
    }
    out
}

/// One abusive client from [`ABUSER_IP`], until `stop`: oversized chats,
/// absurd max_tokens, floods of tiny requests, 64 keep-alive clients
/// fetching attestation documents without pause, non-streamed requests it
/// abandons, and slow-loris uploads that trickle a body to the relay.
pub async fn abuser(client: Arc<Client>, relay: SocketAddr, stop: Arc<AtomicBool>, counts: Arc<Abuse>) {
    let flooders: Vec<_> = (0..64)
        .map(|_| {
            let (stop, counts) = (stop.clone(), counts.clone());
            tokio::spawn(async move {
                let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
                connector.set_local_address(Some(ABUSER_IP));
                let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build::<_, http_body_util::Full<bytes::Bytes>>(connector);
                while !stop.load(Ordering::Relaxed) {
                    let uri = format!("http://{relay}/v1/attestation?nonce={}", veil_attestation::Nonce::random());
                    match http.get(uri.parse().unwrap()).await {
                        Ok(r) => {
                            let refused = r.status() != 200;
                            let _ = http_body_util::BodyExt::collect(r.into_body()).await;
                            if refused {
                                counts.refused.fetch_add(1, Ordering::Relaxed);
                                // Asks again at once, as a flooder does — but
                                // a refusal takes a round trip over a real
                                // network, not the 2 cores this test shares
                                // with the relay and the cluster.
                                tokio::time::sleep(FLOOD_RTT).await;
                            }
                        }
                        Err(_) => tokio::time::sleep(FLOOD_RTT).await,
                    }
                    counts.attestations.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let abandoner = {
        let (stop, counts, client) = (stop.clone(), counts.clone(), client.clone());
        tokio::spawn(async move {
            // Twice, 10 s apart: 64 non-streamed max_tokens-2000 requests
            // sent and walked away from (the relay relays its share).
            for _ in 0..2 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let (statuses, conns) = abandon(&client, relay, 64).await;
                drop(conns);
                counts.abandoned.fetch_add(statuses.iter().filter(|s| **s == 200).count(), Ordering::Relaxed);
                counts.refused.fetch_add(statuses.iter().filter(|s| **s != 200).count(), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
        })
    };
    let loris = {
        let (stop, counts) = (stop.clone(), counts.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let mut conns = Vec::new();
                for _ in 0..4 {
                    if let Ok(mut tcp) = connect_as_abuser(relay).await {
                        let head = "POST /v1/sealed HTTP/1.1\r\nHost: x\r\nContent-Type: message/ohttp-chunked-req\r\nContent-Length: 100000\r\n\r\n";
                        let _ = tcp.write_all(head.as_bytes()).await;
                        counts.slow_loris.fetch_add(1, Ordering::Relaxed);
                        conns.push(tcp);
                    }
                }
                for _ in 0..10 {
                    for c in &mut conns {
                        let _ = c.write_all(b"x").await;
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                }
            }
        })
    };
    let refused = |counts: &Abuse, r: Result<veil_client::seal::OpenedResponse, veil_client::sdk::ClientError>| {
        if r.map(|o| o.status != 200).unwrap_or(true) {
            counts.refused.fetch_add(1, Ordering::Relaxed);
        }
    };
    while !stop.load(Ordering::Relaxed) {
        // Over the message limit (refused before templating), and at it
        // with a prompt over the context (refused after one linear pass).
        for n in [2000, 1000] {
            let msgs: Vec<serde_json::Value> = (0..n)
                .map(|i| serde_json::json!({"role": "user", "content": format!("message number {i} of many")}))
                .collect();
            let body = serde_json::json!({ "messages": msgs });
            refused(&counts, client.call("POST", "/v1/chat/completions", &body).await);
            counts.many_messages.fetch_add(1, Ordering::Relaxed);
        }
        let huge =
            serde_json::json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1_000_000_000_000u64});
        refused(&counts, client.call("POST", "/v1/chat/completions", &huge).await);
        counts.huge_max_tokens.fetch_add(1, Ordering::Relaxed);
        for _ in 0..10 {
            let tiny = serde_json::json!({"prompt": "a", "max_tokens": 1, "temperature": 0});
            if let Ok(r) = client.call("POST", "/v1/completions", &tiny).await {
                let _ = r.collect().await;
            }
            counts.tiny.fetch_add(1, Ordering::Relaxed);
        }
    }
    loris.abort();
    abandoner.abort();
    for f in flooders {
        let _ = f.await;
    }
}

/// Starts an in-process relay in front of the cluster's gateway; one client
/// address may hold `per_client` sealed slots (the honest sessions all come
/// from 127.0.0.1, so it must cover them; the abuser gets as many).
pub fn relay(rt: &tokio::runtime::Runtime, gateway: SocketAddr, per_client: usize) -> SocketAddr {
    let host = super::cluster::free_port();
    let mut config = veil_host::relay::RelayConfig::new(gateway);
    // Room for the honest sessions and the abuser's uploads together.
    config.max_concurrent = 256;
    config.max_per_client = per_client;
    config.body_timeout = Duration::from_secs(5);
    let relay = veil_host::relay::Relay::new(config);
    let listener = rt.block_on(tokio::net::TcpListener::bind(host)).unwrap();
    rt.spawn(relay.serve(listener));
    host
}
