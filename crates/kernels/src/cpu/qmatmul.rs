//! `x · Wᵀ` with block-quantised `W` on the CPU, reading the quantised rows directly.
//!
//! Every result is a function of its activation row and weight row alone, computed the
//! same way for a decode row and for a prompt's thousandth row (see `rows.rs`, which only
//! schedules the pairs): packed matrices through their fused kernels, integer ones against
//! activations quantised to 8 bits per block or exact f32 ones, each row on its own
//! ([`QuantDots`], [`Q8Rows`]); the exact products of the K-quants and every product of the
//! formats without a packed layout dequantise a tile of rows at a time and multiply by
//! [`dot_f32_rows`]. Either way the weights are exactly
//! the file's values. The backend holds the choice of dots; tests against exact
//! references use the exact ones.

use std::cell::RefCell;
use std::ops::Range;

use super::rows::{TILE, products};
use crate::quant::{PackedQuant, Q8Rows, QuantFormat, block_sums, dequantize_row, dot_f32_rows};

/// How the CPU computes products with packed quantised weights: one of the closed
/// sets of settings in `met-config`, which the command line offers by name.
pub use met_config::QuantDots;

/// `x [m, k] · wᵀ + bias` for `w [n, k]` stored as `n` rows of `format` blocks.
///
/// # Panics
/// If the slice lengths do not match `m`, `k`, `n` and the format.
pub fn matmul_quant(
    x: &[f32],
    w: &[u8],
    bias: Option<&[f32]>,
    (m, k, n): (usize, usize, usize),
    format: QuantFormat,
) -> Vec<f32> {
    let row_bytes = format.bytes_for(k).expect("k is a whole number of blocks");
    assert_eq!(w.len(), n * row_bytes, "w is not [n, k]");
    assert_eq!(x.len(), m * k, "x is not [m, k]");
    let dequantize = |rows: Range<usize>, out: &mut [f32]| {
        dequantize_row(format, &w[rows.start * row_bytes..rows.end * row_bytes], out);
    };
    let out = products(n, m, &|run, out| dot_dequantized(x, k, &dequantize, run, out));
    add_bias(out, bias, n)
}

thread_local! {
    /// A tile of dequantised weight rows and its `[m, TILE]` products, kept per thread so
    /// products do not allocate (and fault in) fresh ones per task.
    static DEQUANTIZED: RefCell<[Vec<f32>; 2]> = const { RefCell::new([Vec::new(), Vec::new()]) };
}

/// `out [m, run.len()] = x · rowsᵀ` for the weight rows `run`, which `dequantize` writes
/// as f32 a tile of [`TILE`] rows at a time.
fn dot_dequantized(
    x: &[f32],
    k: usize,
    dequantize: &dyn Fn(Range<usize>, &mut [f32]),
    run: Range<usize>,
    out: &mut [f32],
) {
    let m = x.len() / k.max(1);
    DEQUANTIZED.with_borrow_mut(|[rows, part]| {
        for first in run.clone().step_by(TILE) {
            let tile = first..(first + TILE).min(run.end);
            rows.resize(tile.len() * k, 0.0);
            part.resize(m * tile.len(), 0.0);
            dequantize(tile.clone(), rows);
            dot_f32_rows(x, rows, k, part);
            for (i, got) in part.chunks_exact(tile.len()).enumerate() {
                let at = i * run.len() + tile.start - run.start;
                out[at..at + tile.len()].copy_from_slice(got);
            }
        }
    });
}

/// `x [m, k] · wᵀ + bias` for a packed `w`, with products computed as `dots` says.
///
/// # Panics
/// If `x` is not `[m, k]`.
pub fn matmul_packed(x: &[f32], w: &PackedQuant, bias: Option<&[f32]>, m: usize, dots: QuantDots) -> Vec<f32> {
    matmul_packed_parts(x, std::slice::from_ref(w), bias, m, dots)
}

/// [`matmul_packed`] for a matrix stored as row blocks `parts` (a fused projection whose
/// parts keep their own formats), all of `k` columns: each weight row's products are
/// those of its part alone, so the result equals the parts' products side by side.
///
/// # Panics
/// If `x` is not `[m, k]` or the parts' `k` differ.
pub fn matmul_packed_parts(
    x: &[f32],
    parts: &[PackedQuant],
    bias: Option<&[f32]>,
    m: usize,
    dots: QuantDots,
) -> Vec<f32> {
    let n = parts.iter().map(PackedQuant::rows).sum();
    add_bias(matmul_packed_rows(x, parts, 0..n, m, dots), bias, n)
}

