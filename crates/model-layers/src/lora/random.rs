//! Random adapters, for measuring: `met bench --lora-dummy N:R` serves N of them with no
//! PEFT directory at hand. Each adapts every projection the model lets adapters touch (all
//! seven of a dense layer), and the routed experts' gate/up and down where the backend
//! applies adapters to experts, with `A` uniform in `±1/√in` (the scale of PEFT's Kaiming
//! initialisation) and a non-zero `B` uniform in `±0.01`, so its deltas are real work of
//! the size a trained adapter's are, drawn from a seed so runs repeat.

use std::sync::Arc;

use met_config::ModelConfig;

use super::LoraAdapter;
use super::experts::{HostDelta, HostExperts};
use super::module::LoraModule;
use super::pool::LoraPool;
use super::pool::{HostPair, HostWeights};
use crate::{ModelError, Result};

/// A SplitMix64 stream of uniform floats.
struct Uniform(u64);

impl Uniform {
    /// `n` values uniform in `[-bound, bound)`.
    fn fill(&mut self, n: usize, bound: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = self.0;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^= z >> 31;
                ((z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * bound
            })
            .collect()
    }
}

impl LoraAdapter {
    /// A random adapter of rank `rank` named `name` on every projection of a model of
    /// `cfg` that takes one, with scale 1, written into a free slot of `pool`.
    ///
    /// # Errors
    /// As [`Self::load`]: a rank over the pool's, no free slot, or a device failure.
    pub fn random(name: &str, cfg: &ModelConfig, pool: &Arc<LoraPool>, rank: usize, seed: u64) -> Result<Self> {
        let fail = |msg: String| ModelError::Adapter { name: name.to_owned(), msg };
        if rank == 0 || rank > pool.max_rank() {
            return Err(fail(format!("rank {rank} is not in 1..={} (--max-lora-rank)", pool.max_rank())));
        }
        let mut rng = Uniform(seed);
        let layers = (0..cfg.num_layers)
            .map(|layer| {
                LoraModule::ALL.map(|m| {
                    let (inputs, outputs) = m.shape(cfg, layer).ok()?;
                    let a = rng.fill(rank * inputs, 1.0 / (inputs as f32).sqrt());
                    Some(HostPair { a, b: rng.fill(outputs * rank, 0.01), rank })
                })
            })
            .collect();
        let experts = (0..cfg.num_layers)
            .map(|layer| {
                let moe = cfg.moe.as_ref().filter(|m| m.sparse_layers.get(layer) == Some(&true))?;
                pool.takes_expert_adapters().then_some(())?;
                let (e, h, i) = (moe.num_experts, cfg.hidden_size, moe.expert_intermediate_size);
                let mut delta = |inputs: usize, outputs: usize| HostDelta {
                    a: rng.fill(e * rank * inputs, 1.0 / (inputs as f32).sqrt()),
                    b: rng.fill(e * outputs * rank, 0.01),
                    rank,
                    scale: 1.0,
                };
                Some(HostExperts { gate_up: Some(delta(h, 2 * i)), down: Some(delta(i, h)) })
            })
            .collect();
        Self::install(name, HostWeights { rank, layers, experts }, 1.0, pool)
    }
}
