//! # veil-client
//!
//! The client side of Veil: the SDK a program uses to talk to a route
//! privately, and the `veil` command line built on it (verify, chat, proxy,
//! canary, policies, and the reviewer's `veil attest` tools).
//!
//! ```text
//!  Client::connect_with(url, &Policy)
//!    GET /v1/attestation?nonce=N ──▶ AttestationDoc ──▶ verify_route ──▶ VerifiedRoute
//!  Client::chat / call / complete
//!    bhttp request ──▶ seal(&VerifiedRoute, …) ──POST /v1/sealed──▶ host relay ──▶ entry
//!  OpenedResponse::next ◀── chunks, each authenticated; the end authenticated too
//! ```
//!
//! * [`sdk`]: `Client`, `ConnectOptions` (CA files, per-stage `Timeouts`),
//!   typed `ClientError`s, re-verification after a key rotation.
//! * [`seal`]: the client half of chunked Oblivious HTTP; a request can only
//!   be sealed to a `VerifiedRoute`.
//! * [`report`]: the verified route's check tables and JSON document.
//! * [`cli`]: one module per `veil` subcommand; [`input`] reads evidence files.
//!
//! Without the default feature `net` only [`seal`] and [`report`] build (no
//! sockets, no clock): the WebAssembly client (`client-sdk/wasm`) uses them.

#![warn(missing_docs, unreachable_pub)]

#[cfg(feature = "net")]
pub mod cli;
#[cfg(feature = "net")]
pub mod input;
pub mod report;
#[cfg(feature = "net")]
pub mod sdk;
pub mod seal;
