//! The integer (`q8` activation) products at every SIMD level this CPU has: exact integer
//! sums (bit for bit against the scalar reference where the f32 scaling is exact too),
//! the scalar reference within f32 reordering elsewhere, the exact f32 product within the
//! activation rounding, and few-row results equal to one row at a time, bit for bit.

use half::f16;

use super::grouped::{self, GroupRow, is_grouped};
use super::packed::f16_value;
use super::q8::{ActRow, WeightRow, block_int_dot, block_min, block_scale, dot_scalar, min_term, quantize_block};
use super::tests::random_row;
use super::*;

const FORMATS: [QuantFormat; 3] = [QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q8_0];

/// Block counts that are not multiples of 8 (k not a multiple of 256), odd and even.
const KS: [usize; 5] = [32, 96, 160, 576, 32 * 70];

/// Deterministic activations of mixed magnitude, with an all-zero block (`d = 0`).
fn activations(m: usize, k: usize, seed: u32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(747_796_405).wrapping_add(2_891_336_453);
    let mut x = Vec::with_capacity(m * k);
    for i in 0..m * k {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let block = i / 32;
        let scale = [0.01, 1.0, 7.5, 0.3][block % 4];
        let v = ((state % 2001) as f32 - 1000.0) / 1000.0 * scale;
        x.push(if block % 7 == 5 { 0.0 } else { v });
    }
    x
}

fn packed(format: QuantFormat, n: usize, k: usize, seed: u32) -> PackedQuant {
    let rows: Vec<u8> = (0..n as u32).flat_map(|r| random_row(format, k, seed * 1000 + r)).collect();
    PackedQuant::from_blocks(format, &rows, k).expect("a packed format")
}

/// The scalar reference for weight row `j` of `p` and `a`, whatever the layout.
pub(super) fn scalar_dot(p: &PackedQuant, j: usize, a: &ActRow<'_>) -> f32 {
    if is_grouped(p.format()) {
        grouped::dot_scalar(&GroupRow::of(p, j), a)
    } else {
        dot_scalar(&WeightRow::of(p, j), a)
    }
}

/// `Σ |terms|` of the scalar reference for weight row `j` of `p` and `a`: the scale of its
/// f32 rounding.
fn term_size(p: &PackedQuant, j: usize, a: &ActRow<'_>) -> f64 {
    let nb = p.k() / 32;
    let (scale, min, int_dot): (Vec<f32>, Vec<f32>, Vec<i32>) = if is_grouped(p.format()) {
        let w = GroupRow::of(p, j);
        let (scale, min) = if p.format() == QuantFormat::Q6_K {
            (0..nb).map(|b| (w.d(b), 0.0)).unzip()
        } else {
            (0..nb).map(|b| w.scale_and_min(b)).unzip()
        };
        (scale, min, (0..nb).map(|b| grouped::block_int_dot(&w, a, b)).collect())
    } else {
        let w = WeightRow::of(p, j);
        let (scale, min) = (0..nb).map(|b| (block_scale(&w, b), block_min(&w, b))).unzip();
        (scale, min, (0..nb).map(|b| block_int_dot(&w, a, b)).collect())
    };
    (0..nb)
        .map(|b| f64::from(scale[b] * a.d[b]) * f64::from(int_dot[b].abs()) + f64::from((min[b] * a.s[b]).abs()))
        .sum()
}

/// Every packed format with row lengths of its own: for the K-quants one super-block and
/// more, up to nine (72 blocks, past the kernels' 64-block groups; odd counts leave the
/// AVX-512 minimum terms a half step).
fn cases() -> impl Iterator<Item = (QuantFormat, usize)> {
    let ks_k = [256, 512, 768, 2304];
    let k_formats = [QuantFormat::Q4_K, QuantFormat::Q5_K, QuantFormat::Q6_K];
    FORMATS
        .into_iter()
        .flat_map(|f| KS.map(|k| (f, k)))
        .chain(k_formats.into_iter().flat_map(move |f| ks_k.map(|k| (f, k))))
}

fn int_product(level: SimdLevel, p: &PackedQuant, x: &Q8Rows, rows: std::ops::Range<usize>) -> Vec<f32> {
    let mut out = vec![0f32; x.rows() * rows.len()];
    p.dot_rows_q8_at(level, x, rows, &mut out);
    out
}

