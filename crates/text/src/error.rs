//! The one error type of the text layer.
//!
//! Every variant names where the problem is: the file, the GGUF metadata key, or the
//! template line, so a message is actionable without a backtrace.

use std::path::PathBuf;

/// Why a tokenizer or chat template could not be loaded, or text not produced.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// A file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A tokenizer or config file is malformed, or names something impossible.
    #[error("{}: {msg}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// `generation_config.json` could not be read.
    #[error(transparent)]
    Config(#[from] met_config::ConfigError),
    /// A GGUF tokenizer key is absent.
    #[error("GGUF metadata: missing key `{key}`")]
    MissingKey {
        /// The metadata key.
        key: String,
    },
    /// A GGUF tokenizer key holds the wrong kind of value or an impossible one.
    #[error("GGUF metadata: key `{key}`: {msg}")]
    InvalidKey {
        /// The metadata key.
        key: String,
        /// What is wrong with it.
        msg: String,
    },
    /// `tokenizer.ggml.model` names a tokenizer met cannot build.
    #[error(
        "GGUF metadata: key `tokenizer.ggml.model`: unsupported tokenizer model `{model}` (supported: gpt2, llama)"
    )]
    UnsupportedModel {
        /// The model it names.
        model: String,
    },
    /// The tokenizers library failed to encode or decode.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A chat template failed to compile or render.
    #[error("chat template{}: {msg}", at_line(*line))]
    Template {
        /// The template line (1-based), when the engine knows it.
        line: Option<usize>,
        /// What went wrong.
        msg: String,
    },
    /// The template called `raise_exception(msg)`: it rejects the conversation (for example,
    /// roles that do not alternate), so this is usually the request's fault.
    #[error("chat template{}: {msg}", at_line(*line))]
    Raised {
        /// The template line (1-based) of the call.
        line: Option<usize>,
        /// The template's message, verbatim.
        msg: String,
    },
    /// The request cannot be rendered in the mode asked for (for example, continuing a final
    /// message when there is none).
    #[error("chat template: {0}")]
    Render(String),
}

impl TextError {
    pub(crate) fn file(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Self::File { path: path.into(), msg: msg.into() }
    }

    pub(crate) fn invalid_key(key: &str, msg: impl Into<String>) -> Self {
        Self::InvalidKey { key: key.to_owned(), msg: msg.into() }
    }
}

fn at_line(line: Option<usize>) -> String {
    line.map(|l| format!(" line {l}")).unwrap_or_default()
}

/// The source attached to the error `raise_exception` returns, so that it can be told apart
/// from the engine's own errors.
#[derive(Debug)]
pub(crate) struct RaisedException;

impl std::fmt::Display for RaisedException {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("raised by the template")
    }
}

impl std::error::Error for RaisedException {}

impl From<minijinja::Error> for TextError {
    fn from(err: minijinja::Error) -> Self {
        let line = err.line();
        let raised = std::error::Error::source(&err).is_some_and(|s| s.is::<RaisedException>());
        if raised {
            return Self::Raised { line, msg: err.detail().unwrap_or_default().to_owned() };
        }
        // Not `err.to_string()`: that appends "(in <name>:<line>)", and the line is a field.
        let mut msg = match err.detail() {
            Some(detail) => format!("{}: {detail}", err.kind()),
            None => err.kind().to_string(),
        };
        let mut source = std::error::Error::source(&err);
        while let Some(cause) = source {
            msg.push_str(": ");
            msg.push_str(&cause.to_string());
            source = cause.source();
        }
        Self::Template { line, msg }
    }
}
