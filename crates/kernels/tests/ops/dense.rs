//! Conformance checks of the memory and dense ops: upload/download, matmul, RMSNorm (plain,
//! per head, fused with the residual add), rotary, SiLU·mul, embedding, add, column splits
//! and row gathers, plus the shape and index errors each must return instead of panicking.

use met_kernels::{DType, Error, GpuBackend, HostTensor, Result, Tensor, UniformRun};

use crate::harness::{Rng, assert_close, assert_values, expect_err, stored, upload_f32, upload_u32, widen};

/// Floats survive an upload/download round trip within the dtype's rounding, u32 exactly;
/// zeros are zero; each download refuses the other kind of tensor.
pub fn memory_round_trip(b: &dyn GpuBackend) -> Result<()> {
    let data = Rng::new(1).vec(24);
    let t = upload_f32(b, &data, &[2, 3, 4])?;
    assert_eq!(t.dtype(), b.float_dtype());
    assert_close(b, &t, &[2, 3, 4], &widen(&data), "f32 round trip")?;

    let ids = [7, 0, u32::MAX, 42];
    let u = upload_u32(b, &ids, &[2, 2])?;
    assert_eq!((u.dtype(), u.dims()), (DType::U32, &[2, 2][..]));
    assert_eq!(b.download_u32(&u)?, ids);

    let z = b.zeros(&[3, 5], b.float_dtype())?;
    assert_eq!(z.dims(), [3, 5]);
    assert!(b.download_f32(&z)?.iter().all(|&x| x == 0.0), "float zeros");
    assert_eq!(b.download_u32(&b.zeros(&[4], DType::U32)?)?, [0; 4]);

    expect_err(b.download_u32(&t), "download_u32 of a float tensor");
    expect_err(b.download_f32(&u), "download_f32 of a u32 tensor");

    // f32 uploads stay exact whatever the float dtype, and casts reach f32.
    let exact = b.upload(&HostTensor::from_f32(&data, &[24]), DType::F32)?;
    assert_eq!(exact.dtype(), DType::F32);
    assert_eq!(b.download_f32(&exact)?, data);
    let cast = b.cast(&t, DType::F32)?;
    assert_eq!(cast.dtype(), DType::F32);
    assert_eq!(b.download_f32(&cast)?, b.download_f32(&t)?, "a cast to f32 is exact");
    expect_err(b.upload(&HostTensor::from_u32(&ids, &[4]), DType::F32), "u32 data as f32");
    expect_err(b.cast(&u, DType::F32), "cast of a u32 tensor");
    b.synchronize()
}

/// Empty tensors (a zero-length batch, a zero-width block) upload and download like any
/// other.
pub fn empty_tensors_round_trip(b: &dyn GpuBackend) -> Result<()> {
    for dims in [&[0][..], &[3, 0], &[0, 4]] {
        let t = upload_f32(b, &[], dims)?;
        assert_close(b, &t, dims, &[], &format!("empty f32 {dims:?}"))?;
        assert_eq!(b.download_u32(&upload_u32(b, &[], dims)?)?, [0u32; 0]);
    }
    Ok(())
}

/// `x [m, k] · wᵀ (+ bias)` in f64.
pub fn matmul_reference(x: &[f32], w: &[f32], bias: Option<&[f32]>, m: usize, k: usize) -> Vec<f64> {
    let n = w.len() / k.max(1);
    let mut out = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            let dot: f64 = (0..k).map(|l| f64::from(x[i * k + l]) * f64::from(w[j * k + l])).sum();
            out.push(dot + bias.map_or(0.0, |b| f64::from(b[j])));
        }
    }
    out
}

/// The backend's and the reference's `x · wᵀ (+ bias)` for random inputs of one shape.
pub fn matmul_outputs(
    b: &dyn GpuBackend,
    shape: (usize, usize, usize),
    with_bias: bool,
    seed: u64,
) -> Result<(Vec<f32>, Vec<f64>)> {
    matmul_outputs_and_terms(b, shape, with_bias, seed).map(|(got, want, _)| (got, want))
}

/// [`matmul_outputs`], with each output's magnitude of terms `Σ |x·w| + |bias|` (for
/// [`crate::harness::compare_terms`]).
pub fn matmul_outputs_and_terms(
    b: &dyn GpuBackend,
    (m, k, n): (usize, usize, usize),
    with_bias: bool,
    seed: u64,
) -> Result<(Vec<f32>, Vec<f64>, Vec<f64>)> {
    let mut rng = Rng::new(seed);
    let (x, w, bias) = (stored(b, rng.vec(m * k)), stored(b, rng.vec(n * k)), stored(b, rng.vec(n)));
    let bias = with_bias.then_some(&bias[..]);
    let bias_t = bias.map(|v| upload_f32(b, v, &[n])).transpose()?;
    let out = b.matmul(&upload_f32(b, &x, &[m, k])?, &upload_f32(b, &w, &[n, k])?, bias_t.as_ref())?;
    assert_eq!(out.dims(), [m, n], "matmul shape");
    let abs = |v: &[f32]| v.iter().map(|x| x.abs()).collect::<Vec<_>>();
    let terms = matmul_reference(&abs(&x), &abs(&w), bias.map(abs).as_deref(), m, k);
    Ok((b.download_f32(&out)?, matmul_reference(&x, &w, bias, m, k), terms))
}

