//! The dense ops of the CUDA backend: shape and dtype checks on the host (the same rules as
//! the CPU backend), then one kernel or cuBLAS call each. Float operands are bf16 (the
//! backend's float dtype); rotary frequencies are f32.

use cudarc::driver::LaunchConfig;

use super::gemm::Gemm;
use super::gemv::{self, Gemv};
use super::{CudaBackend, elementwise, expect_dtype, launch, per_row, ptr, storage};
use super::{fp8, gguf};
use crate::error::{Error, Result, ensure};
use crate::{DType, Tensor};

const BF16: &[DType] = &[DType::BF16];

pub(super) fn cast(b: &CudaBackend, t: &Tensor, dtype: DType) -> Result<Tensor> {
    if t.dtype() == fp8::FP8 && dtype == DType::BF16 {
        return fp8::rows_bf16(b, t, None)?.reshape(t.dims());
    }
    if dtype == DType::BF16
        && let Some(w) = gguf::of("cast", t)?
    {
        return gguf::widen(b, &w, gguf::row_len(t), None)?.reshape(t.dims());
    }
    expect_dtype("cast", t, &[DType::BF16, DType::F32])?;
    if !matches!(dtype, DType::BF16 | DType::F32) {
        return Err(Error::DType { op: "cast", expected: DType::F32, got: dtype });
    }
    let out = b.alloc(t.dims(), dtype)?;
    let n = t.elem_count() as u64;
    match (t.dtype(), dtype) {
        (DType::BF16, DType::F32) => {
            launch!(b, "cast_bf16_f32", elementwise(n as usize), [ptr("cast", t)?, ptr("cast", &out)?, n])?;
        }
        (DType::F32, DType::BF16) => {
            launch!(b, "cast_f32_bf16", elementwise(n as usize), [ptr("cast", t)?, ptr("cast", &out)?, n])?;
        }
        _ => {
            let bytes = t.elem_count() * dtype.size_in_bytes();
            b.dev.copy(&storage("cast", t)?.buf, &storage("cast", &out)?.buf, bytes)?;
        }
    }
    Ok(out)
}

pub(super) fn matmul(b: &CudaBackend, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let (m, k, n) = crate::check::matmul(x, w, bias)?;
    if let Some(bias) = bias {
        expect_dtype("matmul", bias, BF16)?;
    }
    expect_dtype("matmul", x, BF16)?;
    if let Some(blocks) = gguf::of("matmul", w)? {
        return gguf::matmul(b, x, &blocks, bias);
    }
    expect_dtype("matmul", w, &[DType::BF16, fp8::FP8])?;
    if w.dtype() == fp8::FP8 && m > 0 && n > 0 {
        // cuBLASLt's FP8 products write rows up to a multiple of 8: the first m are kept.
        let rows = fp8::out_rows(b, m);
        let out = b.alloc(&[rows, n], DType::BF16)?;
        fp8::matmul(b, x, w, bias, &out)?;
        return if rows == m { Ok(out) } else { b.view("matmul", &out, 0, &[m, n]) };
    }
    let out = b.alloc(&[m, n], DType::BF16)?;
    if m == 0 || n == 0 {
        return Ok(out);
    }
    let out_ptr = ptr("matmul", &out)?;
    if b.batch_invariant && k > 0 {
        super::moe::dense_gemm(b, (ptr("matmul", x)?, ptr("matmul", w)?, out_ptr), m, n, k)?;
        return match bias {
            Some(bias) => add_bias(b, &out, bias, m, n),
            None => Ok(out),
        };
    }
    if gemv::applies(m, n, k) {
        let bias = bias.map(|t| ptr("matmul", t)).transpose()?.unwrap_or(0);
        let g = Gemv { x: ptr("matmul", x)?, w: ptr("matmul", w)?, bias, out: out_ptr, m, n, k };
        gemv::gemv(b, &g)?;
        return Ok(out);
    }
    match bias {
        Some(bias) => {
            let total = (m * n) as u64;
            launch!(b, "fill_rows_bf16", elementwise(m * n), [ptr("matmul", bias)?, out_ptr, n as u32, total])?;
        }
        None if k == 0 => b.dev.zero(&storage("matmul", &out)?.buf, m * n * 2)?,
        None => {}
    }
    if k > 0 {
        let g = Gemm { x: ptr("matmul", x)?, w: ptr("matmul", w)?, out: out_ptr, m, n, k, accumulate: bias.is_some() };
        b.timed("cublas_gemm", || b.blas.gemm(&b.dev, g))?;
    }
    Ok(out)
}

