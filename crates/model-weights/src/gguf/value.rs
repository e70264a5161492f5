//! GGUF metadata values: one enum for the thirteen value types of the format.
//!
//! The accessors are deliberately forgiving about width and signedness and strict about
//! kind: [`GgufValue::as_u64`] accepts any integer that is non-negative (converters write
//! counts as u32 or u64, and some tools as i32), but never a float or a bool, so a key with
//! the wrong kind of value is reported rather than coerced.

use std::fmt;

/// One metadata value, as stored in the file.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// Type 0.
    U8(u8),
    /// Type 1.
    I8(i8),
    /// Type 2.
    U16(u16),
    /// Type 3.
    I16(i16),
    /// Type 4.
    U32(u32),
    /// Type 5.
    I32(i32),
    /// Type 10.
    U64(u64),
    /// Type 11.
    I64(i64),
    /// Type 6.
    F32(f32),
    /// Type 12.
    F64(f64),
    /// Type 7.
    Bool(bool),
    /// Type 8. Invalid UTF-8 is replaced by U+FFFD (tokenizer vocabularies in the wild
    /// occasionally hold such bytes; keys and tensor names must be valid).
    String(String),
    /// Type 9: elements of one type (possibly arrays themselves).
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// The value as an unsigned integer: any integer type holding a non-negative value.
    #[must_use]
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer: any integer type whose value fits.
    #[must_use]
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Self::I8(v) => Some(v.into()),
            Self::I16(v) => Some(v.into()),
            Self::I32(v) => Some(v.into()),
            Self::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// The value as a float: either float type, or any integer (converted, possibly
    /// rounding past 2^53).
    #[must_use]
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => Some(v.into()),
            Self::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64).or_else(|| self.as_u64().map(|v| v as f64)),
        }
    }

    /// The value as a bool.
    #[must_use]
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The value as a string.
    #[must_use]
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(v) => Some(v),
            _ => None,
        }
    }

    /// The value as an array.
    #[must_use]
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            Self::Array(v) => Some(v),
            _ => None,
        }
    }

    /// The GGUF name of the value's type, for messages (`u32`, `string`, `array`, ...).
    #[must_use]
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::U8(_) => "u8",
            Self::I8(_) => "i8",
            Self::U16(_) => "u16",
            Self::I16(_) => "i16",
            Self::U32(_) => "u32",
            Self::I32(_) => "i32",
            Self::U64(_) => "u64",
            Self::I64(_) => "i64",
            Self::F32(_) => "f32",
            Self::F64(_) => "f64",
            Self::Bool(_) => "bool",
            Self::String(_) => "string",
            Self::Array(_) => "array",
        }
    }
}

/// Short forms for messages: strings quoted and cut, arrays by length.
impl fmt::Display for GgufValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 60;
        match self {
            Self::String(s) if s.chars().count() > SHOWN => {
                write!(f, "{:?}...", s.chars().take(SHOWN).collect::<String>())
            }
            Self::String(s) => write!(f, "{s:?}"),
            Self::Array(a) => write!(f, "[{} elements]", a.len()),
            Self::Bool(v) => write!(f, "{v}"),
            Self::F32(v) => write!(f, "{v}"),
            Self::F64(v) => write!(f, "{v}"),
            other => match other.as_i64() {
                Some(v) => write!(f, "{v}"),
                None => write!(f, "{}", other.as_u64().unwrap_or_default()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_convert_across_widths_but_not_kinds() {
        assert_eq!(GgufValue::U32(7).as_u64(), Some(7));
        assert_eq!(GgufValue::I32(7).as_u64(), Some(7));
        assert_eq!(GgufValue::I32(-1).as_u64(), None);
        assert_eq!(GgufValue::U64(u64::MAX).as_i64(), None);
        assert_eq!(GgufValue::F32(7.0).as_u64(), None);
        assert_eq!(GgufValue::Bool(true).as_u64(), None);
        assert_eq!(GgufValue::U16(3).as_f64(), Some(3.0));
        assert_eq!(GgufValue::F32(0.5).as_f64(), Some(0.5));
        assert_eq!(GgufValue::String("x".into()).as_str(), Some("x"));
        assert_eq!(GgufValue::U8(1).as_bool(), None);
    }

    #[test]
    fn display_is_short() {
        assert_eq!(GgufValue::Array(vec![GgufValue::U8(1); 5]).to_string(), "[5 elements]");
        assert_eq!(GgufValue::I8(-3).to_string(), "-3");
        assert_eq!(GgufValue::U64(u64::MAX).to_string(), u64::MAX.to_string());
        assert!(GgufValue::String("y".repeat(100)).to_string().ends_with("..."));
    }
}