/// Matmul over shapes with m = 1, n = 1 and inner dims that are not multiples of 8, with
/// and without bias.
pub fn matmul_matches_reference(b: &dyn GpuBackend) -> Result<()> {
    let shapes = [(1, 7, 5), (1, 576, 96), (4, 13, 1), (5, 64, 33), (33, 19, 17), (64, 72, 40)];
    for (seed, &shape) in shapes.iter().enumerate() {
        for with_bias in [false, true] {
            let (got, want) = matmul_outputs(b, shape, with_bias, seed as u64)?;
            assert_values(b, &got, &want, &format!("matmul {shape:?} bias={with_bias}"));
        }
    }
    Ok(())
}

/// RMSNorm over the last dim of `x` (rows of `weight.len()`), in f64.
fn rms_norm_reference(x: &[f32], weight: &[f32], eps: f32) -> Vec<f64> {
    let n = weight.len();
    x.chunks(n)
        .flat_map(|row| {
            let mean_sq = row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / n as f64;
            let inv = 1.0 / (mean_sq + f64::from(eps)).sqrt();
            row.iter().zip(weight).map(move |(&v, &w)| f64::from(v) * inv * f64::from(w))
        })
        .collect()
}

/// A weight around 1, as trained norms have.
fn norm_weight(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| 1.0 + 0.5 * rng.uniform()).collect()
}

/// RMSNorm on `[t, n]` with a zero row and a row small enough that `eps` dominates its
/// mean square, then per head on `[t, h, d]` with a `[d]` weight.
pub fn rms_norm_matches_reference(b: &dyn GpuBackend) -> Result<()> {
    let mut rng = Rng::new(2);
    let (t, n, eps) = (5, 48, 1e-5);
    let mut x = rng.vec(t * n);
    x[2 * n..3 * n].fill(0.0);
    x[3 * n..4 * n].iter_mut().for_each(|v| *v *= 1e-3);
    let (x, w) = (stored(b, x), stored(b, norm_weight(&mut rng, n)));
    let out = b.rms_norm(&upload_f32(b, &x, &[t, n])?, &upload_f32(b, &w, &[n])?, eps)?;
    assert_close(b, &out, &[t, n], &rms_norm_reference(&x, &w, eps), "rms_norm [t, n]")?;

    let (h, d) = (4, 16);
    let x = stored(b, rng.vec(t * h * d));
    let w = stored(b, norm_weight(&mut rng, d));
    let out = b.rms_norm(&upload_f32(b, &x, &[t, h, d])?, &upload_f32(b, &w, &[d])?, 1e-6)?;
    assert_close(b, &out, &[t, h, d], &rms_norm_reference(&x, &w, 1e-6), "rms_norm per head")?;

    // A row of 4,096 (vector chunks past the first of each thread) and one of 45 (no
    // multiple of 8: the scalar kernel on CUDA).
    for n in [4096, 45] {
        let x = stored(b, rng.vec(t * n));
        let w = stored(b, norm_weight(&mut rng, n));
        let out = b.rms_norm(&upload_f32(b, &x, &[t, n])?, &upload_f32(b, &w, &[n])?, 1e-6)?;
        assert_close(b, &out, &[t, n], &rms_norm_reference(&x, &w, 1e-6), &format!("rms_norm [{t}, {n}]"))?;
    }
    Ok(())
}

/// `add_rms_norm` returns `(rms_norm(x + residual), x + residual)`: rows of 32 and 4,096
/// elements (the CUDA backend's vector kernel, one chunk and four a thread) and of 36 (its
/// scalar one).
pub fn add_rms_norm_matches_reference(b: &dyn GpuBackend) -> Result<()> {
    let mut rng = Rng::new(3);
    for (t, n) in [(4, 32), (3, 4096), (2, 36)] {
        let (x, res, w) = (stored(b, rng.vec(t * n)), stored(b, rng.vec(t * n)), stored(b, norm_weight(&mut rng, n)));
        let sum: Vec<f32> = x.iter().zip(&res).map(|(a, b)| a + b).collect();
        let (normed, summed) = b.add_rms_norm(
            &upload_f32(b, &x, &[t, n])?,
            &upload_f32(b, &res, &[t, n])?,
            &upload_f32(b, &w, &[n])?,
            1e-6,
        )?;
        let want_sum: Vec<f64> = x.iter().zip(&res).map(|(&a, &b)| f64::from(a) + f64::from(b)).collect();
        assert_close(b, &summed, &[t, n], &want_sum, &format!("add_rms_norm residual [{t}, {n}]"))?;
        assert_close(
            b,
            &normed,
            &[t, n],
            &rms_norm_reference(&sum, &w, 1e-6),
            &format!("add_rms_norm norm [{t}, {n}]"),
        )?;
    }
    Ok(())
}

