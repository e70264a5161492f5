//! `x · Wᵀ` with block-quantised `W` on the CPU, reading the quantised rows directly.
//!
//! Few activation rows (decode): fused dequantise-and-dot products, parallel over runs of
//! the rows of `W`. Many rows (prefill): `W` is dequantised a tile of rows at a time into a
//! scratch buffer and multiplied with the `gemm` crate, so the arithmetic runs at GEMM
//! speed while the weights stay quantised in memory. Either way the weights are exactly
//! the file's values.
//!
//! For packed matrices the few-row products come in two flavours ([`CpuDots`]): exact f32
//! products, or integer products against activations quantised once per product to 8
//! bits per block ([`Q8Rows`]), which are faster and differ from the exact ones by that
//! rounding alone. The backend holds the choice; tests against exact references use the
//! exact one.

use std::ops::Range;
use std::sync::Mutex;

use super::pool::SpinPool;
use crate::quant::{PackedQuant, Q8Rows, QuantFormat, block_sums, dequantize_row, dot_rows};

/// At or above this many activation rows, the tiled GEMM path wins over exact dots, which
/// unpack each weight block once for 4 rows at a time. Measured on the default model
/// (2 threads, AVX-512): decode steps of 8, 12, 16 and 24 rows took 46, 65, 83 and 115 ms
/// on the dots against 84, 92, 104 and 124 ms tiled; at 32 rows, 151 against 146.
const GEMM_ROWS: usize = 32;
/// At or above this many activation rows, the tiled GEMM path wins over integer dots,
/// whose register blocking reuses each weight block for up to 8 rows at a time (16 and 24
/// rows: 43 and 68 ms a step, against 90 and 128 tiled).
const GEMM_ROWS_INT8: usize = 32;

/// How the CPU computes few-row products with packed Q4_0 / Q4_1 / Q8_0 weights: one of the
/// closed sets of settings in `met-config`, which the command line offers by name.
pub use met_config::CpuDots;

/// Rows of `W` dequantised per task of the GEMM path.
const TILE: usize = 64;

/// A quantised `[n, k]` matrix the kernels can read by rows.
trait QuantRows: Sync {
    fn k(&self) -> usize;
    fn n(&self) -> usize;
    /// `out[j] = x · row (rows.start + j)`.
    fn dot_rows(&self, x: &[f32], sums: &[f32], rows: Range<usize>, out: &mut [f32]);
    /// `out[i · rows.len() + j] = x_i · row (rows.start + j)` for the rows of `x` (`[m, k]`,
    /// block sums `sums` back to back), each equal to [`Self::dot_rows`] of its row.
    fn dot_rows_many(&self, x: &[f32], sums: &[f32], rows: Range<usize>, out: &mut [f32]) {
        let (k, nb) = (self.k(), self.k() / 32);
        for (i, o) in out.chunks_exact_mut(rows.len().max(1)).enumerate() {
            self.dot_rows(&x[i * k..(i + 1) * k], &sums[i * nb..(i + 1) * nb], rows.clone(), o);
        }
    }
    /// Rows `rows` as f32.
    fn dequantize_rows(&self, rows: Range<usize>, out: &mut [f32]);
}

/// GGUF blocks as they are stored.
struct Blocks<'a> {
    format: QuantFormat,
    bytes: &'a [u8],
    k: usize,
    row_bytes: usize,
}

impl QuantRows for Blocks<'_> {
    fn k(&self) -> usize {
        self.k
    }

    fn n(&self) -> usize {
        self.bytes.len() / self.row_bytes
    }

    fn dot_rows(&self, x: &[f32], _sums: &[f32], rows: Range<usize>, out: &mut [f32]) {
        dot_rows(self.format, x, &self.bytes[rows.start * self.row_bytes..rows.end * self.row_bytes], out);
    }

    fn dequantize_rows(&self, rows: Range<usize>, out: &mut [f32]) {
        dequantize_row(self.format, &self.bytes[rows.start * self.row_bytes..rows.end * self.row_bytes], out);
    }
}

