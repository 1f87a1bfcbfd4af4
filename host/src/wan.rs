//! A userspace WAN link shim: a TCP relay that adds one-way delay, jitter and
//! a bandwidth cap between two loopback endpoints.
//!
//! The machines Veil is benchmarked on have no `netem`, so shard-to-shard
//! latency is simulated here instead. Each accepted connection opens one
//! connection to the target, and each direction is shaped on its own:
//!
//! ```text
//!  peer ──read──▶ reader ──(release_at, bytes)──▶ bounded queue ──▶ writer ──sleep_until, write──▶ other peer
//!                   │                                                  │
//!                   └── ReleaseSchedule: serialise at the rate,        └── zero-length chunk = FIN:
//!                       add delay ± jitter, never before the               shut down the write half
//!                       previous chunk's release (no reordering)
//! ```
//!
//! The reader timestamps every chunk it reads (at most [`MAX_CHUNK_BYTES`])
//! and asks the schedule when the chunk may leave; the writer sleeps until
//! then and writes it. The queue holds at most [`MAX_IN_FLIGHT_BYTES`] per
//! direction, so a slow receiver pushes back on the sender as TCP would.
//!
//! End of stream is relayed as a half-close after the same delay as data. An
//! I/O error on either side ends the whole relayed connection: both sockets
//! are dropped, which closes the other peer's connection too.
//!
//! Only sizes and addresses are logged, never payload bytes.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, Semaphore, SemaphorePermit};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tracing::{debug, info_span, warn, Instrument};

/// The largest chunk the reader takes from a socket in one read.
pub const MAX_CHUNK_BYTES: usize = 64 * 1024;

/// Bytes read but not yet written, per direction of one connection. When the
/// queue is full the shim stops reading, and TCP flow control slows the sender.
pub const MAX_IN_FLIGHT_BYTES: usize = 32 * 1024 * 1024;

/// Chunks queued per direction (bounds the queue when chunks are small).
const MAX_IN_FLIGHT_CHUNKS: usize = 8192;

/// The shape of a simulated link, applied to each direction on its own.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkShape {
    /// One-way propagation delay added to every chunk.
    pub delay: Duration,
    /// Each chunk's delay is drawn uniformly from `delay ± jitter` (never
    /// below zero). Chunks are never reordered: a chunk whose draw would
    /// overtake the previous one leaves together with it, so the observed
    /// delay is skewed towards `delay + jitter` for back-to-back chunks.
    pub jitter: Duration,
    /// Bandwidth cap in bits per second; `None` for unlimited. A chunk of `b`
    /// bytes occupies the link for `b * 8 / rate` seconds, one chunk at a time.
    /// `Some(0)` is rejected by [`WanShim::start`].
    pub rate_bits_per_s: Option<u64>,
}

impl LinkShape {
    /// No delay, no jitter, no bandwidth cap: a plain relay.
    pub const IDEAL: LinkShape = LinkShape { delay: Duration::ZERO, jitter: Duration::ZERO, rate_bits_per_s: None };

    /// The same link with the given one-way delay.
    pub const fn with_delay(self, delay: Duration) -> Self {
        LinkShape { delay, ..self }
    }

    /// The same link with `± jitter` on each chunk's delay.
    pub const fn with_jitter(self, jitter: Duration) -> Self {
        LinkShape { jitter, ..self }
    }

    /// The same link capped at `rate_bits_per_s`.
    pub const fn with_rate_bits_per_s(self, rate_bits_per_s: u64) -> Self {
        LinkShape { rate_bits_per_s: Some(rate_bits_per_s), ..self }
    }

    /// How long `bytes` occupy the link at the capped rate (zero if uncapped).
    fn transmit_time(&self, bytes: usize) -> Duration {
        match self.rate_bits_per_s {
            None | Some(0) => Duration::ZERO,
            Some(rate) => {
                let nanos = (bytes as u128 * 8 * 1_000_000_000).div_ceil(u128::from(rate));
                Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
            }
        }
    }

    fn check(&self) -> io::Result<()> {
        if self.rate_bits_per_s == Some(0) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "link rate must be above 0 bit/s"));
        }
        Ok(())
    }
}

impl Default for LinkShape {
    fn default() -> Self {
        Self::IDEAL
    }
}

