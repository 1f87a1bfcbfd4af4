//! Errors of the model side, sorted by who is to blame.

/// Why a model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// A model file could not be opened, read or written (the message
    /// names the file; the cause is in the message, not a `source`, so it
    /// is printed once).
    #[error("model file: {0}")]
    Io(std::io::Error),
    /// Not a GGUF file, or a truncated or corrupt one.
    #[error("malformed GGUF: {0}")]
    Malformed(String),
    /// The weights do not match the model manifest, or the manifest file is
    /// unusable (the host's disk changed bytes, or handed over another model's).
    #[error("model manifest: {0}")]
    Manifest(String),
    /// A valid file we cannot serve (architecture, quant type, tokenizer).
    #[error("unsupported model: {0}")]
    Unsupported(String),
    /// The caller asked for something impossible (layer range, context, empty prompt).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The session's KV cache would exceed its memory budget.
    #[error("KV cache budget exceeded: {needed_bytes} bytes needed, {budget_bytes} allowed")]
    KvBudget {
        /// Bytes the session would hold.
        needed_bytes: usize,
        /// The budget.
        budget_bytes: usize,
    },
    /// The compute device cannot be used: a build without its feature, no
    /// driver, no such GPU, or a GPU not in the confidential ready state.
    #[error("compute device: {0}")]
    Device(String),
    /// A tensor operation failed (a defect, or a device error).
    #[error("tensor operation failed: {0}")]
    Tensor(#[from] candle_core::Error),
}

impl From<std::io::Error> for ModelError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

/// Result alias of the model side.
pub type Result<T> = std::result::Result<T, ModelError>;