impl QuantRows for PackedQuant {
    fn k(&self) -> usize {
        PackedQuant::k(self)
    }

    fn n(&self) -> usize {
        self.rows()
    }

    fn dot_rows(&self, x: &[f32], sums: &[f32], rows: Range<usize>, out: &mut [f32]) {
        PackedQuant::dot_rows(self, x, sums, rows, out);
    }

    fn dot_rows_many(&self, x: &[f32], sums: &[f32], rows: Range<usize>, out: &mut [f32]) {
        PackedQuant::dot_rows_many(self, x, sums, rows, out);
    }

    fn dequantize_rows(&self, rows: Range<usize>, out: &mut [f32]) {
        PackedQuant::dequantize_rows(self, rows, out);
    }
}

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
    matmul_rows(x, &Blocks { format, bytes: w, k, row_bytes }, bias, m)
}

/// `x [m, k] · wᵀ + bias` for a packed `w`, with few-row products computed as `dots` says.
///
/// # Panics
/// If `x` is not `[m, k]`.
pub fn matmul_packed(x: &[f32], w: &PackedQuant, bias: Option<&[f32]>, m: usize, dots: CpuDots) -> Vec<f32> {
    let k = w.k();
    assert_eq!(x.len(), m * k, "x is not [m, k]");
    if dots == CpuDots::Int8 && m < GEMM_ROWS_INT8 {
        let q = Q8Rows::quantize(x, k);
        let out = fused(w.rows(), m, &|run, out| w.dot_rows_q8(&q, run, out));
        return add_bias(out, bias, w.rows());
    }
    matmul_rows(x, w, bias, m)
}

fn matmul_rows(x: &[f32], w: &impl QuantRows, bias: Option<&[f32]>, m: usize) -> Vec<f32> {
    let k = w.k();
    assert_eq!(x.len(), m * k, "x is not [m, k]");
    let out = if m >= GEMM_ROWS {
        tiled(x, w, m)
    } else {
        let sums: Vec<f32> = x.chunks_exact(k.max(1)).flat_map(block_sums).collect();
        fused(w.n(), m, &|run, out| w.dot_rows_many(x, &sums, run, out))
    };
    add_bias(out, bias, w.n())
}

fn add_bias(mut out: Vec<f32>, bias: Option<&[f32]>, n: usize) -> Vec<f32> {
    if let Some(b) = bias {
        for row in out.chunks_exact_mut(n.max(1)) {
            row.iter_mut().zip(b).for_each(|(o, b)| *o += b);
        }
    }
    out
}

/// Places per-run `[m, run]` results into a row-major `[m, n]` output.
fn assemble(parts: Vec<(Range<usize>, Vec<f32>)>, m: usize, n: usize) -> Vec<f32> {
    if let [(r, _)] = &parts[..]
        && (r.len() == n || m == 1)
    {
        return parts.into_iter().next().expect("one part").1;
    }
    let mut out = vec![0f32; m * n];
    for (run, part) in parts {
        for (i, row) in part.chunks_exact(run.len().max(1)).enumerate() {
            out[i * n + run.start..i * n + run.end].copy_from_slice(row);
        }
    }
    out
}

/// Runs of output rows per pool thread in a fused product: enough that a thread which
/// stalls leaves most of its share to the others, few enough that claiming stays cheap.
const RUNS_PER_THREAD: usize = 2;

/// The fewest output rows in one run.
const MIN_RUN: usize = 64;

