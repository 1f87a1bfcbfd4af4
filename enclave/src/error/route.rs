//! Why a route file is unusable (returned by [`crate::pipeline::route`]): a
//! leaf, it imports nothing from this crate.

use std::path::PathBuf;

/// Why a route file is unusable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RouteError {
    /// The file could not be read.
    #[error("cannot read route {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Not valid TOML for a route.
    #[error("route {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// Parsed, but inconsistent.
    #[error("route: {0}")]
    Invalid(String),
}
