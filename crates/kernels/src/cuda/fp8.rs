//! FP8 weights on CUDA: a checkpoint's `float8_e4m3fn` matrices kept as e4m3 bytes on the
//! device (one byte a weight instead of bf16's two), with their f32 scales beside them.
//!
//! A host matrix of [`QuantFormat::F8_E4M3`] blocks (32 bytes under one scale, what
//! `met-model-weights`' `Fp8View` makes of every FP8 layout) stays e4m3 when its scales are
//! constant along each row (per-tensor and per-channel checkpoints, and fusions of them) or
//! over 128 x 128 blocks (block-wise ones), its rows are a multiple of 16 and its columns of
//! 128; any other matrix is widened to bf16 at upload, as before there were FP8 kernels. The
//! grid is read from the scales' values, so it is exact either way.
//!
//! Products (`cuda/fp8.cu`): up to [`GEMV_MAX_M`] rows, and every row count under
//! `--batch-invariant`, stream the weights through the tensor-core GEMV with bf16
//! activations, but for one-row decode steps outside `--batch-invariant`, which take a
//! streaming GEMV of many short blocks, as bf16 weights do. Larger batches quantize the activations to e4m3 (per token and 128
//! columns for block-scaled weights, per token for per-row ones, as transformers' FP8
//! linear does) and run cuBLASLt's FP8 GEMM with the matching scale modes (128 x 128 blocks
//! against 128-element vectors, or outer vectors: cuBLAS 12.9 on Hopper), whose 1-D scales
//! take rows in groups of 8: a batch is padded with zero rows to a multiple of 8 (a second
//! pass of the GEMV over the last `m % 8` rows would read every weight again). MoE experts
//! stacked in e4m3 run the grouped GEMM's e4m3 form (`moe_gemm_e4m3_*`): tiles one scale
//! chunk deep, e4m3 fed to the mma unscaled, each chunk's f32 sums times their row's scale;
//! decode batches stream each slot's expert instead (`moe_gemv_*_e4m3`, `src/cuda/moe.rs`).

mod lt;

use cudarc::driver::LaunchConfig;
use rayon::prelude::*;

pub(super) use self::lt::Lt;
use self::lt::LtGemm;
use super::device::DeviceBuffer;
use super::{CudaBackend, CudaStorage, launch, ptr, storage};
use crate::error::{Error, Result, ensure};
use crate::quant::QuantFormat;
use crate::{DType, HostTensor, Shape, Storage, Tensor};

/// The dtype of an e4m3 matrix on the device.
pub(super) const FP8: DType = DType::Quant(QuantFormat::F8_E4M3);
/// The largest batch the GEMV takes by default; larger ones go to cuBLASLt.
pub(super) const GEMV_MAX_M: usize = 16;
/// Columns a scale chunk covers (`FP8_CHUNK` of `fp8.cu`).
const CHUNK: usize = 128;
/// `FP8_THREADS` / `FP8_WARPS` of `fp8.cu`.
const THREADS: u32 = 128;
const WARPS: usize = 4;
/// The GEMV's split counters (`fp8_last_split` of `fp8.cu`): one a block of columns and
/// tokens.
pub(super) const COUNTERS: usize = 16 << 10;

/// Every kernel of `fp8.cu`, for loading at startup.
pub(super) const KERNELS: [&str; 19] = [
    "moe_gemv_silu_e4m3",
    "moe_gemv_e4m3",
    "fp8_gemv_h1",
    "fp8_gemv_h1_silu",
    "fp8_gemv_tc1",
    "fp8_gemv_tc1_silu",
    "fp8_gemv_n1",
    "fp8_gemv_n2",
    "fp8_gemv_silu_n1",
    "fp8_gemv_silu_n2",
    "fp8_gemv_small_m1",
    "fp8_gemv_small_silu_m1",
    "moe_gemm_e4m3_m16_deep",
    "moe_gemm_e4m3_m16",
    "moe_gemm_e4m3_m32",
    "moe_gemm_e4m3_m64",
    "fp8_quantize_vec128",
    "fp8_quantize_row",
    "fp8_rows_bf16",
];

/// How an e4m3 matrix's scales cover it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Grid {
    /// One scale a row: `scales [rows]`.
    Row,
    /// One scale a 128 x 128 block: `scales [ceil(rows / 128), stride]`, `stride` the
    /// column chunks rounded up to a multiple of 4 (the layout cuBLASLt reads).
    Block { stride: u32 },
}

