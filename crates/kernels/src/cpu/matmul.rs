//! `x · Wᵀ` on the CPU through the `gemm` crate.

use crate::Tensor;
use crate::error::Result;

use super::{CpuDots, WeightView, f32_tensor, read_f32, read_weight};

pub(super) fn matmul(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, dots: CpuDots) -> Result<Tensor> {
    let (m, k, n) = crate::check::matmul(x, w, bias)?;
    let (xs, ws) = (read_f32("matmul", x)?, read_weight("matmul", w)?);
    let bs = bias.map(|b| read_f32("matmul", b)).transpose()?;
    let out = match ws {
        WeightView::F32(ws) => matmul_xwt(&xs, &ws, bs.as_deref(), m, k, n),
        WeightView::Quant(q, blocks) => {
            if q.bytes_for(k).is_none() {
                return Err(crate::Error::Shape { op: "matmul", msg: format!("k = {k} is not whole {q} blocks") });
            }
            super::matmul_quant(&xs, &blocks, bs.as_deref(), (m, k, n), q)
        }
        WeightView::Packed(p) => super::qmatmul::matmul_packed(&xs, &p, bs.as_deref(), m, dots),
    };
    Ok(f32_tensor(out, &[m, n]))
}

/// `x [m, k] · wᵀ` for row-major `w [n, k]`, plus `bias [n]`: row-major `[m, n]`, on the
/// rayon pool.
///
/// # Panics
/// If the slice lengths do not match `m`, `k` and `n`.
pub fn matmul_xwt(x: &[f32], w: &[f32], bias: Option<&[f32]>, m: usize, k: usize, n: usize) -> Vec<f32> {
    gemm_xwt(x, w, bias, (m, k, n), gemm::Parallelism::Rayon(0))
}

/// `x [m, k] · wᵀ` for a panel `w` of `n` weight rows laid out column by column (element
/// `(j, l)` at `l · n + j`, the layout `gemm` packs its left operand into), written into the
/// columns `col..col + n` of the row-major `out [m, width]`, on the calling thread.
///
/// # Safety
/// `out` must point to `m * width` f32s with `col + n <= width`, and no other thread may
/// read or write those `n` columns during the call.
pub(crate) unsafe fn gemm_x_panel_into(
    x: &[f32],
    w: &[f32],
    (m, k, n): (usize, usize, usize),
    out: *mut f32,
    (col, width): (usize, usize),
) {
    assert!(col + n <= width, "columns {col}..{} past a width of {width}", col + n);
    // SAFETY: as the caller guarantees for `out` (rows `width` apart, the panel's columns
    // from `col`); row `j` of the panel is `w[j..]` read `n` apart.
    unsafe {
        gemm_xwt_raw(x, (w, (1, n)), (m, k, n), out.wrapping_add(col), width, false, gemm::Parallelism::None);
    }
}

fn gemm_xwt(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    (m, k, n): (usize, usize, usize),
    parallelism: gemm::Parallelism,
) -> Vec<f32> {
    let mut out = match bias {
        Some(b) => {
            assert_eq!(b.len(), n, "bias is not [n]");
            b.repeat(m)
        }
        None => vec![0f32; m * n],
    };
    // SAFETY: `out` holds `m * n` f32s, rows `n` apart, and is this call's own. With a
    // bias it starts as the bias rows and the product is added to it.
    unsafe { gemm_xwt_raw(x, (w, (k, 1)), (m, k, n), out.as_mut_ptr(), n, bias.is_some(), parallelism) };
    out
}

/// `out (+)= x [m, k] · wᵀ` for `n` weight rows of `k` with element `(j, l)` of `w` at
/// `j · w_strides.0 + l · w_strides.1` (`(k, 1)`: row-major), into rows of `out` that are
/// `row_stride` elements apart (added to what they hold when `accumulate`).
///
/// # Safety
/// `out` must address `m` rows of `n` f32s, `row_stride` apart, that nothing else reads or
/// writes during the call and that alias neither input. `w_strides` must be `(k, 1)` or
/// `(1, n)`.
unsafe fn gemm_xwt_raw(
    x: &[f32],
    (w, (w_row, w_col)): (&[f32], (usize, usize)),
    (m, k, n): (usize, usize, usize),
    out: *mut f32,
    row_stride: usize,
    accumulate: bool,
    parallelism: gemm::Parallelism,
) {
    assert_eq!(x.len(), m * k, "x is not [m, k]");
    assert_eq!(w.len(), n * k, "w is not [n, k]");
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    debug_assert!((w_row, w_col) == (k, 1) || (w_row, w_col) == (1, n), "w is neither row- nor column-major");
    // SAFETY: `out` as the caller guarantees; x is row-major `[m, k]` (column stride 1,
    // row stride k) and wᵀ's column `j` is w's row `j` (wᵀ's column stride is w's row
    // stride, its row stride w's column stride); either layout of `n · k` elements stays
    // inside the slices asserted above.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out,
            1,
            row_stride as isize,
            accumulate,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            w_row as isize,
            w_col as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_naive_product_with_bias() {
        let (m, k, n) = (3, 5, 4);
        let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let b: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let got = matmul_xwt(&x, &w, Some(&b), m, k, n);
        for i in 0..m {
            for j in 0..n {
                let want: f32 = b[j] + (0..k).map(|l| x[i * k + l] * w[j * k + l]).sum::<f32>();
                assert!((got[i * n + j] - want).abs() < 1e-5, "({i},{j}): {} vs {want}", got[i * n + j]);
            }
        }
    }
}
