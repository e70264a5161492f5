//! The LoRA ops on the GPU: the kernels of `cuda/lora.cu` behind the operand checks the CPU
//! backend shares (`backend::lora::check_shrink`, `check_expand`).
//!
//! A projection's deltas are two launches whatever its rows hold. The shrink runs on the
//! side stream, forked before the base product and joined by the expansion after it, so
//! the two overlap (a graph records the fork as a branch): the shrink of every row
//! to its slot's rank (f32, `[t, parts, rank]`: for a few rows a block per row, module and
//! rank index, so a decode step of one row still spreads over rank × modules blocks; for
//! many rows grouped by slot, tensor-core tiles of one adapter's rows), then the expansion
//! added into `out` in place (a lane per two columns; for a few rows a block per 64 columns
//! and a tile of rows, so the tile's rows of one adapter find its `b` in cache; for many
//! rows grouped by slot, a block per tile of one adapter's rows, which reads `b` once). Base rows are skipped
//! by the kernels themselves, reading the row-slot tensor on the device, so the launches
//! depend on shapes alone and a decode step records into a graph that replays with
//! whatever slots are written before it. The row slots are checked
//! on the host when their host copy is at hand (an eager step's upload); a graph's own
//! slot tensor has none, and a slot past the stacks is then a base row on the device.

use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::{CudaBackend, elementwise, expect_dtype, launch, ptr, storage};
use crate::backend::lora::{self as operands, LoraDims};
use crate::backend::{LORA_MAX_PARTS, LoraSlots};
use crate::error::{Error, Result};
use crate::{DType, Tensor};

/// The kernels of `lora.cu`, looked up at startup.
pub(super) const KERNELS: [&str; 5] =
    ["lora_shrink_bf16", "lora_shrink_grouped_bf16", "lora_expand_bf16", "lora_expand_grouped_bf16", "lora_copy_b16"];

/// `LORA_SHRINK_WARPS` of `lora.cu`: warps per shrink block, which split the inputs.
const SHRINK_WARPS: u32 = 4;

/// Rows from which a step with its rows grouped by slot takes the grouped shrink: below it
/// the per-row blocks spread a few rows over more of the device.
const GROUPED_FROM: usize = 16;

/// `LORA_GROUP_ROWS`, `LORA_GROUP_SPLIT`, `LORA_GROUP_BK`, `LORA_GROUP_STAGES`,
/// `LORA_GROUP_MAX_RANK` and `LORA_GROUP_THREADS` of `lora.cu`: the grouped shrink's row
/// tile, input spans (its cluster), columns per stage, stages, largest rank and threads.
const GROUP_ROWS: usize = 16;
const GROUP_SPLIT: u32 = 8;
const GROUP_BK: usize = 64;
const GROUP_STAGES: usize = 4;
const GROUP_MAX_RANK: usize = 64;
const GROUP_THREADS: u32 = 128;

/// `LORA_GROUP_EXPAND_WARPS` of `lora.cu`: warps of the grouped expansion's block, 64
/// columns each.
const GROUP_EXPAND_WARPS: u32 = 4;

/// `LORA_TILE_ROWS` of `lora.cu`: rows per expansion block.
const TILE_ROWS: usize = 64;

/// The most blocks a grid's third dimension holds: the shrink's ranks.
const MAX_GRID_Z: usize = 65_535;

/// `LORA_EXPAND_THREADS` of `lora.cu`: threads per expansion block.
const EXPAND_THREADS: u32 = 256;

/// `LORA_EXPAND_COLUMNS` of `lora.cu`: output columns per expansion block, two a lane.
const EXPAND_COLUMNS: u32 = 64;

/// `LoraParts` of `lora.cu`, passed by value: each module's stacks, output columns and
/// first column; unused parts are zero.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct LoraParts {
    a: [u64; LORA_MAX_PARTS],
    b: [u64; LORA_MAX_PARTS],
    n: [u32; LORA_MAX_PARTS],
    column: [u32; LORA_MAX_PARTS],
}

// SAFETY: `repr(C)` plain data with the field order and types of the CUDA struct of the
// same name (six u64 then six u32: 72 bytes, no padding on either side).
unsafe impl DeviceRepr for LoraParts {}