impl Grid {
    /// `scale_rows`, `scale_stride` and `chunk_step` of `fp8.cu`.
    fn kernel_args(self) -> (u32, u32, u32) {
        match self {
            Self::Row => (1, 1, 0),
            Self::Block { stride } => (CHUNK as u32, stride, 1),
        }
    }
}

/// [`CudaBackend`]'s `fp8_grids` bits: an e4m3 matrix with one scale a row was kept.
pub(super) const GRID_ROW: u8 = 1;
/// An e4m3 matrix with 128 x 128 block scales was kept.
pub(super) const GRID_BLOCK: u8 = 2;

/// The e4m3 form of a bf16 matrix's rows, as `fp8_quantize_row` (one scale a row) or
/// `fp8_quantize_vec128` (`block`: one a 128 columns, token-major within a group of
/// `padded` rows) writes them, padded with zero rows to `padded` (a multiple of 8): a norm
/// or a SwiGLU writes it beside its output when the products after it are cuBLASLt's.
pub(super) struct E4m3Rows {
    pub(super) q: DeviceBuffer,
    pub(super) scales: DeviceBuffer,
    pub(super) padded: usize,
    pub(super) block: bool,
}

/// Whether a norm (or the SwiGLU of a down projection's input) of `rows` rows of `n`
/// feeding products of this backend's e4m3 matrices writes their e4m3 form too, and in which grid (`Some(block)`): batches past the GEMV's,
/// outside `--batch-invariant`, where every e4m3 matrix kept has the same grid.
pub(super) fn norm_writes_e4m3(b: &CudaBackend, rows: usize, n: usize) -> Option<bool> {
    if b.lt.is_none() || b.batch_invariant || gemv_only(b, rows) {
        return None;
    }
    match b.fp8_grids.load(std::sync::atomic::Ordering::Relaxed) {
        GRID_ROW => Some(false),
        GRID_BLOCK if n.is_multiple_of(CHUNK) => Some(true),
        _ => None,
    }
}

/// The scales of an e4m3 matrix, on the device.
pub(super) struct Fp8Scales {
    pub(super) buf: DeviceBuffer,
    pub(super) grid: Grid,
}

/// The scale of `F8_E4M3` block `g` of row `i` (as bits) in the blocks of a matrix of
/// `per_row` blocks a row.
fn block_scale(blocks: &[u8], per_row: usize, i: usize, g: usize) -> u32 {
    let at = (i * per_row + g) * QuantFormat::F8_E4M3.block_bytes();
    u32::from_le_bytes(blocks[at..at + 4].try_into().expect("4 bytes"))
}

/// The scale grid of `F8_E4M3` blocks of an `[n, k]` matrix (`k` a multiple of 128), or
/// `None` when the scales are neither constant along rows nor over 128 x 128 blocks.
fn grid_of(blocks: &[u8], n: usize, k: usize) -> Option<Grid> {
    let per_row = k / QuantFormat::F8_E4M3.block_elems();
    let groups = CHUNK / QuantFormat::F8_E4M3.block_elems();
    let scale = |i, g| block_scale(blocks, per_row, i, g);
    if (0..n).into_par_iter().all(|i| (1..per_row).all(|g| scale(i, g) == scale(i, 0))) {
        return Some(Grid::Row);
    }
    let blockwise = (0..n)
        .into_par_iter()
        .all(|i| (0..per_row).all(|g| scale(i, g) == scale(i / CHUNK * CHUNK, g / groups * groups)));
    blockwise.then(|| Grid::Block { stride: (k / CHUNK).next_multiple_of(4) as u32 })
}

