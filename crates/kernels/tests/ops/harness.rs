//! Shared machinery of the op conformance tests: the per-dtype tolerances, a seeded input
//! generator, upload helpers, and the comparison every check ends with.
//!
//! References are computed in f64 on the host from the inputs exactly as the backend stores
//! them (`stored` rounds random inputs to the backend's float dtype before both the upload
//! and the reference), so a tolerance covers only the backend's own arithmetic: its
//! accumulation order and the roundings of intermediates and results to its float dtype.

use met_kernels::{DType, GpuBackend, HostTensor, Result, Tensor};

/// How far a result may sit from its f64 reference. Element `i` passes when
/// `|got_i - want_i| <= rel · (|want_i| + rms(want))`: a relative bound per element plus
/// an absolute floor at the output's own magnitude, because sums with cancellation leave
/// small outputs carrying the rounding error of the large terms that produced them.
#[derive(Debug, Clone, Copy)]
pub struct Tol {
    /// Relative error allowed, against `|want_i| + rms(want)`.
    pub rel: f64,
}

impl Tol {
    /// The tolerance of a result computed through `roundings` successive roundings of
    /// intermediates to the float dtype, each of which the next step can carry into a sum
    /// with cancellation: the errors add, so the bound scales with their number.
    pub fn chained(self, roundings: u32) -> Self {
        Self { rel: self.rel * f64::from(roundings) }
    }
}

/// The tolerance for results of a backend whose floats are stored as `dtype`.
///
/// - f32 (`1e-5`): storage is exact for our inputs and f32 accumulation over the short
///   reductions of these tests (at most a few hundred terms) stays within a few ulps of
///   2⁻²⁴ ≈ 6e-8 times √k; 1e-5 leaves room for reordering and still catches any real bug.
/// - f16 (`2e-3`): a 10-bit mantissa rounds each stored input and output by up to
///   2⁻¹¹ ≈ 4.9e-4; a few such roundings compound along an op.
/// - bf16 (`1e-2`): a 7-bit mantissa rounds by up to 2⁻⁸ ≈ 3.9e-3 per value. With exact
///   inputs a single op rounds its result once and at most one or two intermediates (the
///   CUDA backend rounds where transformers does: RMSNorm's normalised value, rotary's
///   cos, sin and products); two roundings of 3.9e-3 stay under 1e-2 of `|want| + rms`.
///   Ops that chain several roundings say so with [`Tol::chained`].
pub fn tolerance(dtype: DType) -> Tol {
    match dtype {
        DType::F32 => Tol { rel: 1e-5 },
        DType::F16 => Tol { rel: 2e-3 },
        DType::BF16 => Tol { rel: 1e-2 },
        DType::U32 | DType::F8E4M3 | DType::Quant(_) => {
            panic!("a backend's float dtype is never u32, fp8 or quantised")
        }
    }
}

/// Compares `got` with `want` under `tol`, describing the worst element on failure.
pub fn compare(got: &[f32], want: &[f64], tol: Tol) -> std::result::Result<(), String> {
    compare_terms(got, want, &[], tol)
}

/// [`compare`] for sums whose terms' magnitudes are known (`terms_i`, such as `Σ |x·w|` of a
/// product, or empty): element `i` may also be off by `tol.rel · terms_i`. A sum with
/// cancellation carries the rounding of its large terms however small it comes out, and an
/// output of one element has no other elements' rms to stand for them.
pub fn compare_terms(got: &[f32], want: &[f64], terms: &[f64], tol: Tol) -> std::result::Result<(), String> {
    if got.len() != want.len() || !(terms.is_empty() || terms.len() == want.len()) {
        return Err(format!("{} elements, expected {} ({} term magnitudes)", got.len(), want.len(), terms.len()));
    }
    let rms = (want.iter().map(|w| w * w).sum::<f64>() / want.len().max(1) as f64).sqrt();
    let mut worst: Option<(usize, f64)> = None;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let magnitude = (w.abs() + rms).max(terms.get(i).copied().unwrap_or(0.0));
        let (err, bound) = ((f64::from(g) - w).abs(), tol.rel * magnitude);
        // A NaN error compares false, so NaN never passes.
        let within = err <= bound;
        let excess = if within {
            0.0
        } else if err.is_nan() {
            f64::INFINITY
        } else {
            err / bound
        };
        if !within && worst.is_none_or(|(_, e)| excess > e) {
            worst = Some((i, excess));
        }
    }
    match worst {
        None => Ok(()),
        Some((i, excess)) => Err(format!(
            "element {i}: got {}, want {} ({excess:.1}x the tolerance {:?}, output rms {rms:.3e})",
            got[i], want[i], tol
        )),
    }
}

