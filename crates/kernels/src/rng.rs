//! The counter-based random stream of sampling: one uniform per `(seed, step)`.
//!
//! A draw is a pure function of the request's seed and the position in its stream, with no
//! state carried between calls, so a seeded request gets the same tokens whatever else
//! shares its batch, whichever backend runs it, and after a preemption replays its steps.
//! The mixing function is the SplitMix64 finaliser (Steele, Lea and Flood, "Fast splittable
//! pseudorandom number generators", 2014), applied twice: once to spread the step over 64
//! bits, once to mix that with the seed. Every backend implements exactly these integer
//! operations, so their draws agree bit for bit.

/// The golden-ratio increment of SplitMix64.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The SplitMix64 finaliser: a bijection of `u64` with full avalanche.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// 64 random bits for draw `step` of the stream `seed`.
pub fn random_bits(seed: u64, step: u64) -> u64 {
    mix64(seed ^ mix64(step.wrapping_add(1).wrapping_mul(GAMMA)))
}

/// Element `i` of the weight stream `key`, uniform in `[-1, 1)`: `2u - 1`, where `u` is the
/// top 24 bits of `mix64(key + (i + 1) · GAMMA)` over 2²⁴ (SplitMix64's own sequence, read
/// at position `i`), exact in f32. Dummy weights are drawn from it ([`crate::UniformRun`]);
/// every backend computes it with these integer operations and one f32 product, so a
/// tensor generated on a device equals the host's before rounding to the float dtype.
pub fn weight_uniform(key: u64, i: u64) -> f32 {
    let bits = mix64(key.wrapping_add(i.wrapping_add(1).wrapping_mul(GAMMA)));
    2.0 * ((bits >> 40) as f32 * (1.0 / (1u64 << 24) as f32)) - 1.0
}

/// A uniform in `[0, 1)` for draw `step` of the stream `seed`: the top 24 bits of
/// [`random_bits`], so the value is an exact f32 and never rounds up to 1.
pub fn uniform(seed: u64, step: u64) -> f32 {
    (random_bits(seed, step) >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
}

/// The stream of a sequence's speculative acceptance tests, apart from its draws
/// (`seed`'s own stream), so that verifying a draft never reuses a draw's uniform.
pub fn accept_stream(seed: u64) -> u64 {
    // An arbitrary odd constant keeps this stream distinct from `seed` itself.
    mix64(seed ^ 0xA5A5_5A5A_C3C3_3C3D)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_is_in_range_with_the_moments_of_u01() {
        let n = 200_000u64;
        let (mut sum, mut sum_sq) = (0f64, 0f64);
        let mut buckets = [0u32; 16];
        for step in 0..n {
            let u = uniform(7, step);
            assert!((0.0..1.0).contains(&u), "draw {step}: {u} is outside [0, 1)");
            sum += f64::from(u);
            sum_sq += f64::from(u) * f64::from(u);
            buckets[(u * 16.0) as usize] += 1;
        }
        // The mean of n uniforms has standard deviation sqrt(1/12 / n) ≈ 6.5e-4; 0.005 is
        // over 7 of them. The variance of U(0,1) is 1/12.
        let mean = sum / n as f64;
        assert!((mean - 0.5).abs() < 0.005, "mean {mean}");
        let var = sum_sq / n as f64 - mean * mean;
        assert!((var - 1.0 / 12.0).abs() < 0.002, "variance {var}");
        // Each sixteenth expects 12 500 draws with standard deviation ≈ 108.
        for (i, &c) in buckets.iter().enumerate() {
            assert!(c.abs_diff(12_500) < 800, "bucket {i} holds {c} of {n}");
        }
    }

    #[test]
    fn draws_are_pure_and_depend_on_seed_and_step() {
        assert_eq!(uniform(3, 11), uniform(3, 11));
        assert_ne!(random_bits(3, 11), random_bits(3, 12));
        assert_ne!(random_bits(3, 11), random_bits(4, 11));
        // Neighbouring seeds must not produce shifted copies of one stream.
        let a: Vec<u64> = (0..64).map(|s| random_bits(0, s)).collect();
        let b: Vec<u64> = (0..64).map(|s| random_bits(1, s)).collect();
        assert!(a.iter().all(|x| !b.contains(x)));
    }
}