const BF16: &[DType] = &[DType::BF16];

/// A size as the kernels' u32 indices take it.
fn as_u32(op: &'static str, what: &str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::InvalidArgument(format!("{op}: {n} {what} exceed the kernel's u32 indices")))
}

/// Whether a step's rows take the grouped kernels: many rows, grouped by slot on the host,
/// shapes the tensor-core shrink takes, and no `--batch-invariant` (the grouped kernels
/// sum a row's shrink in another order than the per-row ones, so that setting keeps every
/// step on the per-row kernels).
fn grouped(b: &CudaBackend, lora: &LoraSlots<'_>, d: &LoraDims) -> bool {
    lora.groups.is_some()
        && !b.batch_invariant
        && d.t >= GROUPED_FROM
        && d.rank.is_multiple_of(16)
        && d.rank <= GROUP_MAX_RANK
        && d.k.is_multiple_of(8)
}

/// Checks the row slots (and their groups) against the stacks where their host copy is at
/// hand.
fn check_host_rows(op: &'static str, lora: &LoraSlots<'_>, slots: usize) -> Result<()> {
    let host_rows = storage(op, lora.rows)?.host_u32.lock().clone();
    if let Some(rows) = host_rows {
        operands::check_rows(op, &rows, slots)?;
        if let Some(groups) = lora.groups
            && let Some(groups) = storage(op, groups)?.host_u32.lock().as_ref()
        {
            operands::check_groups(op, &rows, groups, slots)?;
        }
    }
    Ok(())
}

/// The shrink runs on the side stream, forked from the compute stream here, so it overlaps
/// the base product the caller issues next; [`lora_expand`] joins it.
pub(super) fn lora_shrink(b: &CudaBackend, x: &Tensor, lora: &LoraSlots<'_>) -> Result<Tensor> {
    const OP: &str = "lora_shrink";
    let d = operands::check_shrink(OP, x, lora)?;
    expect_dtype(OP, x, BF16)?;
    check_host_rows(OP, lora, d.slots)?;
    let parts = parts(OP, lora)?;
    let n_parts = lora.stacks.len() as u32;
    let shrunk = b.alloc_side(&[d.t, lora.stacks.len(), d.rank], DType::F32)?;
    if d.t == 0 || d.rank == 0 || d.slots == 0 {
        return Ok(shrunk);
    }
    let LoraDims { t, k, slots, rank, .. } = d;
    let (t32, k32) = (as_u32(OP, "rows", t)?, as_u32(OP, "inputs", k)?);
    let (slots32, rank32) = (as_u32(OP, "slots", slots)?, as_u32(OP, "ranks", rank)?);
    if rank > MAX_GRID_Z {
        return Err(Error::InvalidArgument(format!("{OP}: rank {rank} (the shrink's grid takes {MAX_GRID_Z})")));
    }
    let (xp, rows, sp) = (ptr(OP, x)?, ptr(OP, lora.rows)?, ptr(OP, &shrunk)?);
    // `x`, the stacks and the row tensors stay alive past the join (`lora_shrink`'s
    // contract); `shrunk` is joined before it is freed.
    b.dev.fork()?;
    match lora.groups {
        Some(groups) if grouped(b, lora, &d) => {
            let tiles = as_u32(OP, "row tiles", t.div_ceil(GROUP_ROWS) + slots)?;
            let shrink = LaunchConfig {
                grid_dim: (tiles, n_parts, GROUP_SPLIT),
                block_dim: (GROUP_THREADS, 1, 1),
                shared_mem_bytes: (GROUP_STAGES * (GROUP_ROWS + rank) * GROUP_BK * 2) as u32,
            };
            let gp = ptr(OP, groups)?;
            launch!(side b, "lora_shrink_grouped_bf16", shrink, [xp, gp, parts, sp, t32, slots32, rank32, k32])?;
        }
        _ => {
            let shrink = LaunchConfig {
                grid_dim: (t32, n_parts, rank32),
                block_dim: (SHRINK_WARPS * 32, 1, 1),
                shared_mem_bytes: 0,
            };
            launch!(side b, "lora_shrink_bf16", shrink, [xp, rows, parts, sp, slots32, rank32, k32])?;
        }
    }
    Ok(shrunk)
}

