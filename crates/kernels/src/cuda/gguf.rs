//! GGUF block formats kept in their blocks on the device: Q4_0, Q8_0, Q4_K, Q5_K and Q6_K
//! matrices (what a Q4_K_M, Q5_K_M, Q6_K, Q8_0 or Q4_0 file holds) are not widened to bf16
//! at upload, so an 8B model in Q4_K_M takes about a third of its bf16 memory.
//!
//! At upload each block's fields are split into regions (`cuda/gguf.cu` names them: the
//! quants, the high bits, the scales, the block scales), each region a row after another, so
//! the kernels read aligned 16-byte words; the bytes are the file's, reordered. A matrix
//! joined from parts of different formats (a Q4_K_M file's fused q/k/v, whose v is Q6_K in
//! some layers) keeps each part in its own format: consecutive rows of one format form a
//! part, and each op runs once a part. Stacks of experts (joins of more parts than a fused
//! projection has, and GGUF's own 3-D expert tensors) are widened at upload, as before: the
//! grouped GEMM reads bf16 (a stack kept in blocks anyway is widened a call at a time).
//!
//! Products: up to [`GEMV_ROWS`] activation rows a warp per weight row decodes each weight
//! once and dots it with every row (`gguf_gemv_<format>_m*`); up to [`GEMM_ROWS`] a tiled
//! product decodes weight tiles into shared memory as bf16 for tensor-core `mma`
//! (`gguf_gemm_<format>_m*`); more rows, and every product under `--batch-invariant`, widen
//! the matrix a part at a time into a bf16 scratch and take the bf16 product. The GEMV
//! multiplies the decoded weights in f32, the other two round them to bf16 first, so (as
//! with bf16 checkpoints, whose GEMV and cuBLAS sum in other orders) a row's result depends
//! on its batch's size unless `--batch-invariant` is set. Embedding lookups, casts and
//! downloads decode the rows they need (`gguf_widen_bf16`). A format, shape or alignment the kernels do not take is widened at
//! upload, as before.

use std::sync::Arc;

use cudarc::driver::{DeviceRepr, LaunchConfig};
use rayon::prelude::*;

use super::device::DeviceBuffer;
use super::{CudaBackend, CudaStorage, launch, ptr, storage};
use crate::error::{Error, Result};
use crate::quant::QuantFormat;
use crate::{DType, HostTensor, Shape, Storage, Tensor};

/// The kernels of `gguf.cu`, looked up at startup: a GEMV per format and batch bound, and
/// the widening.
pub(super) const KERNELS: [&str; 48] = [
    "gguf_gemv_q4_0_m1",
    "gguf_gemv_q4_0_m2",
    "gguf_gemv_q4_0_m4",
    "gguf_gemv_q4_0_m8",
    "gguf_gemv_q8_0_m1",
    "gguf_gemv_q8_0_m2",
    "gguf_gemv_q8_0_m4",
    "gguf_gemv_q8_0_m8",
    "gguf_gemv_q4_k_m1",
    "gguf_gemv_q4_k_m2",
    "gguf_gemv_q4_k_m4",
    "gguf_gemv_q4_k_m8",
    "gguf_gemv_q5_k_m1",
    "gguf_gemv_q5_k_m2",
    "gguf_gemv_q5_k_m4",
    "gguf_gemv_q5_k_m8",
    "gguf_gemv_q6_k_m1",
    "gguf_gemv_q6_k_m2",
    "gguf_gemv_q6_k_m4",
    "gguf_gemv_q6_k_m8",
    "gguf_gemm_q4_0_m16",
    "gguf_gemm_q4_0_m64",
    "gguf_gemm_q8_0_m16",
    "gguf_gemm_q8_0_m64",
    "gguf_gemm_q4_k_m16",
    "gguf_gemm_q4_k_m64",
    "gguf_gemm_q5_k_m16",
    "gguf_gemm_q5_k_m64",
    "gguf_gemm_q6_k_m16",
    "gguf_gemm_q6_k_m64",
    "gguf_widen_bf16",
    "gguf_quantize_q8",
    "gguf_gemv_q4_k_q8_m1",
    "gguf_gemv_q4_k_q8_m2",
    "gguf_gemv_q4_k_q8_m4",
    "gguf_gemv_q4_k_q8_m8",
    "gguf_gemv_q6_k_q8_m1",
    "gguf_gemv_q6_k_q8_m2",
    "gguf_gemv_q6_k_q8_m4",
    "gguf_gemv_q6_k_q8_m8",
    "gguf_gemv_silu_q4_k_q8_m1",
    "gguf_gemv_silu_q4_k_q8_m2",
    "gguf_gemv_silu_q4_k_q8_m4",
    "gguf_gemv_silu_q4_k_q8_m8",
    "gguf_gemv_silu_q6_k_q8_m1",
    "gguf_gemv_silu_q6_k_q8_m2",
    "gguf_gemv_silu_q6_k_q8_m4",
    "gguf_gemv_silu_q6_k_q8_m8",
];

