//! The recurrent (Gated DeltaNet) ops on the GPU: the kernels of `cuda/recurrent.cu` behind
//! the CPU backend's checks.
//!
//! Pools: the convolution's window `[slots, c, w - 1]` is bf16 (the float dtype: its
//! entries are copies of bf16 inputs), the delta rule's matrices `[slots, h_v, d_k, d_v]`
//! f32. `cu_seqlens` and `slots` are read by the kernels on the device and checked on the
//! host beforehand from their host copies (`check::recurrent_runs`), as attention's
//! metadata is; the grid depends only on shapes, so a step without snapshots issues
//! nothing but kernels and can be captured in a graph. Snapshots are a host slice, uploaded
//! per call into a small `u32 [n, 2]` table, so they are for eager steps: an op with
//! snapshots refuses to be recorded in a graph, which would replay its recording's table.
//!
//! The delta rule is the fused recurrent form, one row after another per head, for decode
//! steps and short prefills; a step with a long sequence takes the chunked (WY) form of
//! `chunked_delta.rs`.

use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::{CudaBackend, chunked_delta, elementwise, expect_dtype, launch, per_row, ptr, storage};
use crate::backend::{DeltaRule, RecurrentBatch, StateSnapshot};
use crate::check::SeqRun;
use crate::error::{Error, Result};
use crate::{DType, Tensor};

/// The kernels of `recurrent.cu`, looked up at startup.
pub(super) const KERNELS: [&str; 13] = [
    "state_slot_jobs",
    "gated_delta_rule_bf16_cols_k128_v128",
    "gated_delta_rule_bf16_seqs_k128_v128",
    "causal_conv1d_bf16",
    "conv_states_bf16",
    "causal_conv1d_step_w4_bf16",
    "gated_delta_rule_bf16_cols_r8",
    "gated_delta_rule_bf16_cols_r16",
    "gated_delta_rule_bf16_cols_r32",
    "gated_delta_rule_bf16_cols_r64",
    "rms_norm_gated_bf16",
    "rms_norm_gated_bf16_wf32",
    "sigmoid_mul_bf16",
];

/// `DELTA_WARPS` of `recurrent.cu`: warps per block.
const DELTA_WARPS: usize = 4;

/// `DeltaDims` of `recurrent.cu`, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct DeltaDims {
    pub(super) hk: u32,
    pub(super) hv: u32,
    pub(super) dk: u32,
    pub(super) dv: u32,
    pub(super) n_snap: u32,
    /// The fused kernel leaves sequences of this many rows or more to the chunked form.
    pub(super) below: u32,
}

// SAFETY: `repr(C)` plain data with the field order and types of the CUDA struct of the
// same name (six u32: no padding).
unsafe impl DeviceRepr for DeltaDims {}

const BF16: &[DType] = &[DType::BF16];

pub(super) fn zero_state_slots(b: &CudaBackend, pools: &[&Tensor], slots: &[u32]) -> Result<()> {
    const OP: &str = "zero_state_slots";
    crate::check::state_slots(OP, pools, slots.iter().copied())?;
    let mut jobs = vec![];
    for pool in pools {
        let (buf, per_slot) = (&storage(OP, pool)?.buf, slot_bytes(OP, pool)?);
        for &s in slots {
            jobs.push(SlotJob { src: None, dst: buf.ptr() + s as u64 * per_slot as u64, bytes: per_slot as u64 });
        }
    }
    run_slot_jobs(b, OP, &jobs)
}

/// Every pool's copy of every pair, with the effect of one copy after another in the order
/// given (so a chain of pairs reads what the earlier pairs wrote, as on the CPU): the pairs
/// go in waves, a pair starting a new wave when it reads or writes a slot its wave writes,
/// or writes one its wave reads.
pub(super) fn copy_state_slots(b: &CudaBackend, pools: &[&Tensor], pairs: &[(u32, u32)]) -> Result<()> {
    const OP: &str = "copy_state_slots";
    crate::check::state_slots(OP, pools, pairs.iter().flat_map(|&(a, b)| [a, b]))?;
    let pairs: Vec<(u32, u32)> = pairs.iter().copied().filter(|&(from, to)| from != to).collect();
    for wave in copy_waves(&pairs) {
        let mut jobs = vec![];
        for pool in pools {
            let (buf, per_slot) = (&storage(OP, pool)?.buf, slot_bytes(OP, pool)?);
            let at = |slot: u32| buf.ptr() + slot as u64 * per_slot as u64;
            for &(from, to) in wave {
                jobs.push(SlotJob { src: Some(at(from)), dst: at(to), bytes: per_slot as u64 });
            }
        }
        run_slot_jobs(b, OP, &jobs)?;
    }
    Ok(())
}