/// A running shim. Dropping it, or calling [`WanShim::shutdown`], stops it:
/// the listener closes and every relayed connection is dropped.
#[derive(Debug)]
pub struct WanShim {
    local_addr: SocketAddr,
    /// Dropping the sender (with the shim) tells the accept loop to stop.
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl WanShim {
    /// Binds `listen` (port 0 picks a free port) and relays every accepted
    /// connection to `target` through a link of the given `shape`.
    ///
    /// Must be called within a tokio runtime with time and I/O enabled.
    pub async fn start(listen: SocketAddr, target: SocketAddr, shape: LinkShape) -> io::Result<WanShim> {
        shape.check()?;
        let listener = TcpListener::bind(listen).await?;
        let local_addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(
            accept_loop(listener, target, shape, stopped)
                .instrument(info_span!("wan_shim", listen = %local_addr, %target)),
        );
        Ok(WanShim { local_addr, stop: Some(stop), task })
    }

    /// The address the shim listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting, drops every relayed connection, and returns once the
    /// listener is closed and the connection tasks have ended.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            // The accept loop may already have ended (it panicked); nothing to tell it then.
            let _ = stop.send(());
        }
        if let Err(e) = (&mut self.task).await {
            warn!(error = %e, "wan shim accept loop did not end cleanly");
        }
    }
}

async fn accept_loop(listener: TcpListener, target: SocketAddr, shape: LinkShape, mut stopped: oneshot::Receiver<()>) {
    let mut connections = JoinSet::new();
    let mut next_id: u64 = 0;
    loop {
        tokio::select! {
            // A message or a dropped sender both mean stop.
            _ = &mut stopped => break,
            (client, peer) = veil_wire::net::accept(&listener) => {
                next_id += 1;
                let span = info_span!("conn", id = next_id, %peer);
                connections.spawn(relay(client, target, shape, fresh_seed()).instrument(span));
            }
            Some(joined) = connections.join_next(), if !connections.is_empty() => {
                if let Err(e) = joined {
                    warn!(error = %e, "relay task failed");
                }
            }
        }
    }
    drop(listener);
    connections.shutdown().await;
    debug!("wan shim stopped");
}

/// Relays one accepted connection until both directions have closed or
/// either side fails; logs the outcome.
async fn relay(mut client: TcpStream, target: SocketAddr, shape: LinkShape, seed: u64) {
    let mut upstream = match TcpStream::connect(target).await {
        Ok(upstream) => upstream,
        Err(e) => {
            warn!(error = %e, "cannot connect to target; dropping the client");
            return;
        }
    };
    // The shim decides when bytes leave; Nagle's algorithm would add its own delay.
    for stream in [&client, &upstream] {
        if let Err(e) = stream.set_nodelay(true) {
            debug!(error = %e, "cannot set TCP_NODELAY");
        }
    }
    debug!("relaying");
    let (client_read, client_write) = client.split();
    let (upstream_read, upstream_write) = upstream.split();
    let outcome = tokio::try_join!(
        pump(client_read, upstream_write, ReleaseSchedule::new(shape, seed)),
        pump(upstream_read, client_write, ReleaseSchedule::new(shape, seed ^ 0x5DEE_CE66_D1CE_5EED)),
    );
    match outcome {
        Ok((to_target, to_client)) => debug!(bytes_to_target = to_target, bytes_to_client = to_client, "closed"),
        Err(e) if is_disconnect(&e) => debug!(error = %e, "peer disconnected; closing both sides"),
        Err(e) => warn!(error = %e, "relay failed; closing both sides"),
    }
}

fn is_disconnect(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::NotConnected
            | io::ErrorKind::UnexpectedEof
    )
}

/// A chunk on its way through one direction. An empty chunk is end of stream.
struct Chunk<'a> {
    release_at: Instant,
    bytes: Vec<u8>,
    /// This chunk's share of the in-flight byte budget, returned when it is written.
    _budget: Option<SemaphorePermit<'a>>,
}

