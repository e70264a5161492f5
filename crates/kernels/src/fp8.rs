//! `float8_e4m3fn`: 1 sign, 4 exponent (bias 7) and 3 mantissa bits, subnormals below
//! exponent 1, no infinities, NaN at `S.1111.111`; the largest finite value is 448. The
//! element type of FP8 checkpoints' weights and of the FP8 KV cache.
//!
//! Encoding rounds to nearest, ties to even, and saturates: a finite value beyond ±448
//! becomes ±448 (as the engines' scaled conversions clamp before they convert), so a large
//! key never turns into NaN. NaN stays NaN.

/// The largest finite e4m3 value.
pub const E4M3_MAX: f32 = 448.0;

/// The value of the e4m3 byte `b`.
pub const fn e4m3_to_f32(b: u8) -> f32 {
    let (exp, man) = ((b >> 3) & 0xf, b & 7);
    let magnitude = if exp == 15 && man == 7 {
        f32::NAN
    } else if exp == 0 {
        // m · 2^-9, exact.
        man as f32 / 512.0
    } else {
        f32::from_bits(((exp as u32 + 120) << 23) | ((man as u32) << 20))
    };
    if b & 0x80 != 0 { -magnitude } else { magnitude }
}

/// [`e4m3_to_f32`] in arithmetic that vectorises (no branches on the exponent): a normal
/// byte's exponent and mantissa bits placed where f32 keeps its own, the exponent rebased
/// by an integer add; a subnormal byte (exponent 0) is its mantissa times `2^-9`; NaN is
/// chosen apart. No step makes an f32 subnormal, which x86's vector units multiply through
/// a slow assist.
#[inline(always)]
pub fn e4m3_to_f32_fast(b: u8) -> f32 {
    const TWO_POW_MINUS_9: f32 = 1.0 / 512.0;
    let bits = u32::from(b & 0x7f);
    let normal = f32::from_bits((bits << 20) + (120 << 23));
    let magnitude = if bits < 8 { bits as f32 * TWO_POW_MINUS_9 } else { normal };
    let value = if b & 0x80 != 0 { -magnitude } else { magnitude };
    if bits == 0x7f { f32::NAN } else { value }
}

/// `out[i] = value(bytes[i]) · scale`: e4m3 bytes widened under their scale, in a loop
/// the compiler vectorises.
#[inline(always)]
pub fn widen_e4m3(out: &mut [f32], bytes: &[u8], scale: f32) {
    out.iter_mut().zip(bytes).for_each(|(w, &b)| *w = e4m3_to_f32_fast(b) * scale);
}

/// [`widen_e4m3`] compiled for the CPU's widest vectors (AVX-512 or AVX2 where it has
/// them; the portable build has SSE2 only). Every path computes each value as
/// `e4m3(q) · scale`, one rounding, so all give the same bits. `quant`'s F8 rows keep a
/// dispatch of their own, once a row rather than once a block of 32: a shared trampoline
/// taking a closure was tried and lost the vectorisation (decode step 192 against 74 ms,
/// `bench/results/cpu-fp8-blocks-2026-12-04`).
pub fn widen_e4m3_simd(out: &mut [f32], bytes: &[u8], scale: f32) {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::quant::SimdLevel;
        #[target_feature(enable = "avx512f,avx512bw")]
        fn avx512(out: &mut [f32], bytes: &[u8], scale: f32) {
            widen_e4m3(out, bytes, scale);
        }
        #[target_feature(enable = "avx2,fma")]
        fn avx2(out: &mut [f32], bytes: &[u8], scale: f32) {
            widen_e4m3(out, bytes, scale);
        }
        match SimdLevel::current() {
            // SAFETY: the level is the CPU's (detected, never raised by `MET_CPU_SIMD`).
            SimdLevel::Avx512 => return unsafe { avx512(out, bytes, scale) },
            // SAFETY: as above.
            SimdLevel::Avx2 => return unsafe { avx2(out, bytes, scale) },
            SimdLevel::None => {}
        }
    }
    widen_e4m3(out, bytes, scale);
}