/// The int8-activation GEMV of `format` for `m` rows, where there is one (`silu`: its
/// SwiGLU form).
fn gemv_q8_kernel(format: QuantFormat, m: usize, silu: bool) -> Option<&'static str> {
    let first = match format {
        QuantFormat::Q4_K => 32,
        QuantFormat::Q6_K => 36,
        _ => return None,
    } + if silu { 8 } else { 0 };
    Some(match m {
        1 => KERNELS[first],
        2 => KERNELS[first + 1],
        3 | 4 => KERNELS[first + 2],
        5..=GEMV_ROWS => KERNELS[first + 3],
        _ => return None,
    })
}

/// The most activation rows the tiled product takes; more widen the matrix for the bf16
/// product (prefill, where the product's FLOPs outweigh reading bf16 weights).
pub(super) const GEMM_ROWS: usize = 256;

/// `GGUF_BK` of `gguf.cu`: the tiled product's columns a step.
const GEMM_BK: usize = 128;

/// `GGUF_BN` of `gguf.cu`: weight rows a tiled-product block owns.
const GEMM_BN: usize = 64;

/// The tiled product of `format` for `m` rows (past [`GEMV_ROWS`], up to [`GEMM_ROWS`]) and
/// its token tile.
fn gemm_kernel(format: QuantFormat, m: usize) -> Option<(&'static str, usize)> {
    let f = code(format)? as usize;
    match m {
        0..=GEMV_ROWS => None,
        9..=16 => Some((KERNELS[20 + 2 * f], 16)),
        17..=GEMM_ROWS => Some((KERNELS[20 + 2 * f + 1], 64)),
        _ => None,
    }
}

/// The GEMV of `format` for batches of `m` rows (1 to [`GEMV_ROWS`]): the kernel whose
/// bound `M` is the least power of two at or above `m`.
fn gemv_kernel(format: QuantFormat, m: usize) -> Option<&'static str> {
    let f = code(format)? as usize;
    let bound = match m {
        1 => 0,
        2 => 1,
        3 | 4 => 2,
        5..=GEMV_ROWS => 3,
        _ => return None,
    };
    Some(KERNELS[4 * f + bound])
}

/// The most activation rows the GEMV takes (its largest kernel's `M`).
pub(super) const GEMV_ROWS: usize = 8;

/// The most parts a join kept in blocks has: a fused projection's (q, k and v). Joins of
/// more are expert stacks, widened at upload.
pub(super) const FUSED_PARTS: usize = 3;

/// `GGUF_WARPS` of `gguf.cu`: weight rows a GEMV block owns, a warp each.
const WARPS: usize = 4;

/// Region starts are aligned to this, as pool allocations are.
const ALIGN: usize = 256;

/// A format's code in `gguf.cu` (`GGUF_Q4_0` ...), for the formats kept in blocks.
fn code(format: QuantFormat) -> Option<u32> {
    match format {
        QuantFormat::Q4_0 => Some(0),
        QuantFormat::Q8_0 => Some(1),
        QuantFormat::Q4_K => Some(2),
        QuantFormat::Q5_K => Some(3),
        QuantFormat::Q6_K => Some(4),
        _ => None,
    }
}

