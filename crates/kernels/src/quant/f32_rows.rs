//! Products of f32 activation rows with f32 weight rows (`x · wᵀ`), each result computed
//! the same way whatever else is computed with it.
//!
//! The CPU's f32 matmuls (f32 weights, and block formats without a packed layout once a
//! tile of their rows is dequantised) go through here instead of a GEMM library, because
//! a GEMM picks its kernel, its blocking of `k` and its order of summation by the shape of
//! the whole product: a row's result would change with the number of rows beside it, so a
//! sequence's logits would depend on its batch-mates and on how its prompt was chunked.
//!
//! Invariant: the result for activation row `i` and weight row `j` is a pure function of
//! those two rows and the process's SIMD level. Each pair owns one vector accumulator that
//! takes the 32-element blocks in order (the block's vectors in element order, one fused
//! multiply-add each), its lanes are summed in the set's fixed tree, and the elements past
//! the last whole block are added one at a time. Register blocking (several activation and
//! weight rows per kernel call) only decides which pairs share loads, never their order.

use super::SimdLevel;

/// `out[i · r + j] = x_i · w_j` for the rows of `x` (`[m, k]`) and of `w` (`[r, k]`).
///
/// # Panics
/// If `x`, `w` or `out` are not whole rows of the shapes above.
pub fn dot_f32_rows(x: &[f32], w: &[f32], k: usize, out: &mut [f32]) {
    dot_f32_rows_at(SimdLevel::current(), x, w, k, out);
}

/// [`dot_f32_rows`] with the kernels of `level` (capped at what the CPU has).
pub(super) fn dot_f32_rows_at(level: SimdLevel, x: &[f32], w: &[f32], k: usize, out: &mut [f32]) {
    let k1 = k.max(1);
    assert!(x.len().is_multiple_of(k1) && w.len().is_multiple_of(k1), "x or w is not whole rows of {k}");
    let (m, r) = (x.len() / k1, w.len() / k1);
    assert_eq!(out.len(), m * r, "one output per pair of rows");
    #[cfg(target_arch = "x86_64")]
    if x86::dot_rows(level.min(SimdLevel::detected()), (x, w, k), out) {
        return;
    }
    let _ = level;
    for (i, o) in out.chunks_exact_mut(r.max(1)).enumerate().take(m) {
        for (j, o) in o.iter_mut().enumerate() {
            *o = dot_scalar(&x[i * k..(i + 1) * k], &w[j * k..(j + 1) * k]);
        }
    }
}

