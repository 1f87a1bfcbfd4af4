//! Why the sealed-request gateway refused a request (returned by
//! [`crate::gateway::seal`]): a leaf, it imports nothing from this crate.

/// Why the gateway refused a sealed request or could not seal its
/// response (the client's side of the same exchange is
/// `veil_client::seal::SealError`). None of these reveal anything about
/// the plaintext.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatewaySealError {
    /// Larger than [`MAX_SEALED_REQUEST`](super::seal::MAX_SEALED_REQUEST).
    #[error("sealed request of {0} bytes exceeds the limit")]
    TooLarge(usize),
    /// Not an encapsulated request for this key (key id, algorithms, length).
    #[error("not a sealed request for this key: {0}")]
    WrongKey(String),
    /// The same encapsulated key was seen before.
    #[error("replayed sealed request")]
    Replay,
    /// The sealed timestamp is missing or outside the window (a replay of an
    /// old request, or a client clock off by more than the skew).
    #[error("sealed request timestamp refused: {0}")]
    Stale(String),
    /// The replay window is full: try again shortly.
    #[error("too many sealed requests in the replay window; retry shortly")]
    Busy,
    /// Decryption or framing failed (tampered or truncated).
    #[error("sealed request does not open: {0}")]
    Open(String),
    /// The request inside is not Binary HTTP.
    #[error("sealed request holds no valid binary HTTP message: {0}")]
    Message(String),
    /// Writing the response failed (the client went away).
    #[error("response could not be sealed: {0}")]
    Response(String),
}
