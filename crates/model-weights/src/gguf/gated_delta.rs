//! llama.cpp's Gated DeltaNet tensors (`qwen3next`, `qwen35`, `qwen35moe`), undone.
//!
//! Besides renaming, `convert_hf_to_gguf.py` changes a Gated DeltaNet layer's tensors
//! (`Qwen3NextModel.modify_tensors`, and for Qwen3.5 `_LinearAttentionVReorderBase`), after
//! widening them to f32:
//!
//! - `A_log` becomes `ssm_a = -exp(A_log)`. The store serves `ln(-a)` as f32: the round
//!   trip through `exp` is not exact, so a value may differ from the checkpoint's in its
//!   last bit.
//! - `conv1d.weight` `[c, 1, k]` is squeezed to `[c, k]`; the store serves the 3-D shape.
//! - Every zero-centred `*norm.weight` holds `1 + w` (the architecture's `norm_shift`);
//!   the gated `linear_attn.norm` alone is written as it is ([`keeps_norm`]).
//! - Qwen3.5, whose layers have more value heads than key heads, reorders the value heads
//!   of every tensor indexed by them from grouped by key head (`k0v0 k0v1 k1v0 k1v1`) to
//!   tiled (`k0v0 k1v0 k0v1 k1v1`): the V rows of `in_proj_qkv` and `conv1d`, the rows of
//!   `in_proj_z`, `in_proj_b`, `in_proj_a`, `A_log` and `dt_bias`, and the columns of
//!   `out_proj`. The store puts them back in grouped order ([`Tiling`]).
//!
//! Qwen3-Next's fused `in_proj_qkvz` is split by the converter into `attn_qkv` (the q, k
//! and v rows of all heads) and `attn_gate` (z): met's canonical `in_proj_qkv` and
//! `in_proj_z`. Its `in_proj_ba` is written unchanged, grouped per key head.

use super::{GgufArch, GgufFile};
use crate::WeightError;

/// How a converter ordered the value heads of an architecture's Gated DeltaNet tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VHeadOrder {
    /// As the checkpoint, grouped by key head (`qwen3next`).
    Grouped,
    /// Tiled over the key heads (`qwen35`, `qwen35moe`).
    Tiled,
}

/// The head layout of a Gated DeltaNet, from `{arch}.ssm.*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GdnHeads {
    k_heads: usize,
    v_per_k: usize,
    k_dim: usize,
    v_dim: usize,
}

impl GdnHeads {
    /// Reads `ssm.group_count` (key heads), `ssm.time_step_rank` (value heads),
    /// `ssm.state_size` (key head dim) and `ssm.inner_size` (all value dims).
    ///
    /// # Errors
    /// [`WeightError::Metadata`] naming the key that is missing, zero or inconsistent.
    pub(crate) fn read(file: &GgufFile, arch: &GgufArch) -> Result<Self, WeightError> {
        let key = |k: &str| format!("{}.ssm.{k}", arch.name);
        let get = |k: &str| -> Result<usize, WeightError> {
            let v = file.get_u64(&key(k))?;
            match usize::try_from(v) {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(file.metadata_error(&key(k), format!("{v} must be a positive count"))),
            }
        };
        let (k_heads, v_heads) = (get("group_count")?, get("time_step_rank")?);
        if !v_heads.is_multiple_of(k_heads) {
            let msg = format!("{v_heads} value heads do not split over {k_heads} key heads (ssm.group_count)");
            return Err(file.metadata_error(&key("time_step_rank"), msg));
        }
        let inner = get("inner_size")?;
        if !inner.is_multiple_of(v_heads) {
            let msg = format!("{inner} does not split into {v_heads} value heads (ssm.time_step_rank)");
            return Err(file.metadata_error(&key("inner_size"), msg));
        }
        Ok(Self { k_heads, v_per_k: v_heads / k_heads, k_dim: get("state_size")?, v_dim: inner / v_heads })
    }

    /// The reorder of value heads of `head_dim` elements that start at `start`.
    fn tiling(self, start: usize, head_dim: usize) -> Tiling {
        Tiling { start, k_heads: self.k_heads, v_per_k: self.v_per_k, head_dim }
    }
}

/// Value heads stored tiled from index `start` on, along one dimension of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tiling {
    start: usize,
    k_heads: usize,
    v_per_k: usize,
    head_dim: usize,
}

impl Tiling {
    /// The length of the dimension: the leading part plus every value head.
    pub(crate) fn len(self) -> usize {
        self.start + self.k_heads * self.v_per_k * self.head_dim
    }

    /// The stored index of checkpoint index `i`: element `e` of value head `v` of key head
    /// `g` sits at `(g · v_per_k + v) · head_dim + e` in the checkpoint and at
    /// `(v · k_heads + g) · head_dim + e` in the file.
    pub(crate) fn stored(self, i: usize) -> usize {
        let Some(j) = i.checked_sub(self.start).filter(|&j| j < self.len() - self.start) else { return i };
        let (head, e) = (j / self.head_dim, j % self.head_dim);
        let (g, v) = (head / self.v_per_k, head % self.v_per_k);
        self.start + (v * self.k_heads + g) * self.head_dim + e
    }
}

/// What the store undoes for one checkpoint tensor of a Gated DeltaNet layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Undo {
    /// The file holds `-exp(x)`; serve `x`.
    pub(crate) neg_exp: bool,
    /// The file dropped the middle dimension of `[c, 1, k]`.
    pub(crate) unsqueeze: bool,
    /// Rows (the outermost dimension) stored tiled.
    pub(crate) rows: Option<Tiling>,
    /// Columns (the innermost dimension) stored tiled.
    pub(crate) cols: Option<Tiling>,
}