/// `out [m, n] += bias [n]` in place, for a product that could not add it in its sum.
pub(super) fn add_bias(b: &CudaBackend, out: &Tensor, bias: &Tensor, m: usize, n: usize) -> Result<Tensor> {
    let total = (m * n) as u64;
    launch!(b, "add_rows_bf16", elementwise(m * n), [ptr("matmul", bias)?, ptr("matmul", out)?, n as u32, total])?;
    Ok(out.clone())
}

/// Norm weights are bf16 (`LlamaRMSNorm`) or f32 (`GemmaRMSNorm`'s `1 + w`); see
/// `norm_weighted` in `common.cuh`.
fn check_norm(op: &'static str, x: &Tensor, weight: &Tensor) -> Result<usize> {
    let n = x.shape().last();
    ensure(n > 0 && weight.dims() == [n], op, || {
        format!("weight {:?} does not match x {:?}", weight.dims(), x.dims())
    })?;
    expect_dtype(op, x, BF16)?;
    expect_dtype(op, weight, &[DType::BF16, DType::F32])?;
    Ok(n)
}

/// `NORM_VECS` of `dense.cu`: 16-byte chunks per thread of the vector norm kernels.
const NORM_VECS: usize = 4;

/// A norm's kernel and launch shape: the vector kernel (`*_v_*`: one block per row, each
/// thread holding up to `NORM_VECS` chunks of 8) for rows of a multiple of 8 elements at
/// 16-byte aligned addresses, else the scalar one; `_wf32` for an f32 weight.
fn norm_launch(op: &'static str, weight: &Tensor, rows: usize, n: usize, ptrs: &[u64]) -> (&'static str, LaunchConfig) {
    let chunks = n / 8;
    let vector = n.is_multiple_of(8) && chunks <= NORM_VECS * 1024 && ptrs.iter().all(|p| p.is_multiple_of(16));
    let f32_weight = weight.dtype() == DType::F32;
    let kernel = match (op, vector, f32_weight) {
        ("rms_norm", true, false) => "rms_norm_v_bf16",
        ("rms_norm", true, true) => "rms_norm_v_bf16_wf32",
        ("rms_norm", false, false) => "rms_norm_bf16",
        ("rms_norm", false, true) => "rms_norm_bf16_wf32",
        (_, true, false) => "add_rms_norm_v_bf16",
        (_, true, true) => "add_rms_norm_v_bf16_wf32",
        (_, false, false) => "add_rms_norm_bf16",
        (_, false, true) => "add_rms_norm_bf16_wf32",
    };
    let cfg = if vector { per_row(rows, chunks.div_ceil(NORM_VECS), 1024) } else { per_row(rows, n, 1024) };
    (kernel, cfg)
}

/// Whether a norm of `rows` rows of `n` (launched as `kernel`) writes its rows' int8 form
/// too: a decode step of a model with GGUF matrices whose GEMVs read int8 activations, on
/// the vector kernels (four lanes a block of 32).
fn norm_writes_q8(b: &CudaBackend, kernel: &str, rows: usize, n: usize) -> bool {
    b.gguf_int8
        && b.packs_gguf.load(std::sync::atomic::Ordering::Relaxed)
        && !b.batch_invariant
        && rows <= gguf::GEMV_ROWS
        && n.is_multiple_of(32)
        && kernel.contains("_v_")
}

/// `kernel`'s form that also writes the int8 form of its rows.
fn q8_kernel(kernel: &str) -> &'static str {
    match kernel {
        "rms_norm_v_bf16" => "rms_norm_v_q8_bf16",
        "rms_norm_v_bf16_wf32" => "rms_norm_v_q8_bf16_wf32",
        "add_rms_norm_v_bf16" => "add_rms_norm_v_q8_bf16",
        _ => "add_rms_norm_v_q8_bf16_wf32",
    }
}