/// `theta^(-2i / rot_dim)` for `i < rot_dim / 2`, as Hugging Face builds `inv_freq`.
fn inv_freq(theta: f64, rot_dim: usize) -> Vec<f32> {
    (0..rot_dim / 2).map(|i| theta.powf(-((2 * i) as f64) / rot_dim as f64) as f32).collect()
}

/// Rotate-half rotary on `x [t, h, d]` in f64. The angle `p · inv_freq[i]` is rounded to
/// f32 first, as Hugging Face computes it (`freqs` in float32): at p = 1000 that rounding
/// alone moves the result by ~3e-5, above the f32 tolerance, so the reference reproduces
/// it rather than hiding it under a looser bound.
fn rotary_reference(x: &[f32], d: usize, positions: &[u32], freq: &[f32]) -> Vec<f64> {
    let half = freq.len();
    let per_token = x.len() / positions.len();
    let mut out = widen(x);
    for (token, &p) in positions.iter().enumerate() {
        for head in out[token * per_token..(token + 1) * per_token].chunks_mut(d) {
            for (i, &f) in freq.iter().enumerate() {
                let (sin, cos) = f64::from(p as f32 * f).sin_cos();
                let (a, c) = (head[i], head[i + half]);
                head[i] = a * cos - c * sin;
                head[i + half] = c * cos + a * sin;
            }
        }
    }
    out
}

/// Rotary with unordered, large positions at head dims 16 and 64 (theta 10000), and a
/// partial rotary where only the first 8 of 16 dims rotate and the rest pass through.
pub fn rotary_matches_reference(b: &dyn GpuBackend) -> Result<()> {
    check_rotary(b, &[0, 5, 1000, 31], 4, &[(3, 16, 16, 10_000.0), (2, 64, 64, 10_000.0), (3, 16, 8, 10_000.0)])
}

/// Rotary of random `x [t, h, d]` at `positions` for each `(h, d, rot_dim, theta)`, against
/// the f64 reference.
fn check_rotary(b: &dyn GpuBackend, positions: &[u32], seed: u64, cases: &[(usize, usize, usize, f64)]) -> Result<()> {
    let t = positions.len();
    let mut rng = Rng::new(seed);
    for &(h, d, rot_dim, theta) in cases {
        let x = stored(b, rng.vec(t * h * d));
        let freq = inv_freq(theta, rot_dim);
        let out = b.rotary(
            &upload_f32(b, &x, &[t, h, d])?,
            &upload_u32(b, positions, &[t])?,
            // Frequencies stay f32 on every backend, as the model uploads them.
            &b.upload(&HostTensor::from_f32(&freq, &[freq.len()]), DType::F32)?,
        )?;
        let want = rotary_reference(&x, d, positions, &freq);
        assert_close(b, &out, &[t, h, d], &want, &format!("rotary h={h} d={d} rot={rot_dim} theta={theta}"))?;
    }
    Ok(())
}

/// Rotary at the positions long contexts reach, up to 32k: head dims 64 and 128 with the
/// bases of Llama 3 (500k) and Qwen (1M), and theta 10000, where the fastest pairs turn
/// thousands of times. The reference rounds each angle to f32 as transformers does, so a
/// kernel that lost precision in the angle (a fast `__sinf`, an f16 angle, positions
/// wrapped at 16 bits) fails here.
pub fn rotary_at_long_positions(b: &dyn GpuBackend) -> Result<()> {
    let positions = [32_767, 0, 16_384, 4_095, 31_999, 8_191, 24_577, 65_535, 1, 20_000];
    check_rotary(b, &positions, 40, &[(2, 128, 128, 500_000.0), (3, 64, 64, 1_000_000.0), (2, 128, 128, 10_000.0)])
}

