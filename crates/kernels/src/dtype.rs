//! Element types a [`crate::Tensor`] can hold.

use std::fmt;

/// The element type of a tensor. Float types hold weights and activations; `U32` holds
/// token ids, positions, slot mappings and block tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE 754 single precision.
    F32,
    /// IEEE 754 half precision.
    F16,
    /// bfloat16: f32's exponent with a 7-bit mantissa.
    BF16,
    /// Unsigned 32-bit integers (ids and indices).
    U32,
}

impl DType {
    /// Bytes per element.
    pub const fn size_in_bytes(self) -> usize {
        match self {
            Self::F32 | Self::U32 => 4,
            Self::F16 | Self::BF16 => 2,
        }
    }

    /// Whether the type holds floating-point values.
    pub const fn is_float(self) -> bool {
        !matches!(self, Self::U32)
    }

    /// The lower-case name used in messages and file formats (`f32`, `bf16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::BF16 => "bf16",
            Self::U32 => "u32",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