/// `kernel`'s form that also writes the e4m3 form of its rows, by row or by 128 columns.
fn e4m3_kernel(kernel: &str, block: bool) -> &'static str {
    match (kernel, block) {
        ("rms_norm_v_bf16", false) => "rms_norm_v_e4m3r_bf16",
        ("rms_norm_v_bf16_wf32", false) => "rms_norm_v_e4m3r_bf16_wf32",
        ("add_rms_norm_v_bf16", false) => "add_rms_norm_v_e4m3r_bf16",
        (_, false) => "add_rms_norm_v_e4m3r_bf16_wf32",
        ("rms_norm_v_bf16", true) => "rms_norm_v_e4m3v_bf16",
        ("rms_norm_v_bf16_wf32", true) => "rms_norm_v_e4m3v_bf16_wf32",
        ("add_rms_norm_v_bf16", true) => "add_rms_norm_v_e4m3v_bf16",
        (_, true) => "add_rms_norm_v_e4m3v_bf16_wf32",
    }
}

/// A norm's output with room for its rows' e4m3 form, and the launch that writes both.
struct E4m3Norm {
    out: Tensor,
    kernel: &'static str,
    /// One block a row of the padded rows.
    cfg: LaunchConfig,
    /// The e4m3 rows' and their scales' addresses.
    q: u64,
    scales: u64,
}

/// [`E4m3Norm`] where [`fp8::norm_writes_e4m3`] says a norm of `rows` rows of `n` (launched
/// as `kernel` with `cfg`) writes the e4m3 form too; `None` where it does not.
fn e4m3_norm(
    b: &CudaBackend,
    x: &Tensor,
    kernel: &str,
    cfg: LaunchConfig,
    rows: usize,
    n: usize,
) -> Result<Option<E4m3Norm>> {
    let Some(block) = kernel.contains("_v_").then(|| fp8::norm_writes_e4m3(b, rows, n)).flatten() else {
        return Ok(None);
    };
    let padded = rows.next_multiple_of(8);
    let out = b.alloc_e4m3(x.dims(), n, padded, block)?;
    let (q, scales) =
        storage("rms_norm", &out)?.e4m3.as_ref().map(|r| (r.q.ptr(), r.scales.ptr())).expect("alloc_e4m3");
    let cfg = LaunchConfig { grid_dim: (padded as u32, 1, 1), ..cfg };
    Ok(Some(E4m3Norm { out, kernel: e4m3_kernel(kernel, block), cfg, q, scales }))
}

pub(super) fn rms_norm(b: &CudaBackend, x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    let n = check_norm("rms_norm", x, weight)?;
    let rows = x.elem_count() / n;
    // The pointers only decide the vector form's alignment; the output is aligned as x is.
    let (xp, wp) = (ptr("rms_norm", x)?, ptr("rms_norm", weight)?);
    let (kernel, cfg) = norm_launch("rms_norm", weight, rows, n, &[xp, wp]);
    if rows > 0
        && let Some(e) = e4m3_norm(b, x, kernel, cfg, rows, n)?
    {
        let (op, padded) = (ptr("rms_norm", &e.out)?, e.cfg.grid_dim.0);
        launch!(b, e.kernel, e.cfg, [xp, wp, op, n as u32, eps, e.q, e.scales, rows as u32, padded])?;
        return Ok(e.out);
    }
    if rows > 0 && norm_writes_q8(b, kernel, rows, n) {
        let out = b.alloc_q8(x.dims(), n)?;
        let (qp, dp) = b.q8_of("rms_norm", &out)?.expect("alloc_q8 makes the int8 form");
        launch!(b, q8_kernel(kernel), cfg, [xp, wp, ptr("rms_norm", &out)?, n as u32, eps, qp, dp])?;
        return Ok(out);
    }
    let out = b.alloc(x.dims(), DType::BF16)?;
    if rows > 0 {
        let op = ptr("rms_norm", &out)?;
        let (kernel, cfg) = norm_launch("rms_norm", weight, rows, n, &[xp, wp, op]);
        launch!(b, kernel, cfg, [xp, wp, op, n as u32, eps])?;
    }
    Ok(out)
}

