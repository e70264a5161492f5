//! The decode-batch products of `cuda/gemv.cu`: `x [m, k] · wᵀ` for `m <= 4`, reading
//! the weights once at memory bandwidth, where cuBLAS's small-batch kernels fall short.
//! From 5 rows on, each weight feeds enough arithmetic that these CUDA-core kernels lose to
//! cuBLAS (measured: `cuda_gemv` in `benches/cuda.rs`), so larger batches go there.
//!
//! The kernels are instantiated for batch buckets 1, 2 and 4 (a batch runs in the smallest
//! bucket that holds it) and for one or two weight rows per block: two when the matrix has
//! rows enough for many blocks per SM either way (fewer, longer blocks read x less often),
//! one otherwise (more, shorter blocks end more evenly across the SMs).

use cudarc::driver::LaunchConfig;

use super::{CudaBackend, launch};
use crate::error::Result;

/// The largest batch the kernels take; larger ones go to cuBLAS.
pub(super) const MAX_M: usize = 4;
/// `GEMV_THREADS` of `gemv.cu`.
const THREADS: u32 = 128;
/// Blocks of two rows per SM from which a matrix takes two rows per block.
const TWO_ROW_BLOCKS_PER_SM: usize = 16;

/// Whether a product of this shape runs here: a decode batch, and rows of whole 16-byte
/// vectors (pool allocations are 256-byte aligned, so row starts are then aligned too).
pub(super) fn applies(m: usize, n: usize, k: usize) -> bool {
    (1..=MAX_M).contains(&m) && n > 0 && k > 0 && k.is_multiple_of(8) && u32::try_from(n.max(k)).is_ok()
}

fn bucket(m: usize) -> usize {
    m.next_power_of_two()
}

/// Operand addresses of one product (bf16, contiguous, row-major).
pub(super) struct Gemv {
    pub x: u64,
    pub w: u64,
    /// `[n]`, or 0 for none.
    pub bias: u64,
    pub out: u64,
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

/// `out [m, n] = x · wᵀ (+ bias)`.
pub(super) fn gemv(b: &CudaBackend, g: &Gemv) -> Result<()> {
    let sms = usize::try_from(b.dev.multiprocessors).unwrap_or(1).max(1);
    let rows_per_block = if g.n >= 2 * TWO_ROW_BLOCKS_PER_SM * sms { 2 } else { 1 };
    let name = match (bucket(g.m), rows_per_block) {
        (1, 1) => "gemv_bf16_m1_r1",
        (1, _) => "gemv_bf16_m1_r2",
        (2, 1) => "gemv_bf16_m2_r1",
        (2, _) => "gemv_bf16_m2_r2",
        (_, 1) => "gemv_bf16_m4_r1",
        (_, _) => "gemv_bf16_m4_r2",
    };
    let cfg = config(g.n.div_ceil(rows_per_block));
    launch!(b, name, cfg, [g.x, g.w, g.bias, g.out, g.m as u32, g.n as u32, g.k as u32])
}

/// `out [m, i] = silu(x · gateᵀ) · (x · upᵀ)` with `w [2i, k]` holding gate rows then up rows.
pub(super) fn gemv_silu(b: &CudaBackend, x: u64, w: u64, out: u64, m: usize, half: usize, k: usize) -> Result<()> {
    let name = match bucket(m) {
        1 => "gemv_silu_bf16_m1",
        2 => "gemv_silu_bf16_m2",
        _ => "gemv_silu_bf16_m4",
    };
    launch!(b, name, config(half), [x, w, out, m as u32, half as u32, k as u32])
}

fn config(blocks: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

/// Every kernel name above, for loading at startup.
pub(super) const KERNELS: [&str; 9] = [
    "gemv_bf16_m1_r1",
    "gemv_bf16_m1_r2",
    "gemv_bf16_m2_r1",
    "gemv_bf16_m2_r2",
    "gemv_bf16_m4_r1",
    "gemv_bf16_m4_r2",
    "gemv_silu_bf16_m1",
    "gemv_silu_bf16_m2",
    "gemv_silu_bf16_m4",
];
