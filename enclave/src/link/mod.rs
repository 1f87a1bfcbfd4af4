//! The link protocol between shards: frames and their codec
//! ([`frame`]), per-link state ([`state`]), and the tokio transport over
//! mutually attested TLS (this module).

// The session cores: no unwrap or expect outside tests (a panic here would drop sessions).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod frame;
pub mod state;

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use frame::{Frame, FrameDecoder, FrameError, Hello};
use state::{LinkState, PeerRequirement, Side, Violation};

/// Frames queued towards one peer before senders wait (backpressure).
pub const SEND_QUEUE: usize = 256;
/// How long the opening hello may take.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a link ended.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LinkFailure {
    /// The connection failed or closed mid-frame.
    #[error("link I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The peer sent bytes that are not a frame.
    #[error("bad frame from peer: {0}")]
    Frame(#[from] FrameError),
    /// The peer broke the protocol.
    #[error("protocol violation: {0}")]
    Violation(#[from] Violation),
    /// The peer said nothing in time.
    #[error("peer timed out")]
    Timeout,
}

/// The receiving half of a link: decodes frames and checks the protocol.
#[derive(Debug)]
pub struct LinkReader<R> {
    io: R,
    decoder: FrameDecoder,
    state: LinkState,
    buf: Vec<u8>,
}

impl<R: AsyncRead + Unpin> LinkReader<R> {
    /// Wraps a reader; frames over `max_frame` bytes end the link.
    pub fn new(io: R, side: Side, require: PeerRequirement, max_frame: usize) -> Self {
        Self { io, decoder: FrameDecoder::new(max_frame), state: LinkState::new(side, require), buf: vec![0; 64 << 10] }
    }

    /// The next frame; `Ok(None)` on a clean close between frames.
    pub async fn next(&mut self) -> Result<Option<Frame>, LinkFailure> {
        loop {
            if let Some(frame) = self.decoder.next_frame()? {
                self.state.on_receive(&frame)?;
                return Ok(Some(frame));
            }
            let n = self.io.read(&mut self.buf).await?;
            if n == 0 {
                return if self.decoder.wanted() == 4 {
                    Ok(None)
                } else {
                    Err(LinkFailure::Io(std::io::ErrorKind::UnexpectedEof.into()))
                };
            }
            self.decoder.push(&self.buf[..n]);
        }
    }

    /// The peer's hello, once received.
    pub fn peer(&self) -> Option<&Hello> {
        self.state.peer()
    }
}

/// Writes every frame from `rx` to `io` until the channel closes or a write fails.
pub async fn write_loop<W: AsyncWrite + Unpin>(mut io: W, mut rx: mpsc::Receiver<Frame>) -> std::io::Result<()> {
    while let Some(frame) = rx.recv().await {
        io.write_all(&frame.encode()).await?;
        // Coalesce what is already queued into one flush.
        while let Ok(more) = rx.try_recv() {
            io.write_all(&more.encode()).await?;
        }
        io.flush().await?;
    }
    io.shutdown().await
}

/// Opens a link over an established (attested) stream: the dialer sends
/// its hello first, the acceptor answers with the role the dialer declared;
/// each checks the other's. Starts the writer task and returns the sender
/// for outgoing frames, the reader for incoming ones, and the peer's hello.
pub async fn open<S>(
    stream: S,
    side: Side,
    ours: Hello,
    require: PeerRequirement,
    max_frame: usize,
) -> Result<(mpsc::Sender<Frame>, LinkReader<tokio::io::ReadHalf<S>>, Hello), LinkFailure>
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (r, w) = tokio::io::split(stream);
    let (tx, rx) = mpsc::channel(SEND_QUEUE);
    tokio::spawn(async move {
        if let Err(e) = write_loop(w, rx).await {
            tracing::debug!(error = %e, "link writer stopped");
        }
    });
    let closed = || LinkFailure::Io(std::io::ErrorKind::BrokenPipe.into());
    if side == Side::Dialer {
        tx.send(Frame::Hello(ours.clone())).await.map_err(|_| closed())?;
    }
    let mut reader = LinkReader::new(r, side, require, max_frame);
    let hello = match tokio::time::timeout(HELLO_TIMEOUT, reader.next()).await {
        Err(_) => return Err(LinkFailure::Timeout),
        Ok(Ok(Some(Frame::Hello(h)))) => h,
        Ok(Ok(Some(other))) => return Err(Violation::Hello(other.name()).into()),
        Ok(Ok(None)) => return Err(LinkFailure::Io(std::io::ErrorKind::UnexpectedEof.into())),
        Ok(Err(e)) => return Err(e),
    };
    if side == Side::Acceptor {
        tx.send(Frame::Hello(Hello { role: hello.role, ..ours })).await.map_err(|_| closed())?;
    }
    Ok((tx, reader, hello))
}