/// `random_uniform` makes exactly the host's weight stream, rounded once to the float
/// dtype, run after run (an empty run in the middle included), and refuses runs that do
/// not fill the tensor.
pub fn random_uniform_is_the_weight_stream(b: &dyn GpuBackend) -> Result<()> {
    let runs = [
        UniformRun { len: 1_000, key: 0x1234_5678_9abc_def0, bound: 0.5 },
        UniformRun { len: 0, key: 7, bound: 1.0 },
        UniformRun { len: 4_097, key: u64::MAX, bound: 0.03 },
    ];
    let got = b.download_f32(&b.random_uniform(&[3, 1_699], &runs)?)?;
    let want: Vec<f32> = stored(b, runs.iter().flat_map(UniformRun::host_values).collect());
    assert_eq!(got.len(), want.len());
    if let Some(i) = got.iter().zip(&want).position(|(g, w)| g.to_bits() != w.to_bits()) {
        panic!("random_uniform element {i}: {} on {}, {} on the host", got[i], b.name(), want[i]);
    }
    assert!(want.iter().all(|x| x.abs() <= 0.5) && want.iter().any(|x| x.abs() > 0.4), "the bounds hold");
    expect_err(b.random_uniform(&[3, 1_700], &runs), "runs short of the tensor");
    expect_err(b.random_uniform(&[2], &[UniformRun { len: 2, key: 1, bound: f32::NAN }]), "a NaN bound");
    Ok(())
}

/// `silu(gate) · up` with gates up to ±20, where a naive `exp` would overflow.
/// `silu(gate) · up`, at a width of 7 and at one of 8·37 (the CUDA backend's 16-byte
/// vector kernel, with chunks past a 128-thread block).
pub fn silu_mul_matches_reference(b: &dyn GpuBackend) -> Result<()> {
    let mut rng = Rng::new(5);
    for (t, n) in [(3, 7), (5, 8 * 37)] {
        let x = stored(b, rng.vec(t * 2 * n).iter().map(|v| v * 20.0).collect());
        let want: Vec<f64> = x
            .chunks(2 * n)
            .flat_map(|row| {
                let (gate, up) = row.split_at(n);
                gate.iter().zip(up).map(|(&g, &u)| {
                    let g = f64::from(g);
                    g / (1.0 + (-g).exp()) * f64::from(u)
                })
            })
            .collect();
        let out = b.silu_mul(&upload_f32(b, &x, &[t, 2 * n])?)?;
        assert_close(b, &out, &[t, n], &want, &format!("silu_mul [{t}, {n}]"))?;
    }
    Ok(())
}

/// Rows of `table [v, h]` picked by `ids`, in f64.
fn gather_reference(table: &[f32], h: usize, ids: &[u32]) -> Vec<f64> {
    ids.iter().flat_map(|&i| widen(&table[i as usize * h..(i as usize + 1) * h])).collect()
}

/// Embedding gathers table rows (repeats and the last row included); an id past the
/// vocabulary is an `InvalidArgument` error.
pub fn embedding_matches_reference(b: &dyn GpuBackend) -> Result<()> {
    let (v, h) = (11, 6);
    let table = stored(b, Rng::new(6).vec(v * h));
    let table_t = upload_f32(b, &table, &[v, h])?;
    let ids = [3, 0, 10, 3, 7];
    let out = b.embedding(&upload_u32(b, &ids, &[ids.len()])?, &table_t)?;
    assert_close(b, &out, &[ids.len(), h], &gather_reference(&table, h, &ids), "embedding")?;

    let bad = b.embedding(&upload_u32(b, &[1, 11], &[2])?, &table_t);
    assert!(matches!(bad, Err(Error::InvalidArgument(_))), "id 11 of 11 rows: {bad:?}");
    Ok(())
}

/// `gather_rows` picks rows in the given order, with repeats.
pub fn gather_rows_matches_reference(b: &dyn GpuBackend) -> Result<()> {
    let (m, n) = (6, 5);
    let x = stored(b, Rng::new(7).vec(m * n));
    let rows = [5, 0, 5, 2];
    let out = b.gather_rows(&upload_f32(b, &x, &[m, n])?, &upload_u32(b, &rows, &[4])?)?;
    assert_close(b, &out, &[4, n], &gather_reference(&x, n, &rows), "gather_rows")
}

/// Elementwise add on a rank-3 shape.
pub fn add_matches_reference(b: &dyn GpuBackend) -> Result<()> {
    let mut rng = Rng::new(8);
    let (x, y) = (stored(b, rng.vec(30)), stored(b, rng.vec(30)));
    let out = b.add(&upload_f32(b, &x, &[2, 3, 5])?, &upload_f32(b, &y, &[2, 3, 5])?)?;
    let want: Vec<f64> = x.iter().zip(&y).map(|(&a, &c)| f64::from(a) + f64::from(c)).collect();
    assert_close(b, &out, &[2, 3, 5], &want, "add")
}

