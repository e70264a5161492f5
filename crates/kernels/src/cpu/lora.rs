//! The LoRA ops on the CPU: per run of consecutive rows in one slot, the shrink
//! `x[rows] · A[slot]ᵀ` and the expansion `· B[slot]ᵀ` as two f32 products
//! ([`matmul_xwt`]), scaled and added into a copy of the base output, in PEFT's order
//! (`base + (x·Aᵀ·Bᵀ) · scale`). Each row of both products is that row's alone, so a row's
//! result never depends on the rows beside it; a slot's zero-padded ranks add exact zeros,
//! so a padded adapter computes as the unpadded one.

use super::matmul::matmul_xwt;
use super::{f32_tensor, read_f32, read_u32, write_f32};
use crate::backend::lora as operands;
use crate::backend::{LoraSlots, NO_LORA_SLOT};
use crate::error::{Result, ensure};
use crate::{DType, Tensor};

pub(super) fn lora_shrink(x: &Tensor, lora: &LoraSlots<'_>) -> Result<Tensor> {
    const OP: &str = "lora_shrink";
    let d = operands::check_shrink(OP, x, lora)?;
    let rows = checked_rows(OP, lora, d.slots)?;
    let xs = read_f32(OP, x)?;
    let (parts, r, k) = (lora.stacks.len(), d.rank, d.k);
    let mut shrunk = vec![0.0f32; d.t * parts * r];
    for run in runs(&rows) {
        let m = run.rows.len();
        for (p, stack) in lora.stacks.iter().enumerate() {
            let a = read_f32(OP, stack.a)?;
            let a = &a[run.slot * r * k..(run.slot + 1) * r * k];
            let product = matmul_xwt(&xs[run.rows.start * k..run.rows.end * k], a, None, m, k, r);
            for (i, row) in product.chunks_exact(r.max(1)).enumerate() {
                let at = ((run.rows.start + i) * parts + p) * r;
                shrunk[at..at + r].copy_from_slice(row);
            }
        }
    }
    Ok(f32_tensor(shrunk, &[d.t, parts, r]))
}

pub(super) fn lora_expand(shrunk: &Tensor, out: &Tensor, lora: &LoraSlots<'_>) -> Result<Tensor> {
    const OP: &str = "lora_expand";
    let d = operands::check_expand(OP, shrunk, out, lora)?;
    let rows = checked_rows(OP, lora, d.slots)?;
    let (s, scales) = (read_f32(OP, shrunk)?, read_f32(OP, lora.scales)?);
    let (parts, r) = (lora.stacks.len(), d.rank);
    let mut result = read_f32(OP, out)?.to_vec();
    for run in runs(&rows) {
        let scale = scales[run.slot];
        for (p, stack) in lora.stacks.iter().enumerate() {
            let b = read_f32(OP, stack.b)?;
            let n = stack.b.dims()[1];
            let b = &b[run.slot * n * r..(run.slot + 1) * n * r];
            let mine: Vec<f32> =
                run.rows.clone().flat_map(|row| s[(row * parts + p) * r..][..r].iter().copied()).collect();
            let delta = matmul_xwt(&mine, b, None, run.rows.len(), r, n);
            for (i, row) in delta.chunks_exact(n.max(1)).enumerate() {
                let at = (run.rows.start + i) * d.width + stack.column;
                for (o, dv) in result[at..at + n].iter_mut().zip(row) {
                    *o += dv * scale;
                }
            }
        }
    }
    Ok(f32_tensor(result, &[d.t, d.width]))
}

/// The row slots of `lora`, checked against `slots` and against its row groups.
fn checked_rows(op: &'static str, lora: &LoraSlots<'_>, slots: usize) -> Result<Vec<u32>> {
    let rows = read_u32(op, lora.rows)?.to_vec();
    operands::check_rows(op, &rows, slots)?;
    if let Some(groups) = lora.groups {
        operands::check_groups(op, &rows, &read_u32(op, groups)?, slots)?;
    }
    Ok(rows)
}

/// Consecutive rows through one slot.
struct Run {
    rows: std::ops::Range<usize>,
    slot: usize,
}

/// The runs of consecutive rows through one adapter's slot, base rows left out.
fn runs(rows: &[u32]) -> Vec<Run> {
    let mut runs = Vec::new();
    let mut start = 0;
    while start < rows.len() {
        let slot = rows[start];
        let end = start + rows[start..].iter().take_while(|&&s| s == slot).count();
        if slot != NO_LORA_SLOT {
            runs.push(Run { rows: start..end, slot: slot as usize });
        }
        start = end;
    }
    runs
}

