//! The ggml tensor types a GGUF file can declare, with their block geometry.
//!
//! Every ggml type stores a tensor's innermost dimension as a run of fixed-size blocks:
//! `block_size()` elements in `type_size()` bytes (plain types are blocks of one element).
//! Knowing the geometry of a type is enough to validate a file's byte ranges, so the enum
//! lists every type in current ggml with a stable size, not only the ones met can
//! dequantise ([`GgmlType::is_dequantizable`]). Ids and sizes follow ggml's `ggml_type`
//! and `type_traits` table (mirrored by gguf-py's `GGML_QUANT_SIZES`); ids that ggml
//! retired (4, 5, 31-33, 36-38) and Q8_1 (a matmul-internal type never stored in files)
//! are unknown here, and a file using them fails to open.

use std::fmt;

use met_kernels::quant::QuantFormat;

/// A ggml tensor element type, by its GGUF id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types, missing_docs)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

/// `(type, id, name, elements per block, bytes per block)`, the one table of facts.
const TABLE: [(GgmlType, u32, &str, usize, usize); 31] = {
    use GgmlType::*;
    [
        (F32, 0, "F32", 1, 4),
        (F16, 1, "F16", 1, 2),
        (Q4_0, 2, "Q4_0", 32, 18),
        (Q4_1, 3, "Q4_1", 32, 20),
        (Q5_0, 6, "Q5_0", 32, 22),
        (Q5_1, 7, "Q5_1", 32, 24),
        (Q8_0, 8, "Q8_0", 32, 34),
        (Q2_K, 10, "Q2_K", 256, 84),
        (Q3_K, 11, "Q3_K", 256, 110),
        (Q4_K, 12, "Q4_K", 256, 144),
        (Q5_K, 13, "Q5_K", 256, 176),
        (Q6_K, 14, "Q6_K", 256, 210),
        (Q8_K, 15, "Q8_K", 256, 292),
        (IQ2_XXS, 16, "IQ2_XXS", 256, 66),
        (IQ2_XS, 17, "IQ2_XS", 256, 74),
        (IQ3_XXS, 18, "IQ3_XXS", 256, 98),
        (IQ1_S, 19, "IQ1_S", 256, 50),
        (IQ4_NL, 20, "IQ4_NL", 32, 18),
        (IQ3_S, 21, "IQ3_S", 256, 110),
        (IQ2_S, 22, "IQ2_S", 256, 82),
        (IQ4_XS, 23, "IQ4_XS", 256, 136),
        (I8, 24, "I8", 1, 1),
        (I16, 25, "I16", 1, 2),
        (I32, 26, "I32", 1, 4),
        (I64, 27, "I64", 1, 8),
        (F64, 28, "F64", 1, 8),
        (IQ1_M, 29, "IQ1_M", 256, 56),
        (BF16, 30, "BF16", 1, 2),
        (TQ1_0, 34, "TQ1_0", 256, 54),
        (TQ2_0, 35, "TQ2_0", 256, 66),
        (MXFP4, 39, "MXFP4", 32, 17),
    ]
};

/// The types [`crate::gguf::dequantize`] converts to f32, for messages.
pub(crate) const DEQUANTIZABLE: [GgmlType; 11] = {
    use GgmlType::*;
    [F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K]
};

impl GgmlType {
    /// The type with GGUF id `id`, or `None` for an id ggml does not define (or retired).
    #[must_use]
    pub fn from_id(id: u32) -> Option<Self> {
        TABLE.iter().find(|row| row.1 == id).map(|row| row.0)
    }

    /// The GGUF id.
    #[must_use]
    pub fn id(self) -> u32 {
        self.row().1
    }

    /// ggml's name for the type, e.g. `Q4_K`.
    #[must_use]
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Elements per block (1 for plain types, 32 for the legacy quants, 256 for K-quants).
    #[must_use]
    pub fn block_size(self) -> usize {
        self.row().3
    }

    /// Bytes per block.
    #[must_use]
    pub fn type_size(self) -> usize {
        self.row().4
    }

    /// Whether met can dequantise this type to f32.
    #[must_use]
    pub fn is_dequantizable(self) -> bool {
        DEQUANTIZABLE.contains(&self)
    }

    /// The block format met's kernels compute with, for the block-quantised types they
    /// implement.
    #[must_use]
    pub fn quant_format(self) -> Option<QuantFormat> {
        Some(match self {
            Self::Q4_0 => QuantFormat::Q4_0,
            Self::Q4_1 => QuantFormat::Q4_1,
            Self::Q5_0 => QuantFormat::Q5_0,
            Self::Q5_1 => QuantFormat::Q5_1,
            Self::Q8_0 => QuantFormat::Q8_0,
            Self::Q4_K => QuantFormat::Q4_K,
            Self::Q5_K => QuantFormat::Q5_K,
            Self::Q6_K => QuantFormat::Q6_K,
            _ => return None,
        })
    }

    /// Bytes taking `elements` elements, or `None` when `elements` is not a whole number
    /// of blocks or the size overflows.
    #[must_use]
    pub fn bytes_for(self, elements: usize) -> Option<usize> {
        if !elements.is_multiple_of(self.block_size()) {
            return None;
        }
        (elements / self.block_size()).checked_mul(self.type_size())
    }

    fn row(self) -> &'static (GgmlType, u32, &'static str, usize, usize) {
        // TABLE lists the variants in declaration order (checked by a unit test).
        &TABLE[self as usize]
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The dequantisable types as a comma-separated list, for messages.
pub(crate) fn dequantizable_list() -> String {
    DEQUANTIZABLE.map(GgmlType::name).join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_round_trips_through_its_id() {
        for (i, (t, id, name, block, size)) in TABLE.into_iter().enumerate() {
            assert_eq!(t as usize, i, "{name} is out of order");
            assert_eq!(GgmlType::from_id(id), Some(t), "{name}");
            assert_eq!((t.id(), t.name(), t.block_size(), t.type_size()), (id, name, block, size));
        }
        let ids: std::collections::HashSet<u32> = TABLE.iter().map(|r| r.1).collect();
        assert_eq!(ids.len(), TABLE.len(), "duplicate ids");
        for retired in [4, 5, 9, 31, 36, 40, 1000] {
            assert_eq!(GgmlType::from_id(retired), None);
        }
    }

    #[test]
    fn bytes_for_needs_whole_blocks() {
        assert_eq!(GgmlType::Q4_K.bytes_for(512), Some(288));
        assert_eq!(GgmlType::Q4_K.bytes_for(100), None);
        assert_eq!(GgmlType::F16.bytes_for(3), Some(6));
        assert_eq!(GgmlType::F32.bytes_for(usize::MAX), None);
    }
}