pub(super) fn lora_expand(b: &CudaBackend, shrunk: &Tensor, out: Tensor, lora: &LoraSlots<'_>) -> Result<Tensor> {
    const OP: &str = "lora_expand";
    let d = operands::check_expand(OP, shrunk, &out, lora)?;
    expect_dtype(OP, &out, BF16)?;
    check_host_rows(OP, lora, d.slots)?;
    // The shrink (on the side stream) is done before anything after this reads `shrunk`.
    b.dev.join()?;
    if d.t == 0 || d.rank == 0 || d.slots == 0 {
        return Ok(out);
    }
    let parts = parts(OP, lora)?;
    let n_parts = lora.stacks.len() as u32;
    let LoraDims { t, width, slots, rank, .. } = d;
    let (t32, width32) = (as_u32(OP, "rows", t)?, as_u32(OP, "columns", width)?);
    let (slots32, rank32) = (as_u32(OP, "slots", slots)?, as_u32(OP, "ranks", rank)?);
    let (rows, sp) = (ptr(OP, lora.rows)?, ptr(OP, shrunk)?);
    let (scales, op_) = (ptr(OP, lora.scales)?, ptr(OP, &out)?);
    let widest = parts.n.iter().copied().max().unwrap_or(0);
    match lora.groups {
        Some(groups) if grouped(b, lora, &d) => {
            let tiles = as_u32(OP, "row tiles", t.div_ceil(GROUP_ROWS) + slots)?;
            let expand = LaunchConfig {
                grid_dim: (tiles, widest.div_ceil(GROUP_EXPAND_WARPS * 64).max(1), n_parts),
                block_dim: (GROUP_EXPAND_WARPS * 32, 1, 1),
                shared_mem_bytes: 0,
            };
            let gp = ptr(OP, groups)?;
            launch!(
                b,
                "lora_expand_grouped_bf16",
                expand,
                [sp, gp, parts, scales, op_, t32, slots32, rank32, width32]
            )?;
        }
        _ => {
            let tiles = as_u32(OP, "row tiles", t.div_ceil(TILE_ROWS))?;
            let expand = LaunchConfig {
                grid_dim: (widest.div_ceil(EXPAND_COLUMNS).max(1), tiles, n_parts),
                block_dim: (EXPAND_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            launch!(b, "lora_expand_bf16", expand, [sp, rows, parts, scales, op_, t32, slots32, rank32, width32])?;
        }
    }
    Ok(out)
}

/// The stacks of `lora` as the kernels take them.
fn parts(op: &'static str, lora: &LoraSlots<'_>) -> Result<LoraParts> {
    let mut parts = LoraParts::default();
    for (i, s) in lora.stacks.iter().enumerate() {
        expect_dtype(op, s.a, BF16)?;
        expect_dtype(op, s.b, BF16)?;
        parts.a[i] = ptr(op, s.a)?;
        parts.b[i] = ptr(op, s.b)?;
        parts.n[i] = as_u32(op, "columns", s.b.dims()[1])?;
        parts.column[i] = as_u32(op, "columns", s.column)?;
    }
    Ok(parts)
}

pub(super) fn lora_write_slot(b: &CudaBackend, stack: &Tensor, slot: usize, src: &Tensor) -> Result<()> {
    const OP: &str = "lora_write_slot";
    let per_slot = operands::check_slot_write(OP, stack, slot, src)?;
    expect_dtype(OP, stack, &[DType::BF16, DType::F32, DType::U32])?;
    // The copy kernel moves 16-bit words: a bf16 element is one, an f32 or u32 two.
    let words = per_slot * stack.dtype().size_in_bytes() / 2;
    if words == 0 {
        return Ok(());
    }
    let dst = ptr(OP, stack)? + (slot * per_slot * stack.dtype().size_in_bytes()) as u64;
    launch!(b, "lora_copy_b16", elementwise(words), [ptr(OP, src)?, dst, words as u64])
}