/// `split_columns` cuts `[m, n]` into consecutive column blocks (a fused QKV layout).
pub fn split_columns_matches_reference(b: &dyn GpuBackend) -> Result<()> {
    let (m, n) = (4, 10);
    let x = stored(b, Rng::new(9).vec(m * n));
    let widths = [5, 3, 2];
    let parts = b.split_columns(&upload_f32(b, &x, &[m, n])?, &widths)?;
    assert_eq!(parts.len(), widths.len());
    let mut start = 0;
    for (part, &w) in parts.iter().zip(&widths) {
        let want: Vec<f64> = x.chunks(n).flat_map(|row| widen(&row[start..start + w])).collect();
        assert_close(b, part, &[m, w], &want, &format!("split_columns block at {start}"))?;
        start += w;
    }
    // One row, where CUDA hands out views at aligned offsets (0, 8 and 16 here; 11 is a
    // copy): the parts outlive the split tensor, whose memory another tensor may then take.
    let (n, widths) = (32, [8, 3, 5, 16]);
    let x = stored(b, Rng::new(10).vec(n));
    let parts = b.split_columns(&upload_f32(b, &x, &[1, n])?, &widths)?;
    let other = upload_f32(b, &vec![7.0; n], &[1, n])?;
    let mut start = 0;
    for (part, &w) in parts.iter().zip(&widths) {
        let want = widen(&x[start..start + w]);
        assert_close(b, part, &[1, w], &want, &format!("split_columns of one row, block at {start}"))?;
        start += w;
    }
    drop(other);
    Ok(())
}

/// Every dense op returns `Err` (never panics) on operands that do not fit.
pub fn dense_ops_reject_bad_shapes(b: &dyn GpuBackend) -> Result<()> {
    let f = |dims: &[usize]| upload_f32(b, &vec![0.5; dims.iter().product()], dims);
    let u = |data: &[u32]| upload_u32(b, data, &[data.len()]);

    expect_err(b.matmul(&f(&[2, 3])?, &f(&[4, 5])?, None), "matmul inner dims 3 vs 5");
    expect_err(b.matmul(&f(&[2, 3])?, &f(&[4, 3])?, Some(&f(&[5])?)), "matmul bias of 5 for n = 4");
    expect_err(b.matmul(&f(&[2, 3, 4])?, &f(&[4, 4])?, None), "matmul of a rank-3 x");
    expect_err(b.rms_norm(&f(&[2, 8])?, &f(&[7])?, 1e-6), "rms_norm weight of 7 for 8");
    expect_err(b.add_rms_norm(&f(&[2, 8])?, &f(&[2, 7])?, &f(&[8])?, 1e-6), "add_rms_norm residual");
    let freq = f(&[4])?;
    expect_err(b.rotary(&f(&[3, 2, 8])?, &u(&[0, 1])?, &freq), "rotary 2 positions for 3 tokens");
    expect_err(b.rotary(&f(&[3, 2, 6])?, &u(&[0, 1, 2])?, &freq), "rotary width 8 past head dim 6");
    expect_err(b.silu_mul(&f(&[2, 7])?), "silu_mul of an odd width");
    expect_err(b.add(&f(&[2, 3])?, &f(&[3, 2])?), "add [2, 3] + [3, 2]");
    expect_err(b.split_columns(&f(&[2, 6])?, &[2, 3]), "split_columns widths summing to 5 of 6");
    expect_err(b.gather_rows(&f(&[3, 4])?, &u(&[0, 3])?), "gather_rows row 3 of 3");
    Ok(())
}

/// Decode-batch products (1 to 16 rows, the shapes a backend may give its own small-batch
/// kernel, or hand over to a library past some size): every batch size's bucket and its
/// padding rows, inner dims whose 8-element
/// vectors do not fill the last unrolled step (1,032 = 129 vectors), matrices with few rows
/// and with enough for two rows per warp, with and without bias.
pub fn matmul_decode_batches_match_reference(b: &dyn GpuBackend) -> Result<()> {
    let mut seed = 100;
    for &(k, n) in &[(8, 5), (512, 300), (1_032, 2_300), (2_048, 96)] {
        for m in [1, 2, 3, 5, 8, 11, 16] {
            for with_bias in [false, true] {
                seed += 1;
                let (got, want) = matmul_outputs(b, (m, k, n), with_bias, seed)?;
                assert_values(b, &got, &want, &format!("matmul m={m} k={k} n={n} bias={with_bias}"));
            }
        }
    }
    Ok(())
}

