//! Checks of e4m3 weight matrices (FP8 checkpoints, as `F8_E4M3` blocks): products, the
//! SwiGLU product, embedding rows and downloads compute with exactly the values the blocks
//! decode to, under scales one a row or one a 128 x 128 block (what real checkpoints carry)
//! on matrices whose rows end mid-block and whose chunk counts are not multiples of 4, one
//! short (3 chunks) and one long and narrow (18 chunks, 96 rows), whose products CUDA splits
//! between blocks that add their partial sums.
//!
//! A backend may narrow the activations of large batches to e4m3 as well (CUDA's FP8 GEMM,
//! per token and 128 columns or per token, as transformers' FP8 linear does): those rows are
//! checked against a reference that narrows them the same way, and the check first shows
//! that the narrowing moves results by more than its tolerance, so a GEMM that skipped or
//! misplaced the activation scales could not pass.

use std::borrow::Cow;

use met_kernels::fp8::{e4m3_from_f32, e4m3_to_f32};
use met_kernels::quant::QuantFormat;
use met_kernels::{DType, GpuBackend, HostTensor, Result};

use crate::harness::{Rng, Tol, assert_close_within, compare, stored, tolerance, upload_f32, upload_u32, widen};
use crate::moe::{Experts, moe_reference};

/// How a test matrix's scales cover it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grid {
    Row,
    Block,
}

/// The test matrices' shapes.
const SHAPES: [(usize, usize); 2] = [(160, 384), (96, 2304)];

/// `F8_E4M3` blocks of an `[n, k]` matrix under `grid`: random bytes (no NaN codes) and
/// scales in [0.0005, 0.003).
pub fn blocks(n: usize, k: usize, grid: Grid, rng: &mut Rng) -> Vec<u8> {
    let groups = k / 32;
    let row_scales: Vec<f32> = (0..n).map(|_| 0.0005 + rng.uniform().abs() * 0.0025).collect();
    let block_scales: Vec<f32> =
        (0..n.div_ceil(128) * k.div_ceil(128)).map(|_| 0.0005 + rng.uniform().abs() * 0.0025).collect();
    let mut out = Vec::with_capacity(n * groups * 36);
    for i in 0..n {
        for g in 0..groups {
            let scale = match grid {
                Grid::Row => row_scales[i],
                Grid::Block => block_scales[(i / 128) * k.div_ceil(128) + g * 32 / 128],
            };
            out.extend(scale.to_le_bytes());
            out.extend((0..32).map(|_| {
                let q = rng.below(256) as u8;
                if q & 0x7f == 0x7f { q ^ 1 } else { q }
            }));
        }
    }
    out
}

pub fn fp8_host(n: usize, k: usize, grid: Grid, rng: &mut Rng) -> Result<HostTensor<'static>> {
    HostTensor::from_bytes(DType::Quant(QuantFormat::F8_E4M3), &[n, k], Cow::Owned(blocks(n, k, grid, rng)))
}

/// `x [m, k] · wᵀ (+ bias)` in f64.
fn product(x: &[f64], w: &[f32], bias: Option<&[f32]>, m: usize, n: usize, k: usize) -> Vec<f64> {
    (0..m)
        .flat_map(|i| {
            (0..n).map(move |j| {
                let dot: f64 = (0..k).map(|l| x[i * k + l] * f64::from(w[j * k + l])).sum();
                dot + bias.map_or(0.0, |b| f64::from(b[j]))
            })
        })
        .collect()
}

/// The activations as an FP8 GEMM sees them: each group of `group` columns of a row
/// divided by `amax / 448` (1 for zeros), rounded to e4m3, times the scale again.
pub fn narrowed(x: &[f32], k: usize, group: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for g in x.chunks(group.min(k)) {
        let amax = g.iter().fold(0f32, |a, v| a.max(v.abs()));
        let scale = if amax > 0.0 { amax / 448.0 } else { 1.0 };
        out.extend(g.iter().map(|&v| f64::from(e4m3_to_f32(e4m3_from_f32(v / scale))) * f64::from(scale)));
    }
    out
}

