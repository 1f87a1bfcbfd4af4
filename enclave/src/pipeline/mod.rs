//! The sharded pipeline: route configuration, the stage worker that batches
//! every session's frames into one forward, shard and entry servers.

pub mod entry;
pub mod local;
pub mod net;
pub mod route;
pub mod sessions;
pub mod shard;
pub mod worker;
