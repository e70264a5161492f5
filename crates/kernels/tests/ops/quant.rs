//! Conformance checks of quantised weights: a backend given ggml blocks (`DType::Quant`)
//! must compute matmuls and embeddings with exactly the values the blocks decode to,
//! whether it keeps the blocks (CPU) or dequantises them at upload.

use std::borrow::Cow;

use half::f16;
use met_kernels::quant::QuantFormat;
use met_kernels::{DType, GpuBackend, HostTensor, Result, Tensor};

use crate::harness::{
    Rng, assert_close, assert_close_within, assert_values, stored, tolerance, upload_f32, upload_u32, widen,
};

/// Random blocks of `format` for a `[n, k]` matrix, with small finite scales.
fn blocks(format: QuantFormat, n: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let count = n * k / format.block_elems();
    let mut bytes = Vec::with_capacity(count * format.block_bytes());
    for _ in 0..count {
        let mut block: Vec<u8> = (0..format.block_bytes()).map(|_| rng.below(256) as u8).collect();
        let scale_at = if format == QuantFormat::Q6_K { format.block_bytes() - 2 } else { 0 };
        block[scale_at..scale_at + 2].copy_from_slice(&f16::from_f32(0.002 + rng.uniform().abs() * 0.01).to_le_bytes());
        if matches!(format, QuantFormat::Q4_1 | QuantFormat::Q5_1 | QuantFormat::Q4_K | QuantFormat::Q5_K) {
            block[2..4].copy_from_slice(&f16::from_f32(rng.uniform() * 0.05).to_le_bytes());
        }
        if format == QuantFormat::F8_E4M3 {
            // An f32 scale, and e4m3 values without the NaN codes (0x7F, 0xFF).
            block[..4].copy_from_slice(&(0.002 + rng.uniform().abs() * 0.01).to_le_bytes());
            block[4..].iter_mut().filter(|q| **q & 0x7F == 0x7F).for_each(|q| *q ^= 1);
        }
        bytes.extend(block);
    }
    bytes
}

/// Matmul (decode- and prefill-sized), embedding and download of quantised weights equal
/// the same ops on the decoded values.
pub fn quantized_weights_compute_with_their_decoded_values(b: &dyn GpuBackend) -> Result<()> {
    let mut rng = Rng::new(77);
    let (n, k) = (40, 512);
    for format in QuantFormat::ALL {
        let host = HostTensor::from_bytes(DType::Quant(format), &[n, k], Cow::Owned(blocks(format, n, k, &mut rng)))?;
        let decoded = host.to_f32_vec()?;
        let w = b.upload(&host, b.float_dtype())?;
        assert_values(b, &b.download_f32(&w)?, &widen(&decoded), &format!("{format} download"));
        // What a backend without quantised kernels computes with: the decoded values in its
        // float dtype (unchanged on the CPU, which keeps the blocks).
        let values = stored(b, decoded.clone());
        for m in [1, 3, 12] {
            let x = stored(b, rng.vec(m * k));
            let want: Vec<f64> = (0..m)
                .flat_map(|i| {
                    let (x, values) = (&x, &values);
                    (0..n).map(move |j| (0..k).map(|l| f64::from(x[i * k + l]) * f64::from(values[j * k + l])).sum())
                })
                .collect();
            let y = b.matmul(&upload_f32(b, &x, &[m, k])?, &w, None)?;
            assert_close(b, &y, &[m, n], &want, &format!("{format} matmul m={m}"))?;
        }
        let ids = [3u32, 0, 39, 3];
        let rows = b.embedding(&upload_u32(b, &ids, &[4])?, &w)?;
        let want: Vec<f64> = ids.iter().flat_map(|&i| widen(&decoded[i as usize * k..(i as usize + 1) * k])).collect();
        assert_close(b, &rows, &[4, k], &want, &format!("{format} embedding"))?;
    }
    Ok(())
}

/// `x` (rows of `k`) as int8 blocks of 32 see it: each block over `d = max|x| / 127`,
/// rounded to the nearest integer, times `d` again (CUDA's `gguf_quantize_q8`).
fn q8_rounded(x: &[f32]) -> Vec<f64> {
    x.chunks(32)
        .flat_map(|block| {
            let amax = block.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            block.iter().map(move |&v| if amax > 0.0 { f64::from((v / d).round_ties_even() * d) } else { 0.0 })
        })
        .collect()
}