/// The check's bound: the backend's tolerance, at most 5e-3 (an FP8 product rounds once,
/// to bf16, from f32 sums of exact products).
fn tol(b: &dyn GpuBackend) -> Tol {
    Tol { rel: tolerance(b.float_dtype()).rel.min(5e-3) }
}

/// Decode-sized products (with and without a bias; on CUDA one row takes the streaming
/// GEMV, or the one `MET_FP8_ONE` names, 2 to 16 the tensor-core one; one row also with
/// activations past f16's range), the SwiGLU product, embedding rows and the download
/// of e4m3 matrices equal the decoded values' (f64 reference); a row's product is the same
/// in a batch of 2 as in a batch of 3.
pub fn fp8_matrices_compute_with_their_decoded_values(b: &dyn GpuBackend) -> Result<()> {
    let mut rng = Rng::new(808);
    for ((n, k), grid) in SHAPES.into_iter().flat_map(|s| [(s, Grid::Row), (s, Grid::Block)]) {
        let host = fp8_host(n, k, grid, &mut rng)?;
        let decoded = host.to_f32_vec()?;
        let w = b.upload(&host, b.float_dtype())?;
        let what = |s: &str| format!("e4m3 {n} x {k} {grid:?} {s}");
        let got = b.download_f32(&w)?;
        compare(&got, &widen(&stored(b, decoded.clone())), tol(b))
            .unwrap_or_else(|e| panic!("{}: {e}", what("download")));
        let bias = stored(b, rng.vec(n));
        for m in [1, 2, 3, 4, 5, 9, 16] {
            let x = stored(b, rng.vec(m * k));
            let xt = upload_f32(b, &x, &[m, k])?;
            let with_bias = m == 5;
            let want = product(&widen(&x), &decoded, with_bias.then_some(&bias[..]), m, n, k);
            let bias_t = with_bias.then(|| upload_f32(b, &bias, &[n])).transpose()?;
            let y = b.matmul(&xt, &w, bias_t.as_ref())?;
            assert_close_within(b, &y, &[m, n], &want, tol(b), &what(&format!("matmul m={m}")))?;
            let fused = b.download_f32(&b.matmul_silu_mul(&xt, &w)?)?;
            let unfused = b.download_f32(&b.silu_mul(&b.matmul(&xt, &w, None)?)?)?;
            assert_eq!(fused, unfused, "{}", what(&format!("matmul_silu_mul m={m} equals silu_mul of the product")));
            if m == 1 {
                // Activations past f16's range (65,504): x times 2^18, exact in bf16, gives the
                // product times 2^18 (a one-row kernel on f16 tensor cores scales them down).
                const BIG: f32 = 262_144.0;
                let big: Vec<f32> = x.iter().map(|v| v * BIG).collect();
                let want_big: Vec<f64> = want.iter().map(|v| v * f64::from(BIG)).collect();
                let y = b.matmul(&upload_f32(b, &big, &[m, k])?, &w, None)?;
                assert_close_within(b, &y, &[m, n], &want_big, tol(b), &what("matmul m=1 of x * 2^18"))?;
            }
            if m == 3 {
                let two = b.download_f32(&b.matmul(&upload_f32(b, &x[..2 * k], &[2, k])?, &w, None)?)?;
                let batched = b.download_f32(&y)?;
                assert_eq!(two[..n], batched[..n], "{}", what("row 0 of 2 = row 0 of 3"));
            }
        }
        if b.float_dtype() == DType::BF16 {
            // A cast of stacked e4m3 experts to bf16 (the CPU casts to f32 only).
            let experts = b.cast(&w.reshape(&[2, n / 2, k])?, b.float_dtype())?;
            assert_eq!(experts.dims(), [2, n / 2, k], "{}", what("experts cast"));
            assert_eq!(b.download_f32(&experts)?, got, "{}", what("experts cast = download"));
        }
        let ids = [3u32, 0, n as u32 - 1, 3, n as u32 - 30];
        let rows = b.embedding(&upload_u32(b, &ids, &[ids.len()])?, &w)?;
        let want: Vec<f64> = ids.iter().flat_map(|&i| widen(&decoded[i as usize * k..(i as usize + 1) * k])).collect();
        assert_close_within(b, &rows, &[ids.len(), k], &want, tol(b), &what("embedding"))?;
    }
    Ok(())
}

