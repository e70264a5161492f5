//! Undoing llama.cpp's Q/K row permutation.
//!
//! Hugging Face Llama checkpoints apply rotary embeddings with `rotate_half`: within each
//! head of `d` rows, row `j < d/2` pairs with row `j + d/2`. ggml's rope pairs *adjacent*
//! rows instead, so `convert_hf_to_gguf.py` (`LlamaModel.permute`) reorders the rows of
//! `q_proj` and `k_proj` (weights and biases) for the `llama` architecture:
//!
//! ```text
//! w.reshape(heads, 2, d/2, ...).swapaxes(1, 2).reshape(w.shape)
//! ```
//!
//! Row `h·d + s·d/2 + i` of the HF tensor (head `h`, half `s ∈ {0, 1}`, `i < d/2`) lands at
//! row `h·d + 2·i + s` of the GGUF tensor. The inverse, used here: HF row `h·d + j` is
//! GGUF row `h·d + 2·(j mod d/2) + ⌊j / (d/2)⌋`. `heads` is the head count of the tensor
//! itself: query heads for `q_proj`, key/value heads for `k_proj` (the converter passes
//! `n_head_kv` for keys). A quantised row is a run of whole blocks, so the permutation
//! moves rows of bytes and works on any ggml type.

/// The GGUF row holding row `r` of the HF tensor, for `rows` rows in `heads` heads.
/// Callers guarantee `rows` is a multiple of `2 × heads`.
fn gguf_row(r: usize, rows: usize, heads: usize) -> usize {
    let d = rows / heads;
    let half = d / 2;
    let (head, j) = (r / d, r % d);
    head * d + 2 * (j % half) + j / half
}

/// Checks that a tensor of `rows` rows can be un-permuted over `heads` heads.
///
/// # Errors
/// A message when `heads` is zero or `rows` is not a multiple of `2 × heads`.
pub(crate) fn check(rows: usize, heads: usize) -> Result<(), String> {
    match heads.checked_mul(2) {
        Some(two_h) if two_h > 0 && rows.is_multiple_of(two_h) => Ok(()),
        _ => Err(format!("{rows} rows cannot be split into {heads} heads of two rotary halves")),
    }
}

/// The rows of `bytes` (a GGUF Q or K projection, `rows` equal rows) in HF order.
///
/// # Errors
/// As [`check`], or when `bytes` is not `rows` equal rows.
pub(crate) fn unpermute_rows(bytes: &[u8], rows: usize, heads: usize) -> Result<Vec<u8>, String> {
    check(rows, heads)?;
    if !bytes.len().is_multiple_of(rows) {
        return Err(format!("{} bytes are not {rows} equal rows", bytes.len()));
    }
    if rows == 0 {
        return Ok(Vec::new());
    }
    let row_bytes = bytes.len() / rows;
    let mut out = Vec::with_capacity(bytes.len());
    for r in 0..rows {
        let src = gguf_row(r, rows, heads) * row_bytes;
        out.extend_from_slice(&bytes[src..src + row_bytes]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The converter's forward permutation on row indices, written as its numpy
    /// expression reads: view rows as `[heads, 2, d/2]`, swap the last two axes, flatten.
    fn llama_cpp_permute(rows: &[usize], heads: usize) -> Vec<usize> {
        let d = rows.len() / heads;
        let mut out = Vec::new();
        for h in 0..heads {
            for i in 0..d / 2 {
                for s in 0..2 {
                    out.push(rows[h * d + s * (d / 2) + i]);
                }
            }
        }
        out
    }

    #[test]
    fn unpermute_inverts_the_converter() {
        for (rows, heads) in [(8, 1), (16, 2), (64, 4), (192, 3), (24, 6)] {
            let hf: Vec<usize> = (0..rows).map(|r| r * 7 + 1).collect();
            let gguf = llama_cpp_permute(&hf, heads);
            assert_ne!(gguf, hf, "the permutation must move rows ({rows} rows, {heads} heads)");
            let row_bytes = 3;
            let bytes: Vec<u8> = gguf.iter().flat_map(|&v| [v as u8, (v >> 8) as u8, 0xAB]).collect();
            let back = unpermute_rows(&bytes, rows, heads).unwrap();
            let rows_back: Vec<usize> =
                back.chunks(row_bytes).map(|c| usize::from(c[0]) | (usize::from(c[1]) << 8)).collect();
            assert_eq!(rows_back, hf, "{rows} rows, {heads} heads");
        }
    }

    #[test]
    fn a_small_case_by_hand() {
        // One head of 4 rows: HF [a0, a1, b0, b1] is stored as [a0, b0, a1, b1].
        let stored = [0u8, 2, 1, 3];
        assert_eq!(unpermute_rows(&stored, 4, 1).unwrap(), [0, 1, 2, 3]);
    }

    #[test]
    fn refuses_rows_that_do_not_split() {
        assert!(unpermute_rows(&[0; 6], 6, 2).is_err());
        assert!(unpermute_rows(&[0; 8], 8, 0).is_err());
        assert!(unpermute_rows(&[0; 9], 4, 1).is_err());
    }
}
