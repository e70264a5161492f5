//! The LoRA delta on the CPU: per segment, the shrink `x[rows] · Aᵀ` and the expansion
//! `· Bᵀ` as two f32 products ([`matmul_xwt`]), scaled and added into a copy of the base
//! output, in PEFT's order (`base + (x·Aᵀ·Bᵀ) · scale`). Each row of both products is
//! that row's alone, so a row's result never depends on the rows beside it.

use super::matmul::matmul_xwt;
use super::{f32_tensor, read_f32};
use crate::backend::LoraSegment;
use crate::error::{Result, ensure};
use crate::{DType, Tensor};

const OP: &str = "lora_shrink_expand";

pub(super) fn lora_shrink_expand(x: &Tensor, out: &Tensor, segments: &[LoraSegment<'_>]) -> Result<Tensor> {
    let (t, k, width) = check(x, out)?;
    let xs = read_f32(OP, x)?;
    let mut result = read_f32(OP, out)?.to_vec();
    for s in segments {
        let (r, n) = check_segment(s, t, k, width)?;
        let m = s.rows.len();
        let (a, b) = (read_f32(OP, s.a)?, read_f32(OP, s.b)?);
        let shrunk = matmul_xwt(&xs[s.rows.start * k..s.rows.end * k], &a, None, m, k, r);
        let delta = matmul_xwt(&shrunk, &b, None, m, r, n);
        for (i, row) in delta.chunks_exact(n).enumerate() {
            let at = (s.rows.start + i) * width + s.column;
            for (o, d) in result[at..at + n].iter_mut().zip(row) {
                *o += d * s.scale;
            }
        }
    }
    Ok(f32_tensor(result, &[t, width]))
}

/// `(t, in, N)` of `x [t, in]` and `out [t, N]`.
fn check(x: &Tensor, out: &Tensor) -> Result<(usize, usize, usize)> {
    let (xd, od) = (x.dims(), out.dims());
    ensure(xd.len() == 2 && od.len() == 2 && xd[0] == od[0], OP, || format!("x {xd:?} and out {od:?}"))?;
    ensure(x.dtype() == DType::F32 && out.dtype() == DType::F32, OP, || "x and out must be f32".into())?;
    Ok((xd[0], xd[1], od[1]))
}

/// `(r, n)` of a segment whose `a [r, in]` and `b [n, r]` fit `x` and `out`.
fn check_segment(s: &LoraSegment<'_>, t: usize, k: usize, width: usize) -> Result<(usize, usize)> {
    let (ad, bd) = (s.a.dims(), s.b.dims());
    ensure(ad.len() == 2 && bd.len() == 2 && ad[1] == k && bd[1] == ad[0], OP, || {
        format!("a {ad:?} and b {bd:?} for inputs of {k}")
    })?;
    ensure(s.rows.start <= s.rows.end && s.rows.end <= t, OP, || format!("rows {:?} of {t}", s.rows))?;
    ensure(s.column + bd[0] <= width, OP, || format!("columns {}..{} of {width}", s.column, s.column + bd[0]))?;
    Ok((ad[0], bd[0]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CpuBackend, GpuBackend, HostTensor};

    fn upload(b: &CpuBackend, v: &[f32], dims: &[usize]) -> Tensor {
        b.upload(&HostTensor::from_f32(v, dims), DType::F32).unwrap()
    }

    fn values(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 + seed) * 0.37).sin()).collect()
    }

    /// Rows 1..3 get the delta in columns 2..5; rows 0 and 3 keep the base output.
    #[test]
    fn adds_the_scaled_delta_to_its_rows_and_columns_only() {
        let b = CpuBackend::new();
        let (t, k, width, r, n) = (4, 3, 6, 2, 3);
        let (xv, ov, av, bv) = (values(t * k, 0.0), values(t * width, 1.0), values(r * k, 2.0), values(n * r, 3.0));
        let (x, out, a, bb) = (
            upload(&b, &xv, &[t, k]),
            upload(&b, &ov, &[t, width]),
            upload(&b, &av, &[r, k]),
            upload(&b, &bv, &[n, r]),
        );
        let seg = LoraSegment { rows: 1..3, a: &a, b: &bb, scale: 0.5, column: 2 };
        let got = b.download_f32(&b.lora_shrink_expand(&x, &out, &[seg]).unwrap()).unwrap();
        for i in 0..t {
            for j in 0..width {
                let mut want = ov[i * width + j];
                if (1..3).contains(&i) && (2..5).contains(&j) {
                    let shrunk: Vec<f32> =
                        (0..r).map(|q| (0..k).map(|l| xv[i * k + l] * av[q * k + l]).sum()).collect();
                    want += 0.5 * (0..r).map(|q| shrunk[q] * bv[(j - 2) * r + q]).sum::<f32>();
                }
                assert!((got[i * width + j] - want).abs() < 1e-5, "({i},{j}): {} vs {want}", got[i * width + j]);
            }
        }
    }

    #[test]
    fn refuses_columns_past_the_output() {
        let b = CpuBackend::new();
        let (x, out) = (upload(&b, &values(6, 0.0), &[2, 3]), upload(&b, &values(8, 0.0), &[2, 4]));
        let (a, bb) = (upload(&b, &values(6, 0.0), &[2, 3]), upload(&b, &values(6, 0.0), &[3, 2]));
        let seg = LoraSegment { rows: 0..2, a: &a, b: &bb, scale: 1.0, column: 2 };
        assert!(b.lora_shrink_expand(&x, &out, &[seg]).is_err());
    }
}