/// Prefill-sized products of e4m3 matrices: each row equals the reference on its decoded
/// weights and on its activations as the backend narrows them (see the module docs; rows
/// a backend keeps in bf16 against the plain reference). `narrows(m)` says, for a batch
/// of `m` rows, how many leading rows the backend narrows, and with what column group.
pub fn fp8_large_batches_match_their_reference(
    b: &dyn GpuBackend,
    narrows: impl Fn(usize, Grid) -> (usize, Option<usize>),
) -> Result<()> {
    let mut rng = Rng::new(909);
    let mut sensitive = false;
    for ((n, k), grid) in SHAPES.into_iter().flat_map(|s| [(s, Grid::Row), (s, Grid::Block)]) {
        let host = fp8_host(n, k, grid, &mut rng)?;
        let decoded = host.to_f32_vec()?;
        let w = b.upload(&host, b.float_dtype())?;
        let bias = stored(b, rng.vec(n));
        for m in [17, 40, 67, 300] {
            let x = stored(b, rng.vec(m * k));
            let (narrowed_rows, group) = narrows(m, grid);
            let group = group.unwrap_or(k);
            let mut xs = narrowed(&x[..narrowed_rows * k], k, group);
            xs.extend(widen(&x[narrowed_rows * k..]));
            let with_bias = m == 40;
            let bias = with_bias.then_some(&bias[..]);
            let want = product(&xs, &decoded, bias, m, n, k);
            if narrowed_rows > 0 {
                let plain = product(&widen(&x), &decoded, bias, m, n, k);
                let f32s: Vec<f32> = want.iter().map(|&v| v as f32).collect();
                sensitive |= compare(&f32s, &plain, tol(b)).is_err();
            }
            let bias_t = bias.map(|v| upload_f32(b, v, &[n])).transpose()?;
            let y = b.matmul(&upload_f32(b, &x, &[m, k])?, &w, bias_t.as_ref())?;
            let what =
                format!("e4m3 {n} x {k} {grid:?} matmul m={m} ({narrowed_rows} rows narrowed in groups of {group})");
            assert_close_within(b, &y, &[m, n], &want, tol(b), &what)?;
        }
    }
    let narrows_any = [17, 40, 67, 300].iter().any(|&m| narrows(m, Grid::Block).0 > 0);
    assert!(sensitive || !narrows_any, "narrowing the activations never moved a result past the tolerance");
    Ok(())
}

/// [`fp8_large_batches_match_their_reference`] for a backend that never narrows the
/// activations (the CPU; CUDA under `--batch-invariant`).
pub fn fp8_large_batches_match_the_decoded_values(b: &dyn GpuBackend) -> Result<()> {
    fp8_large_batches_match_their_reference(b, |_, _| (0, None))
}

#[cfg(feature = "cuda")]
/// CUDA's default: batches past 16 rows narrow every row (those past a multiple of 8 too,
/// through cuBLASLt's padded rows), per 128 columns under block scales and per row under
/// row scales; and the matrices stay e4m3.
pub fn fp8_cuda_narrows_large_batches(b: &dyn GpuBackend) -> Result<()> {
    let mut rng = Rng::new(1111);
    for ((n, k), grid) in SHAPES.into_iter().flat_map(|s| [(s, Grid::Row), (s, Grid::Block)]) {
        let w = b.upload(&fp8_host(n, k, grid, &mut rng)?, b.float_dtype())?;
        assert!(kept(&w), "{grid:?}: a {n} x {k} e4m3 matrix was widened");
    }
    fp8_large_batches_match_their_reference(b, |m, grid| {
        let narrowed = if m > 16 { m } else { 0 };
        (narrowed, (grid == Grid::Block).then_some(128))
    })
}