/// A row's product does not depend on the batch it is computed in, up to the 4 rows the
/// CUDA backend's own decode kernels take: the property that lets a graph replayed at a
/// padded batch size equal the eager step. Checked bit for bit on the CUDA backend only;
/// the CPU's GEMM and cuBLAS make no such promise.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub fn matmul_rows_do_not_depend_on_the_batch(b: &dyn GpuBackend) -> Result<()> {
    let mut rng = Rng::new(77);
    let (k, n) = (4_096, 1_000);
    let w = upload_f32(b, &stored(b, rng.vec(n * k)), &[n, k])?;
    let x: Vec<f32> = stored(b, rng.vec(4 * k));
    let alone: Vec<Vec<f32>> = (0..4)
        .map(|i| b.download_f32(&b.matmul(&upload_f32(b, &x[i * k..(i + 1) * k], &[1, k])?, &w, None)?))
        .collect::<Result<_>>()?;
    for m in [2, 3, 4] {
        let out = b.download_f32(&b.matmul(&upload_f32(b, &x[..m * k], &[m, k])?, &w, None)?)?;
        for (i, row) in out.chunks(n).enumerate() {
            assert!(row == &alone[i][..], "row {i} of a batch of {m} differs from the row alone");
        }
    }
    Ok(())
}

/// The fused gate/up product with SiLU·mul equals the two ops it replaces exactly (it rounds
/// where they do), at decode batches and past them, and follows the f64 reference.
pub fn matmul_silu_mul_matches_unfused(b: &dyn GpuBackend) -> Result<()> {
    let mut rng = Rng::new(91);
    for &(m, k, i) in &[(1, 256, 300), (3, 1_032, 1_100), (16, 64, 40), (40, 96, 24)] {
        let (x, w) = (stored(b, rng.vec(m * k)), stored(b, rng.vec(2 * i * k)));
        let (xt, wt) = (upload_f32(b, &x, &[m, k])?, upload_f32(b, &w, &[2 * i, k])?);
        let fused = b.matmul_silu_mul(&xt, &wt)?;
        assert_eq!(fused.dims(), [m, i], "matmul_silu_mul shape");
        let unfused = b.silu_mul(&b.matmul(&xt, &wt, None)?)?;
        let (fused, unfused) = (b.download_f32(&fused)?, b.download_f32(&unfused)?);
        assert!(fused == unfused, "matmul_silu_mul m={m} k={k} i={i} differs from silu_mul(matmul)");
        let gate_up = stored(b, matmul_reference(&x, &w, None, m, k).into_iter().map(|v| v as f32).collect());
        let want: Vec<f64> = (0..m * i)
            .map(|j| {
                let (r, c) = (j / i, j % i);
                let (g, u) = (f64::from(gate_up[r * 2 * i + c]), f64::from(gate_up[r * 2 * i + i + c]));
                g / (1.0 + (-g).exp()) * u
            })
            .collect();
        assert_values(b, &fused, &want, &format!("matmul_silu_mul m={m} k={k} i={i}"));
    }
    Ok(())
}

/// An RMSNorm weight in f32 (Gemma's `1 + w`) multiplies the f32 normalised value, which is
/// rounded once: the f64 reference with no intermediate rounding, within one rounding. Rows
/// of 40 and 44 elements: on and off the CUDA backend's 8-element vector kernel.
pub fn rms_norm_with_f32_weight_matches_reference(b: &dyn GpuBackend) -> Result<()> {
    let mut rng = Rng::new(31);
    for (t, n, eps) in [(4, 40, 1e-6), (3, 44, 1e-6)] {
        let x = stored(b, rng.vec(t * n));
        let res = stored(b, rng.vec(t * n));
        let w: Vec<f32> = rng.vec(n).into_iter().map(|v| 1.0 + 0.3 * v).collect();
        let w_t = b.upload(&HostTensor::from_f32(&w, &[n]), DType::F32)?;
        let out = b.rms_norm(&upload_f32(b, &x, &[t, n])?, &w_t, eps)?;
        assert_close(b, &out, &[t, n], &rms_norm_reference(&x, &w, eps), &format!("rms_norm, f32 weight, n={n}"))?;
        let (normed, _) = b.add_rms_norm(&upload_f32(b, &x, &[t, n])?, &upload_f32(b, &res, &[t, n])?, &w_t, eps)?;
        let sum = stored(b, x.iter().zip(&res).map(|(a, r)| a + r).collect());
        let want = rms_norm_reference(&sum, &w, eps);
        assert_close(b, &normed, &[t, n], &want, &format!("add_rms_norm, f32 weight, n={n}"))?;
    }
    Ok(())
}