/// The pairs cut into runs whose copies may all happen at once: no pair reads or writes a
/// slot an earlier pair of its run writes, or writes a slot an earlier pair of its run reads.
fn copy_waves(pairs: &[(u32, u32)]) -> Vec<&[(u32, u32)]> {
    use std::collections::HashSet;
    let (mut waves, mut start) = (vec![], 0);
    let (mut reads, mut writes) = (HashSet::new(), HashSet::new());
    for (i, &(from, to)) in pairs.iter().enumerate() {
        if writes.contains(&from) || writes.contains(&to) || reads.contains(&to) {
            waves.push(&pairs[start..i]);
            (start, reads, writes) = (i, HashSet::new(), HashSet::new());
        }
        reads.insert(from);
        writes.insert(to);
    }
    if start < pairs.len() {
        waves.push(&pairs[start..]);
    }
    waves
}

/// One copy (or, without a source, zeroing) of `bytes` device bytes.
struct SlotJob {
    src: Option<u64>,
    dst: u64,
    bytes: u64,
}

/// Bytes of a job one block of `state_slot_jobs` takes.
const SLOT_JOB_SPAN: u64 = 64 << 10;
/// Jobs of one launch (the grid's `y` limit).
const SLOT_JOBS_PER_LAUNCH: usize = 65_535;