/// `host` (a matrix of `F8_E4M3` blocks) as an e4m3 matrix on the device, or `None` when
/// it does not fit the kernels (see the module docs) and is to be widened.
pub(super) fn upload(b: &CudaBackend, host: &HostTensor<'_>) -> Result<Option<Tensor>> {
    let &[n, k] = host.shape() else { return Ok(None) };
    let fits =
        b.lt.is_some() && n > 0 && n.is_multiple_of(16) && k.is_multiple_of(CHUNK) && u32::try_from(n.max(k)).is_ok();
    let Some(grid) = fits.then(|| grid_of(host.bytes(), n, k)).flatten() else { return Ok(None) };
    let (block_bytes, block) = (QuantFormat::F8_E4M3.block_bytes(), QuantFormat::F8_E4M3.block_elems());
    let blocks = host.bytes();
    let mut q = vec![0u8; n * k];
    q.par_chunks_mut(k).zip(blocks.par_chunks(k / block * block_bytes)).for_each(|(row, src)| {
        for (dst, src) in row.chunks_exact_mut(block).zip(src.chunks_exact(block_bytes)) {
            dst.copy_from_slice(&src[4..]);
        }
    });
    let scale = |i, g| f32::from_bits(block_scale(blocks, k / block, i, g));
    let scales: Vec<f32> = match grid {
        Grid::Row => (0..n).map(|i| scale(i, 0)).collect(),
        Grid::Block { stride } => {
            let (stride, groups) = (stride as usize, CHUNK / block);
            let mut s = vec![0f32; n.div_ceil(CHUNK) * stride];
            for (r, row) in s.chunks_exact_mut(stride).enumerate() {
                for (c, v) in row.iter_mut().take(k / CHUNK).enumerate() {
                    *v = scale(r * CHUNK, c * groups);
                }
            }
            s
        }
    };
    let scales = if b.fault == Some(WRONG_SCALE) { wrong(scales) } else { scales };
    let buf = b.dev.alloc(q.len())?;
    b.dev.upload(&buf, &q)?;
    let scale_buf = b.dev.alloc(size_of_val(scales.as_slice()))?;
    b.dev.upload(&scale_buf, &scales)?;
    let bit = if matches!(grid, Grid::Row) { GRID_ROW } else { GRID_BLOCK };
    b.fp8_grids.fetch_or(bit, std::sync::atomic::Ordering::Relaxed);
    let storage = CudaStorage { fp8: Some(Fp8Scales { buf: scale_buf, grid }), ..CudaStorage::of(buf) };
    Ok(Some(Tensor::from_storage(Storage::Cuda(storage), FP8, Shape::new(&[n, k]))))
}

/// The `MET_TEST_FAULT` variant that gives e4m3 weights wrong scales.
const WRONG_SCALE: &str = "fp8-wrong-scale";

/// `scales` with every other one doubled (every other 128-column block of a row block, or
/// every other row for per-row scales): the deliberately wrong weights of [`WRONG_SCALE`],
/// for testing the tests (a per-tensor checkpoint's rows all share one scale, so moving
/// scales around would change nothing there).
fn wrong(mut scales: Vec<f32>) -> Vec<f32> {
    scales.iter_mut().skip(1).step_by(2).for_each(|s| *s *= 2.0);
    scales
}

/// The scales of the e4m3 matrix `w`.
fn scales_of<'a>(op: &'static str, w: &'a Tensor) -> Result<&'a Fp8Scales> {
    storage(op, w)?.fp8.as_ref().ok_or_else(|| Error::InvalidArgument(format!("{op}: an e4m3 tensor without scales")))
}

/// The scale arguments of `fp8.cu`'s kernels for the e4m3 `w`: the scales' address,
/// `scale_rows`, `scale_stride` and `chunk_step`.
pub(super) fn scale_args(op: &'static str, w: &Tensor) -> Result<(u64, u32, u32, u32)> {
    let s = scales_of(op, w)?;
    let (rows, stride, step) = s.grid.kernel_args();
    Ok((s.buf.ptr(), rows, stride, step))
}

/// Split count of the GEMV over a matrix of `col_blocks` blocks of columns and `chunks`
/// 128-column chunks: the count whose waves of blocks take the least time, with four blocks
/// resident a multiprocessor (their registers allow that many), a last wave that only part
/// fills costing a whole one, and a block's time its warps' share of the chunks plus two
/// chunks' worth for its first loads and its sums; the fewest splits among equals, each warp
/// two chunks at least. It depends on the matrix only, never on the batch.
fn splits(b: &CudaBackend, col_blocks: usize, chunks: usize) -> usize {
    split_count(col_blocks, chunks, usize::try_from(b.dev.multiprocessors).unwrap_or(1))
}

