//! `x · Wᵀ` on the CPU: f32 weights through [`dot_f32_rows`], block-quantised ones through
//! `qmatmul`; every row of a product is the same bits whatever rows run beside it.

use super::qmatmul::add_bias;
use super::rows::products;
use crate::Tensor;
use crate::error::Result;
use crate::quant::dot_f32_rows;

use super::{QuantDots, WeightView, f32_tensor, read_f32, read_weight};

pub(super) fn matmul(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, dots: QuantDots) -> Result<Tensor> {
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
        WeightView::Packed(parts) => super::qmatmul::matmul_packed_parts(&xs, &parts, bs.as_deref(), m, dots),
    };
    Ok(f32_tensor(out, &[m, n]))
}

/// `x [m, k] · wᵀ` for row-major `w [n, k]`, plus `bias [n]`: row-major `[m, n]`, over the
/// spinning pool. Each row of the result is bit for bit that row's product alone
/// ([`dot_f32_rows`]), whatever `m` is.
///
/// # Panics
/// If the slice lengths do not match `m`, `k` and `n`.
pub fn matmul_xwt(x: &[f32], w: &[f32], bias: Option<&[f32]>, m: usize, k: usize, n: usize) -> Vec<f32> {
    assert_eq!(x.len(), m * k, "x is not [m, k]");
    assert_eq!(w.len(), n * k, "w is not [n, k]");
    if let Some(b) = bias {
        assert_eq!(b.len(), n, "bias is not [n]");
    }
    let out = products(n, m, &|run, out| dot_f32_rows(x, &w[run.start * k..run.end * k], k, out));
    add_bias(out, bias, n)
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