/// `[m, n]` products from `dot(run, out)`, which writes `[m, run.len()]` results of the
/// output rows `run`, over runs of rows shared out by the spinning pool, a few per thread:
/// a decode step runs hundreds of these products back to back, too short to pay for
/// waking parked threads, and a thread that loses its core for a while leaves its runs to
/// the others.
fn fused(n: usize, m: usize, dot: &(dyn Fn(Range<usize>, &mut [f32]) + Sync)) -> Vec<f32> {
    let pool = SpinPool::global();
    let chunks = (pool.parts() * RUNS_PER_THREAD).min(n.div_ceil(MIN_RUN)).max(1);
    let per = n.div_ceil(chunks).max(1);
    let run_of = |chunk: usize| (chunk * per).min(n)..((chunk + 1) * per).min(n);
    if m == 1 {
        // One activation row: each run's results are a contiguous slice of the output, so
        // they are written in place.
        let mut out = vec![0f32; n];
        pool.run_pieces(&mut out, per, &|chunk, o| dot(run_of(chunk), o));
        return out;
    }
    let slots: Vec<Mutex<Vec<f32>>> = (0..chunks).map(|_| Mutex::new(Vec::new())).collect();
    pool.run(chunks, &|chunk| {
        let run = run_of(chunk);
        let mut out = vec![0f32; m * run.len()];
        if !run.is_empty() {
            dot(run.clone(), &mut out);
        }
        *slots[chunk].lock().unwrap_or_else(|e| e.into_inner()) = out;
    });
    let parts: Vec<(Range<usize>, Vec<f32>)> = slots
        .into_iter()
        .enumerate()
        .map(|(chunk, slot)| (run_of(chunk), slot.into_inner().unwrap_or_else(|e| e.into_inner())))
        .collect();
    if m == 1 {
        return parts.into_iter().flat_map(|(_, p)| p).collect();
    }
    assemble(parts, m, n)
}

thread_local! {
    /// A tile of dequantised weights (row by row) and its panels (column by column), kept
    /// per thread so prefill products do not allocate (and fault in) fresh ones per task.
    static TILE_SCRATCH: std::cell::RefCell<[Vec<f32>; 2]> = const { std::cell::RefCell::new([Vec::new(), Vec::new()]) };
}

/// Weight rows per panel of a tiled product: the rows of `gemm`'s f32 microkernel, 16 for
/// its AVX2 kernels and 64 for its AVX-512 ones. A panel is laid out as `gemm` packs its
/// left operand (for each of the `k` columns, the panel's rows side by side), so `gemm`
/// multiplies it where it lies instead of copying it first. A wrong guess costs speed only.
fn panel_rows() -> usize {
    if crate::quant::SimdLevel::current() >= crate::quant::SimdLevel::Avx512 { 64 } else { 16 }
}

/// Activation rows multiplied per pass over a tile's panels, so that a long prompt's rows
/// stay in cache while every panel reads them.
const ROW_BLOCK: usize = 256;

fn tiled(x: &[f32], w: &impl QuantRows, m: usize) -> Vec<f32> {
    tiled_in_panels(x, w, m, panel_rows())
}

/// [`tiled`] with panels of `panel` rows (a divisor of [`TILE`]).
fn tiled_in_panels(x: &[f32], w: &impl QuantRows, m: usize, panel: usize) -> Vec<f32> {
    static UNPACKED_PANELS: std::sync::Once = std::sync::Once::new();
    // `gemm` copies a left operand it will reuse across more than 8 × 6 columns (here
    // activation rows) even when it is laid out as packed already: let it use the panels.
    UNPACKED_PANELS.call_once(|| gemm::set_lhs_packing_threshold_single_thread(256));
    let (k, n) = (w.k(), w.n());
    let mut out = vec![0f32; m * n];
    let dst = super::Disjoint(out.as_mut_ptr());
    SpinPool::global().run(n.div_ceil(TILE), &|t| {
        let tile = t * TILE..((t + 1) * TILE).min(n);
        TILE_SCRATCH.with_borrow_mut(|[rows, panels]| {
            rows.resize(tile.len() * k, 0.0);
            panels.resize(tile.len() * k, 0.0);
            w.dequantize_rows(tile.clone(), rows);
            for (src, dst) in rows.chunks(panel * k).zip(panels.chunks_mut(panel * k)) {
                transpose(src, dst, k);
            }
            for first in (0..m).step_by(ROW_BLOCK) {
                let block = first..(first + ROW_BLOCK).min(m);
                for (p, w) in panels.chunks(panel * k).enumerate() {
                    let col = tile.start + p * panel;
                    let dst = &dst;
                    // SAFETY: `out` holds `m * n` f32s and outlives the pool's job; this
                    // task alone writes the columns of `tile`, this call the panel's.
                    unsafe {
                        super::matmul::gemm_x_panel_into(
                            &x[block.start * k..block.end * k],
                            w,
                            (block.len(), k, w.len() / k),
                            dst.0.wrapping_add(block.start * n),
                            (col, n),
                        );
                    }
                }
            }
        });
    });
    out
}

