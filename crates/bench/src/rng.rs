//! Seeded randomness for `met bench`: random prompts, the ShareGPT sample and arrival times
//! are functions of `--seed` alone, so two runs with the same flags send the same load.
//!
//! SplitMix64 (the same stream the engine's sampler uses) is small, fast and good enough
//! for workloads; gamma variates follow Marsaglia and Tsang, "A simple method for
//! generating gamma variables" (2000), which is also what numpy and `rand_distr` use.

/// A SplitMix64 stream.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// The stream of `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The stream of `seed` for one purpose (`salt`), independent of the others.
    pub fn derived(seed: u64, salt: u64) -> Self {
        let mut mix = Self::new(seed ^ salt.wrapping_mul(0xA076_1D64_78BD_642F));
        Self(mix.next_u64())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), 53 bits.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `lo..hi` (Lemire's multiply-shift; the bias is below 2^-32 for the
    /// ranges used here).
    pub fn range(&mut self, lo: u32, hi: u32) -> u32 {
        let span = u64::from(hi - lo);
        lo + ((u128::from(self.next_u64()) * u128::from(span)) >> 64) as u32
    }

    /// Standard normal (Box-Muller; the second variate is dropped, which keeps the stream
    /// stateless beyond its counter).
    fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Gamma with `shape` k > 0 and `scale` θ: mean kθ, variance kθ².
    pub fn gamma(&mut self, shape: f64, scale: f64) -> f64 {
        if shape < 1.0 {
            // Gamma(k) = Gamma(k + 1) · U^(1/k) (Marsaglia and Tsang, section 6).
            let u = 1.0 - self.uniform();
            return self.gamma(shape + 1.0, scale) * u.powf(1.0 / shape);
        }
        let d = shape - 1.0 / 3.0;
        let c = 1.0 / (9.0 * d).sqrt();
        loop {
            let x = self.normal();
            let v = (1.0 + c * x).powi(3);
            if v <= 0.0 {
                continue;
            }
            let u = 1.0 - self.uniform();
            if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
                return d * v * scale;
            }
        }
    }

    /// Shuffles `items` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.range(0, i as u32 + 1) as usize;
            items.swap(i, j);
        }
    }
}

/// Seconds between two arrivals at `rate` requests per second: gamma with shape
/// `burstiness` and mean `1 / rate` (vLLM's definition). Burstiness 1 is the exponential,
/// so arrivals form a Poisson process; below 1 they bunch up, above 1 they even out.
pub fn interarrival(rng: &mut Rng, rate: f64, burstiness: f64) -> f64 {
    rng.gamma(burstiness, 1.0 / (rate * burstiness))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moments(samples: &[f64]) -> (f64, f64) {
        let n = samples.len() as f64;
        let mean = samples.iter().sum::<f64>() / n;
        let var = samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
        (mean, var)
    }

    #[test]
    fn interarrival_times_have_mean_one_over_rate_and_gamma_variance() {
        for (rate, burstiness) in [(4.0, 1.0), (10.0, 0.25), (2.0, 4.0)] {
            let mut rng = Rng::new(7);
            let gaps: Vec<f64> = (0..200_000).map(|_| interarrival(&mut rng, rate, burstiness)).collect();
            let (mean, var) = moments(&gaps);
            assert!(gaps.iter().all(|&g| g >= 0.0));
            assert!((mean * rate - 1.0).abs() < 0.02, "rate {rate}, B {burstiness}: mean {mean}");
            // Gamma(k, θ = 1/(R·k)) has variance 1/(k·R²): the coefficient of variation
            // squared is 1/k, which is what burstiness controls.
            let expected = 1.0 / (burstiness * rate * rate);
            assert!((var / expected - 1.0).abs() < 0.05, "rate {rate}, B {burstiness}: var {var} vs {expected}");
        }
    }

    #[test]
    fn streams_are_seeded_and_ranges_hold() {
        let draw = |seed| {
            let mut rng = Rng::new(seed);
            (0..100).map(|_| rng.range(10, 20)).collect::<Vec<_>>()
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
        assert!(draw(3).iter().all(|id| (10..20).contains(id)));
        let mut all = draw(4);
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 10, "every value of a small range shows up");
        assert_ne!(Rng::derived(1, 0).next_u64(), Rng::derived(1, 1).next_u64());
        let mut items: Vec<u32> = (0..50).collect();
        Rng::new(5).shuffle(&mut items);
        assert_ne!(items, (0..50).collect::<Vec<_>>());
        items.sort_unstable();
        assert_eq!(items, (0..50).collect::<Vec<_>>(), "a permutation");
    }
}