/// `x · w` in element order, without SIMD.
fn dot_scalar(x: &[f32], w: &[f32]) -> f32 {
    x.iter().zip(w).fold(0f32, |acc, (a, b)| acc + a * b)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::SimdLevel;
    use super::super::x86_isa::{Avx2, Avx512, Isa};

    /// Most activation rows per kernel call.
    const MAX_M: usize = 4;

    /// The operands of one product: activation rows, weight rows, their length.
    type Operands<'a> = (&'a [f32], &'a [f32], usize);

    /// [`super::dot_f32_rows`] with AVX-512 or AVX2; false at [`SimdLevel::None`].
    pub(super) fn dot_rows(level: SimdLevel, (x, w, k): Operands<'_>, out: &mut [f32]) -> bool {
        if level == SimdLevel::None || k == 0 {
            return false;
        }
        let m = x.len() / k;
        for first in (0..m).step_by(MAX_M) {
            match (m - first).min(MAX_M) {
                1 => group::<1>(level, (x, w, k), first, out),
                2 => group::<2>(level, (x, w, k), first, out),
                3 => group::<3>(level, (x, w, k), first, out),
                _ => group::<4>(level, (x, w, k), first, out),
            }
        }
        true
    }

    /// Activation rows `first..first + M` against every weight row: four weight rows a call
    /// on AVX-512 (16 accumulators of its 32 registers), two on AVX2 (8 of 16).
    fn group<const M: usize>(level: SimdLevel, (x, w, k): Operands<'_>, first: usize, out: &mut [f32]) {
        let r = w.len() / k;
        let xs: [&[f32]; M] = std::array::from_fn(|i| &x[(first + i) * k..(first + i + 1) * k]);
        let wide = level == SimdLevel::Avx512;
        let mut j = 0;
        while j < r {
            j += if wide && r - j >= 4 {
                tile::<4, M>(level, &xs, (w, k), (first, j), out)
            } else if r - j >= 2 {
                tile::<2, M>(level, &xs, (w, k), (first, j), out)
            } else {
                tile::<1, M>(level, &xs, (w, k), (first, j), out)
            };
        }
    }

    /// Weight rows `j..j + R` against the activation rows `xs` (from row `first`), into
    /// `out`; returns `R`.
    fn tile<const R: usize, const M: usize>(
        level: SimdLevel,
        xs: &[&[f32]; M],
        (w, k): (&[f32], usize),
        (first, j): (usize, usize),
        out: &mut [f32],
    ) -> usize {
        let r = w.len() / k;
        let ws: [&[f32]; R] = std::array::from_fn(|d| &w[(j + d) * k..(j + d + 1) * k]);
        // SAFETY: the level is one the CPU has (capped by the caller); every row is `k` long.
        let got = unsafe {
            if level == SimdLevel::Avx512 { kernel_512::<R, M>(&ws, xs) } else { kernel_256::<R, M>(&ws, xs) }
        };
        for (d, got) in got.iter().enumerate() {
            for (i, g) in got.iter().enumerate() {
                out[(first + i) * r + j + d] = *g;
            }
        }
        R
    }

    /// One block's `Σ w · x` as a vector: the product of the first vectors, then each next
    /// one fused in.
    ///
    /// # Safety
    /// The CPU must have `S`'s features.
    #[inline(always)]
    unsafe fn block_dot<S: Isa>(w: &S::Block, x: &S::Block) -> S::F {
        let (w, x) = (w.as_ref(), x.as_ref());
        // SAFETY: as the caller guarantees.
        unsafe {
            let mut p = S::mul(w[0], x[0]);
            for j in 1..w.len() {
                p = S::fmadd(w[j], x[j], p);
            }
            p
        }
    }

    /// [`kernel`] with AVX-512.
    ///
    /// # Safety
    /// The CPU must have AVX-512F, AVX2 and FMA; every row must be equally long.
    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn kernel_512<const R: usize, const M: usize>(w: &[&[f32]; R], x: &[&[f32]; M]) -> [[f32; M]; R] {
        // SAFETY: this function enables `Avx512`'s features; the rest as the caller guarantees.
        unsafe { kernel::<Avx512, R, M>(w, x) }
    }

    /// [`kernel`] with AVX2.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; every row must be equally long.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn kernel_256<const R: usize, const M: usize>(w: &[&[f32]; R], x: &[&[f32]; M]) -> [[f32; M]; R] {
        // SAFETY: this function enables `Avx2`'s features; the rest as the caller guarantees.
        unsafe { kernel::<Avx2, R, M>(w, x) }
    }

    /// `out[r][i] = x[i] · w[r]`: per 32-element block, the block's products summed into one
    /// vector in element order and added to the pair's accumulator (two levels, so each
    /// lane's running sum takes one term a block: closer to the exact sum than one long
    /// chain); then its lanes are summed and the tail added in order.
    ///
    /// # Safety
    /// The CPU must have `S`'s features; every row must be equally long.
    #[inline(always)]
    unsafe fn kernel<S: Isa, const R: usize, const M: usize>(w: &[&[f32]; R], x: &[&[f32]; M]) -> [[f32; M]; R] {
        let k = w[0].len();
        // SAFETY: the CPU has `S`'s features (the caller guarantees).
        let mut acc = [[unsafe { S::zero() }; M]; R];
        for b in 0..k / 32 {
            // SAFETY: block `b` (32 values from `32 b`) lies inside every row of `k`.
            unsafe {
                let mut xv = [S::zero_block(); M];
                for (xv, row) in xv.iter_mut().zip(x) {
                    *xv = S::load_block(row.as_ptr().add(b * 32));
                }
                for (acc, row) in acc.iter_mut().zip(w) {
                    let wv = S::load_block(row.as_ptr().add(b * 32));
                    for (acc, xv) in acc.iter_mut().zip(&xv) {
                        *acc = S::add(*acc, block_dot::<S>(&wv, xv));
                    }
                }
            }
        }
        let tail = k / 32 * 32;
        let mut out = [[0f32; M]; R];
        for r in 0..R {
            for i in 0..M {
                // SAFETY: the CPU has `S`'s features.
                let lanes = unsafe { S::reduce(acc[r][i]) };
                out[r][i] = w[r][tail..].iter().zip(&x[i][tail..]).fold(lanes, |acc, (a, b)| acc + a * b);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(n: usize, k: usize, seed: usize) -> Vec<f32> {
        (0..n * k).map(|i| (((i * 37 + seed * 11) % 101) as f32 - 50.0) / 23.0).collect()
    }

    /// Every level, every row count and a length with a tail past the last block: each
    /// result equals the row computed alone bit for bit, and the f64 product within the
    /// rounding of its terms.
    #[test]
    fn every_row_equals_itself_alone_and_the_f64_product() {
        for level in SimdLevel::available() {
            for k in [32, 100, 576] {
                let (n, w) = (7, rows(7, k, 3));
                for m in [1, 2, 3, 4, 5, 9] {
                    let x = rows(m, k, m);
                    let mut together = vec![0f32; m * n];
                    dot_f32_rows_at(level, &x, &w, k, &mut together);
                    for i in 0..m {
                        let xi = &x[i * k..(i + 1) * k];
                        for j in 0..n {
                            let mut alone = [0f32; 1];
                            dot_f32_rows_at(level, xi, &w[j * k..(j + 1) * k], k, &mut alone);
                            let got = together[i * n + j];
                            assert_eq!(got.to_bits(), alone[0].to_bits(), "{level:?} k={k} m={m} ({i},{j})");
                            let terms = xi.iter().zip(&w[j * k..]).map(|(a, b)| f64::from(*a) * f64::from(*b));
                            let (want, scale) = (terms.clone().sum::<f64>(), terms.map(f64::abs).sum::<f64>());
                            assert!((f64::from(got) - want).abs() <= 1e-5 * scale, "{level:?} k={k}: {got} vs {want}");
                        }
                    }
                }
            }
        }
    }
}