/// Whether rows of `k` weights in `format` are kept in blocks: a format the kernels take and
/// rows of whole 64-weight units (256 for the K formats, whose super-blocks are 256).
fn keeps(format: QuantFormat, k: usize) -> bool {
    code(format).is_some() && k > 0 && k.is_multiple_of(format.block_elems().max(64)) && u32::try_from(k).is_ok()
}

/// Bytes a row takes in each region (quants, high bits, scales, block scales).
fn region_row_bytes(format: QuantFormat, k: usize) -> [usize; 4] {
    match format {
        QuantFormat::Q4_0 => [k / 2, 0, 0, k / 32 * 2],
        QuantFormat::Q8_0 => [k, 0, 0, k / 32 * 2],
        QuantFormat::Q4_K => [k / 2, 0, k / 256 * 16, 0],
        QuantFormat::Q5_K => [k / 2, k / 8, k / 256 * 16, 0],
        QuantFormat::Q6_K => [k / 2, k / 4, k / 16, k / 256 * 2],
        _ => [0; 4],
    }
}

/// Where each field of a block goes: (region, offset in the block, bytes, offset in the
/// block's share of the region's row).
fn fields(format: QuantFormat) -> &'static [(usize, usize, usize, usize)] {
    match format {
        // d (f16), qs[16]
        QuantFormat::Q4_0 => &[(3, 0, 2, 0), (0, 2, 16, 0)],
        // d (f16), qs[32]
        QuantFormat::Q8_0 => &[(3, 0, 2, 0), (0, 2, 32, 0)],
        // d, dmin (f16), scales[12], qs[128]: the record is scales, then d and dmin
        QuantFormat::Q4_K => &[(2, 0, 4, 12), (2, 4, 12, 0), (0, 16, 128, 0)],
        // d, dmin, scales[12], qh[32], qs[128]
        QuantFormat::Q5_K => &[(2, 0, 4, 12), (2, 4, 12, 0), (1, 16, 32, 0), (0, 48, 128, 0)],
        // ql[128], qh[64], scales[16], d (f16)
        QuantFormat::Q6_K => &[(0, 0, 128, 0), (1, 128, 64, 0), (2, 192, 16, 0), (3, 208, 2, 0)],
        _ => &[],
    }
}

/// A block's share of each region's row.
fn region_block_bytes(format: QuantFormat) -> [usize; 4] {
    let mut share = [0usize; 4];
    for &(region, _, bytes, at) in fields(format) {
        share[region] = share[region].max(at + bytes);
    }
    share
}

/// `rows` rows of `k` weights of `format` blocks, split into the regions, each starting on
/// [`ALIGN`]: the bytes and each region's start.
fn repack(format: QuantFormat, blocks: &[u8], rows: usize, k: usize) -> (Vec<u8>, [usize; 4]) {
    let row_bytes = region_row_bytes(format, k);
    let mut starts = [0usize; 4];
    let mut end = 0;
    for (start, per_row) in starts.iter_mut().zip(row_bytes) {
        *start = end;
        end = (end + per_row * rows).next_multiple_of(ALIGN);
    }
    let mut out = vec![0u8; end];
    let (block_bytes, per_row) = (format.block_bytes(), k / format.block_elems());
    let share = region_block_bytes(format);
    // Each region is filled row by row in parallel: its rows are disjoint slices.
    let mut rest: &mut [u8] = &mut out;
    let mut regions: Vec<&mut [u8]> = Vec::with_capacity(4);
    let mut taken = 0;
    for (i, &start) in starts.iter().enumerate() {
        let (_, tail) = rest.split_at_mut(start - taken);
        let (region, tail) = tail.split_at_mut(row_bytes[i] * rows);
        regions.push(region);
        taken = start + row_bytes[i] * rows;
        rest = tail;
    }
    for (i, region) in regions.into_iter().enumerate() {
        if row_bytes[i] == 0 {
            continue;
        }
        region.par_chunks_mut(row_bytes[i]).enumerate().for_each(|(r, dst)| {
            let src_row = &blocks[r * per_row * block_bytes..(r + 1) * per_row * block_bytes];
            for (blk, src) in src_row.chunks_exact(block_bytes).enumerate() {
                let dst = &mut dst[blk * share[i]..(blk + 1) * share[i]];
                for &(region, from, bytes, at) in fields(format) {
                    if region == i {
                        dst[at..at + bytes].copy_from_slice(&src[from..from + bytes]);
                    }
                }
            }
        });
    }
    (out, starts)
}

