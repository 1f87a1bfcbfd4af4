//! The sharded pipeline: route configuration, the stage worker that batches
//! every session's frames into one forward, shard and entry servers.

// The session cores: no unwrap or expect outside tests (a panic here would drop sessions).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod entry;
pub mod local;
pub mod net;
pub mod route;
pub mod sessions;
pub mod shard;
pub mod worker;