/// Q4_K and Q6_K products over int8 activations (the CPU's `--quant-dots int8`, CUDA's
/// `--quant-dots int8`) equal the decoded weights' product with x rounded to 8 bits a block
/// of 32, at every GEMV batch bound; and they are nearer that reference than the unrounded
/// one by well more than the output's rounding, so the check sees whether the int8 form
/// ran at all.
pub fn k_quant_int8_dots_match_rounded_activations(b: &dyn GpuBackend) -> Result<()> {
    let mut rng = Rng::new(4242);
    let (n, k) = (40, 1024);
    for format in [QuantFormat::Q4_K, QuantFormat::Q6_K] {
        let host = HostTensor::from_bytes(DType::Quant(format), &[n, k], Cow::Owned(blocks(format, n, k, &mut rng)))?;
        let decoded = widen(&host.to_f32_vec()?);
        let w = b.upload(&host, b.float_dtype())?;
        let decoded = &decoded;
        let product = |x: &[f64], m: usize| -> Vec<f64> {
            (0..m).flat_map(|i| (0..n).map(move |j| (0..k).map(|l| x[i * k + l] * decoded[j * k + l]).sum())).collect()
        };
        let rms = |a: &[f32], b: &[f64]| {
            (a.iter().zip(b).map(|(&a, &b)| (f64::from(a) - b).powi(2)).sum::<f64>() / a.len() as f64).sqrt()
        };
        for m in [1, 2, 3, 5, 8] {
            let x = stored(b, rng.vec(m * k));
            let (rounded, exact) = (product(&q8_rounded(&x), m), product(&widen(&x), m));
            let y = b.matmul(&upload_f32(b, &x, &[m, k])?, &w, None)?;
            let what = format!("{format} int8 dots m={m}");
            assert_close(b, &y, &[m, n], &rounded, &what)?;
            let got = b.download_f32(&y)?;
            let (near, far) = (rms(&got, &rounded), rms(&got, &exact));
            assert!(near < 0.6 * far, "{what}: rms {near:.3e} from the int8 reference, {far:.3e} from the exact one");
            // The SwiGLU over the same matrix as gate and up halves: the bits of the product
            // and `silu_mul` apart (CUDA runs it as one kernel).
            let xs = upload_f32(b, &x, &[m, k])?;
            let fused = b.download_f32(&b.matmul_silu_mul(&xs, &w)?)?;
            let apart = b.download_f32(&b.silu_mul(&b.matmul(&xs, &w, None)?)?)?;
            assert_eq!(fused.len(), m * n / 2, "{what}: SwiGLU shape");
            for (i, (f, a)) in fused.iter().zip(&apart).enumerate() {
                assert_eq!(f.to_bits(), a.to_bits(), "{what}: SwiGLU element {i}, {f} fused against {a} apart");
            }
        }
        norm_outputs_feed_int8_dots(b, &w, k, &mut rng)?;
    }
    Ok(())
}

/// A decode step's norm feeding a product over int8 activations (CUDA writes the rows'
/// int8 form beside them): its rows are those of a norm too many rows for that (9), and
/// the product is that of the same values without the int8 form, bit for bit.
fn norm_outputs_feed_int8_dots(b: &dyn GpuBackend, w: &Tensor, k: usize, rng: &mut Rng) -> Result<()> {
    let dt = b.float_dtype();
    let weight = upload_f32(b, &stored(b, rng.vec(k)), &[k])?;
    let (x, r) = (stored(b, rng.vec(9 * k)), stored(b, rng.vec(9 * k)));
    let (x9, r9) = (upload_f32(b, &x, &[9, k])?, upload_f32(b, &r, &[9, k])?);
    let wide = b.download_f32(&b.add_rms_norm(&x9, &r9, &weight, 1e-6)?.0)?;
    let wide_plain = b.download_f32(&b.rms_norm(&x9, &weight, 1e-6)?)?;
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for m in [1, 3, 8] {
        let (xm, rm) = (upload_f32(b, &x[..m * k], &[m, k])?, upload_f32(b, &r[..m * k], &[m, k])?);
        for (normed, rows) in
            [(b.add_rms_norm(&xm, &rm, &weight, 1e-6)?.0, &wide), (b.rms_norm(&xm, &weight, 1e-6)?, &wide_plain)]
        {
            assert_eq!(bits(&b.download_f32(&normed)?), bits(&rows[..m * k]), "a norm of {m} rows against 9");
            let plain = b.add(&normed, &b.zeros(&[m, k], dt)?)?;
            let (with, without) = (b.matmul(&normed, w, None)?, b.matmul(&plain, w, None)?);
            assert_eq!(
                bits(&b.download_f32(&with)?),
                bits(&b.download_f32(&without)?),
                "a norm's {m} rows into int8 dots"
            );
        }
    }
    Ok(())
}