/// [`matmul_packed_parts`] for weight rows `rows` of the matrix alone (an expert's rows of
/// a stack of experts): `x [m, k] · w[rows]ᵀ`, each product as the whole matrix's would be.
///
/// # Panics
/// If `x` is not `[m, k]`, the parts' `k` differ or `rows` runs past the matrix.
pub fn matmul_packed_rows(x: &[f32], parts: &[PackedQuant], rows: Range<usize>, m: usize, dots: QuantDots) -> Vec<f32> {
    let k = parts.first().map_or(0, PackedQuant::k);
    assert!(parts.iter().all(|p| p.k() == k), "parts of different widths");
    assert!(rows.end <= parts.iter().map(PackedQuant::rows).sum(), "rows past the matrix");
    assert_eq!(x.len(), m * k, "x is not [m, k]");
    let q8 = matches!(dots, QuantDots::Int8).then(|| Q8Rows::quantize(x, k));
    let sums: Vec<f32> = if matches!(dots, QuantDots::Exact) && parts.iter().any(|p| p.format().block_elems() <= 32) {
        x.chunks_exact(k.max(1)).flat_map(block_sums).collect()
    } else {
        Vec::new()
    };
    let dot_part = |w: &PackedQuant, run: Range<usize>, out: &mut [f32]| match &q8 {
        Some(q) => w.dot_rows_q8(q, run, out),
        // The K-quants have no f32 kernels of their own: tiles of their rows dequantise
        // to exactly the file's values and multiply as f32 rows.
        None if w.format().block_elems() > 32 => {
            let dequantize = |rows: Range<usize>, out: &mut [f32]| w.dequantize_rows(rows, out);
            dot_dequantized(x, k, &dequantize, run, out);
        }
        None => w.dot_rows_many(x, &sums, run, out),
    };
    let first = rows.start;
    products(rows.len(), m, &|run, out| for_parts(parts, run.start + first..run.end + first, out, &dot_part))
}

/// `out [m, run.len()]` for weight rows `run` of a matrix stored as row blocks `parts`:
/// `dot` of each part over its rows in the run, written straight into `out` when one part
/// holds the whole run.
fn for_parts(
    parts: &[PackedQuant],
    run: Range<usize>,
    out: &mut [f32],
    dot: &impl Fn(&PackedQuant, Range<usize>, &mut [f32]),
) {
    let width = run.len();
    let m = out.len() / width.max(1);
    let mut first = 0;
    for p in parts {
        let own = run.start.max(first)..run.end.min(first + p.rows());
        if own.len() == width {
            return dot(p, own.start - first..own.end - first, out);
        }
        if !own.is_empty() {
            let mut part = vec![0f32; m * own.len()];
            dot(p, own.start - first..own.end - first, &mut part);
            for (i, got) in part.chunks_exact(own.len()).enumerate() {
                let at = i * width + own.start - run.start;
                out[at..at + own.len()].copy_from_slice(got);
            }
        }
        first += p.rows();
    }
}

