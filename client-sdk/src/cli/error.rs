//! Why a `veil` command could not do its work, sorted by who is to blame.
//! Each variant's `Display` is the text the command prints after its
//! `veil <command>: ` prefix (scripts and tests read it).

use std::path::PathBuf;

/// Any error, boxed: what another crate's step failed with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a command failed before (or instead of) its verdict.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CliError {
    /// Our caller's mistake: flags that do not fit together, or a value
    /// the command cannot use (the message says which).
    #[error("{0}")]
    Usage(String),
    /// A flag's value does not parse.
    #[error("{flag}: {source}")]
    BadFlag {
        /// The flag, as typed (`--seed`).
        flag: &'static str,
        /// Why.
        source: BoxError,
    },
    /// An unknown SEV-SNP product name.
    #[error(transparent)]
    Product(#[from] UnknownProduct),
    /// A file's contents do not parse, or are refused (a bad signature,
    /// an invalid policy, a rolled-back bundle).
    #[error("{}: {source}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// Why.
        source: BoxError,
    },
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file or directory could not be written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A step of another crate failed; its message is shown as is.
    #[error(transparent)]
    Failed(BoxError),
}

impl CliError {
    /// `map_err` adapter: `flag`'s value does not parse.
    pub fn flag<E: Into<BoxError>>(flag: &'static str) -> impl FnOnce(E) -> Self {
        move |e| Self::BadFlag { flag, source: e.into() }
    }

    /// `map_err` adapter: the file at `path` is malformed or refused.
    pub fn malformed<E: Into<BoxError>>(path: impl Into<PathBuf>) -> impl FnOnce(E) -> Self {
        let path = path.into();
        move |e| Self::Malformed { path, source: e.into() }
    }

    /// `map_err` adapter: the file at `path` cannot be read.
    pub fn read(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Read { path, source }
    }

    /// `map_err` adapter: the file or directory at `path` cannot be written.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { path, source }
    }

    /// Another crate's step failed.
    pub fn failed<E: Into<BoxError>>(e: E) -> Self {
        Self::Failed(e.into())
    }
}

/// A product name other than Milan, Genoa or Turin (the caller is to blame).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown product {name:?} (Milan, Genoa, Turin)")]
#[non_exhaustive]
pub struct UnknownProduct {
    /// The name given.
    pub name: String,
}