/// Shapes one direction: reads `from`, writes `to` on schedule, and shuts
/// down `to`'s write half when `from` ends. Returns the bytes relayed.
async fn pump<R, W>(mut from: R, mut to: W, mut schedule: ReleaseSchedule) -> io::Result<u64>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let budget = Semaphore::new(MAX_IN_FLIGHT_BYTES);
    let (queue, mut queued) = mpsc::channel::<Chunk<'_>>(MAX_IN_FLIGHT_CHUNKS);

    let reader = async {
        let mut buf = vec![0u8; MAX_CHUNK_BYTES];
        loop {
            // Reserve room for a full chunk before reading, so a full queue stops the reads.
            let mut permit = budget
                .acquire_many(MAX_CHUNK_BYTES as u32)
                .await
                .map_err(|_| io::Error::other("in-flight budget closed"))?;
            let n = from.read(&mut buf).await?;
            let release_at = schedule.release_at(Instant::now(), n);
            // Keep only what the chunk uses; the rest goes back to the budget here.
            let chunk = Chunk { release_at, bytes: buf[..n].to_vec(), _budget: permit.split(n) };
            if queue.send(chunk).await.is_err() {
                // The writer has ended, which it does only on an error; try_join reports that one.
                return Ok::<(), io::Error>(());
            }
            if n == 0 {
                return Ok(());
            }
        }
    };

    let writer = async {
        let mut relayed: u64 = 0;
        while let Some(chunk) = queued.recv().await {
            // A past deadline still waits for a timer tick; skip the timer when it is due already.
            if chunk.release_at > Instant::now() {
                tokio::time::sleep_until(chunk.release_at).await;
            }
            if chunk.bytes.is_empty() {
                to.shutdown().await?;
                return Ok::<u64, io::Error>(relayed);
            }
            to.write_all(&chunk.bytes).await?;
            relayed += chunk.bytes.len() as u64;
        }
        // The reader stopped without an end-of-stream chunk: it failed, and try_join reports that.
        Ok(relayed)
    };

    let ((), relayed) = tokio::try_join!(reader, writer)?;
    Ok(relayed)
}

/// When each chunk of one direction may be written: a sans-IO model of a
/// FIFO link, driven by the reader's clock readings.
#[derive(Debug)]
struct ReleaseSchedule {
    shape: LinkShape,
    rng: SplitMix64,
    /// When the link finishes serialising the last chunk (bandwidth cap only).
    link_free_at: Option<Instant>,
    /// The previous chunk's release time; releases never go backwards.
    last_release: Option<Instant>,
}

impl ReleaseSchedule {
    fn new(shape: LinkShape, seed: u64) -> Self {
        ReleaseSchedule { shape, rng: SplitMix64(seed), link_free_at: None, last_release: None }
    }

    /// The release time of a chunk of `len` bytes read at `read_at` (`len` 0
    /// is end of stream, which takes no link time but is delayed like data).
    ///
    /// The chunk starts serialising once the link is free and it has been
    /// read, occupies the link for its transmit time, then arrives after
    /// `delay ± jitter`, but never before the previous chunk.
    fn release_at(&mut self, read_at: Instant, len: usize) -> Instant {
        let start = self.link_free_at.map_or(read_at, |free| free.max(read_at));
        let sent = start + self.shape.transmit_time(len);
        self.link_free_at = Some(sent);
        let arrival = sent + self.one_way_delay();
        let release = self.last_release.map_or(arrival, |last| last.max(arrival));
        self.last_release = Some(release);
        release
    }

    /// `delay ± jitter`, uniform, floored at zero.
    fn one_way_delay(&mut self) -> Duration {
        let LinkShape { delay, jitter, .. } = self.shape;
        if jitter.is_zero() {
            return delay;
        }
        let jitter_nanos = u64::try_from(jitter.as_nanos()).unwrap_or(u64::MAX / 2).min(u64::MAX / 2);
        let draw = self.rng.below(2 * jitter_nanos + 1);
        (delay + Duration::from_nanos(jitter_nanos)).saturating_sub(Duration::from_nanos(draw))
    }
}

/// SplitMix64 (Steele, Lea, Flood 2014): a small, fast generator, plenty for
/// jitter. Not for anything secret.
#[derive(Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (Lemire's multiply-shift; the bias is at most
    /// `bound / 2^64`). `bound` must be non-zero.
    fn below(&mut self, bound: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }
}