/// [`splits`] on `sms` multiprocessors.
fn split_count(col_blocks: usize, chunks: usize, sms: usize) -> usize {
    let slots = 4 * sms.max(1);
    // A split count's time in chunks a warp, times s · WARPS to stay whole:
    // waves · (2 + chunks / (s · WARPS)).
    let scaled = |s: usize| (col_blocks * s).div_ceil(slots) * (2 * s * WARPS + chunks);
    (1..=(chunks / (2 * WARPS)).max(1))
        .min_by(|&s1, &s2| (scaled(s1) * s2).cmp(&(scaled(s2) * s1)).then(s1.cmp(&s2)))
        .unwrap_or(1)
}

/// One GEMV launch: `out [m, cols]` from `x [m, k]` (row addresses) and the e4m3 `w`.
struct Gemv {
    x: u64,
    w: u64,
    bias: u64,
    out: u64,
    m: usize,
    n: usize,
    k: usize,
    silu: bool,
}

fn gemv(b: &CudaBackend, s: &Fp8Scales, g: &Gemv) -> Result<()> {
    if g.m == 0 {
        return Ok(());
    }
    if g.m == 1 && !b.batch_invariant {
        return match b.fp8_one {
            OneRow::Tc => gemv_tc1(b, s, g),
            OneRow::F16 if g.k <= H1_MAX_K => gemv_h1(b, s, g),
            OneRow::F16Silu if g.silu && g.k <= H1_MAX_K => gemv_h1(b, s, g),
            _ => gemv_one(b, s, g),
        };
    }
    let (scale_rows, scale_stride, chunk_step) = s.grid.kernel_args();
    let nt = if g.m <= 8 { 1 } else { 2 };
    let (cols, col_block) = if g.silu { (g.n / 2, 16) } else { (g.n, 32) };
    let col_blocks = cols.div_ceil(col_block);
    let splits = splits(b, col_blocks, g.k / CHUNK);
    let partial = if splits > 1 { Some(b.alloc(&[splits * g.m * g.n], DType::F32)?) } else { None };
    let partial_ptr = partial.as_ref().map(|p| ptr("fp8 gemv", p)).transpose()?.unwrap_or(0);
    let token_blocks = g.m.div_ceil(8 * nt);
    // The last split of each block of columns and tokens adds the partial sums, counted in
    // the `Lt`'s counters, or in zeroed ones of this product's own past their number (only
    // `--batch-invariant` prompts have that many blocks; decode steps, graphs included,
    // have far fewer).
    let blocks = col_blocks * token_blocks;
    let own = if splits > 1 && blocks > COUNTERS { Some(b.alloc(&[blocks], DType::U32)?) } else { None };
    if let Some(own) = &own {
        b.dev.zero(&storage("fp8 gemv", own)?.buf, blocks * 4)?;
    }
    let counters = match (&own, &b.lt) {
        _ if splits == 1 => 0,
        (Some(own), _) => ptr("fp8 gemv", own)?,
        (None, Some(lt)) => lt.counters.ptr(),
        (None, None) => return Err(Error::InvalidArgument("fp8 gemv: an e4m3 matrix without cuBLASLt".into())),
    };
    let cfg = LaunchConfig {
        grid_dim: (col_blocks as u32, token_blocks as u32, splits as u32),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let (m, k, sp, splits32) = (g.m as u32, g.k as u32, s.buf.ptr(), splits as u32);
    if g.silu {
        let name = if nt == 1 { "fp8_gemv_silu_n1" } else { "fp8_gemv_silu_n2" };
        let half = cols as u32;
        launch!(
            b,
            name,
            cfg,
            [g.x, g.w, sp, scale_rows, scale_stride, chunk_step, g.out, partial_ptr, counters, m, half, k, splits32]
        )?;
    } else {
        let name = if nt == 1 { "fp8_gemv_n1" } else { "fp8_gemv_n2" };
        let n = g.n as u32;
        launch!(
            b,
            name,
            cfg,
            [
                g.x,
                g.w,
                sp,
                scale_rows,
                scale_stride,
                chunk_step,
                g.bias,
                g.out,
                partial_ptr,
                counters,
                m,
                n,
                k,
                splits32
            ]
        )?;
    }
    Ok(())
}

/// [`gemv`] of one row on the streaming kernel (`fp8_gemv_small_*`), 2 weight rows a block.
fn gemv_one(b: &CudaBackend, s: &Fp8Scales, g: &Gemv) -> Result<()> {
    let (scale_rows, scale_stride, chunk_step) = s.grid.kernel_args();
    let cols = if g.silu { g.n / 2 } else { g.n.div_ceil(2) };
    let cfg = LaunchConfig { grid_dim: (cols as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
    let (m, k, sp) = (g.m as u32, g.k as u32, s.buf.ptr());
    if g.silu {
        let half = (g.n / 2) as u32;
        launch!(
            b,
            "fp8_gemv_small_silu_m1",
            cfg,
            [g.x, g.w, sp, scale_rows, scale_stride, chunk_step, g.out, m, half, k]
        )
    } else {
        let n = g.n as u32;
        launch!(
            b,
            "fp8_gemv_small_m1",
            cfg,
            [g.x, g.w, sp, scale_rows, scale_stride, chunk_step, g.bias, g.out, m, n, k]
        )
    }
}

/// [`gemv`] of one row on f16 tensor cores (`fp8_gemv_h1*`): a tile of 16 weight rows a
/// block, x in `k * 2` bytes of shared memory.
fn gemv_h1(b: &CudaBackend, s: &Fp8Scales, g: &Gemv) -> Result<()> {
    let (scale_rows, scale_stride, chunk_step) = s.grid.kernel_args();
    let cfg = LaunchConfig {
        grid_dim: ((g.n / 16) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: (g.k * 2) as u32,
    };
    let (k, sp) = (g.k as u32, s.buf.ptr());
    if g.silu {
        let half = (g.n / 2) as u32;
        launch!(b, "fp8_gemv_h1_silu", cfg, [g.x, g.w, sp, scale_rows, scale_stride, chunk_step, g.out, half, k])
    } else {
        let n = g.n as u32;
        launch!(b, "fp8_gemv_h1", cfg, [g.x, g.w, sp, scale_rows, scale_stride, chunk_step, g.bias, g.out, n, k])
    }
}

/// [`gemv`] of one row on the tensor-core stream (`fp8_gemv_tc1*`), 8 weight rows a block.
fn gemv_tc1(b: &CudaBackend, s: &Fp8Scales, g: &Gemv) -> Result<()> {
    let (scale_rows, scale_stride, chunk_step) = s.grid.kernel_args();
    let cols = if g.silu { (g.n / 2).div_ceil(4) } else { g.n.div_ceil(8) };
    let cfg = LaunchConfig { grid_dim: (cols as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let (m, k, sp) = (g.m as u32, g.k as u32, s.buf.ptr());
    if g.silu {
        let half = (g.n / 2) as u32;
        launch!(b, "fp8_gemv_tc1_silu", cfg, [g.x, g.w, sp, scale_rows, scale_stride, chunk_step, g.out, m, half, k])
    } else {
        let n = g.n as u32;
        launch!(b, "fp8_gemv_tc1", cfg, [g.x, g.w, sp, scale_rows, scale_stride, chunk_step, g.bias, g.out, m, n, k])
    }
}

/// The kernel of one-row e4m3 products outside `--batch-invariant`: `MET_FP8_ONE`, for
/// measuring one against another in one build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OneRow {
    /// The streaming GEMV (`fp8_gemv_small_*`): unset or `stream`.
    Stream,
    /// The tensor-core stream with bf16 operands (`fp8_gemv_tc1*`): `tc`.
    Tc,
    /// f16 tensor cores over activations staged in shared memory (`fp8_gemv_h1*`), for
    /// `k` up to [`H1_MAX_K`]: `f16`.
    F16,
    /// `F16` for the SwiGLU product alone (alone, the form measured 17 % faster than the
    /// stream there and slower on the other products), the stream for the rest: `f16silu`.
    F16Silu,
}

/// The largest `k` of `fp8_gemv_h1*` (`FP8_H1_MAX_K`): x as f16 in shared memory, 32 KiB.
const H1_MAX_K: usize = 16384;

impl OneRow {
    pub(super) fn from_env() -> Result<Self> {
        const VAR: &str = "MET_FP8_ONE";
        match std::env::var(VAR).as_deref() {
            Err(_) | Ok("" | "stream") => Ok(Self::Stream),
            Ok("tc") => Ok(Self::Tc),
            Ok("f16") => Ok(Self::F16),
            Ok("f16silu") => Ok(Self::F16Silu),
            Ok(other) => Err(Error::InvalidArgument(format!("{VAR}={other}: expected stream, tc, f16 or f16silu"))),
        }
    }
}

/// Whether a product of `m` rows runs on the GEMV alone: decode batches, every batch under
/// `--batch-invariant`, and every batch where there is no cuBLASLt.
pub(super) fn gemv_only(b: &CudaBackend, m: usize) -> bool {
    b.batch_invariant || m <= GEMV_MAX_M || b.lt.is_none()
}

/// `out [m, n] = x · wᵀ (+ bias)` for an e4m3 `w` (shapes and dtypes checked by the caller).
pub(super) fn matmul(b: &CudaBackend, x: &Tensor, w: &Tensor, bias: Option<&Tensor>, out: &Tensor) -> Result<()> {
    const OP: &str = "matmul";
    let s = scales_of(OP, w)?;
    let (m, k) = (x.dims()[0], x.dims()[1]);
    let n = w.dims()[0];
    let (xp, wp, op) = (ptr(OP, x)?, ptr(OP, w)?, ptr(OP, out)?);
    let bias = bias.map(|t| ptr(OP, t)).transpose()?.unwrap_or(0);
    let lt = match &b.lt {
        Some(lt) if !gemv_only(b, m) => lt,
        _ => return gemv(b, s, &Gemv { x: xp, w: wp, bias, out: op, m, n, k, silu: false }),
    };
    // cuBLASLt's 1-D scales take rows in groups of 8: the activations are padded with zero
    // rows to a multiple of 8, and `out` holds that many rows (`out_rows`).
    let padded = m.next_multiple_of(8);
    ensure(out.elem_count() >= padded * n, OP, || {
        format!("an output of {} rows for {m} padded to {padded}", out.elem_count() / n.max(1))
    })?;
    let block = matches!(s.grid, Grid::Block { .. });
    // The e4m3 rows a norm wrote beside x, or x quantized here.
    let quantized;
    let (qp, sp) = match storage(OP, x)?.e4m3.as_ref().filter(|r| r.block == block && r.padded == padded) {
        Some(rows) => (rows.q.ptr(), rows.scales.ptr()),
        None => {
            quantized = quantize(b, xp, m, padded, k, block)?;
            (ptr(OP, &quantized.0)?, ptr(OP, &quantized.1)?)
        }
    };
    let g = LtGemm { w: wp, w_scales: s.buf.ptr(), x: qp, x_scales: sp, out: op, bias, n, m: padded, k, block };
    b.timed("cublaslt_fp8_gemm", || lt.gemm(&b.dev, &g))
}

/// The `m` rows of `x [m, k]` (at address `xp`) in e4m3, padded with zero rows to
/// `padded`, and their scales: per 128 columns (token-major within a group) where `block`,
/// else per row.
fn quantize(b: &CudaBackend, xp: u64, m: usize, padded: usize, k: usize, block: bool) -> Result<(Tensor, Tensor)> {
    const OP: &str = "matmul";
    let xq = b.alloc(&[padded, k], DType::F8E4M3)?;
    let xs = b.alloc(&[if block { padded * (k / CHUNK) } else { padded }], DType::F32)?;
    let (qp, sp) = (ptr(OP, &xq)?, ptr(OP, &xs)?);
    if block {
        let cfg = LaunchConfig {
            grid_dim: ((padded * (k / CHUNK)).div_ceil(4) as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(b, "fp8_quantize_vec128", cfg, [xp, qp, sp, m as u32, padded as u32, k as u32])?;
    } else {
        let cfg = LaunchConfig { grid_dim: (padded as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        launch!(b, "fp8_quantize_row", cfg, [xp, qp, sp, m as u32, k as u32])?;
    }
    Ok((xq, xs))
}

/// The rows `out` of [`matmul`] must have for a product of `m` rows: `m`, or past the
/// GEMV's batches `m` rounded up to a multiple of 8 (the caller keeps the first `m`).
pub(super) fn out_rows(b: &CudaBackend, m: usize) -> usize {
    if b.lt.is_some() && !gemv_only(b, m) { m.next_multiple_of(8) } else { m }
}

/// `silu(x · gateᵀ) · (x · upᵀ)` for an e4m3 `w [2i, k]` (gate rows, then up), into
/// `out [m, i]`, on the GEMV's fused form (for batches [`gemv_only`] takes; the caller takes
/// the product and the activation apart for the others).
pub(super) fn matmul_silu_mul(b: &CudaBackend, x: &Tensor, w: &Tensor, out: &Tensor) -> Result<()> {
    const OP: &str = "matmul_silu_mul";
    let (m, k, n) = (x.dims()[0], x.dims()[1], w.dims()[0]);
    let g = Gemv { x: ptr(OP, x)?, w: ptr(OP, w)?, bias: 0, out: ptr(OP, out)?, m, n, k, silu: true };
    gemv(b, scales_of(OP, w)?, &g)
}

/// Rows of the e4m3 `w` widened to bf16: rows `ids` (an index tensor, checked by the
/// caller) or all of them.
pub(super) fn rows_bf16(b: &CudaBackend, w: &Tensor, ids: Option<&Tensor>) -> Result<Tensor> {
    const OP: &str = "fp8 rows";
    let s = scales_of(OP, w)?;
    let k = w.shape().last();
    let n = w.elem_count() / k.max(1);
    let count = ids.map_or(n, Tensor::elem_count);
    let out = b.alloc(&[count, k], DType::BF16)?;
    if count > 0 {
        let (scale_rows, scale_stride, chunk_step) = s.grid.kernel_args();
        let ids = ids.map(|t| ptr(OP, t)).transpose()?.unwrap_or(0);
        let cfg = LaunchConfig {
            grid_dim: (count as u32, (k / 4).div_ceil(128) as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let args = (ptr(OP, w)?, s.buf.ptr(), ptr(OP, &out)?);
        launch!(
            b,
            "fp8_rows_bf16",
            cfg,
            [ids, args.0, args.1, scale_rows, scale_stride, chunk_step, args.2, n as u32, k as u32]
        )?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{CHUNK, Grid, grid_of, split_count};

    /// `F8_E4M3` blocks of an `[n, k]` matrix whose scale at (row, 32-column group) is
    /// `scale(row, group)`; the bytes do not matter here.
    fn blocks(n: usize, k: usize, scale: impl Fn(usize, usize) -> f32) -> Vec<u8> {
        let mut out = Vec::new();
        for i in 0..n {
            for g in 0..k / 32 {
                out.extend(scale(i, g).to_le_bytes());
                out.extend([0x38u8; 32]);
            }
        }
        out
    }

    #[test]
    fn the_grid_is_read_from_the_scales() {
        let (n, k) = (272, 384);
        // One scale a tensor or a row: rows.
        assert_eq!(grid_of(&blocks(n, k, |_, _| 0.5), n, k), Some(Grid::Row));
        assert_eq!(grid_of(&blocks(n, k, |i, _| i as f32), n, k), Some(Grid::Row));
        // One a 128 x 128 block (rows ending mid-block): blocks, 3 chunks padded to 4.
        let block = |i: usize, g: usize| (i / CHUNK * 10 + g * 32 / CHUNK) as f32;
        assert_eq!(grid_of(&blocks(n, k, block), n, k), Some(Grid::Block { stride: 4 }));
        // A scale that changes inside a block, or within 128 columns of a row: neither.
        assert_eq!(grid_of(&blocks(n, k, |i, g| block(i, g) + f32::from(u8::from(i == 5 && g == 1))), n, k), None);
        assert_eq!(grid_of(&blocks(n, k, |i, g| (i * 100 + g) as f32), n, k), None);
    }

    #[test]
    fn splits_fill_whole_waves() {
        // The Llama-3.1-8B projections on an H200 (132 SMs, 528 resident blocks): qkv's 192
        // column blocks take 2 splits (one wave) rather than 3 (1.09 waves); o and down 4
        // (512 blocks; down not 5, 1.2 waves); the SwiGLU gate/up (896 blocks, 1.7 waves)
        // stays whole, as 4 splits would make 7 waves of short blocks.
        assert_eq!(split_count(192, 32, 132), 2);
        assert_eq!(split_count(128, 32, 132), 4);
        assert_eq!(split_count(128, 112, 132), 4);
        assert_eq!(split_count(896, 32, 132), 1);
        // Too few chunks for two a warp: one split; a small matrix splits as far as it may.
        assert_eq!(split_count(3, 3, 132), 1);
        assert_eq!(split_count(3, 18, 132), 2);
    }
}