/// Every level against the scalar reference. Levels sum the same exact per-block
/// integers but (except for the grouped formats, which must match it bit for bit) scale
/// and add them in another order (lanes, then a tree), so each result
/// is within `(nb + 32) · ε_f32 · Σ |terms|` of the reference: one rounding per addition
/// on the longest path (`nb / 2` or `nb` lane additions, 4 tree levels, the minimum terms)
/// with room to spare, and far below the `dw · dx` that one unit of integer error adds.
#[test]
fn every_level_matches_the_scalar_integer_reference() {
    for (format, k) in cases() {
        let (n, nb) = (13, k / 32);
        let p = packed(format, n, k, k as u32);
        let x = Q8Rows::quantize(&activations(16, k, 3), k);
        for level in SimdLevel::available() {
            let got = int_product(level, &p, &x, 0..n);
            for i in 0..16 {
                for j in 0..n {
                    let a = x.row(i);
                    let want = scalar_dot(&p, j, &a);
                    if is_grouped(format) {
                        // Every lane of the grouped kernels does the reference's operations.
                        assert_eq!(got[i * n + j].to_bits(), want.to_bits(), "{format} k={k} {level:?} ({i},{j})");
                    }
                    let bound = (nb + 32) as f64 * f64::from(f32::EPSILON) * term_size(&p, j, &a);
                    let (g, want) = (f64::from(got[i * n + j]), f64::from(want));
                    assert!((g - want).abs() <= bound, "{format} k={k} {level:?} ({i},{j}): {g} vs {want}");
                }
            }
        }
    }
}

/// Blocks whose every f32 step is exact (power-of-two scales, activations that quantise
/// without rounding, sums below 2²⁴ units) make each level equal the scalar reference bit
/// for bit, so any error in an integer sum would show. They include the extremes that
/// could saturate a 16-bit pair sum: Q8_0 weights of −128 against activations of ±127.
#[test]
fn integer_sums_are_exact_at_every_level() {
    for format in FORMATS {
        for k in KS {
            let n = 9;
            let mut bytes = Vec::new();
            for r in 0..n {
                let mut row = random_row(format, k, 77 + r as u32);
                for (b, block) in row.chunks_exact_mut(format.block_bytes()).enumerate() {
                    block[..2].copy_from_slice(&f16::from_f32(0.0625 / (1 << (r % 3)) as f32).to_le_bytes());
                    if format == QuantFormat::Q4_1 {
                        block[2..4].copy_from_slice(&f16::from_f32(-0.5 * (b % 3) as f32).to_le_bytes());
                    }
                    if r == 0 && b == 0 {
                        let q = if format == QuantFormat::Q8_0 { 0x80 } else { 0xFF };
                        block.iter_mut().skip(if format == QuantFormat::Q4_1 { 4 } else { 2 }).for_each(|v| *v = q);
                    }
                }
                bytes.extend(row);
            }
            let p = PackedQuant::from_blocks(format, &bytes, k).expect("a packed format");
            // Activations `q · 2⁻⁴` with one |q| = 127 per block: `d = 2⁻⁴`, no rounding.
            let mut xf: Vec<f32> =
                activations(5, k, 9).iter().map(|v| (v * 16.0).round().clamp(-127.0, 127.0)).collect();
            for (b, block) in xf.chunks_exact_mut(32).enumerate() {
                block[b % 32] = if b % 2 == 0 { 127.0 } else { -127.0 };
                if b == 0 {
                    block.iter_mut().enumerate().for_each(|(j, v)| *v = if j % 2 == 0 { 127.0 } else { -127.0 });
                }
            }
            let xf: Vec<f32> = xf.iter().map(|v| v / 16.0).collect();
            let x = Q8Rows::quantize(&xf, k);
            assert!(x.d.iter().all(|&d| d == 0.0625), "activations quantise exactly");
            for level in SimdLevel::available() {
                let got = int_product(level, &p, &x, 0..n);
                for i in 0..x.rows() {
                    for j in 0..n {
                        let want = scalar_dot(&p, j, &x.row(i));
                        assert_eq!(got[i * n + j], want, "{format} k={k} {level:?} ({i},{j})");
                    }
                }
            }
        }
    }
}