/// A seed that differs between connections and between runs.
fn fresh_seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    now ^ COUNTER.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn releases_after_the_delay_without_jitter() {
        let mut schedule = ReleaseSchedule::new(LinkShape::IDEAL.with_delay(30 * MS), 1);
        let t0 = Instant::now();
        for i in 0..100u32 {
            let read_at = t0 + i * MS / 3;
            assert_eq!(schedule.release_at(read_at, 1000), read_at + 30 * MS);
        }
    }

    #[test]
    fn jittered_releases_are_monotone_and_within_bounds() {
        let shape = LinkShape::IDEAL.with_delay(10 * MS).with_jitter(4 * MS);
        let mut schedule = ReleaseSchedule::new(shape, 42);
        let t0 = Instant::now();
        let mut last = t0;
        let mut distinct_delays = std::collections::BTreeSet::new();
        for i in 0..10_000u32 {
            // Reads arrive in bursts and gaps, so some draws would overtake.
            let read_at = t0 + (i / 7) * MS;
            let release = schedule.release_at(read_at, 100);
            assert!(release >= last, "chunk {i} released before its predecessor");
            assert!(release >= read_at + 6 * MS, "chunk {i} released before delay - jitter");
            assert!(release <= read_at + 14 * MS, "chunk {i} released after delay + jitter");
            distinct_delays.insert(release - read_at);
            last = release;
        }
        assert!(distinct_delays.len() > 100, "jitter does not vary: {} distinct delays", distinct_delays.len());
    }

    #[test]
    fn jitter_larger_than_delay_floors_at_zero() {
        let shape = LinkShape::IDEAL.with_delay(MS).with_jitter(5 * MS);
        let mut schedule = ReleaseSchedule::new(shape, 7);
        let t0 = Instant::now();
        let mut last = t0;
        for i in 0..1000u32 {
            let read_at = t0 + i * MS;
            let release = schedule.release_at(read_at, 10);
            assert!(release >= read_at && release >= last);
            last = release;
        }
    }

    #[test]
    fn rate_cap_serialises_chunks() {
        // 8 Mbit/s: 1000 bytes take exactly 1 ms on the link.
        let shape = LinkShape::IDEAL.with_delay(20 * MS).with_rate_bits_per_s(8_000_000);
        let mut schedule = ReleaseSchedule::new(shape, 3);
        let t0 = Instant::now();
        // Ten chunks read at once leave one link-time apart.
        for i in 1..=10u32 {
            assert_eq!(schedule.release_at(t0, 1000), t0 + i * MS + 20 * MS);
        }
        // An idle link starts serialising when the chunk is read.
        let later = t0 + 100 * MS;
        assert_eq!(schedule.release_at(later, 500), later + MS / 2 + 20 * MS);
    }

    #[test]
    fn end_of_stream_is_delayed_like_data_and_not_before_it() {
        let shape = LinkShape::IDEAL.with_delay(5 * MS).with_rate_bits_per_s(8_000);
        let mut schedule = ReleaseSchedule::new(shape, 9);
        let t0 = Instant::now();
        let data = schedule.release_at(t0, 1000); // 1 s on the link
        let fin = schedule.release_at(t0 + MS, 0);
        assert_eq!(data, t0 + 1000 * MS + 5 * MS);
        assert_eq!(fin, data);
    }

    #[test]
    fn transmit_time_rounds_up_and_saturates() {
        assert_eq!(LinkShape::IDEAL.transmit_time(1 << 20), Duration::ZERO);
        assert_eq!(LinkShape::IDEAL.with_rate_bits_per_s(3).transmit_time(1), Duration::from_nanos(2_666_666_667));
        assert_eq!(LinkShape::IDEAL.with_rate_bits_per_s(1).transmit_time(usize::MAX), Duration::from_nanos(u64::MAX));
    }

    #[test]
    fn rejects_zero_rate() {
        assert_eq!(LinkShape::IDEAL.with_rate_bits_per_s(0).check().unwrap_err().kind(), io::ErrorKind::InvalidInput);
        assert!(LinkShape::IDEAL.check().is_ok());
    }

    #[test]
    fn splitmix_below_stays_in_range() {
        let mut rng = SplitMix64(0);
        assert!((0..10_000).all(|_| rng.below(3) < 3));
        assert_eq!(rng.below(1), 0);
    }
}
