//! The recurrent (Gated DeltaNet) ops on the CPU, following transformers'
//! `modeling_qwen3_next.py` (`torch_causal_conv1d_fn`, `torch_recurrent_gated_delta_rule`,
//! `Qwen3NextRMSNormGated`).
//!
//! States live in f32 pools the caller owns; the convolution (`conv.rs`) and the delta rule
//! (`delta.rs`, its recurrence over value columns in `columns.rs`) update each sequence's
//! slot in place and copy snapshots out as they pass the snapshot rows. Every op computes a
//! row the same way whatever step it arrives in, so a sequence's outputs never depend on
//! how its rows were batched (the delta rule runs row by row even in a long prompt). `check::recurrent_runs` has
//! already made every slot a step writes distinct, which is what lets the pool's tasks write
//! the pool through one shared pointer without meeting.

mod columns;
mod conv;
mod delta;
#[cfg(test)]
mod op_tests;
#[cfg(test)]
#[path = "../../tests/ops/recurrent_reference.rs"]
mod reference;
#[cfg(test)]
mod tests;

pub(super) use conv::causal_conv1d;
pub(super) use delta::gated_delta_rule;

use crate::Tensor;
use crate::backend::RecurrentBatch;
use crate::check::SeqRun;
use crate::error::Result;

use super::ops::for_each_row;
use super::{f32_tensor, read_f32, read_u32, write_f32};

/// Elements per task of the elementwise ops.
const ELEMS_PER_TASK: usize = 1 << 12;

pub(super) fn zero_state_slots(pools: &[&Tensor], slots: &[u32]) -> Result<()> {
    crate::check::state_slots("zero_state_slots", pools, slots.iter().copied())?;
    for pool in pools {
        let per_slot = slot_elems(pool);
        let mut data = write_f32("zero_state_slots", pool)?;
        for &s in slots {
            data[s as usize * per_slot..][..per_slot].fill(0.0);
        }
    }
    Ok(())
}

pub(super) fn copy_state_slots(pools: &[&Tensor], pairs: &[(u32, u32)]) -> Result<()> {
    crate::check::state_slots("copy_state_slots", pools, pairs.iter().flat_map(|&(a, b)| [a, b]))?;
    for pool in pools {
        let per_slot = slot_elems(pool);
        let mut data = write_f32("copy_state_slots", pool)?;
        for &(from, to) in pairs {
            data.copy_within(from as usize * per_slot..(from as usize + 1) * per_slot, to as usize * per_slot);
        }
    }
    Ok(())
}

/// Elements of one slot of a `[slots, ..]` pool.
fn slot_elems(pool: &Tensor) -> usize {
    pool.dims()[1..].iter().product()
}

/// The checked sequences of a step over `t` rows and a pool of `capacity` slots.
fn read_runs(op: &'static str, batch: &RecurrentBatch<'_>, t: usize, capacity: usize) -> Result<Vec<SeqRun>> {
    let (cu, slots) = (read_u32(op, batch.cu_seqlens)?, read_u32(op, batch.slots)?);
    crate::check::recurrent_runs(op, (&cu, &slots), batch.snapshots, t, capacity)
}

pub(super) fn rms_norm_gated(x: &Tensor, z: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    let d = crate::check::rms_norm_gated(x, z, weight)?;
    let op = "rms_norm_gated";
    let (xs, zs, ws) = (read_f32(op, x)?, read_f32(op, z)?, read_f32(op, weight)?);
    let mut out = vec![0f32; xs.len()];
    for_each_row(&mut out, d, |i, o| {
        let (x, z) = (&xs[i * d..(i + 1) * d], &zs[i * d..(i + 1) * d]);
        let mean_sq = x.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let inv = 1.0 / (mean_sq + eps).sqrt();
        o.copy_from_slice(z);
        silu_in_place(o);
        for ((o, &x), &w) in o.iter_mut().zip(x).zip(ws.iter()) {
            *o *= w * (x * inv);
        }
    });
    Ok(f32_tensor(out, x.dims()))
}

pub(super) fn sigmoid_mul(x: &Tensor, gate: &Tensor) -> Result<Tensor> {
    let span = crate::check::sigmoid_mul(x, gate)?;
    let (xs, gs) = (read_f32("sigmoid_mul", x)?, read_f32("sigmoid_mul", gate)?);
    let mut out = vec![0f32; xs.len()];
    for_each_row(&mut out, ELEMS_PER_TASK, |i, o| {
        let at = i * ELEMS_PER_TASK;
        for (j, (o, &x)) in o.iter_mut().zip(&xs[at..]).enumerate() {
            *o = x * sigmoid(gs[(at + j) / span]);
        }
    });
    Ok(f32_tensor(out, x.dims()))
}

/// `1 / (1 + e^-x)`: `e^-x` overflows to infinity only where the result is 0.
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `x · sigmoid(x)` for every element, as `silu_mul` computes it: over `e = e^-|x|` (at
/// most 1, so nothing overflows), `x / (1 + e)` for `x >= 0` and `x e / (1 + e)` below, with
/// the softmax's vectorised exponential, built for AVX2 where the CPU has it.
fn silu_in_place(xs: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::quant::SimdLevel::current() >= crate::quant::SimdLevel::Avx2 {
        // SAFETY: the level is at least AVX2, so the CPU has AVX2.
        return unsafe { silu_in_place_avx2(xs) };
    }
    silu_in_place_body(xs);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn silu_in_place_avx2(xs: &mut [f32]) {
    silu_in_place_body(xs);
}

#[inline(always)]
fn silu_in_place_body(xs: &mut [f32]) {
    let mut e = [0f32; 64];
    for block in xs.chunks_mut(64) {
        let e = &mut e[..block.len()];
        for (e, &x) in e.iter_mut().zip(block.iter()) {
            *e = -x.abs();
        }
        super::attention::exp_in_place(e);
        for (x, &e) in block.iter_mut().zip(e.iter()) {
            *x = if *x >= 0.0 { *x } else { *x * e } / (1.0 + e);
        }
    }
}