/// Whether the converter left the norm weight `hf_name` unshifted.
pub(crate) fn keeps_norm(hf_name: &str) -> bool {
    hf_name.ends_with(".linear_attn.norm.weight")
}

/// What to undo for the checkpoint tensor `hf_name`; `tiled` holds the head layout when
/// the file's value heads are tiled.
pub(crate) fn undo(hf_name: &str, tiled: Option<GdnHeads>) -> Undo {
    let Some((_, part)) = hf_name.split_once(".linear_attn.") else { return Undo::default() };
    let t = |start: usize, head_dim: usize| tiled.map(|h| h.tiling(start, head_dim));
    let qk = tiled.map_or(0, |h| 2 * h.k_heads * h.k_dim);
    let v_dim = tiled.map_or(0, |h| h.v_dim);
    match part {
        "A_log" => Undo { neg_exp: true, rows: t(0, 1), ..Undo::default() },
        "dt_bias" | "in_proj_b.weight" | "in_proj_a.weight" => Undo { rows: t(0, 1), ..Undo::default() },
        "conv1d.weight" => Undo { unsqueeze: true, rows: t(qk, v_dim), ..Undo::default() },
        "in_proj_qkv.weight" => Undo { rows: t(qk, v_dim), ..Undo::default() },
        "in_proj_z.weight" => Undo { rows: t(0, v_dim), ..Undo::default() },
        "out_proj.weight" => Undo { cols: t(0, v_dim), ..Undo::default() },
        _ => Undo::default(),
    }
}

/// `rows` equal rows of `bytes` in checkpoint order.
pub(crate) fn untile_rows(bytes: &[u8], rows: usize, t: Tiling) -> Vec<u8> {
    let row_bytes = bytes.len() / rows.max(1);
    (0..rows).flat_map(|r| &bytes[t.stored(r) * row_bytes..(t.stored(r) + 1) * row_bytes]).copied().collect()
}

/// The columns of every row of `bytes` (`cols` elements of `elem` bytes each) in
/// checkpoint order.
pub(crate) fn untile_cols(bytes: &[u8], cols: usize, elem: usize, t: Tiling) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    for row in bytes.chunks_exact(cols * elem) {
        for c in 0..cols {
            let at = t.stored(c) * elem;
            out.extend_from_slice(&row[at..at + elem]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The converter's reorder on indices, as its torch expression reads: view the value
    /// part as `[k_heads, v_per_k, head_dim]`, swap the first two axes, flatten.
    fn llama_cpp_tile(xs: &[usize], start: usize, k_heads: usize, v_per_k: usize, head_dim: usize) -> Vec<usize> {
        let mut out = xs[..start].to_vec();
        for v in 0..v_per_k {
            for g in 0..k_heads {
                let head = start + (g * v_per_k + v) * head_dim;
                out.extend_from_slice(&xs[head..head + head_dim]);
            }
        }
        out
    }

    #[test]
    fn untiling_inverts_the_converter() {
        for (start, k_heads, v_per_k, head_dim) in [(0, 2, 2, 1), (0, 2, 3, 4), (8, 2, 2, 3), (64, 16, 2, 128)] {
            let t = Tiling { start, k_heads, v_per_k, head_dim };
            let hf: Vec<usize> = (0..t.len()).collect();
            let stored = llama_cpp_tile(&hf, start, k_heads, v_per_k, head_dim);
            assert_ne!(stored, hf, "the reorder must move heads");
            let back: Vec<usize> = (0..t.len()).map(|i| stored[t.stored(i)]).collect();
            assert_eq!(back, hf, "{t:?}");
        }
    }

    #[test]
    fn untiles_rows_and_columns_of_bytes() {
        // Two key heads, two value heads each, heads of one element: stored v order 0 2 1 3.
        let t = Tiling { start: 0, k_heads: 2, v_per_k: 2, head_dim: 1 };
        assert_eq!(untile_rows(&[10, 11, 30, 31, 20, 21, 40, 41], 4, t), [10, 11, 20, 21, 30, 31, 40, 41]);
        assert_eq!(untile_cols(&[1, 3, 2, 4, 5, 7, 6, 8], 4, 1, t), [1, 2, 3, 4, 5, 6, 7, 8]);
    }

    #[test]
    fn which_tensors_are_undone() {
        let heads = GdnHeads { k_heads: 2, v_per_k: 2, k_dim: 16, v_dim: 8 };
        let u = undo("model.layers.0.linear_attn.in_proj_qkv.weight", Some(heads));
        assert_eq!(u.rows.map(Tiling::len), Some(64 + 32));
        assert!(undo("model.layers.0.linear_attn.A_log", None).neg_exp);
        assert!(undo("model.layers.0.linear_attn.conv1d.weight", None).unsqueeze);
        assert_eq!(undo("model.layers.0.linear_attn.out_proj.weight", Some(heads)).cols.map(Tiling::len), Some(32));
        assert_eq!(undo("model.layers.0.self_attn.q_proj.weight", Some(heads)), Undo::default());
        assert!(keeps_norm("model.layers.0.linear_attn.norm.weight"));
        assert!(!keeps_norm("model.layers.0.input_layernorm.weight"));
    }
}