pub(super) fn lora_write_slot(stack: &Tensor, slot: usize, src: &Tensor) -> Result<()> {
    const OP: &str = "lora_write_slot";
    let per_slot = operands::check_slot_write(OP, stack, slot, src)?;
    ensure(stack.dtype() == DType::F32 && !stack.same_storage(src), OP, || "an f32 stack and another source".into())?;
    let values = read_f32(OP, src)?.to_vec();
    write_f32(OP, stack)?[slot * per_slot..(slot + 1) * per_slot].copy_from_slice(&values);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::LoraStack;
    use crate::{CpuBackend, GpuBackend, HostTensor};

    fn upload(b: &CpuBackend, v: &[f32], dims: &[usize]) -> Tensor {
        b.upload(&HostTensor::from_f32(v, dims), DType::F32).unwrap()
    }

    fn values(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 + seed) * 0.37).sin()).collect()
    }

    /// Rows 1..3 run through slot 1 (columns 2..5); rows 0 and 3 are the base model's and
    /// keep the base output; slot 0 holds another adapter no row uses.
    #[test]
    fn adds_the_scaled_delta_to_its_rows_and_columns_only() {
        let b = CpuBackend::new();
        let (t, k, width, r, n, slots) = (4, 3, 6, 2, 3, 2);
        let (xv, ov, av, bv) =
            (values(t * k, 0.0), values(t * width, 1.0), values(slots * r * k, 2.0), values(slots * n * r, 3.0));
        let (x, out, a, bb) = (
            upload(&b, &xv, &[t, k]),
            upload(&b, &ov, &[t, width]),
            upload(&b, &av, &[slots, r, k]),
            upload(&b, &bv, &[slots, n, r]),
        );
        let rows = b.upload(&HostTensor::from_u32(&[NO_LORA_SLOT, 1, 1, NO_LORA_SLOT], &[t]), DType::U32).unwrap();
        let scales = upload(&b, &[9.0, 0.5], &[slots]);
        let stacks = [LoraStack { a: &a, b: &bb, column: 2 }];
        let lora = LoraSlots { rows: &rows, scales: &scales, stacks: &stacks, groups: None };
        let got = b.download_f32(&b.lora_shrink_expand(&x, out, &lora).unwrap()).unwrap();
        let (a1, b1) = (&av[r * k..], &bv[n * r..]);
        for i in 0..t {
            for j in 0..width {
                let mut want = ov[i * width + j];
                if (1..3).contains(&i) && (2..5).contains(&j) {
                    let shrunk: Vec<f32> =
                        (0..r).map(|q| (0..k).map(|l| xv[i * k + l] * a1[q * k + l]).sum()).collect();
                    want += 0.5 * (0..r).map(|q| shrunk[q] * b1[(j - 2) * r + q]).sum::<f32>();
                }
                assert!((got[i * width + j] - want).abs() < 1e-5, "({i},{j}): {} vs {want}", got[i * width + j]);
            }
        }
    }

    #[test]
    fn refuses_columns_past_the_output() {
        let b = CpuBackend::new();
        let (x, out) = (upload(&b, &values(6, 0.0), &[2, 3]), upload(&b, &values(8, 0.0), &[2, 4]));
        let (a, bb) = (upload(&b, &values(6, 0.0), &[1, 2, 3]), upload(&b, &values(6, 0.0), &[1, 3, 2]));
        let rows = b.upload(&HostTensor::from_u32(&[0, 0], &[2]), DType::U32).unwrap();
        let scales = upload(&b, &[1.0], &[1]);
        let stacks = [LoraStack { a: &a, b: &bb, column: 2 }];
        let lora = LoraSlots { rows: &rows, scales: &scales, stacks: &stacks, groups: None };
        assert!(b.lora_shrink_expand(&x, out, &lora).is_err());
    }

    #[test]
    fn writes_one_slot_and_leaves_the_others() {
        let b = CpuBackend::new();
        let stack = upload(&b, &[1.0; 12], &[3, 2, 2]);
        b.lora_write_slot(&stack, 1, &upload(&b, &[5.0, 6.0, 7.0, 8.0], &[2, 2])).unwrap();
        let got = b.download_f32(&stack).unwrap();
        assert_eq!(got, [1.0, 1.0, 1.0, 1.0, 5.0, 6.0, 7.0, 8.0, 1.0, 1.0, 1.0, 1.0]);
        assert!(b.lora_write_slot(&stack, 3, &upload(&b, &[0.0; 4], &[2, 2])).is_err());
        assert!(b.lora_write_slot(&stack, 0, &upload(&b, &[0.0; 3], &[3])).is_err());
    }
}