/// `gelu_tanh(gate) · up` with PyTorch's tanh approximation, over a range where the
/// approximation's curvature matters (gates in ±6).
pub fn gelu_tanh_mul_matches_reference(b: &dyn GpuBackend) -> Result<()> {
    let mut rng = Rng::new(32);
    // Widths off and on the CUDA backend's 8-column vector kernel.
    for (t, n) in [(3, 9), (4, 8 * 20)] {
        let x = stored(b, rng.vec(t * 2 * n).iter().map(|v| v * 6.0).collect());
        let want: Vec<f64> = x
            .chunks(2 * n)
            .flat_map(|row| {
                let (gate, up) = row.split_at(n);
                gate.iter().zip(up).map(|(&g, &u)| {
                    let g = f64::from(g);
                    let k = (2.0 / std::f64::consts::PI).sqrt();
                    0.5 * g * (1.0 + (k * (g + 0.044_715 * g.powi(3))).tanh()) * f64::from(u)
                })
            })
            .collect();
        let out = b.gelu_tanh_mul(&upload_f32(b, &x, &[t, 2 * n])?)?;
        assert_close(b, &out, &[t, n], &want, &format!("gelu_tanh_mul [{t}, {n}]"))?;
    }
    expect_err(b.gelu_tanh_mul(&upload_f32(b, &[0.0; 6], &[2, 3])?), "gelu_tanh_mul of an odd width");
    Ok(())
}

/// `scale` multiplies by the factor rounded to the tensor's dtype (Gemma's `√hidden`), in
/// the float dtype and in f32.
pub fn scale_matches_reference(b: &dyn GpuBackend) -> Result<()> {
    let x = stored(b, Rng::new(33).vec(24));
    let factor = 48f32.sqrt();
    let rounded = f64::from(stored(b, vec![factor])[0]);
    let want: Vec<f64> = x.iter().map(|&v| f64::from(v) * rounded).collect();
    let out = b.scale(&upload_f32(b, &x, &[4, 6])?, factor)?;
    assert_close(b, &out, &[4, 6], &want, "scale")?;
    let x32 = b.upload(&HostTensor::from_f32(&x, &[4, 6]), DType::F32)?;
    let exact: Vec<f64> = x.iter().map(|&v| f64::from(v) * f64::from(factor)).collect();
    let got = b.download_f32(&b.scale(&x32, factor)?)?;
    assert_values(b, &got, &exact, "scale of f32");
    Ok(())
}

/// `softcap` is `cap · tanh(x / cap)`: near identity for small values, bounded by the cap
/// for large ones; a cap that is not positive is refused.
pub fn softcap_matches_reference(b: &dyn GpuBackend) -> Result<()> {
    let x: Vec<f32> = Rng::new(34).vec(30).into_iter().map(|v| v * 120.0).collect();
    let cap = 30.0f32;
    let want: Vec<f64> = x.iter().map(|&v| f64::from(cap) * (f64::from(v) / f64::from(cap)).tanh()).collect();
    let logits = b.upload(&HostTensor::from_f32(&x, &[3, 10]), DType::F32)?;
    let got = b.download_f32(&b.softcap(&logits, cap)?)?;
    assert_values(b, &got, &want, "softcap of f32 logits");
    assert!(got.iter().all(|v| v.abs() <= cap), "softcapped values stay within the cap");
    let x = stored(b, x);
    let want: Vec<f64> = x.iter().map(|&v| f64::from(cap) * (f64::from(v) / f64::from(cap)).tanh()).collect();
    let out = b.softcap(&upload_f32(b, &x, &[3, 10])?, cap)?;
    assert_close(b, &out, &[3, 10], &want, "softcap in the float dtype")?;
    expect_err(b.softcap(&logits, 0.0), "softcap with a zero cap");
    Ok(())
}

/// `write_u32_columns` fills the first columns of each row and leaves the rest as they
/// were, small (staged) and large (pageable) writes alike; a width past the matrix, data
/// that are not whole rows, and a non-`U32` or non-matrix tensor are errors.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub fn write_u32_columns_keeps_the_other_columns(b: &dyn GpuBackend) -> Result<()> {
    for (rows, cols, width) in [(5, 7, 3), (256, 512, 24), (300, 512, 512), (4, 9, 0)] {
        let before: Vec<u32> = (0..rows * cols).map(|i| 1_000_000 + i as u32).collect();
        let t = upload_u32(b, &before, &[rows, cols])?;
        let data: Vec<u32> = (0..rows * width).map(|i| 7 + 3 * i as u32).collect();
        b.write_u32_columns(&t, &data, width)?;
        let got = b.download_u32(&t)?;
        for r in 0..rows {
            for c in 0..cols {
                let want = if c < width { data[r * width + c] } else { before[r * cols + c] };
                assert_eq!(got[r * cols + c], want, "{rows}x{cols} width {width}: ({r}, {c})");
            }
        }
    }
    let t = upload_u32(b, &[0; 12], &[3, 4])?;
    expect_err(b.write_u32_columns(&t, &[0; 15], 5), "a width past the matrix");
    expect_err(b.write_u32_columns(&t, &[0; 7], 2), "data that are not whole rows");
    expect_err(b.write_u32_columns(&upload_u32(b, &[0; 12], &[12])?, &[0; 4], 1), "a vector");
    let floats = b.upload(&HostTensor::from_f32(&[0.0; 12], &[3, 4]), DType::F32)?;
    expect_err(b.write_u32_columns(&floats, &[0; 6], 2), "f32 values");
    Ok(())
}