/// The integer product against the exact f32 one: rounding `x` to `dx · qx` moves each
/// element by at most `dx / 2`, so `|Δ| ≤ Σ_blocks (dx / 2) · Σ |w|`, plus f32 rounding of
/// at most `1e-5 · Σ |w · x|`.
#[test]
fn int_product_is_within_the_activation_rounding_of_the_exact_product() {
    for (format, k) in cases() {
        let n = 11;
        let p = packed(format, n, k, 5 + k as u32);
        let xf = activations(4, k, 21);
        let x = Q8Rows::quantize(&xf, k);
        let mut w = vec![0f32; n * k];
        p.dequantize_rows(0..n, &mut w);
        for level in SimdLevel::available() {
            let got = int_product(level, &p, &x, 0..n);
            for i in 0..4 {
                for j in 0..n {
                    let (xr, wr) = (&xf[i * k..(i + 1) * k], &w[j * k..(j + 1) * k]);
                    let exact: f64 = xr.iter().zip(wr).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
                    let size: f64 = xr.iter().zip(wr).map(|(a, b)| f64::from((a * b).abs())).sum();
                    let rounding: f64 = (0..k / 32)
                        .map(|b| {
                            let wsum: f64 = wr[b * 32..(b + 1) * 32].iter().map(|v| f64::from(v.abs())).sum();
                            f64::from(x.d[i * (k / 32) + b]) / 2.0 * wsum
                        })
                        .sum();
                    let g = f64::from(got[i * n + j]);
                    let bound = rounding + 1e-5 * size;
                    assert!((g - exact).abs() <= bound, "{format} k={k} {level:?} ({i},{j}): {g} vs {exact}");
                }
            }
        }
    }
}

/// One to sixteen activation rows, over any range of weight rows, give each pair exactly
/// what it gets alone: the register blocking changes which rows share loads, never the
/// operations of a pair.
#[test]
fn few_rows_equal_one_row_at_a_time_bit_for_bit() {
    for (format, k) in cases().filter(|&(_, k)| matches!(k, 96 | 576 | 256 | 768)) {
        let n = 19;
        let p = packed(format, n, k, 40);
        for level in SimdLevel::available() {
            for m in 1..=16 {
                let xf = activations(m, k, m as u32);
                let x = Q8Rows::quantize(&xf, k);
                let together = int_product(level, &p, &x, 2..n);
                for i in 0..m {
                    let alone = Q8Rows::quantize(&xf[i * k..(i + 1) * k], k);
                    for j in 2..n {
                        let one = int_product(level, &p, &alone, j..j + 1);
                        assert_eq!(together[i * (n - 2) + j - 2], one[0], "{format} {level:?} m={m} ({i},{j})");
                    }
                }
            }
        }
    }
}

/// The SIMD quantiser gives the scalar one's blocks exactly (the same rounding).
#[test]
fn simd_quantiser_equals_the_scalar_one() {
    let x = activations(3, 576, 8);
    let q = Q8Rows::quantize(&x, 576);
    for (b, xb) in x.chunks_exact(32).enumerate() {
        let mut qs = [0i8; 32];
        let (d, s) = quantize_block(xb, &mut qs);
        assert_eq!((q.d[b], q.s[b]), (d, s), "block {b}");
        assert_eq!(&q.qs[b * 32..(b + 1) * 32], &qs[..], "block {b}");
    }
}

#[test]
fn quantised_activations_keep_their_block_terms() {
    let x = activations(2, 96, 1);
    let q = Q8Rows::quantize(&x, 96);
    assert_eq!((q.rows(), q.k()), (2, 96));
    for (b, xb) in x.chunks_exact(32).enumerate() {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        assert_eq!(q.d[b], amax / 127.0);
        let qs = &q.qs[b * 32..(b + 1) * 32];
        assert_eq!(q.s[b], q.d[b] * qs.iter().map(|&v| i32::from(v)).sum::<i32>() as f32);
        for (v, &qv) in xb.iter().zip(qs) {
            assert!((v - q.d[b] * f32::from(qv)).abs() <= q.d[b] / 2.0 * 1.0001, "{v} vs {qv}");
        }
    }
    // The minimum term reads the block terms of the row it is given.
    let p = packed(QuantFormat::Q4_1, 1, 96, 2);
    let want: f32 = (0..3).map(|b| f16_value(p.m[b]) * q.s[3 + b]).sum();
    assert_eq!(min_term(&WeightRow::of(&p, 0), &q.row(1)), want);
}
