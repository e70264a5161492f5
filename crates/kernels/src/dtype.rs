//! Element types a [`crate::Tensor`] can hold.

use std::fmt;

use crate::quant::QuantFormat;

/// The element type of a tensor. Float types hold weights and activations; `U32` holds
/// token ids, positions, slot mappings and block tables; `Quant` holds weights in a
/// ggml block format (rows of whole blocks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE 754 single precision.
    F32,
    /// IEEE 754 half precision.
    F16,
    /// bfloat16: f32's exponent with a 7-bit mantissa.
    BF16,
    /// `float8_e4m3fn` ([`crate::fp8`]): the FP8 KV cache's element, read under a scale.
    F8E4M3,
    /// Unsigned 32-bit integers (ids and indices).
    U32,
    /// Block-quantised weights.
    Quant(QuantFormat),
}

impl DType {
    /// Bytes per element.
    ///
    /// # Panics
    /// For a quantised format, whose elements have no size of their own: use
    /// [`DType::bytes_for`].
    pub const fn size_in_bytes(self) -> usize {
        match self {
            Self::F32 | Self::U32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::F8E4M3 => 1,
            Self::Quant(_) => panic!("quantised formats have no per-element size"),
        }
    }

    /// Bytes of `elems` elements; `None` for a quantised format when they are not a whole
    /// number of blocks.
    pub const fn bytes_for(self, elems: usize) -> Option<usize> {
        match self {
            Self::Quant(q) => q.bytes_for(elems),
            _ => Some(elems * self.size_in_bytes()),
        }
    }

    /// Whether the type holds plain floating-point values (f32, f16, bf16).
    pub const fn is_float(self) -> bool {
        matches!(self, Self::F32 | Self::F16 | Self::BF16)
    }

    /// Whether the type holds values a float op can consume, plain or quantised.
    pub const fn is_real(self) -> bool {
        !matches!(self, Self::U32)
    }

    /// The lower-case name used in messages and file formats (`f32`, `bf16`, `q4_1`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::BF16 => "bf16",
            Self::F8E4M3 => "f8_e4m3",
            Self::U32 => "u32",
            Self::Quant(q) => q.name(),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