/// A norm feeding the FP8 product of a larger batch (CUDA writes the rows' e4m3 form beside
/// the norm's output where every e4m3 matrix of the backend has one scale grid, so the
/// product skips its own quantization): the product is that of the same values without it,
/// bit for bit, after `rms_norm` and `add_rms_norm`, at row counts that are multiples of 8
/// and that are not (cuBLASLt's padding rows); and the norms did write that form, so the
/// check is not passed by a product that never reads it. For a fresh backend, one grid.
#[cfg(feature = "cuda")]
pub fn fp8_norm_outputs_feed_the_gemm(b: &met_kernels::CudaBackend, grid: Grid) -> Result<()> {
    use met_kernels::CudaBackend;
    let mut rng = Rng::new(1212);
    let dt = b.float_dtype();
    let bits =
        |t: &met_kernels::Tensor| -> Result<Vec<u32>> { Ok(b.download_f32(t)?.iter().map(|f| f.to_bits()).collect()) };
    for (n, k) in SHAPES {
        let w = b.upload(&fp8_host(n, k, grid, &mut rng)?, dt)?;
        let weight = upload_f32(b, &stored(b, rng.vec(k)), &[k])?;
        for m in [17, 40, 67] {
            let x = upload_f32(b, &stored(b, rng.vec(m * k)), &[m, k])?;
            let r = upload_f32(b, &stored(b, rng.vec(m * k)), &[m, k])?;
            for (normed, norm) in [
                (b.rms_norm(&x, &weight, 1e-6)?, "rms_norm"),
                (b.add_rms_norm(&x, &r, &weight, 1e-6)?.0, "add_rms_norm"),
            ] {
                let plain = b.add(&normed, &b.zeros(&[m, k], dt)?)?;
                assert!(
                    CudaBackend::has_e4m3_rows(&normed),
                    "{grid:?} {n} x {k}: {norm} of {m} rows wrote no e4m3 rows"
                );
                assert!(!CudaBackend::has_e4m3_rows(&plain), "an add wrote e4m3 rows");
                assert_eq!(
                    bits(&b.matmul(&normed, &w, None)?)?,
                    bits(&b.matmul(&plain, &w, None)?)?,
                    "{grid:?} {n} x {k}: the product of {m} rows of {norm} against the same values alone"
                );
            }
        }
    }
    Ok(())
}

/// The SwiGLU of a larger FP8 batch feeding its down projection (CUDA writes the
/// activations' e4m3 form beside them, as a norm does, so the product skips its own
/// quantization): the activations are `silu_mul`'s bits after the product, they carry that
/// form, and the down product is that of the same values without it, bit for bit, at row
/// counts that are multiples of 8 and that are not. For a fresh backend, one grid.
#[cfg(feature = "cuda")]
pub fn fp8_silu_outputs_feed_the_gemm(b: &met_kernels::CudaBackend, grid: Grid) -> Result<()> {
    use met_kernels::CudaBackend;
    let mut rng = Rng::new(1313);
    let dt = b.float_dtype();
    let bits =
        |t: &met_kernels::Tensor| -> Result<Vec<u32>> { Ok(b.download_f32(t)?.iter().map(|f| f.to_bits()).collect()) };
    for (i, k) in [(256, 384), (384, 256)] {
        let gate_up = b.upload(&fp8_host(2 * i, k, grid, &mut rng)?, dt)?;
        let down = b.upload(&fp8_host(k, i, grid, &mut rng)?, dt)?;
        for m in [17, 40, 67] {
            let x = upload_f32(b, &stored(b, rng.vec(m * k)), &[m, k])?;
            let act = b.matmul_silu_mul(&x, &gate_up)?;
            let what = format!("{grid:?} SwiGLU {i} x {k} of {m} rows");
            assert!(CudaBackend::has_e4m3_rows(&act), "{what}: no e4m3 rows");
            assert_eq!(bits(&act)?, bits(&b.silu_mul(&b.matmul(&x, &gate_up, None)?)?)?, "{what}: against silu_mul");
            let plain = b.add(&act, &b.zeros(&[m, i], dt)?)?;
            assert!(!CudaBackend::has_e4m3_rows(&plain), "an add wrote e4m3 rows");
            assert_eq!(
                bits(&b.matmul(&act, &down, None)?)?,
                bits(&b.matmul(&plain, &down, None)?)?,
                "{what}: the down product against the same values alone"
            );
        }
    }
    Ok(())
}

