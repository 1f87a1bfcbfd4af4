//! The one accept loop every Veil listener uses (entry gateway, shard data
//! links, loopback endpoint, host relay, WAN shim, `veil proxy`).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

/// First wait after a failed accept; it doubles up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(10);
/// Longest wait between accept attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Accepts the next connection. An accept error (out of file descriptors,
/// say) is logged and retried after a back-off ([`FIRST_BACKOFF`] doubling
/// to [`MAX_BACKOFF`]), so a listener never spins on a persistent error and
/// recovers by itself once the cause goes away. Cancel-safe: dropping the
/// future loses no accepted connection.
pub async fn accept(listener: &TcpListener) -> (TcpStream, SocketAddr) {
    let mut delay = FIRST_BACKOFF;
    loop {
        match listener.accept().await {
            Ok(c) => return c,
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?delay, "accept failed");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_BACKOFF);
            }
        }
    }
}