/// Runs `jobs`, which touch disjoint bytes, in as few launches as the grid allows; while a
/// graph is recorded (which would replay this call's table), one driver call a job instead.
fn run_slot_jobs(b: &CudaBackend, op: &'static str, jobs: &[SlotJob]) -> Result<()> {
    if b.dev.recording_here() {
        for job in jobs {
            // SAFETY: the jobs are slots of live pools, checked against them by the caller, and
            // a copy's two slots differ.
            unsafe { b.dev.copy_or_zero_raw(job.src, job.dst, job.bytes as usize) }?;
        }
        return Ok(());
    }
    for batch in jobs.chunks(SLOT_JOBS_PER_LAUNCH) {
        let widest = batch.iter().map(|j| j.bytes).max().unwrap_or(0);
        if widest == 0 {
            continue;
        }
        let split = |v: u64| [v as u32, (v >> 32) as u32];
        let table: Vec<u32> =
            batch.iter().flat_map(|j| [split(j.src.unwrap_or(0)), split(j.dst), split(j.bytes)]).flatten().collect();
        let table = b.upload_u32(&table, &[batch.len(), 6])?;
        let cfg = LaunchConfig {
            grid_dim: (as_u32(op, "blocks a job", widest.div_ceil(SLOT_JOB_SPAN) as usize)?, batch.len() as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(b, "state_slot_jobs", cfg, [ptr(op, &table)?, SLOT_JOB_SPAN])?;
    }
    Ok(())
}

/// Bytes of one slot of a float `[slots, ..]` pool.
fn slot_bytes(op: &'static str, pool: &Tensor) -> Result<usize> {
    expect_dtype(op, pool, &[DType::F32, DType::BF16])?;
    Ok(pool.dims()[1..].iter().product::<usize>() * pool.dtype().size_in_bytes())
}

/// Checks the step's sequences against `t` rows and a pool of `capacity` slots, on the
/// host copies of `cu_seqlens` and `slots`.
fn check_runs(
    b: &CudaBackend,
    op: &'static str,
    batch: &RecurrentBatch<'_>,
    t: usize,
    capacity: usize,
) -> Result<Vec<SeqRun>> {
    let (cu, slots) = (b.host_u32(op, batch.cu_seqlens)?, b.host_u32(op, batch.slots)?);
    crate::check::recurrent_runs(op, (&cu, &slots), batch.snapshots, t, capacity)
}

/// The snapshots as the kernels read them, `u32 [n, 2]` of (row, slot), and its address
/// (0 when there are none, so a step without snapshots uploads nothing).
///
/// # Errors
/// Snapshots while a graph is recorded: the graph would replay the table of the recording.
fn snapshot_table(b: &CudaBackend, op: &'static str, snapshots: &[StateSnapshot]) -> Result<(Option<Tensor>, u64)> {
    if snapshots.is_empty() {
        return Ok((None, 0));
    }
    if b.dev.recording_here() {
        return Err(Error::InvalidArgument(format!("{op}: a step with state snapshots cannot be recorded in a graph")));
    }
    let pairs: Vec<u32> = snapshots.iter().flat_map(|s| [s.row, s.slot]).collect();
    let table = b.upload_u32(&pairs, &[snapshots.len(), 2])?;
    let at = ptr("snapshots", &table)?;
    Ok((Some(table), at))
}

/// A grid-wide launch count as the kernels take it.
fn as_u32(op: &'static str, what: &str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::InvalidArgument(format!("{op}: {n} {what} exceed the kernel's u32 indices")))
}

/// The width `causal_conv1d_step_w4_bf16` takes, and the longest run it takes: a step of
/// sequences this short (decode steps, speculative verifies) runs its outputs and windows
/// in that one launch, each thread walking one sequence's rows of one channel.
const STEP_WIDTH: usize = 4;
const STEP_MAX_ROWS: usize = 8;

pub(super) fn causal_conv1d(
    b: &CudaBackend,
    x: &Tensor,
    weight: &Tensor,
    state: &Tensor,
    batch: &RecurrentBatch<'_>,
) -> Result<Tensor> {
    const OP: &str = "causal_conv1d";
    let crate::check::Conv { t, c, w, capacity } = crate::check::causal_conv1d(x, weight, state, batch)?;
    for operand in [x, weight, state] {
        expect_dtype(OP, operand, BF16)?;
    }
    let runs = check_runs(b, OP, batch, t, capacity)?;
    let out = b.alloc(&[t, c], DType::BF16)?;
    if t == 0 || c == 0 {
        return Ok(out);
    }
    let seqs = as_u32(OP, "sequences", batch.slots.elem_count())?;
    let (c32, w32) = (as_u32(OP, "channels", c)?, as_u32(OP, "taps", w)?);
    as_u32(OP, "rows", t)?;
    let (xp, sp, cu, slots) = (ptr(OP, x)?, ptr(OP, state)?, ptr(OP, batch.cu_seqlens)?, ptr(OP, batch.slots)?);
    let (wp, op_) = (ptr(OP, weight)?, ptr(OP, &out)?);
    let (_table, snaps) = snapshot_table(b, OP, batch.snapshots)?;
    let n_snap = as_u32(OP, "snapshots", batch.snapshots.len())?;
    if w == STEP_WIDTH && runs.iter().all(|r| r.end - r.start <= STEP_MAX_ROWS) {
        let cfg = elementwise(seqs as usize * c);
        launch!(b, "causal_conv1d_step_w4_bf16", cfg, [xp, wp, sp, cu, slots, snaps, n_snap, op_, seqs, c32])?;
        return Ok(out);
    }
    launch!(b, "causal_conv1d_bf16", elementwise(t * c), [xp, wp, sp, cu, slots, op_, seqs, c32, w32, (t * c) as u64])?;
    if w > 1 {
        // After the outputs, which read the old windows (stream order, and each kernel
        // waits for the one before it).
        let cfg = elementwise(seqs as usize * c);
        launch!(b, "conv_states_bf16", cfg, [xp, sp, cu, slots, snaps, n_snap, seqs, c32, w32])?;
    }
    Ok(out)
}

/// The delta-rule kernel for key heads of `dk` and value heads of `dv`: the one built for
/// 128 by 128 (Qwen3.5/3.6, Qwen3-Next: 64 registers a thread, against 254 with the dims at
/// run time), else `_cols_r{R}` (`R` key rows a warp, 32 value columns a block).
fn delta_kernel(dk: usize, dv: usize) -> Result<&'static str> {
    if (dk, dv) == (128, 128) {
        return Ok("gated_delta_rule_bf16_cols_k128_v128");
    }
    Ok(match dk {
        0..=32 => "gated_delta_rule_bf16_cols_r8",
        33..=64 => "gated_delta_rule_bf16_cols_r16",
        65..=128 => "gated_delta_rule_bf16_cols_r32",
        129..=256 => "gated_delta_rule_bf16_cols_r64",
        _ => return Err(Error::InvalidArgument(format!("gated_delta_rule: key heads of {dk} (the kernels take 256)"))),
    })
}

/// Value columns of a delta-rule block: a warp's lanes.
const DELTA_COLUMNS: usize = 32;

pub(super) fn gated_delta_rule(
    b: &CudaBackend,
    (qkv, a, gb): (&Tensor, &Tensor, &Tensor),
    rule: &DeltaRule<'_>,
    state: &Tensor,
    batch: &RecurrentBatch<'_>,
) -> Result<Tensor> {
    const OP: &str = "gated_delta_rule";
    let (t, capacity) = crate::check::gated_delta_rule((qkv, a, gb), rule, state, batch)?;
    for operand in [qkv, a, gb] {
        expect_dtype(OP, operand, BF16)?;
    }
    for operand in [rule.a_log, rule.dt_bias, state] {
        expect_dtype(OP, operand, &[DType::F32])?;
    }
    let (hk, hv, dk, dv) = (rule.num_key_heads, rule.num_value_heads, rule.key_dim, rule.value_dim);
    let kernel = delta_kernel(dk, dv)?;
    let runs = check_runs(b, OP, batch, t, capacity)?;
    let out = b.alloc(&[t, hv, dv], DType::BF16)?;
    if t == 0 {
        return Ok(out);
    }
    let dims = DeltaDims {
        hk: as_u32(OP, "key heads", hk)?,
        hv: as_u32(OP, "value heads", hv)?,
        dk: dk as u32,
        dv: as_u32(OP, "value columns", dv)?,
        n_snap: as_u32(OP, "snapshots", batch.snapshots.len())?,
        below: u32::MAX,
    };
    let (a_log, dt_bias) = (rule.a_log, rule.dt_bias);
    let chunked = chunked_delta::Launch { qkv, a, gb, a_log, dt_bias, state, out: &out };
    // The long sequences take the chunked form, the rest (decode rows, short tails) the fused kernel.
    let from = b.chunked_from;
    let dims = if chunked_delta::try_run(b, &chunked, &runs, dims, from)? {
        if runs.iter().all(|r| r.end - r.start >= from) {
            return Ok(out);
        }
        DeltaDims { below: from as u32, ..dims }
    } else {
        dims
    };
    let (_table, snaps) = snapshot_table(b, OP, batch.snapshots)?;
    let seqs = as_u32(OP, "sequences", batch.slots.elem_count())?;
    let cfg = LaunchConfig {
        grid_dim: (as_u32(OP, "column tiles", dv.div_ceil(DELTA_COLUMNS))?, dims.hv, seqs),
        block_dim: ((DELTA_WARPS * 32) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let operands = [ptr(OP, qkv)?, ptr(OP, a)?, ptr(OP, gb)?, ptr(OP, rule.a_log)?, ptr(OP, rule.dt_bias)?];
    let (sp, cu, slots, op_) = (ptr(OP, state)?, ptr(OP, batch.cu_seqlens)?, ptr(OP, batch.slots)?, ptr(OP, &out)?);
    let [q, ap, bp, alog, dtb] = operands;
    if let (Some(per), (128, 128)) = (b.gdr_seqs, (dk, dv)) {
        let cfg = LaunchConfig { grid_dim: (cfg.grid_dim.0, cfg.grid_dim.1, seqs.div_ceil(per)), ..cfg };
        let kernel = "gated_delta_rule_bf16_seqs_k128_v128";
        launch!(b, kernel, cfg, [q, ap, bp, alog, dtb, sp, cu, slots, snaps, op_, dims, seqs, per])?;
    } else {
        launch!(b, kernel, cfg, [q, ap, bp, alog, dtb, sp, cu, slots, snaps, op_, dims])?;
    }
    Ok(out)
}

/// How many sequences a block of the fused delta rule walks at 128 by 128 heads
/// (`gated_delta_rule_bf16_seqs_k128_v128`, the next one's state requested while the
/// current one computes): `MET_GDR_SEQS=N`, N from 1 to 64, for measuring against the
/// block-a-sequence kernel (unset: that kernel). Same bits either way.
pub(super) fn seqs_per_block_from_env() -> Result<Option<u32>> {
    const VAR: &str = "MET_GDR_SEQS";
    match std::env::var(VAR).as_deref() {
        Err(_) | Ok("") => Ok(None),
        Ok(v) => match v.parse::<u32>() {
            Ok(n) if (1..=64).contains(&n) => Ok(Some(n)),
            _ => Err(Error::InvalidArgument(format!("{VAR}={v}: expected a count of sequences from 1 to 64"))),
        },
    }
}

pub(super) fn rms_norm_gated(b: &CudaBackend, x: &Tensor, z: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    const OP: &str = "rms_norm_gated";
    let d = crate::check::rms_norm_gated(x, z, weight)?;
    expect_dtype(OP, x, BF16)?;
    expect_dtype(OP, z, BF16)?;
    expect_dtype(OP, weight, &[DType::BF16, DType::F32])?;
    let out = b.alloc(x.dims(), DType::BF16)?;
    let rows = x.elem_count() / d;
    if rows == 0 {
        return Ok(out);
    }
    let kernel = if weight.dtype() == DType::F32 { "rms_norm_gated_bf16_wf32" } else { "rms_norm_gated_bf16" };
    let (cfg, n) = (per_row(as_u32(OP, "rows", rows)? as usize, d, 1024), as_u32(OP, "columns", d)?);
    launch!(b, kernel, cfg, [ptr(OP, x)?, ptr(OP, z)?, ptr(OP, weight)?, ptr(OP, &out)?, n, eps])?;
    Ok(out)
}

/// `x · sigmoid(gate)`, plus `y` where given (`sigmoid_mul_add`: one kernel for the two ops).
pub(super) fn sigmoid_mul(b: &CudaBackend, x: &Tensor, gate: &Tensor, y: Option<&Tensor>) -> Result<Tensor> {
    const OP: &str = "sigmoid_mul";
    let span = crate::check::sigmoid_mul(x, gate)?;
    expect_dtype(OP, x, BF16)?;
    expect_dtype(OP, gate, BF16)?;
    let yp = match y {
        Some(y) => {
            crate::error::ensure(y.dims() == x.dims(), "sigmoid_mul_add", || {
                format!("y {:?} is not shaped as x {:?}", y.dims(), x.dims())
            })?;
            expect_dtype(OP, y, BF16)?;
            ptr(OP, y)?
        }
        None => 0,
    };
    let out = b.alloc(x.dims(), DType::BF16)?;
    let n = x.elem_count();
    if n > 0 {
        let args = (ptr(OP, x)?, ptr(OP, gate)?, yp, ptr(OP, &out)?, span as u64, n as u64);
        launch!(b, "sigmoid_mul_bf16", elementwise(n), [args.0, args.1, args.2, args.3, args.4, args.5])?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::copy_waves;

    #[test]
    fn copies_share_a_wave_unless_one_touches_what_another_writes() {
        assert_eq!(copy_waves(&[(0, 1), (0, 2), (3, 4)]), [&[(0, 1), (0, 2), (3, 4)][..]]);
        // Reads what an earlier copy wrote; overwrites what an earlier copy reads; writes twice.
        assert_eq!(copy_waves(&[(0, 1), (1, 2)]), [&[(0, 1)][..], &[(1, 2)][..]]);
        assert_eq!(copy_waves(&[(1, 3), (0, 1)]), [&[(1, 3)][..], &[(0, 1)][..]]);
        assert_eq!(copy_waves(&[(0, 1), (2, 1), (5, 6)]), [&[(0, 1)][..], &[(2, 1), (5, 6)][..]]);
        assert!(copy_waves(&[]).is_empty());
    }
}
