//! The one error type of the kernels crate.

use crate::DType;

/// What can go wrong in a backend call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Operand shapes do not fit the op.
    #[error("{op}: {msg}")]
    Shape {
        /// The op that rejected its operands.
        op: &'static str,
        /// What was wrong, with the shapes involved.
        msg: String,
    },
    /// An operand has the wrong element type.
    #[error("{op}: expected {expected}, got {got}")]
    DType {
        /// The op that rejected its operand.
        op: &'static str,
        /// The element type the op needs.
        expected: DType,
        /// The element type it was given.
        got: DType,
    },
    /// A tensor made by one backend was passed to another.
    #[error("{op}: tensor lives on {found}, not on this {backend} backend")]
    WrongDevice {
        /// The op that rejected its operand.
        op: &'static str,
        /// Where the tensor lives.
        found: &'static str,
        /// The backend that was asked.
        backend: &'static str,
    },
    /// An argument outside the op's domain (an id past the table, a bad option).
    #[error("{0}")]
    InvalidArgument(String),
    /// The device driver or runtime failed.
    #[error("device error: {0}")]
    Device(String),
    /// CUDA was requested from a build without the `cuda` feature.
    #[error("this build of met has no CUDA support; rebuild with `--features cuda`")]
    CudaNotCompiled,
}

/// `Result` with the kernels [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Returns a shape error for `op` unless `ok`.
pub(crate) fn ensure(ok: bool, op: &'static str, msg: impl FnOnce() -> String) -> Result<()> {
    if ok { Ok(()) } else { Err(Error::Shape { op, msg: msg() }) }
}