/// A matrix joined from parts of different formats (a Q4_K_M file's fused q/k/v, whose v is
/// Q6_K in some layers) computes with each part's decoded values: products at every batch
/// size around the CUDA GEMV's largest (8 rows) and past it, with a bias, the fused SwiGLU,
/// embedding rows of each part, and its download and cast.
pub fn gguf_parts_of_mixed_formats_compute_with_their_decoded_values(b: &dyn GpuBackend) -> Result<()> {
    let mut rng = Rng::new(91);
    let k = 512;
    let layout = [(QuantFormat::Q4_K, 24), (QuantFormat::Q6_K, 8), (QuantFormat::Q4_K, 8), (QuantFormat::Q8_0, 6)];
    let n: usize = layout.iter().map(|&(_, rows)| rows).sum();
    let mut decoded = Vec::with_capacity(n * k);
    let parts = layout
        .iter()
        .map(|&(format, rows)| {
            let host = HostTensor::from_bytes(
                DType::Quant(format),
                &[rows, k],
                Cow::Owned(blocks(format, rows, k, &mut rng)),
            )?;
            decoded.extend(host.to_f32_vec()?);
            Ok(host)
        })
        .collect::<Result<Vec<_>>>()?;
    let w = b.upload_rows(parts, b.float_dtype())?;
    assert_eq!(w.dims(), [n, k], "joined shape");
    let got = b.download_f32(&w)?;
    assert_values(b, &got, &widen(&decoded), "mixed download");
    if b.float_dtype() == DType::BF16 {
        assert_eq!(b.download_f32(&b.cast(&w, DType::BF16)?)?, got, "mixed cast = download");
    }
    let values = stored(b, decoded.clone());
    let bias = stored(b, rng.vec(n));
    for m in [1, 2, 3, 5, 8, 9, 33] {
        let x = stored(b, rng.vec(m * k));
        let with_bias = m % 2 == 1;
        let want: Vec<f64> = (0..m)
            .flat_map(|i| {
                let (x, values, bias) = (&x, &values, &bias);
                (0..n).map(move |j| {
                    let dot: f64 = (0..k).map(|l| f64::from(x[i * k + l]) * f64::from(values[j * k + l])).sum();
                    dot + if with_bias { f64::from(bias[j]) } else { 0.0 }
                })
            })
            .collect();
        let xt = upload_f32(b, &x, &[m, k])?;
        let bias_t = with_bias.then(|| upload_f32(b, &bias, &[n])).transpose()?;
        let y = b.matmul(&xt, &w, bias_t.as_ref())?;
        assert_close(b, &y, &[m, n], &want, &format!("mixed matmul m={m} bias {with_bias}"))?;
        let fused = b.download_f32(&b.matmul_silu_mul(&xt, &w)?)?;
        let unfused = b.download_f32(&b.silu_mul(&b.matmul(&xt, &w, None)?)?)?;
        assert_eq!(fused, unfused, "mixed matmul_silu_mul m={m} equals silu_mul of the product");
    }
    let ids = [0u32, 23, 24, 31, 32, 40, 45, 5];
    let rows = b.embedding(&upload_u32(b, &ids, &[ids.len()])?, &w)?;
    let want: Vec<f64> = ids.iter().flat_map(|&i| widen(&decoded[i as usize * k..(i as usize + 1) * k])).collect();
    assert_close(b, &rows, &[ids.len(), k], &want, "mixed embedding")?;
    Ok(())
}