pub(super) fn add_rms_norm(
    b: &CudaBackend,
    x: &Tensor,
    residual: &Tensor,
    weight: &Tensor,
    eps: f32,
) -> Result<(Tensor, Tensor)> {
    ensure(x.dims() == residual.dims(), "add_rms_norm", || {
        format!("x {:?} and residual {:?} differ", x.dims(), residual.dims())
    })?;
    let n = check_norm("add_rms_norm", x, weight)?;
    expect_dtype("add_rms_norm", residual, BF16)?;
    let op = "add_rms_norm";
    let rows = x.elem_count() / n;
    let (xp, rp, wp) = (ptr(op, x)?, ptr(op, residual)?, ptr(op, weight)?);
    let (kernel, cfg) = norm_launch(op, weight, rows, n, &[xp, rp, wp]);
    if rows > 0
        && let Some(e) = e4m3_norm(b, x, kernel, cfg, rows, n)?
    {
        let sum = b.alloc(x.dims(), DType::BF16)?;
        let (np, smp, padded) = (ptr(op, &e.out)?, ptr(op, &sum)?, e.cfg.grid_dim.0);
        launch!(b, e.kernel, e.cfg, [xp, rp, wp, np, smp, n as u32, eps, e.q, e.scales, rows as u32, padded])?;
        return Ok((e.out, sum));
    }
    let q8 = rows > 0 && norm_writes_q8(b, kernel, rows, n);
    let normed = if q8 { b.alloc_q8(x.dims(), n)? } else { b.alloc(x.dims(), DType::BF16)? };
    let sum = b.alloc(x.dims(), DType::BF16)?;
    if rows > 0 {
        let (np, sp) = (ptr(op, &normed)?, ptr(op, &sum)?);
        let (kernel, cfg) = norm_launch(op, weight, rows, n, &[xp, rp, wp, np, sp]);
        match b.q8_of(op, &normed)? {
            Some((qp, dp)) if kernel.contains("_v_") => {
                launch!(b, q8_kernel(kernel), cfg, [xp, rp, wp, np, sp, n as u32, eps, qp, dp])?
            }
            _ => launch!(b, kernel, cfg, [xp, rp, wp, np, sp, n as u32, eps])?,
        }
    }
    Ok((normed, sum))
}

pub(super) fn rotary(b: &CudaBackend, x: &Tensor, positions: &Tensor, inv_freq: &Tensor) -> Result<Tensor> {
    let dims = x.dims();
    let (t, h, d, half) = crate::check::rotary(x, positions, inv_freq)?;
    expect_dtype("rotary", x, BF16)?;
    expect_dtype("rotary", positions, &[DType::U32])?;
    expect_dtype("rotary", inv_freq, &[DType::F32])?;
    let out = b.alloc(dims, DType::BF16)?;
    if t > 0 && h * d > 0 {
        let op = "rotary";
        let args = (ptr(op, x)?, ptr(op, positions)?, ptr(op, inv_freq)?, ptr(op, &out)?);
        let cfg = per_row(t, h * d, 256);
        launch!(b, "rotary_bf16", cfg, [args.0, args.1, args.2, args.3, h as u32, d as u32, half as u32])?;
    }
    Ok(out)
}

/// Decode batches fuse the activation into the product; larger ones run the two ops.
pub(super) fn matmul_silu_mul(b: &CudaBackend, x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (m, k, n) = crate::check::matmul(x, w, None)?;
    expect_dtype("matmul_silu_mul", x, BF16)?;
    if let Some(blocks) = gguf::of("matmul_silu_mul", w)? {
        ensure(n % 2 == 0, "matmul_silu_mul", || format!("w {:?} has an odd number of rows", w.dims()))?;
        if let Some(out) = gguf::matmul_silu_mul(b, x, &blocks)? {
            return Ok(out);
        }
        return silu_mul(b, &matmul(b, x, w, None)?);
    }
    expect_dtype("matmul_silu_mul", w, &[DType::BF16, fp8::FP8])?;
    ensure(n % 2 == 0, "matmul_silu_mul", || format!("w {:?} has an odd number of rows", w.dims()))?;
    if w.dtype() == fp8::FP8 && m > 0 && fp8::gemv_only(b, m) {
        let out = b.alloc(&[m, n / 2], DType::BF16)?;
        fp8::matmul_silu_mul(b, x, w, &out)?;
        return Ok(out);
    }
    if w.dtype() == fp8::FP8 {
        return silu_mul_e4m3(b, &matmul(b, x, w, None)?);
    }
    if b.batch_invariant || !gemv::applies(m, n, k) {
        return silu_mul(b, &matmul(b, x, w, None)?);
    }
    let out = b.alloc(&[m, n / 2], DType::BF16)?;
    let op = "matmul_silu_mul";
    gemv::gemv_silu(b, ptr(op, x)?, ptr(op, w)?, ptr(op, &out)?, m, n / 2, k)?;
    Ok(out)
}

