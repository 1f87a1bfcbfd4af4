//! The WAN shim on loopback: delay, ordering under jitter, rate cap, and
//! close propagation. Timing checks are lower bounds only (the shim must add
//! at least what it promises); no test asserts an upper bound on time.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::timeout;
use veil_host::wan::{LinkShape, WanShim};

const MS: Duration = Duration::from_millis(1);
/// A guard against hangs, far above what any test needs.
const PATIENCE: Duration = Duration::from_secs(20);

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// An echo server: copies each connection back to itself, half-closes after
/// the client's EOF, and reports each EOF (with the bytes echoed) on the channel.
async fn echo_server() -> (SocketAddr, mpsc::UnboundedReceiver<u64>) {
    let listener = TcpListener::bind(loopback()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (eof_tx, eof_rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let eof_tx = eof_tx.clone();
            tokio::spawn(async move {
                let (mut r, mut w) = stream.split();
                if let Ok(n) = tokio::io::copy(&mut r, &mut w).await {
                    let _ = w.shutdown().await;
                    let _ = eof_tx.send(n);
                }
            });
        }
    });
    (addr, eof_rx)
}

/// A sink: reads each connection to its end and reports the byte count and the time it saw EOF.
async fn sink_server() -> (SocketAddr, mpsc::UnboundedReceiver<(usize, Instant)>) {
    let listener = TcpListener::bind(loopback()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let done_tx = done_tx.clone();
            tokio::spawn(async move {
                let mut received = Vec::new();
                if stream.read_to_end(&mut received).await.is_ok() {
                    let _ = done_tx.send((received.len(), Instant::now()));
                }
            });
        }
    });
    (addr, done_rx)
}

/// Deterministic, non-repeating test bytes (xorshift64).
fn pattern(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trip_takes_at_least_twice_the_one_way_delay() {
    let (echo, _) = echo_server().await;
    let shim = WanShim::start(loopback(), echo, LinkShape::IDEAL.with_delay(30 * MS)).await.unwrap();
    let mut client = TcpStream::connect(shim.local_addr()).await.unwrap();
    client.set_nodelay(true).unwrap();

    for _ in 0..3 {
        let started = Instant::now();
        client.write_all(b"ping").await.unwrap();
        let mut reply = [0u8; 4];
        timeout(PATIENCE, client.read_exact(&mut reply)).await.unwrap().unwrap();
        let rtt = started.elapsed();
        assert_eq!(&reply, b"ping");
        assert!(rtt >= 60 * MS, "round trip {rtt:?} is shorter than 2 x 30 ms");
    }
    shim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jittered_transfer_arrives_intact_and_in_order() {
    let (echo, mut echo_eofs) = echo_server().await;
    let shape = LinkShape::IDEAL.with_delay(3 * MS).with_jitter(3 * MS);
    let shim = WanShim::start(loopback(), echo, shape).await.unwrap();
    let sent = pattern(6 * 1024 * 1024 + 12_345);

    let client = TcpStream::connect(shim.local_addr()).await.unwrap();
    let (mut read_half, mut write_half) = client.into_split();
    let to_send = sent.clone();
    let writer = tokio::spawn(async move {
        // Uneven writes, so chunk boundaries differ from the reader's.
        let mut rest = &to_send[..];
        let mut step = 1;
        while !rest.is_empty() {
            let n = rest.len().min(step);
            write_half.write_all(&rest[..n]).await.unwrap();
            rest = &rest[n..];
            step = step * 7 % 200_003 + 1;
        }
        write_half.shutdown().await.unwrap();
    });
    let mut received = Vec::with_capacity(sent.len());
    timeout(PATIENCE, read_half.read_to_end(&mut received)).await.unwrap().unwrap();
    writer.await.unwrap();

    assert_eq!(received.len(), sent.len());
    assert_eq!(fnv1a(&received), fnv1a(&sent), "bytes changed or reordered on the way");
    assert!(received == sent, "bytes changed or reordered on the way");
    let echoed = timeout(PATIENCE, echo_eofs.recv()).await.unwrap().unwrap();
    assert_eq!(echoed, sent.len() as u64);
    shim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_cap_limits_throughput() {
    const BYTES: usize = 1_000_000;
    let (sink, mut done) = sink_server().await;
    // 8 Mbit/s: 1 MB needs 1 s on the link.
    let shim = WanShim::start(loopback(), sink, LinkShape::IDEAL.with_rate_bits_per_s(8_000_000)).await.unwrap();

    let started = Instant::now();
    let mut client = TcpStream::connect(shim.local_addr()).await.unwrap();
    client.write_all(&pattern(BYTES)).await.unwrap();
    client.shutdown().await.unwrap();
    let (received, finished) = timeout(PATIENCE, done.recv()).await.unwrap().unwrap();

    assert_eq!(received, BYTES);
    let took = finished - started;
    assert!(took >= 900 * MS, "1 MB at 8 Mbit/s arrived in {took:?}, under 0.9 s");
    shim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_client_closes_the_upstream_connection() {
    let (echo, mut echo_eofs) = echo_server().await;
    let shim = WanShim::start(loopback(), echo, LinkShape::IDEAL.with_delay(10 * MS)).await.unwrap();

    let mut client = TcpStream::connect(shim.local_addr()).await.unwrap();
    client.write_all(b"hello").await.unwrap();
    let mut reply = [0u8; 5];
    timeout(PATIENCE, client.read_exact(&mut reply)).await.unwrap().unwrap();
    assert_eq!(&reply, b"hello");
    drop(client);

    let echoed = timeout(PATIENCE, echo_eofs.recv()).await.expect("the echo server never saw EOF").unwrap();
    assert_eq!(echoed, 5);
    shim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_the_listener_and_open_connections() {
    let (echo, _) = echo_server().await;
    let shim = WanShim::start(loopback(), echo, LinkShape::IDEAL).await.unwrap();
    let addr = shim.local_addr();

    let mut client = TcpStream::connect(addr).await.unwrap();
    client.write_all(b"x").await.unwrap();
    let mut reply = [0u8; 1];
    timeout(PATIENCE, client.read_exact(&mut reply)).await.unwrap().unwrap();

    shim.shutdown().await;
    // The relayed connection is gone: the client reads EOF (or a reset).
    let mut rest = Vec::new();
    let read = timeout(PATIENCE, client.read_to_end(&mut rest)).await.unwrap();
    assert!(read.is_err() || rest.is_empty());
    assert!(TcpStream::connect(addr).await.is_err(), "the shim still accepts after shutdown");
}

#[tokio::test]
async fn rejects_a_zero_rate() {
    let err = WanShim::start(loopback(), loopback(), LinkShape::IDEAL.with_rate_bits_per_s(0)).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
}
