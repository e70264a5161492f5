//! The LoRA ops on the CPU: per run of consecutive rows in one slot, the shrink
//! `x[rows] · A[slot]ᵀ` and the expansion `· B[slot]ᵀ` as two f32 products
//! ([`matmul_xwt`]), scaled and added into a copy of the base output, in PEFT's order
//! (`base + (x·Aᵀ·Bᵀ) · scale`). Each row of both products is that row's alone, so a row's
//! result never depends on the rows beside it; a slot's zero-padded ranks add exact zeros,
//! so a padded adapter computes as the unpadded one.

use super::matmul::matmul_xwt;
use super::{f32_tensor, read_f32, read_u32, write_f32};
use crate::backend::lora::{self as operands, LoraDims};
use crate::backend::{LoraSlots, LoraStack, NO_LORA_SLOT};
use crate::error::{Result, ensure};
use crate::{DType, Tensor};

const OP: &str = "lora_shrink_expand";

pub(super) fn lora_shrink_expand(x: &Tensor, out: &Tensor, lora: &LoraSlots<'_>) -> Result<Tensor> {
    let dims = operands::check(OP, x, out, lora)?;
    let rows = read_u32(OP, lora.rows)?;
    operands::check_rows(OP, &rows, dims.slots)?;
    if let Some(groups) = lora.groups {
        operands::check_groups(OP, &rows, &read_u32(OP, groups)?, dims.slots)?;
    }
    let (xs, scales) = (read_f32(OP, x)?, read_f32(OP, lora.scales)?);
    let mut result = read_f32(OP, out)?.to_vec();
    let mut start = 0;
    while start < dims.t {
        let slot = rows[start];
        let end = start + rows[start..].iter().take_while(|&&s| s == slot).count();
        if slot != NO_LORA_SLOT {
            for stack in lora.stacks {
                let run = Run { rows: start..end, slot: slot as usize, scale: scales[slot as usize] };
                add_delta(&xs, stack, &dims, &run, &mut result)?;
            }
        }
        start = end;
    }
    Ok(f32_tensor(result, &[dims.t, dims.width]))
}

/// Consecutive rows through one slot.
struct Run {
    rows: std::ops::Range<usize>,
    slot: usize,
    scale: f32,
}

/// Adds `run`'s delta of one module into `result [t, width]`.
fn add_delta(xs: &[f32], stack: &LoraStack<'_>, d: &LoraDims, run: &Run, result: &mut [f32]) -> Result<()> {
    let (a, b) = (read_f32(OP, stack.a)?, read_f32(OP, stack.b)?);
    let (k, r, m) = (d.k, d.rank, run.rows.len());
    let n = stack.b.dims()[1];
    let a = &a[run.slot * r * k..(run.slot + 1) * r * k];
    let b = &b[run.slot * n * r..(run.slot + 1) * n * r];
    let shrunk = matmul_xwt(&xs[run.rows.start * k..run.rows.end * k], a, None, m, k, r);
    let delta = matmul_xwt(&shrunk, b, None, m, r, n);
    for (i, row) in delta.chunks_exact(n.max(1)).enumerate() {
        let at = (run.rows.start + i) * d.width + stack.column;
        for (o, dv) in result[at..at + n].iter_mut().zip(row) {
            *o += dv * run.scale;
        }
    }
    Ok(())
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