pub(super) fn silu_mul(b: &CudaBackend, x: &Tensor) -> Result<Tensor> {
    let (rows, n2) = x.shape().rows_cols();
    ensure(n2 % 2 == 0 && x.shape().rank() > 0, "silu_mul", || format!("last dim of {:?} is odd", x.dims()))?;
    expect_dtype("silu_mul", x, BF16)?;
    let n = n2 / 2;
    let mut dims = x.dims().to_vec();
    *dims.last_mut().expect("rank >= 1 checked above") = n;
    let out = b.alloc(&dims, DType::BF16)?;
    gated_mul(b, "silu_mul", x, &out, rows, n)?;
    Ok(out)
}

/// `silu_mul` of an FP8 product of a larger batch, with the result's e4m3 form beside it
/// where [`fp8::norm_writes_e4m3`] says the products after it read one, as a norm writes it
/// (`silu_mul_e4m3*` of `dense.cu`): the down projection then skips its quantize kernel.
/// Elsewhere the plain activation.
fn silu_mul_e4m3(b: &CudaBackend, x: &Tensor) -> Result<Tensor> {
    const OP: &str = "silu_mul";
    let (rows, n2) = x.shape().rows_cols();
    let n = n2 / 2;
    let xp = ptr(OP, x)?;
    let vector = n2 % 2 == 0 && n.is_multiple_of(8) && xp.is_multiple_of(16) && u32::try_from(rows).is_ok();
    let block = match fp8::norm_writes_e4m3(b, rows, n) {
        Some(block) if rows > 0 && vector && x.dtype() == DType::BF16 => block,
        _ => return silu_mul(b, x),
    };
    let mut dims = x.dims().to_vec();
    *dims.last_mut().expect("rows_cols of a tensor with rows") = n;
    let padded = rows.next_multiple_of(8);
    let out = b.alloc_e4m3(&dims, n, padded, block)?;
    let (q, s) = storage(OP, &out)?.e4m3.as_ref().map(|r| (r.q.ptr(), r.scales.ptr())).expect("alloc_e4m3");
    let kernel = if block { "silu_mul_e4m3v_bf16" } else { "silu_mul_e4m3r_bf16" };
    let cfg = LaunchConfig { grid_dim: (padded as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    launch!(b, kernel, cfg, [xp, ptr(OP, &out)?, q, s, n as u32, rows as u32, padded as u32])?;
    Ok(out)
}

/// Launches the gated activation `op` (`silu_mul`, `gelu_tanh_mul`) of `x [rows, 2n]` into
/// `out [rows, n]`: the vector kernel (`{op}_v_bf16`: 8 columns a thread, a grid row per
/// token row) when `n` is a multiple of 8 and both are 16-byte aligned, else the scalar one.
fn gated_mul(b: &CudaBackend, op: &'static str, x: &Tensor, out: &Tensor, rows: usize, n: usize) -> Result<()> {
    let total = rows * n;
    if total == 0 {
        return Ok(());
    }
    let (xp, op_) = (ptr(op, x)?, ptr(op, out)?);
    if n.is_multiple_of(8) && xp.is_multiple_of(16) && op_.is_multiple_of(16) && u32::try_from(rows).is_ok() {
        let kernel = if op == "silu_mul" { "silu_mul_v_bf16" } else { "gelu_tanh_mul_v_bf16" };
        let cfg = LaunchConfig {
            grid_dim: ((n / 8).div_ceil(128) as u32, rows.min(65_535) as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        return launch!(b, kernel, cfg, [xp, op_, n as u32, rows as u32]);
    }
    let kernel = if op == "silu_mul" { "silu_mul_bf16" } else { "gelu_tanh_mul_bf16" };
    launch!(b, kernel, elementwise(total), [xp, op_, n as u32, total as u64])
}

pub(super) fn gelu_tanh_mul(b: &CudaBackend, x: &Tensor) -> Result<Tensor> {
    let (rows, n2) = x.shape().rows_cols();
    let op = "gelu_tanh_mul";
    ensure(n2 % 2 == 0 && x.shape().rank() > 0, op, || format!("last dim of {:?} is odd", x.dims()))?;
    expect_dtype(op, x, BF16)?;
    let n = n2 / 2;
    let mut dims = x.dims().to_vec();
    *dims.last_mut().expect("rank >= 1 checked above") = n;
    let out = b.alloc(&dims, DType::BF16)?;
    gated_mul(b, op, x, &out, rows, n)?;
    Ok(out)
}

/// One elementwise kernel of a float tensor with one f32 argument, `{name}_bf16` or `{name}_f32`.
fn map_float(b: &CudaBackend, op: &'static str, x: &Tensor, arg: f32) -> Result<Tensor> {
    expect_dtype(op, x, &[DType::BF16, DType::F32])?;
    let out = b.alloc(x.dims(), x.dtype())?;
    let n = x.elem_count();
    if n > 0 {
        let kernel = match (op, x.dtype()) {
            ("scale", DType::F32) => "scale_f32",
            ("scale", _) => "scale_bf16",
            (_, DType::F32) => "softcap_f32",
            _ => "softcap_bf16",
        };
        launch!(b, kernel, elementwise(n), [ptr(op, x)?, ptr(op, &out)?, arg, n as u64])?;
    }
    Ok(out)
}

/// The factor is rounded to the dtype of `x` first, as the trait promises.
pub(super) fn scale(b: &CudaBackend, x: &Tensor, factor: f32) -> Result<Tensor> {
    let factor = if x.dtype() == DType::BF16 { half::bf16::from_f32(factor).to_f32() } else { factor };
    map_float(b, "scale", x, factor)
}

pub(super) fn softcap(b: &CudaBackend, x: &Tensor, cap: f32) -> Result<Tensor> {
    crate::check::softcap(cap)?;
    map_float(b, "softcap", x, cap)
}

pub(super) fn embedding(b: &CudaBackend, ids: &Tensor, table: &Tensor) -> Result<Tensor> {
    let td = table.dims();
    ensure(td.len() == 2 && ids.dims().len() == 1, "embedding", || {
        format!("ids {:?} / table {td:?} are not [t] / [v, h]", ids.dims())
    })?;
    gather(b, ids, table, "embedding")
}

pub(super) fn gather_rows(b: &CudaBackend, x: &Tensor, rows: &Tensor) -> Result<Tensor> {
    ensure(x.dims().len() == 2 && rows.dims().len() == 1, "gather_rows", || {
        format!("x {:?} / rows {:?} are not [m, n] / [r]", x.dims(), rows.dims())
    })?;
    gather(b, rows, x, "gather_rows")
}

/// `GpuBackend::gather_u32`: one elementwise kernel; `src` is read on the device only.
pub(super) fn gather_u32(b: &CudaBackend, src: &Tensor, rows: &[u32]) -> Result<Tensor> {
    const OP: &str = "gather_u32";
    crate::check::gather_u32(src, rows)?;
    if let Some(values) = b.host_copy_u32(OP, src)? {
        let picked: Vec<u32> = rows.iter().map(|&r| values[r as usize]).collect();
        return b.upload_u32(&picked, &[rows.len()]);
    }
    let out = b.alloc(&[rows.len()], DType::U32)?;
    if !rows.is_empty() {
        let rows_t = b.upload_u32(rows, &[rows.len()])?;
        let n = rows.len() as u32;
        launch!(b, OP, elementwise(rows.len()), [ptr(OP, src)?, ptr(OP, &rows_t)?, ptr(OP, &out)?, n])?;
    }
    if b.drawn_only(OP, src)? {
        b.mark_drawn(OP, &out)?;
    }
    Ok(out)
}

pub(super) fn gather(b: &CudaBackend, idx: &Tensor, table: &Tensor, op: &'static str) -> Result<Tensor> {
    let (v, h) = (table.dims()[0], table.dims()[1]);
    let blocks = gguf::of(op, table)?;
    if blocks.is_none() {
        expect_dtype(op, table, &[DType::BF16, DType::F32, fp8::FP8])?;
    }
    expect_dtype(op, idx, &[DType::U32])?;
    // Drawn tokens are not brought back to be checked (`CudaStorage::drawn`): a step fed
    // from the draws before it would wait for them. The kernel reads zeros for an id past
    // the table (a failed draw's `NO_TOKEN`, whose sequence fails when the draw is read).
    if !b.drawn_only(op, idx)? {
        let ids = b.host_u32(op, idx)?;
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= v) {
            return Err(Error::InvalidArgument(format!("{op}: index {bad} is out of range for {v} rows")));
        }
    }
    if table.dtype() == fp8::FP8 {
        return fp8::rows_bf16(b, table, Some(idx));
    }
    if let Some(blocks) = blocks {
        return gguf::widen(b, &blocks, h, Some(idx));
    }
    let rows = idx.elem_count();
    let out = b.alloc(&[rows, h], table.dtype())?;
    let total = rows * h;
    if total > 0 {
        let args = (ptr(op, table)?, ptr(op, idx)?, ptr(op, &out)?, v as u32, h as u32, total as u64);
        let cfg = elementwise(total);
        match table.dtype() {
            DType::F32 => launch!(b, "gather_rows_f32", cfg, [args.0, args.1, args.2, args.3, args.4, args.5])?,
            _ => launch!(b, "gather_rows_bf16", cfg, [args.0, args.1, args.2, args.3, args.4, args.5])?,
        }
    }
    Ok(out)
}

pub(super) fn add(b: &CudaBackend, x: &Tensor, y: &Tensor) -> Result<Tensor> {
    ensure(x.dims() == y.dims(), "add", || format!("{:?} + {:?}", x.dims(), y.dims()))?;
    expect_dtype("add", x, BF16)?;
    expect_dtype("add", y, BF16)?;
    let out = b.alloc(x.dims(), DType::BF16)?;
    let n = x.elem_count();
    if n > 0 {
        launch!(b, "add_bf16", elementwise(n), [ptr("add", x)?, ptr("add", y)?, ptr("add", &out)?, n as u64])?;
    }
    Ok(out)
}

/// Each run generated in place at its offset of one bf16 allocation.
pub(super) fn random_uniform(b: &CudaBackend, dims: &[usize], runs: &[crate::UniformRun]) -> Result<Tensor> {
    crate::check::uniform_runs(dims, runs)?;
    let out = b.alloc(dims, DType::BF16)?;
    let mut at = ptr("random_uniform", &out)?;
    for run in runs.iter().filter(|r| r.len > 0) {
        launch!(b, "random_uniform_bf16", elementwise(run.len), [at, run.len as u64, run.key, run.bound])?;
        at += (run.len * DType::BF16.size_in_bytes()) as u64;
    }
    Ok(out)
}

pub(super) fn split_columns(b: &CudaBackend, x: &Tensor, widths: &[usize]) -> Result<Vec<Tensor>> {
    let d = x.dims();
    ensure(d.len() == 2 && widths.iter().sum::<usize>() == d[1], "split_columns", || {
        format!("widths {widths:?} do not partition {d:?}")
    })?;
    expect_dtype("split_columns", x, BF16)?;
    let (m, n) = (d[0], d[1]);
    let mut start = 0;
    let mut parts = Vec::with_capacity(widths.len());
    for &w in widths {
        // One row: each block is a contiguous run of it, so an aligned one is a view, not a
        // copy (a batch-1 decode step splits every hybrid layer's projections).
        if m == 1 && (start * DType::BF16.size_in_bytes()).is_multiple_of(16) {
            parts.push(b.view("split_columns", x, start, &[m, w])?);
            start += w;
            continue;
        }
        let part = b.alloc(&[m, w], DType::BF16)?;
        let total = m * w;
        if total > 0 {
            let (xp, pp) = (ptr("split_columns", x)?, ptr("split_columns", &part)?);
            launch!(b, "copy_cols_bf16", elementwise(total), [xp, pp, n as u32, start as u32, w as u32, total as u64])?;
        }
        parts.push(part);
        start += w;
    }
    Ok(parts)
}