/// Two experts joined from GGUF matrices (a join short enough to look like a fused
/// projection, so a backend may keep it in blocks) compute with their decoded values, from
/// one token to forty.
pub fn gguf_expert_pairs_compute_with_their_decoded_values(b: &dyn GpuBackend) -> Result<()> {
    let mut rng = Rng::new(93);
    let (e, h, i, k) = (2, 256, 256, 2);
    let dtype = b.float_dtype();
    let mut stack = |rows: usize, cols: usize, format: QuantFormat| -> Result<(Tensor, Vec<f32>)> {
        let mut decoded = Vec::new();
        let parts = (0..e)
            .map(|_| {
                let bytes = blocks(format, rows, cols, &mut rng);
                let host = HostTensor::from_bytes(DType::Quant(format), &[rows, cols], Cow::Owned(bytes))?;
                decoded.extend(host.to_f32_vec()?);
                Ok(host)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((b.upload_rows(parts, dtype)?.reshape(&[e, rows, cols])?, decoded))
    };
    let (gu, gate_up) = stack(2 * i, h, QuantFormat::Q4_K)?;
    let (dn, down) = stack(h, i, QuantFormat::Q6_K)?;
    let ex = crate::moe::Experts { h, i, gate_up: stored(b, gate_up), down: stored(b, down) };
    for t in [1, 5, 40] {
        let x = stored(b, rng.vec(t * h));
        let routing = b.topk_routing(&upload_f32(b, &rng.vec(t * e), &[t, e])?, k, true)?;
        let got = b.moe_experts(&upload_f32(b, &x, &[t, h])?, &routing, &gu, &dn)?;
        let (ids, weights) = (b.download_u32(&routing.experts)?, b.download_f32(&routing.weights)?);
        let want = crate::moe::moe_reference(&ex, &x, &ids, &weights, k);
        // As `moe_experts`' own check: four chained roundings to the float dtype.
        assert_close_within(
            b,
            &got,
            &[t, h],
            &want,
            tolerance(dtype).chained(4),
            &format!("GGUF experts, {t} tokens"),
        )?;
    }
    Ok(())
}

/// Each token's MoE output with experts in packed GGUF blocks is the same bits alone as in
/// a batch of 24 tokens, however many other tokens share its experts (what the CPU promises
/// by default, `--quant-dots int8` included, and CUDA under `--batch-invariant`).
pub fn gguf_expert_rows_are_batch_invariant(b: &dyn GpuBackend) -> Result<()> {
    let mut rng = Rng::new(80);
    let (e, h, i, k, t) = (4, 512, 256, 2, 24);
    let stack = |rows: usize, cols: usize, rng: &mut Rng| -> Result<Tensor> {
        let parts = (0..e)
            .map(|_| {
                let bytes = blocks(QuantFormat::Q4_K, rows, cols, rng);
                HostTensor::from_bytes(DType::Quant(QuantFormat::Q4_K), &[rows, cols], Cow::Owned(bytes))
            })
            .collect::<Result<Vec<_>>>()?;
        b.upload_rows(parts, b.float_dtype())?.reshape(&[e, rows, cols])
    };
    let (gate_up, down) = (stack(2 * i, h, &mut rng)?, stack(h, i, &mut rng)?);
    let (x, logits) = (stored(b, rng.vec(t * h)), rng.vec(t * e));
    let run = |rows: std::ops::Range<usize>| -> Result<Vec<f32>> {
        let n = rows.len();
        let xs = upload_f32(b, &x[rows.start * h..rows.end * h], &[n, h])?;
        let routing = b.topk_routing(&upload_f32(b, &logits[rows.start * e..rows.end * e], &[n, e])?, k, true)?;
        b.download_f32(&b.moe_experts(&xs, &routing, &gate_up, &down)?)
    };
    let batch = run(0..t)?;
    for tok in [0, 5, 11, 23] {
        assert_eq!(run(tok..tok + 1)?, batch[tok * h..(tok + 1) * h], "token {tok}: alone != in a batch of {t}");
    }
    Ok(())
}
