//! Rotary position embedding frequencies, with Llama 3 and linear scaling.
//!
//! Follows `transformers/modeling_rope_utils.py`: base frequencies
//! `theta^(-2i/d)` computed in f32 as transformers does, then rescaled per
//! [`RopeScaling`]. The rotation itself is the backend's `rotary` op.

use std::f64::consts::PI;

use met_config::{RopeConfig, RopeScaling};

/// The `head_dim / 2` inverse frequencies of a rotary embedding.
pub fn inv_freq(rope: &RopeConfig, head_dim: usize) -> Vec<f32> {
    let base = rope.theta as f32;
    let plain = (0..head_dim / 2).map(|i| 1.0 / base.powf((2 * i) as f32 / head_dim as f32));
    match rope.scaling {
        RopeScaling::None => plain.collect(),
        RopeScaling::Linear { factor } => plain.map(|f| f / factor as f32).collect(),
        RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
            let original = original_max_position_embeddings as f64;
            // Wavelengths longer than this are fully scaled; shorter than `short` kept.
            let long = original / low_freq_factor;
            let short = original / high_freq_factor;
            plain
                .map(|f| {
                    let f = f64::from(f);
                    let wavelen = 2.0 * PI / f;
                    let scaled = if wavelen > long {
                        f / factor
                    } else if wavelen < short {
                        f
                    } else {
                        // Between the band edges, blend from scaled to unscaled.
                        let smooth = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    };
                    scaled as f32
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_frequencies_are_geometric() {
        let f = inv_freq(&RopeConfig { theta: 10_000.0, scaling: RopeScaling::None }, 8);
        assert_eq!(f.len(), 4);
        assert_eq!(f[0], 1.0);
        assert!((f[1] - 0.1).abs() < 1e-7);
        assert!((f[3] - 1e-3).abs() < 1e-9);
    }

    #[test]
    fn llama3_scales_only_long_wavelengths() {
        let scaling = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 32,
        };
        let plain = inv_freq(&RopeConfig { theta: 10_000.0, scaling: RopeScaling::None }, 16);
        let f = inv_freq(&RopeConfig { theta: 10_000.0, scaling }, 16);
        // Wavelength 2π (< 8): kept. 2π·10 ≈ 63 (> 32): divided by 8. 2π·10^0.5 ≈ 19.9: blended.
        assert_eq!(f[0], plain[0]);
        assert!((f[2] - plain[2] / 8.0).abs() < 1e-9);
        assert!(f[1] < plain[1] && f[1] > plain[1] / 8.0);
    }
}