/// `GgufMat` of `gguf.cu`, passed by value: a part's regions and its format and row length.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct GgufArgs {
    qs: u64,
    qh: u64,
    sc: u64,
    d: u64,
    format: u32,
    k: u32,
}

// SAFETY: `repr(C)` plain data with the field order and types of the CUDA struct (four u64
// then two u32: 40 bytes, no padding on either side).
unsafe impl DeviceRepr for GgufArgs {}

/// Consecutive rows of one format, on the device.
pub(crate) struct GgufPart {
    format: QuantFormat,
    rows: usize,
    buf: DeviceBuffer,
    starts: [usize; 4],
}

impl GgufPart {
    fn args(&self, k: usize) -> GgufArgs {
        let at = |i: usize| self.buf.ptr() + self.starts[i] as u64;
        GgufArgs { qs: at(0), qh: at(1), sc: at(2), d: at(3), format: code(self.format).unwrap_or(0), k: k as u32 }
    }
}

/// A matrix kept in GGUF blocks: its parts, top to bottom (`CudaStorage::gguf`).
pub(crate) struct GgufMatrix {
    parts: Vec<GgufPart>,
}

/// `host` as a matrix in its blocks, or `None` when it is not one the kernels take (it is
/// then widened, as before).
pub(super) fn upload(b: &CudaBackend, host: &HostTensor<'_>) -> Result<Option<Tensor>> {
    upload_rows(b, std::slice::from_ref(host))
}