/// `x` as the nearest e4m3 byte (ties to even), ±448 for larger magnitudes.
pub fn e4m3_from_f32(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs().min(E4M3_MAX);
    if a < 2f32.powi(-6) {
        // Subnormals are multiples of 2^-9; a count of 8 is the smallest normal, 0x08.
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    let bits = a.to_bits();
    // The biased exponent is 121 or more here (2^-6 and up): e4m3's is 7 less than f32's 127.
    let exp = (bits >> 23) - 120;
    let (keep, rest) = ((bits >> 20) & 7, bits & 0xf_ffff);
    let mut q = (exp << 3) | keep;
    // A carry out of the mantissa moves to the next binade; 448 itself never rounds up.
    if rest > 0x8_0000 || (rest == 0x8_0000 && keep & 1 == 1) {
        q += 1;
    }
    sign | q as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    /// e4m3 bytes of some values: 1.0 = 0x38, -2.0 = 0xc0, 0.5 = 0x30, 448 (the largest) =
    /// 0x7e, 2^-9 (the smallest subnormal) = 0x01.
    #[test]
    fn e4m3_decodes_normals_subnormals_signs_and_nan() {
        let t: [f32; 256] = std::array::from_fn(|b| e4m3_to_f32(b as u8));
        assert_eq!((t[0x38], t[0xc0], t[0x30], t[0x7e], t[0x01], t[0x00]), (1.0, -2.0, 0.5, 448.0, 2f32.powi(-9), 0.0));
        assert_eq!(t[0x80], 0.0);
        assert!(t[0x80].is_sign_negative() && t[0x7f].is_nan() && t[0xff].is_nan());
    }

    /// The arithmetic decoding equals the exact one for every byte.
    #[test]
    fn fast_decoding_is_exact() {
        for b in 0..=255u8 {
            let (fast, exact) = (e4m3_to_f32_fast(b), e4m3_to_f32(b));
            assert!(fast.to_bits() == exact.to_bits() || (fast.is_nan() && exact.is_nan()), "{b:#04x}: {fast} {exact}");
        }
    }

    /// Every finite byte round-trips, and each f32 between two neighbouring e4m3 values
    /// rounds to the nearer (the even one at the midpoint); past 448 it saturates.
    #[test]
    fn encoding_rounds_to_nearest_even_and_saturates() {
        let mut finite: Vec<(f32, u8)> =
            (0..=255u8).filter(|&b| !e4m3_to_f32(b).is_nan() && b != 0x80).map(|b| (e4m3_to_f32(b), b)).collect();
        for &(v, b) in &finite {
            assert_eq!(e4m3_from_f32(v), b, "{v} from byte {b:#04x}");
        }
        finite.sort_by(|a, b| a.0.total_cmp(&b.0));
        for w in finite.windows(2) {
            let ((lo, lb), (hi, hb)) = (w[0], w[1]);
            let mid = (lo + hi) / 2.0;
            let even = if lb & 1 == 0 { lb } else { hb };
            // Compared as values: a negative value rounding to zero keeps its sign.
            let got = |x: f32| e4m3_to_f32(e4m3_from_f32(x));
            assert_eq!(got(mid), e4m3_to_f32(even), "midpoint {mid} of {lo} and {hi}");
            assert_eq!(got(lo + (hi - lo) * 0.25), lo);
            assert_eq!(got(lo + (hi - lo) * 0.75), hi);
        }
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_from_f32(1e6), 0x7e);
        assert_eq!(e4m3_from_f32(-500.0), 0xfe);
        assert_eq!(e4m3_from_f32(f32::INFINITY), 0x7e);
        assert!(e4m3_to_f32(e4m3_from_f32(f32::NAN)).is_nan());
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_from_f32(2f32.powi(-11)), 0, "a quarter of the smallest subnormal rounds to 0");
        assert_eq!(e4m3_from_f32(-0.0), 0x80);
    }
}
