//! The one error type of the config crate.

use std::path::PathBuf;

/// Why a configuration could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is not valid JSON, or not a JSON object.
    #[error("{}: not a JSON object: {msg}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        msg: String,
    },
    /// A required field is absent (or null).
    #[error("{}: missing field `{field}`", path.display())]
    Missing {
        /// The file.
        path: PathBuf,
        /// The field, dotted for nested fields.
        field: String,
    },
    /// A field has the wrong type or an impossible value.
    #[error("{}: field `{field}`: {msg}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The field, dotted for nested fields.
        field: String,
        /// What is wrong with it.
        msg: String,
    },
    /// The architecture is not one met implements.
    #[error("{}: unsupported model_type `{found}` (supported: {supported})", path.display())]
    UnsupportedModelType {
        /// The file.
        path: PathBuf,
        /// The `model_type` it names.
        found: String,
        /// The supported model types, comma separated.
        supported: String,
    },
}