/// `parts` joined along dim 0 as one matrix in blocks, each run of consecutive parts of one
/// format one part on the device, or `None` when a part is not a matrix the kernels take.
pub(super) fn upload_rows(b: &CudaBackend, parts: &[HostTensor<'_>]) -> Result<Option<Tensor>> {
    let Some(&[_, k]) = parts.first().map(HostTensor::shape) else { return Ok(None) };
    let mut runs: Vec<(QuantFormat, Vec<&HostTensor<'_>>)> = Vec::new();
    for p in parts {
        let (DType::Quant(format), &[_, pk]) = (p.dtype(), p.shape()) else { return Ok(None) };
        if pk != k || !keeps(format, k) {
            return Ok(None);
        }
        match runs.last_mut() {
            Some((f, run)) if *f == format => run.push(p),
            _ => runs.push((format, vec![p])),
        }
    }
    let rows: usize = parts.iter().map(|p| p.shape()[0]).sum();
    if rows == 0 || u32::try_from(rows).is_err() {
        return Ok(None);
    }
    let mut kept = Vec::with_capacity(runs.len());
    for (format, run) in runs {
        let part_rows: usize = run.iter().map(|p| p.shape()[0]).sum();
        let joined: Vec<u8>;
        let bytes = match run.as_slice() {
            [one] => one.bytes(),
            _ => {
                joined = run.iter().flat_map(|p| p.bytes().iter().copied()).collect();
                &joined
            }
        };
        let (packed, starts) = repack(format, bytes, part_rows, k);
        let buf = b.dev.alloc(packed.len())?;
        b.dev.upload(&buf, &packed)?;
        kept.push(GgufPart { format, rows: part_rows, buf, starts });
    }
    let dtype = DType::Quant(kept[0].format);
    let storage = CudaStorage { gguf: Some(Arc::new(GgufMatrix { parts: kept })), ..CudaStorage::of(b.dev.alloc(0)?) };
    b.packs_gguf.store(true, std::sync::atomic::Ordering::Relaxed);
    Ok(Some(Tensor::from_storage(Storage::Cuda(storage), dtype, Shape::new(&[rows, k]))))
}

/// The blocks of `t`, if it is a matrix kept in them.
pub(super) fn of(op: &'static str, t: &Tensor) -> Result<Option<Arc<GgufMatrix>>> {
    if !matches!(t.dtype(), DType::Quant(_)) {
        return Ok(None);
    }
    Ok(storage(op, t)?.gguf.clone())
}

/// The length of `t`'s rows: its last dim (a stack of experts is `[e, n, k]`).
pub(super) fn row_len(t: &Tensor) -> usize {
    t.dims().last().copied().unwrap_or(0)
}

/// `out [m, n] = x [m, k] · wᵀ (+ bias)` for `w` kept in blocks.
pub(super) fn matmul(b: &CudaBackend, x: &Tensor, w: &GgufMatrix, bias: Option<&Tensor>) -> Result<Tensor> {
    const OP: &str = "matmul";
    let (m, k) = (x.dims()[0], x.dims()[1]);
    let n: usize = w.parts.iter().map(|p| p.rows).sum();
    if m == 0 || n == 0 {
        return b.alloc(&[m, n], DType::BF16);
    }
    // Each part's kernel and launch shape: the GEMV, else the tiled product, else none; and
    // whether the kernel reads x as int8 blocks.
    let plan: Option<Vec<(&'static str, LaunchConfig, bool)>> = if b.batch_invariant {
        None
    } else if m <= GEMV_ROWS {
        let block = (WARPS as u32 * 32, 1, 1);
        w.parts
            .iter()
            .map(|p| {
                let grid = cfg((p.rows.div_ceil(WARPS) as u32, 1, 1), block);
                match gemv_q8_kernel(p.format, m, false).filter(|_| b.gguf_int8) {
                    Some(name) => Some((name, grid, true)),
                    None => Some((gemv_kernel(p.format, m)?, grid, false)),
                }
            })
            .collect()
    } else if k.is_multiple_of(GEMM_BK) {
        w.parts
            .iter()
            .map(|p| {
                let (name, bm) = gemm_kernel(p.format, m)?;
                Some((name, cfg((p.rows.div_ceil(GEMM_BN) as u32, m.div_ceil(bm) as u32, 1), (128, 1, 1)), false))
            })
            .collect()
    } else {
        None
    };
    if let Some(plan) = plan {
        let out = b.alloc(&[m, n], DType::BF16)?;
        let (xp, op_) = (ptr(OP, x)?, ptr(OP, &out)?);
        let q8 = if plan.iter().any(|p| p.2) { Some(quantize_q8(b, x)?) } else { None };
        let mut column = 0usize;
        for (part, (name, launch, int8)) in w.parts.iter().zip(plan) {
            let args = part.args(k);
            let (rows, width, at) = (part.rows as u32, n as u32, column as u32);
            match (&q8, int8) {
                (Some(q8), true) => launch!(b, name, launch, [q8.qp, q8.dp, args, op_, m as u32, rows, width, at])?,
                _ => launch!(b, name, launch, [xp, args, op_, m as u32, rows, width, at])?,
            }
            column += part.rows;
        }
        return match bias {
            Some(bias) => super::ops::add_bias(b, &out, bias, m, n),
            None => Ok(out),
        };
    }
    let wide = widen(b, w, k, None)?;
    super::ops::matmul(b, x, &wide, bias)
}

/// `x [m, k]` as int8 blocks of 32 (bytes in u32 words) and each block's (d, d · Σq), for
/// the int8-activation GEMVs (`gguf_quantize_q8`).
struct Q8 {
    /// The quantised x this call made (none where a norm wrote it beside x, which the
    /// caller holds).
    _made: Option<(Tensor, Tensor)>,
    qp: u64,
    dp: u64,
}

fn quantize_q8(b: &CudaBackend, x: &Tensor) -> Result<Q8> {
    const OP: &str = "gguf_quantize_q8";
    if let Some((qp, dp)) = b.q8_of(OP, x)? {
        // A norm wrote it beside x.
        return Ok(Q8 { _made: None, qp, dp });
    }
    let (m, k) = (x.dims()[0], x.dims()[1]);
    let blocks = m * k / 32;
    let (q, ds) = (b.alloc(&[m * k / 4], DType::U32)?, b.alloc(&[2 * blocks], DType::F32)?);
    let (qp, dp) = (ptr(OP, &q)?, ptr(OP, &ds)?);
    let grid = cfg((blocks.div_ceil(4) as u32, 1, 1), (128, 1, 1));
    launch!(b, KERNELS[31], grid, [ptr(OP, x)?, qp, dp, blocks as u32])?;
    Ok(Q8 { _made: Some((q, ds)), qp, dp })
}

/// `silu(x · gᵀ) · (x · uᵀ)` for `w = [g; u]` kept in blocks as one Q4_K or Q6_K part, in
/// one kernel over int8 activations (`gguf_gemv_silu_*`), where that applies: `None`
/// otherwise (the product, then `silu_mul`).
pub(super) fn matmul_silu_mul(b: &CudaBackend, x: &Tensor, w: &GgufMatrix) -> Result<Option<Tensor>> {
    const OP: &str = "matmul_silu_mul";
    let (m, k) = (x.dims()[0], x.dims()[1]);
    let [part] = w.parts.as_slice() else { return Ok(None) };
    let Some(name) = gemv_q8_kernel(part.format, m, true) else { return Ok(None) };
    if b.batch_invariant || !b.gguf_int8 || m == 0 || part.rows % 2 != 0 {
        return Ok(None);
    }
    let half = part.rows / 2;
    let out = b.alloc(&[m, half], DType::BF16)?;
    let q8 = quantize_q8(b, x)?;
    let grid = cfg((half.div_ceil(WARPS) as u32, 1, 1), (WARPS as u32 * 32, 1, 1));
    launch!(b, name, grid, [q8.qp, q8.dp, part.args(k), ptr(OP, &out)?, m as u32, half as u32])?;
    Ok(Some(out))
}

/// A launch of `grid` blocks of `block` threads without dynamic shared memory.
fn cfg(grid: (u32, u32, u32), block: (u32, u32, u32)) -> LaunchConfig {
    LaunchConfig { grid_dim: grid, block_dim: block, shared_mem_bytes: 0 }
}

/// Rows of `w` as bf16 `[rows, k]`: all of them, or those `index` names.
pub(super) fn widen(b: &CudaBackend, w: &GgufMatrix, k: usize, index: Option<&Tensor>) -> Result<Tensor> {
    const OP: &str = "gguf_widen";
    let Some(index) = index else {
        let n: usize = w.parts.iter().map(|p| p.rows).sum();
        let out = b.alloc(&[n, k], DType::BF16)?;
        let mut first = 0usize;
        for part in &w.parts {
            let dst = ptr(OP, &out)? + (first * k * 2) as u64;
            widen_part(b, part, k, 0, part.rows, dst)?;
            first += part.rows;
        }
        return Ok(out);
    };
    let count = index.elem_count();
    let out = b.alloc(&[count, k], DType::BF16)?;
    match w.parts.as_slice() {
        [part] => widen_part(b, part, k, ptr(OP, index)?, count, ptr(OP, &out)?)?,
        // Rows of several parts: the whole matrix, then the rows.
        _ => {
            let all = widen(b, w, k, None)?;
            return super::ops::gather(b, index, &all, OP);
        }
    }
    Ok(out)
}

fn widen_part(b: &CudaBackend, part: &GgufPart, k: usize, index: u64, count: usize, dst: u64) -> Result<()> {
    let threads = count * (k / 64);
    if threads == 0 {
        return Ok(());
    }
    let blocks = u32::try_from(threads.div_ceil(256))
        .map_err(|_| Error::InvalidArgument(format!("gguf_widen: {count} rows of {k} exceed one launch")))?;
    let cfg = cfg((blocks, 1, 1), (256, 1, 1));
    launch!(b, "gguf_widen_bf16", cfg, [part.args(k), index, part.rows as u32, dst, count as u32])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize_row;

    /// A block of `format` with every byte distinct-ish and f16 scales that are finite.
    fn blocks(format: QuantFormat, rows: usize, k: usize) -> Vec<u8> {
        let mut bytes: Vec<u8> = (0..rows * k / format.block_elems() * format.block_bytes())
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8)
            .collect();
        // f16 scales at their offsets: 0x3c00 (1.0) with a small mantissa.
        let scale_at: &[usize] = match format {
            QuantFormat::Q4_0 | QuantFormat::Q8_0 => &[0],
            QuantFormat::Q4_K | QuantFormat::Q5_K => &[0, 2],
            QuantFormat::Q6_K => &[208],
            _ => &[],
        };
        for block in bytes.chunks_exact_mut(format.block_bytes()) {
            for &at in scale_at {
                block[at + 1] = 0x2c | (block[at + 1] & 0x03);
            }
        }
        bytes
    }

    /// Reads weight `j` of row `r` back from the regions as `gguf.cu` decodes them, in f64
    /// on the host: the layout, checked against the host's own dequantisation.
    fn decode(format: QuantFormat, packed: &[u8], starts: [usize; 4], k: usize, r: usize, j: usize) -> f32 {
        let rb = region_row_bytes(format, k);
        let reg = |i: usize, at: usize| packed[starts[i] + r * rb[i] + at];
        let h =
            |i: usize, at: usize| half::f16::from_bits(u16::from(reg(i, at)) | u16::from(reg(i, at + 1)) << 8).to_f32();
        match format {
            QuantFormat::Q8_0 => h(3, j / 32 * 2) * f32::from(reg(0, j) as i8),
            QuantFormat::Q4_0 => {
                let (blk, e) = (j / 32, j % 32);
                let byte = reg(0, blk * 16 + e % 16);
                let q = if e < 16 { byte & 15 } else { byte >> 4 };
                (f32::from(q) - 8.0) * h(3, blk * 2)
            }
            QuantFormat::Q4_K | QuantFormat::Q5_K => {
                let (s, w) = (j / 256, j % 256);
                let (sub, l) = (w / 32, w % 32);
                let rec = |i: usize| reg(2, s * 16 + i);
                let (sc, mn) = if sub < 4 {
                    (rec(sub) & 63, rec(sub + 4) & 63)
                } else {
                    ((rec(sub + 4) & 15) | ((rec(sub - 4) >> 6) << 4), (rec(sub + 4) >> 4) | ((rec(sub) >> 6) << 4))
                };
                let (d, dmin) = (h(2, s * 16 + 12), h(2, s * 16 + 14));
                let byte = reg(0, s * 128 + sub / 2 * 32 + l);
                let mut q = if sub % 2 == 0 { byte & 15 } else { byte >> 4 };
                if format == QuantFormat::Q5_K {
                    q += ((reg(1, s * 32 + l) >> sub) & 1) << 4;
                }
                (d * f32::from(sc)) * f32::from(q) - dmin * f32::from(mn)
            }
            QuantFormat::Q6_K => {
                let (s, w) = (j / 256, j % 256);
                let (n, w) = (w / 128, w % 128);
                let (c, l) = (w / 32, w % 32);
                let ql = reg(0, s * 128 + n * 64 + (c % 2) * 32 + l);
                let nib = if c < 2 { ql & 15 } else { ql >> 4 };
                let hi = (reg(1, s * 64 + n * 32 + l) >> (2 * c)) & 3;
                let q = i32::from(nib | hi << 4) - 32;
                let sc = reg(2, s * 16 + n * 8 + l / 16 + 2 * c) as i8;
                (h(3, s * 2) * f32::from(sc)) * q as f32
            }
            _ => unreachable!(),
        }
    }

    #[test]
    fn repacked_regions_decode_to_the_hosts_weights() {
        for format in [QuantFormat::Q4_0, QuantFormat::Q8_0, QuantFormat::Q4_K, QuantFormat::Q5_K, QuantFormat::Q6_K] {
            let (rows, k) = (3, 512);
            let bytes = blocks(format, rows, k);
            let (packed, starts) = repack(format, &bytes, rows, k);
            assert!(starts.iter().all(|s| s % ALIGN == 0), "{format}: region starts {starts:?}");
            let row_bytes = bytes.len() / rows;
            for r in 0..rows {
                let mut want = vec![0f32; k];
                dequantize_row(format, &bytes[r * row_bytes..(r + 1) * row_bytes], &mut want);
                for (j, &w) in want.iter().enumerate() {
                    let got = decode(format, &packed, starts, k, r, j);
                    assert_eq!(got.to_bits(), w.to_bits(), "{format} row {r} weight {j}: {got} vs {w}");
                }
            }
        }
    }

    #[test]
    fn regions_hold_as_many_bytes_as_the_blocks() {
        for format in [QuantFormat::Q4_0, QuantFormat::Q8_0, QuantFormat::Q4_K, QuantFormat::Q5_K, QuantFormat::Q6_K] {
            let k = 1024;
            let per_row: usize = region_row_bytes(format, k).iter().sum();
            assert_eq!(per_row, k / format.block_elems() * format.block_bytes(), "{format}");
            let share: usize = region_block_bytes(format).iter().sum();
            assert_eq!(share, format.block_bytes(), "{format}");
        }
    }

    #[test]
    fn each_format_and_batch_finds_its_gemv() {
        assert_eq!(gemv_kernel(QuantFormat::Q4_0, 1), Some("gguf_gemv_q4_0_m1"));
        assert_eq!(gemv_kernel(QuantFormat::Q8_0, 2), Some("gguf_gemv_q8_0_m2"));
        assert_eq!(gemv_kernel(QuantFormat::Q4_K, 3), Some("gguf_gemv_q4_k_m4"));
        assert_eq!(gemv_kernel(QuantFormat::Q5_K, 5), Some("gguf_gemv_q5_k_m8"));
        assert_eq!(gemv_kernel(QuantFormat::Q6_K, 8), Some("gguf_gemv_q6_k_m8"));
        assert_eq!(gemv_kernel(QuantFormat::Q6_K, 9), None);
        assert_eq!(gemv_kernel(QuantFormat::Q4_1, 1), None);
    }

    #[test]
    fn batches_past_the_gemv_find_their_tiled_product() {
        assert_eq!(gemm_kernel(QuantFormat::Q4_K, 8), None);
        assert_eq!(gemm_kernel(QuantFormat::Q4_0, 9), Some(("gguf_gemm_q4_0_m16", 16)));
        assert_eq!(gemm_kernel(QuantFormat::Q8_0, 17), Some(("gguf_gemm_q8_0_m64", 64)));
        assert_eq!(gemm_kernel(QuantFormat::Q5_K, 16), Some(("gguf_gemm_q5_k_m16", 16)));
        assert_eq!(gemm_kernel(QuantFormat::Q6_K, 256), Some(("gguf_gemm_q6_k_m64", 64)));
        assert_eq!(gemm_kernel(QuantFormat::Q4_K, 257), None);
        assert_eq!(gemm_kernel(QuantFormat::Q4_K, 40), Some(("gguf_gemm_q4_k_m64", 64)));
    }

    #[test]
    fn only_whole_units_of_the_kernels_formats_are_kept() {
        assert!(keeps(QuantFormat::Q4_K, 4096));
        assert!(!keeps(QuantFormat::Q4_K, 4096 + 32));
        assert!(keeps(QuantFormat::Q8_0, 64));
        assert!(!keeps(QuantFormat::Q8_0, 96));
        assert!(!keeps(QuantFormat::Q4_1, 4096));
        assert!(!keeps(QuantFormat::F8_E4M3, 4096));
    }
}
