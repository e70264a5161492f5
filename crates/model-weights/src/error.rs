//! The one error type of the weights crate, and the preflight report it can carry.
//!
//! Every variant names what it is about (a file, a tensor, a store) so that a failed
//! startup can be fixed from the message alone. [`PreflightReport`] collects every
//! mismatch between a checkpoint and a model instead of stopping at the first.

use std::fmt;
use std::path::PathBuf;

use crate::TensorSpec;

/// How many entries of each preflight list are printed before "... and N more".
const REPORT_LINES: usize = 20;

/// What can go wrong while opening a weight store or loading from it.
#[derive(Debug, thiserror::Error)]
pub enum WeightError {
    /// A file could not be opened, read or mapped.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// The path holds no checkpoint this store can open.
    #[error("no checkpoint at {}: {msg}", path.display())]
    NoCheckpoint {
        /// The path that was given.
        path: PathBuf,
        /// What was looked for and what was found.
        msg: String,
    },
    /// A weight file is malformed: bad or truncated header, data past the end of the file.
    #[error("malformed weight file {}: {msg}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// A GGUF metadata key is missing, mistyped, or holds a value met cannot use.
    #[error("GGUF file {}: metadata `{key}`: {msg}", path.display())]
    Metadata {
        /// The file.
        path: PathBuf,
        /// The metadata key, e.g. `llama.block_count`.
        key: String,
        /// What is wrong with it.
        msg: String,
    },
    /// A GGUF tensor is stored in a ggml type met cannot dequantise.
    #[error(
        "tensor `{name}` in {} is stored as ggml type {ggml_type}, which met cannot load (supported: {})",
        path.display(),
        crate::gguf::dequantizable_list()
    )]
    UnsupportedGgmlType {
        /// The file.
        path: PathBuf,
        /// The tensor, as the store names it.
        name: String,
        /// The ggml type's name, e.g. `IQ2_XS`.
        ggml_type: String,
    },
    /// A model config (e.g. one rebuilt from GGUF metadata) does not validate.
    #[error(transparent)]
    Config(#[from] met_config::ConfigError),
    /// A shard index is malformed or disagrees with its shards.
    #[error("bad shard index {}: {msg}", path.display())]
    Index {
        /// The index file.
        path: PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// A tensor was asked for that the store does not hold.
    #[error("tensor `{name}` not found in {store}")]
    Missing {
        /// The tensor asked for.
        name: String,
        /// The store's description.
        store: String,
    },
    /// A stored tensor has an element type met cannot load (I64, U8, F64, F8, ...).
    #[error("tensor `{name}` is stored as {dtype}, which met cannot load (only F32, F16, BF16)")]
    UnsupportedDtype {
        /// The tensor.
        name: String,
        /// The stored element type, as the file names it.
        dtype: String,
    },
    /// A quantized weight that cannot be dequantized as its checkpoint describes it.
    #[error("quantized weight `{name}` {msg}")]
    Quantized {
        /// The weight.
        name: String,
        /// What is wrong.
        msg: String,
    },
    /// Tensors could not be concatenated.
    #[error("cannot concatenate {names:?}: {msg}")]
    Concat {
        /// The tensors, in the order given.
        names: Vec<String>,
        /// Why not.
        msg: String,
    },
    /// A store does not match what the model expects.
    #[error("{0}")]
    Preflight(PreflightReport),
    /// The backend rejected a tensor.
    #[error(transparent)]
    Kernels(#[from] met_kernels::Error),
}

/// Every mismatch between a store and a model's expected tensors.
///
/// Invariant: built by [`crate::preflight`], which returns it only when at least one list
/// is non-empty. Lists are sorted by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PreflightReport {
    /// The store's description.
    pub store: String,
    /// Expected tensors the store lacks.
    pub missing: Vec<TensorSpec>,
    /// Stored tensors the model does not use and that no `ignored` pattern covers.
    pub unexpected: Vec<String>,
    /// `(name, expected shape, stored shape)` of tensors present with the wrong shape.
    pub misshaped: Vec<(String, Vec<usize>, Vec<usize>)>,
    /// `(name, reason)` of expected tensors present but not loadable (unsupported dtype).
    pub unloadable: Vec<(String, String)>,
}

impl PreflightReport {
    /// Whether the store matched: nothing missing, unexpected, mis-shaped or unloadable.
    #[must_use]
    pub fn is_clean(&self) -> bool {
        self.missing.is_empty() && self.unexpected.is_empty() && self.misshaped.is_empty() && self.unloadable.is_empty()
    }
}

impl fmt::Display for PreflightReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} does not match the model: {} missing, {} unexpected, {} mis-shaped, {} unloadable",
            self.store,
            self.missing.len(),
            self.unexpected.len(),
            self.misshaped.len(),
            self.unloadable.len()
        )?;
        write_list(f, "missing", &self.missing, |s| format!("{} {:?}", s.name, s.shape))?;
        write_list(f, "unexpected", &self.unexpected, String::clone)?;
        write_list(f, "mis-shaped", &self.misshaped, |(name, want, got)| {
            format!("{name}: expected {want:?}, found {got:?}")
        })?;
        write_list(f, "unloadable", &self.unloadable, |(name, why)| format!("{name}: {why}"))
    }
}

/// Writes up to [`REPORT_LINES`] items of one list, one per line, then how many were cut.
fn write_list<T>(f: &mut fmt::Formatter<'_>, label: &str, items: &[T], line: impl Fn(&T) -> String) -> fmt::Result {
    for item in items.iter().take(REPORT_LINES) {
        write!(f, "\n  {label}: {}", line(item))?;
    }
    if items.len() > REPORT_LINES {
        write!(f, "\n  ... and {} more {label}", items.len() - REPORT_LINES)?;
    }
    Ok(())
}