/// Adds `bias` to every row of `out` (`[m, n]`).
pub(super) fn add_bias(mut out: Vec<f32>, bias: Option<&[f32]>, n: usize) -> Vec<f32> {
    if let Some(b) = bias {
        for row in out.chunks_exact_mut(n.max(1)) {
            row.iter_mut().zip(b).for_each(|(o, b)| *o += b);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::super::rows::MANY_ROWS;
    use super::*;

    fn weights(format: QuantFormat, n: usize, k: usize) -> Vec<u8> {
        let mut bytes = Vec::new();
        for r in 0..n {
            for b in 0..k / format.block_elems() {
                let mut block = vec![0u8; format.block_bytes()];
                for (i, x) in block.iter_mut().enumerate() {
                    *x = ((r * 131 + b * 17 + i * 7) % 251) as u8;
                }
                let scale_at = if format == QuantFormat::Q6_K { format.block_bytes() - 2 } else { 0 };
                block[scale_at..scale_at + 2]
                    .copy_from_slice(&f16::from_f32(0.01 + (r % 7) as f32 * 0.003).to_le_bytes());
                if matches!(format, QuantFormat::Q4_1 | QuantFormat::Q5_1) {
                    block[2..4].copy_from_slice(&f16::from_f32(-0.02 * (b % 3) as f32).to_le_bytes());
                }
                if format == QuantFormat::F8_E4M3 {
                    crate::quant::f8_test_block(&mut block, 0.01 + (r % 7) as f32 * 0.003);
                }
                bytes.extend(block);
            }
        }
        bytes
    }

    /// The formats with a packed layout.
    const PACKED: [QuantFormat; 6] = [
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q8_0,
        QuantFormat::Q4_K,
        QuantFormat::Q5_K,
        QuantFormat::Q6_K,
    ];

    /// A few activation rows (a decode row and its speculative tokens) give each row
    /// exactly its result alone, bit for bit, with either kind of dots: verification must
    /// see decode's logits.
    #[test]
    fn few_rows_equal_each_row_alone_bit_for_bit() {
        let (k, n) = (256, 37);
        for format in PACKED {
            let w = weights(format, n, k);
            let packed = PackedQuant::from_blocks(format, &w, k).unwrap();
            for dots in [QuantDots::Exact, QuantDots::Int8] {
                for m in 1..MANY_ROWS + 2 {
                    let x: Vec<f32> = (0..m * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect();
                    let together = matmul_packed(&x, &packed, None, m, dots);
                    for (i, row) in x.chunks_exact(k).enumerate() {
                        let alone = matmul_packed(row, &packed, None, 1, dots);
                        assert_eq!(&together[i * n..(i + 1) * n], &alone[..], "{format} {dots} m={m} row {i}");
                    }
                }
            }
            for m in 1..MANY_ROWS + 2 {
                let x: Vec<f32> = (0..m * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect();
                let sums: Vec<f32> = x.chunks_exact(k).flat_map(block_sums).collect();
                let mut many = vec![0f32; m * 5];
                packed.dot_rows_many(&x, &sums, 3..8, &mut many);
                for (i, row) in x.chunks_exact(k).enumerate() {
                    let mut one = [0f32; 5];
                    packed.dot_rows(row, &block_sums(row), 3..8, &mut one);
                    assert_eq!(&many[i * 5..(i + 1) * 5], &one[..], "{format} m={m} rows 3..8");
                }
            }
        }
    }

    /// A matrix kept as row blocks of different formats (a Q4_K_M fused q/k/v: Q4_K rows,
    /// then Q6_K, then Q4_K again) gives, for both kinds of dots and row counts on both
    /// sides of [`MANY_ROWS`], bit for bit each part's own product side by side, with part
    /// boundaries inside a run and inside a tile.
    #[test]
    fn row_blocks_of_different_formats_equal_their_parts_side_by_side() {
        let k = 256;
        let layout = [(QuantFormat::Q4_K, 70), (QuantFormat::Q6_K, 37), (QuantFormat::Q4_K, TILE + 3)];
        let parts: Vec<PackedQuant> =
            layout.iter().map(|&(f, n)| PackedQuant::from_blocks(f, &weights(f, n, k), k).unwrap()).collect();
        let n: usize = layout.iter().map(|&(_, n)| n).sum();
        for dots in [QuantDots::Exact, QuantDots::Int8] {
            for m in [1, 5, MANY_ROWS, 40] {
                let x = batch(m, k);
                let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.01).collect();
                let got = matmul_packed_parts(&x, &parts, Some(&bias), m, dots);
                let alone: Vec<Vec<f32>> = parts.iter().map(|p| matmul_packed(&x, p, None, m, dots)).collect();
                for i in 0..m {
                    let want: Vec<f32> = alone
                        .iter()
                        .zip(&layout)
                        .flat_map(|(a, &(_, w))| a[i * w..(i + 1) * w].iter().copied())
                        .zip(&bias)
                        .map(|(v, b)| v + b)
                        .collect();
                    assert_eq!(&got[i * n..(i + 1) * n], &want[..], "{dots} m={m} row {i}");
                }
            }
        }
    }

    /// The CPU backend keeps a fusion of Q4_K and Q6_K parts in their own formats: its
    /// values are the widened join's, and its product is the parts' kernels side by side.
    #[test]
    fn uploaded_row_blocks_keep_their_formats() {
        use crate::{GpuBackend, HostTensor};
        let k = 256;
        let host = |f: QuantFormat, n: usize| {
            HostTensor::from_bytes(crate::DType::Quant(f), &[n, k], weights(f, n, k).into()).unwrap()
        };
        let parts = vec![host(QuantFormat::Q4_K, 40), host(QuantFormat::Q6_K, 24), host(QuantFormat::Q4_K, 8)];
        let widened = HostTensor::concat_rows(parts.clone()).unwrap().to_f32_vec().unwrap();
        for dots in [QuantDots::Exact, QuantDots::Int8] {
            let cpu = super::super::CpuBackend::with_dots(dots);
            let w = cpu.upload_rows(parts.clone(), crate::DType::F32).unwrap();
            assert_eq!(w.dtype(), crate::DType::Quant(QuantFormat::Q4_K), "the first part's format");
            assert_eq!(w.dims(), [72, k]);
            assert_eq!(cpu.download_f32(&w).unwrap(), widened, "values of the join");
            let x = batch(3, k);
            let got = cpu
                .download_f32(
                    &cpu.matmul(&cpu.upload(&HostTensor::from_f32(&x, &[3, k]), crate::DType::F32).unwrap(), &w, None)
                        .unwrap(),
                )
                .unwrap();
            let packed: Vec<PackedQuant> = parts
                .iter()
                .map(|p| {
                    let crate::DType::Quant(f) = p.dtype() else { unreachable!() };
                    PackedQuant::from_blocks(f, p.bytes(), k).unwrap()
                })
                .collect();
            assert_eq!(got, matmul_packed_parts(&x, &packed, None, 3, dots), "{dots}");
        }
        // A part without a packed layout (Q5_0) widens the whole join to f32, as before.
        let unpackable = vec![host(QuantFormat::Q4_K, 8), host(QuantFormat::Q5_0, 8)];
        let widened = HostTensor::concat_rows(unpackable.clone()).unwrap().to_f32_vec().unwrap();
        let cpu = super::super::CpuBackend::new();
        let w = cpu.upload_rows(unpackable, crate::DType::F32).unwrap();
        assert_eq!(w.dtype(), crate::DType::F32, "a Q5_0 part widens the join");
        assert_eq!(cpu.download_f32(&w).unwrap(), widened);
    }

    /// A matmul of `m` activation rows by one path.
    type Product<'a> = Box<dyn Fn(&[f32], usize) -> Vec<f32> + 'a>;

    /// Activations whose rows differ in scale and sign, as a batch of unrelated sequences.
    fn batch(m: usize, k: usize) -> Vec<f32> {
        (0..m * k).map(|i| (((i * 29 + i / k * 7) % 53) as f32 - 26.0) / (3.0 + (i / k % 5) as f32)).collect()
    }

    /// The batch invariant: every row of a product is bit for bit that row computed alone,
    /// for every format, both kinds of dots, row counts on both sides of [`MANY_ROWS`], and
    /// both schedules of the pairs over the pool (runs per thread, tiles), which stand for
    /// any split over threads.
    #[test]
    fn every_row_of_any_batch_equals_the_row_alone_bit_for_bit() {
        let (k, n) = (256, TILE + 6);
        for format in QuantFormat::ALL {
            let w = weights(format, n, k);
            let packed = PackedQuant::from_blocks(format, &w, k);
            for m in [1, 3, 31, 32, 33, 100] {
                let x = batch(m, k);
                let mut paths: Vec<(String, Product<'_>)> =
                    vec![("blocks".into(), Box::new(|x, m| matmul_quant(x, &w, None, (m, k, n), format)))];
                if let Some(p) = &packed {
                    for dots in [QuantDots::Exact, QuantDots::Int8] {
                        paths
                            .push((format!("packed {dots}"), Box::new(move |x, m| matmul_packed(x, p, None, m, dots))));
                    }
                }
                for (path, product) in &paths {
                    let together = product(&x, m);
                    for (i, row) in x.chunks_exact(k).enumerate() {
                        let alone = product(row, 1);
                        assert_eq!(&together[i * n..(i + 1) * n], &alone[..], "{format} {path} m={m} row {i}");
                    }
                }
                if let Some(p) = &packed {
                    let q = Q8Rows::quantize(&x, k);
                    let dot = |run: Range<usize>, out: &mut [f32]| p.dot_rows_q8(&q, run, out);
                    let (fused, tiled) = (super::super::rows::fused(n, m, &dot), super::super::rows::tiled(n, m, &dot));
                    assert_eq!(fused, tiled, "{format} int8 m={m}: runs against tiles");
                }
            }
        }
    }

    /// Products of more activation rows than a tile's worth of passes, with a last tile of
    /// 6 weight rows, match the f64 product of the dequantised weights.
    #[test]
    fn tiled_products_match_the_dequantised_product() {
        let (m, k, n) = (300, 256, TILE + 6);
        let w = weights(QuantFormat::Q4_1, n, k);
        let mut wf = vec![0f32; n * k];
        dequantize_row(QuantFormat::Q4_1, &w, &mut wf);
        let packed = PackedQuant::from_blocks(QuantFormat::Q4_1, &w, k).unwrap();
        let x: Vec<f32> = (0..m * k).map(|i| ((i * 29 % 53) as f32 - 26.0) / 13.0).collect();
        let paths = [
            ("blocks", matmul_quant(&x, &w, None, (m, k, n), QuantFormat::Q4_1)),
            ("packed exact", matmul_packed(&x, &packed, None, m, QuantDots::Exact)),
        ];
        for (path, got) in paths {
            for i in 0..m {
                for j in 0..n {
                    let terms = (0..k).map(|l| f64::from(x[i * k + l]) * f64::from(wf[j * k + l]));
                    let (want, scale) = (terms.clone().sum::<f64>(), terms.map(f64::abs).sum::<f64>());
                    let g = f64::from(got[i * n + j]);
                    assert!((g - want).abs() <= 1e-5 * scale, "{path} ({i},{j}): {g} vs {want}");
                }
            }
        }
    }

    #[test]
    fn every_path_matches_the_dequantised_product() {
        let (k, n) = (256, 70);
        for format in QuantFormat::ALL {
            let w = weights(format, n, k);
            let mut wf = vec![0f32; n * k];
            dequantize_row(format, &w, &mut wf);
            let packed = PackedQuant::from_blocks(format, &w, k);
            let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.1).collect();
            for m in [1, 3, MANY_ROWS, 20] {
                let x: Vec<f32> = (0..m * k).map(|i| ((i * 29 % 53) as f32 - 26.0) / 13.0).collect();
                let mut results = vec![("blocks", matmul_quant(&x, &w, Some(&bias), (m, k, n), format))];
                if let Some(p) = &packed {
                    results.push(("packed", matmul_packed(&x, p, Some(&bias), m, QuantDots::Exact)));
                }
                let int8 = packed.as_ref().map(|p| matmul_packed(&x, p, Some(&bias), m, QuantDots::Int8));
                for (path, got) in results {
                    for i in 0..m {
                        for j in 0..n {
                            let terms = (0..k).map(|l| f64::from(x[i * k + l]) * f64::from(wf[j * k + l]));
                            let want = f64::from(bias[j]) + terms.clone().sum::<f64>();
                            // Summation order differs between paths: bound the error by the terms' size.
                            let scale = f64::from(bias[j].abs()) + terms.map(f64::abs).sum::<f64>();
                            let g = f64::from(got[i * n + j]);
                            assert!((g - want).abs() <= 1e-5 * scale, "{format} {path} m={m} ({i},{j}): {g} vs {want}");
                        }
                    }
                }
                // Integer dots: within the rounding of the activations to 8 bits (at most
                // half a step of each block's `max|x| / 127`, times the block's `Σ |w|`).
                let Some(int8) = int8 else { continue };
                for i in 0..m {
                    let xi = &x[i * k..(i + 1) * k];
                    for j in 0..n {
                        let wj = &wf[j * k..(j + 1) * k];
                        let want = f64::from(bias[j]) + xi.iter().zip(wj).map(|(a, b)| f64::from(a * b)).sum::<f64>();
                        let scale: f64 = xi.iter().zip(wj).map(|(a, b)| f64::from((a * b).abs())).sum();
                        let rounding: f64 = xi
                            .chunks_exact(32)
                            .zip(wj.chunks_exact(32))
                            .map(|(xb, wb)| {
                                let step = f64::from(xb.iter().fold(0f32, |a, v| a.max(v.abs()))) / 127.0;
                                step / 2.0 * wb.iter().map(|v| f64::from(v.abs())).sum::<f64>()
                            })
                            .sum();
                        let g = f64::from(int8[i * n + j]);
                        assert!(
                            (g - want).abs() <= rounding + 1e-5 * scale,
                            "{format} int8 m={m} ({i},{j}): {g} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