/// Downloads `got` and asserts its dims and values against the reference.
///
/// # Panics
/// On a mismatch, naming `what`.
pub fn assert_close(b: &dyn GpuBackend, got: &Tensor, dims: &[usize], want: &[f64], what: &str) -> Result<()> {
    assert_eq!(got.dims(), dims, "{what}: shape");
    assert_values(b, &b.download_f32(got)?, want, what);
    Ok(())
}

/// [`assert_close`] under an explicit tolerance.
///
/// # Panics
/// On a mismatch, naming `what`.
pub fn assert_close_within(
    b: &dyn GpuBackend,
    got: &Tensor,
    dims: &[usize],
    want: &[f64],
    tol: Tol,
    what: &str,
) -> Result<()> {
    assert_eq!(got.dims(), dims, "{what}: shape");
    if let Err(msg) = compare(&b.download_f32(got)?, want, tol) {
        panic!("{what} on {}: {msg}", b.name());
    }
    Ok(())
}

/// Asserts downloaded values against the reference under `b`'s tolerance.
///
/// # Panics
/// On a mismatch, naming `what`.
pub fn assert_values(b: &dyn GpuBackend, got: &[f32], want: &[f64], what: &str) {
    if let Err(msg) = compare(got, want, tolerance(b.float_dtype())) {
        panic!("{what} on {}: {msg}", b.name());
    }
}

/// Asserts that an op rejected its operands with an error (a panic fails the test too).
///
/// # Panics
/// When `r` is `Ok`.
pub fn expect_err<T: std::fmt::Debug>(r: Result<T>, what: &str) {
    if let Ok(v) = r {
        panic!("{what}: expected an error, got {v:?}");
    }
}

/// Uploads f32 data of shape `dims` (stored in the backend's float dtype).
pub fn upload_f32(b: &dyn GpuBackend, data: &[f32], dims: &[usize]) -> Result<Tensor> {
    b.upload(&HostTensor::from_f32(data, dims), b.float_dtype())
}

/// Uploads u32 data of shape `dims`.
pub fn upload_u32(b: &dyn GpuBackend, data: &[u32], dims: &[usize]) -> Result<Tensor> {
    b.upload(&HostTensor::from_u32(data, dims), DType::U32)
}

/// `xs` as `b` stores floats: rounded to its float dtype (unchanged for f32). Random inputs
/// pass through this before the upload and the reference alike.
pub fn stored(b: &dyn GpuBackend, xs: Vec<f32>) -> Vec<f32> {
    match b.float_dtype() {
        DType::BF16 => xs.into_iter().map(|x| half::bf16::from_f32(x).to_f32()).collect(),
        DType::F16 => xs.into_iter().map(|x| half::f16::from_f32(x).to_f32()).collect(),
        _ => xs,
    }
}

/// f32 inputs as the f64 values a reference computes with.
pub fn widen(xs: &[f32]) -> Vec<f64> {
    xs.iter().map(|&x| f64::from(x)).collect()
}

/// A seeded SplitMix64 generator, so every input is reproducible from its seed.
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[-1, 1)`.
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// `n` values uniform in `[-1, 1)`.
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uniform()).collect()
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Fisher–Yates shuffle.
    pub fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            xs.swap(i, self.below(i + 1));
        }
    }
}