/// Each row of an e4m3 product is the same bits as that row alone, at decode and prefill
/// sizes (`--batch-invariant` on CUDA, always on the CPU).
pub fn fp8_rows_are_batch_invariant(b: &dyn GpuBackend) -> Result<()> {
    let mut rng = Rng::new(1010);
    for ((n, k), grid) in SHAPES.into_iter().flat_map(|s| [(s, Grid::Row), (s, Grid::Block)]) {
        let w = b.upload(&fp8_host(n, k, grid, &mut rng)?, b.float_dtype())?;
        let m = 40;
        let x = stored(b, rng.vec(m * k));
        let batch = b.download_f32(&b.matmul(&upload_f32(b, &x, &[m, k])?, &w, None)?)?;
        let fused = b.download_f32(&b.matmul_silu_mul(&upload_f32(b, &x, &[m, k])?, &w)?)?;
        for i in [0, 7, 16, 39] {
            let row = upload_f32(b, &x[i * k..(i + 1) * k], &[1, k])?;
            let alone: Vec<f32> = b.download_f32(&b.matmul(&row, &w, None)?)?;
            assert_eq!(alone, batch[i * n..(i + 1) * n], "{grid:?} row {i}: alone != in a batch of {m}");
            let alone = b.download_f32(&b.matmul_silu_mul(&row, &w)?)?;
            assert_eq!(alone, fused[i * n / 2..(i + 1) * n / 2], "{grid:?} SwiGLU row {i}: alone != batched");
        }
    }
    Ok(())
}

/// Whether the backend kept a matrix e4m3 (rather than widening it).
#[cfg(feature = "cuda")]
pub fn kept(w: &met_kernels::Tensor) -> bool {
    w.dtype() == DType::Quant(QuantFormat::F8_E4M3)
}

/// MoE experts stacked in e4m3 compute with the values their blocks decode to (f64
/// reference, the routing taken from the backend), from one token (the deep 16-row
/// pipeline on CUDA) to 200 (64-row tiles), under either scale grid, with inner sizes of
/// one and of several 128-column scale chunks.
pub fn fp8_experts_compute_with_their_decoded_values(b: &dyn GpuBackend) -> Result<()> {
    let mut rng = Rng::new(1212);
    let (e, h, i, k) = (4, 384, 128, 2);
    let dtype = b.float_dtype();
    for grid in [Grid::Row, Grid::Block] {
        let (gate_up, down) = (fp8_host(e * 2 * i, h, grid, &mut rng)?, fp8_host(e * h, i, grid, &mut rng)?);
        let ex = Experts { h, i, gate_up: gate_up.to_f32_vec()?, down: down.to_f32_vec()? };
        let gu = b.upload(&gate_up, dtype)?.reshape(&[e, 2 * i, h])?;
        let dn = b.upload(&down, dtype)?.reshape(&[e, h, i])?;
        for t in [1, 5, 40, 200] {
            let x = stored(b, rng.vec(t * h));
            let routing = b.topk_routing(&upload_f32(b, &rng.vec(t * e), &[t, e])?, k, true)?;
            let got = b.moe_experts(&upload_f32(b, &x, &[t, h])?, &routing, &gu, &dn)?;
            let (ids, weights) = (b.download_u32(&routing.experts)?, b.download_f32(&routing.weights)?);
            let want = moe_reference(&ex, &x, &ids, &weights, k);
            // As `moe_experts`' own check: four chained roundings to the float dtype.
            let what = format!("e4m3 {grid:?} experts, {t} tokens");
            assert_close_within(b, &got, &[t, h], &want, tolerance(dtype).chained(4), &what)?;
        }
    }
    Ok(())
}