/// `gather_u32` picks elements of a `u32` vector, repeats included, and refuses an index
/// past it, a matrix and floats.
pub fn gather_u32_picks_elements(b: &dyn GpuBackend) -> Result<()> {
    let src: Vec<u32> = (0..1000).map(|i| i * 7 + 3).collect();
    let t = upload_u32(b, &src, &[src.len()])?;
    let rows: Vec<u32> = vec![999, 0, 5, 5, 512, 1, 998];
    let got = b.download_u32(&b.gather_u32(&t, &rows)?)?;
    assert_eq!(got, rows.iter().map(|&r| src[r as usize]).collect::<Vec<_>>());
    assert_eq!(b.gather_u32(&t, &[])?.elem_count(), 0);
    expect_err(b.gather_u32(&t, &[1000]), "an index past the vector");
    expect_err(b.gather_u32(&upload_u32(b, &src, &[10, 100])?, &[0]), "a matrix");
    let floats = upload_f32(b, &[1.0; 4], &[4])?;
    expect_err(b.gather_u32(&floats, &[0]), "f32 values");
    Ok(())
}

/// A batch-invariant backend's products (`GpuBackend::batch_invariant`): every row of a
/// batch of any size, with or without a bias, 16-byte rows or not, and the fused SiLU·mul,
/// equals the same row computed alone, bit for bit. Batch sizes cross the tile sizes and
/// the kernel changes of the CUDA path (16, 32, 64 rows; 32 and 128 rows per launch).
pub fn matmul_rows_are_batch_invariant(b: &dyn GpuBackend) -> Result<()> {
    assert!(b.batch_invariant(), "{} is not batch-invariant", b.name());
    let (differ, _) = matmul_rows_differing_in_batches(b)?;
    assert!(differ.is_empty(), "{} rows differ from the row alone: {differ:?}", differ.len());
    Ok(())
}

/// The rows of [`matmul_rows_are_batch_invariant`]'s cases that differ from the row
/// alone, each named: the census the GPU bundle prints for the default CUDA kernels.
pub fn matmul_rows_differing_in_batches(b: &dyn GpuBackend) -> Result<(Vec<String>, usize)> {
    let (mut differ, mut compared) = (vec![], 0);
    let mut rng = Rng::new(78);
    for &(k, n) in &[(1_024, 520), (1_003, 96)] {
        let w = upload_f32(b, &stored(b, rng.vec(n * k)), &[n, k])?;
        let bias = upload_f32(b, &stored(b, rng.vec(n)), &[n])?;
        let rows = 300;
        let x: Vec<f32> = stored(b, rng.vec(rows * k));
        let one = |i: usize, bias: Option<&Tensor>| {
            b.download_f32(&b.matmul(&upload_f32(b, &x[i * k..(i + 1) * k], &[1, k])?, &w, bias)?)
        };
        let picks = [0, 1, 15, 16, 17, 31, 63, 64, 127, 128, 199, 299];
        for with_bias in [false, true] {
            let bias = with_bias.then_some(&bias);
            let alone: Vec<Vec<f32>> = picks.iter().map(|&i| one(i, bias)).collect::<Result<_>>()?;
            for m in [2, 17, 33, 65, 129, 200, 300] {
                let out = b.download_f32(&b.matmul(&upload_f32(b, &x[..m * k], &[m, k])?, &w, bias)?)?;
                for (&i, want) in picks.iter().zip(&alone) {
                    if i < m {
                        compared += 1;
                        if out[i * n..(i + 1) * n] != want[..] {
                            differ.push(format!("k={k} n={n} bias={with_bias}: row {i} of {m}"));
                        }
                    }
                }
            }
        }
        let fused_one = |i: usize| {
            let xi = upload_f32(b, &x[i * k..(i + 1) * k], &[1, k])?;
            b.download_f32(&b.matmul_silu_mul(&xi, &w)?)
        };
        let alone: Vec<Vec<f32>> = picks.iter().map(|&i| fused_one(i)).collect::<Result<_>>()?;
        let out = b.download_f32(&b.matmul_silu_mul(&upload_f32(b, &x, &[rows, k])?, &w)?)?;
        for (&i, want) in picks.iter().zip(&alone) {
            compared += 1;
            if out[i * n / 2..(i + 1) * n / 2] != want[..] {
                differ.push(format!("k={k}: matmul_silu_mul row {i} of {rows}"));
            }
        }
    }
    Ok((differ, compared))
}