/// `dst [cols, rows] = srcᵀ` for a row-major `src [rows, cols]`.
fn transpose(src: &[f32], dst: &mut [f32], cols: usize) {
    let rows = src.len() / cols.max(1);
    #[cfg(target_arch = "x86_64")]
    if rows.is_multiple_of(8)
        && cols.is_multiple_of(8)
        && crate::quant::SimdLevel::current() >= crate::quant::SimdLevel::Avx2
    {
        // SAFETY: the level is at least AVX2, so the CPU has AVX2; both sides are whole
        // 8 × 8 blocks.
        return unsafe { transpose_avx2(src, dst, rows, cols) };
    }
    for (i, row) in src.chunks_exact(cols).enumerate() {
        for (l, &v) in row.iter().enumerate() {
            dst[l * rows + i] = v;
        }
    }
}

/// [`transpose`] by 8 × 8 blocks in registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn transpose_avx2(src: &[f32], dst: &mut [f32], rows: usize, cols: usize) {
    use std::arch::x86_64::*;
    assert!(src.len() >= rows * cols && dst.len() >= rows * cols);
    for i in (0..rows).step_by(8) {
        for l in (0..cols).step_by(8) {
            // SAFETY: rows `i..i + 8` and columns `l..l + 8` are inside both (asserted).
            unsafe {
                let r: [__m256; 8] = std::array::from_fn(|j| _mm256_loadu_ps(src.as_ptr().add((i + j) * cols + l)));
                // Pairs of rows interleaved, then quads, then the 128-bit halves swapped.
                let a: [__m256; 8] = std::array::from_fn(|j| {
                    let (x, y) = (r[j & !1], r[j | 1]);
                    if j % 2 == 0 { _mm256_unpacklo_ps(x, y) } else { _mm256_unpackhi_ps(x, y) }
                });
                let b: [__m256; 8] = std::array::from_fn(|j| {
                    let at = (j & 4) | ((j >> 1) & 1);
                    let (x, y) = (a[at], a[at | 2]);
                    if j & 1 == 0 { _mm256_shuffle_ps::<0x44>(x, y) } else { _mm256_shuffle_ps::<0xEE>(x, y) }
                });
                for c in 0..8 {
                    let (lo, hi) = (b[c & 3], b[(c & 3) | 4]);
                    let v = if c < 4 {
                        _mm256_permute2f128_ps::<0x20>(lo, hi)
                    } else {
                        _mm256_permute2f128_ps::<0x31>(lo, hi)
                    };
                    _mm256_storeu_ps(dst.as_mut_ptr().add((l + c) * rows + i), v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use half::f16;

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
                bytes.extend(block);
            }
        }
        bytes
    }

    /// A few activation rows (a decode row and its speculative tokens) give each row
    /// exactly its result alone, bit for bit, with either kind of dots: verification must
    /// see decode's logits.
    #[test]
    fn few_rows_equal_each_row_alone_bit_for_bit() {
        let (k, n) = (256, 37);
        for format in [QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q8_0] {
            let w = weights(format, n, k);
            let packed = PackedQuant::from_blocks(format, &w, k).unwrap();
            for (dots, few) in [(CpuDots::Exact, GEMM_ROWS), (CpuDots::Int8, GEMM_ROWS_INT8)] {
                for m in 1..few + 2 {
                    let x: Vec<f32> = (0..m * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect();
                    let together = matmul_packed(&x, &packed, None, m, dots);
                    for (i, row) in x.chunks_exact(k).enumerate() {
                        let alone = matmul_packed(row, &packed, None, 1, dots);
                        if m < few {
                            assert_eq!(&together[i * n..(i + 1) * n], &alone[..], "{format} {dots} m={m} row {i}");
                        }
                    }
                }
            }
            for m in 1..GEMM_ROWS + 2 {
                let x: Vec<f32> = (0..m * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0).collect();
                let sums: Vec<f32> = x.chunks_exact(k).flat_map(block_sums).collect();
                let mut many = vec![0f32; m * 5];
                packed.dot_rows_many(&x, &sums, 3..8, &mut many);
                for (i, row) in x.chunks_exact(k).enumerate() {
                    let mut one = [0f32; 5];
                    packed.dot_rows(row, &block_sums(row), 3..8, &mut one);
                    assert_eq!(&many[i * 5..(i + 1) * 5], &one[..], "{format} m={m} row {i}, rows 3..8");
                }
            }
        }
    }

    /// The AVX2 transpose of whole 8 × 8 blocks and the scalar one of any shape.
    #[test]
    fn transpose_swaps_rows_and_columns() {
        for (rows, cols) in [(16, 576), (64, 64), (8, 8), (6, 256), (24, 40)] {
            let src: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
            let mut dst = vec![0f32; rows * cols];
            transpose(&src, &mut dst, cols);
            for i in 0..rows {
                for l in 0..cols {
                    assert_eq!(dst[l * rows + i], src[i * cols + l], "{rows} x {cols}: ({i}, {l})");
                }
            }
        }
    }

    /// Tiled products in panels of every size the CPUs use (and 8), over more activation
    /// rows than one pass takes and a last tile of 6 weight rows, match the f64 product.
    #[test]
    fn tiled_panels_match_the_dequantised_product() {
        let (m, k, n) = (ROW_BLOCK + 44, 256, TILE + 6);
        let w = weights(QuantFormat::Q4_1, n, k);
        let mut wf = vec![0f32; n * k];
        dequantize_row(QuantFormat::Q4_1, &w, &mut wf);
        let packed = PackedQuant::from_blocks(QuantFormat::Q4_1, &w, k).unwrap();
        let x: Vec<f32> = (0..m * k).map(|i| ((i * 29 % 53) as f32 - 26.0) / 13.0).collect();
        for panel in [8, 16, 64] {
            let got = tiled_in_panels(&x, &packed, m, panel);
            for i in 0..m {
                for j in 0..n {
                    let terms = (0..k).map(|l| f64::from(x[i * k + l]) * f64::from(wf[j * k + l]));
                    let (want, scale) = (terms.clone().sum::<f64>(), terms.map(f64::abs).sum::<f64>());
                    let g = f64::from(got[i * n + j]);
                    assert!((g - want).abs() <= 1e-5 * scale, "panel {panel} ({i},{j}): {g} vs {want}");
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
            for m in [1, 3, GEMM_ROWS, 20] {
                let x: Vec<f32> = (0..m * k).map(|i| ((i * 29 % 53) as f32 - 26.0) / 13.0).collect();
                let mut results = vec![("blocks", matmul_quant(&x, &w, Some(&bias), (m, k, n), format))];
                if let Some(p) = &packed {
                    results.push(("packed", matmul_packed(&x, p, Some(&bias), m, CpuDots::Exact)));
                }
                let int8 = packed.as_ref().map(|p| matmul_packed(&x, p, Some(&bias), m, CpuDots::Int8));
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
