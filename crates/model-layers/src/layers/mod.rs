//! Building blocks shared by the architectures: linear projections, norm weights, rotary
//! frequencies, self-attention, dense and mixture-of-experts MLPs, and the decoder stack
//! built from a `ModelConfig` recipe.
//!
//! Each block declares the checkpoint tensors it reads (`tensors`) next to the code that
//! loads them (`load`), from one set of name constants, so preflight and loading cannot
//! disagree; each constant carries its tensor-parallel sharding rule ([`crate::parallel`]).

pub mod decoder;
pub mod gated_delta_net;
pub mod linear;
pub(crate) mod mixer;
pub mod mlp;
pub mod norm;
pub mod rotary;
pub mod self_attention;

use met_config::ModelConfig;
use met_kernels::GpuBackend;
use met_model_weights::{TensorSpec, WeightStore};

use crate::parallel::Shard;

/// Where a layer's weights come from: the recipe, the checkpoint, the device they go to,
/// and the share of them this rank holds.
#[derive(Clone, Copy)]
pub struct Loader<'a> {
    /// The model's recipe.
    pub cfg: &'a ModelConfig,
    /// The checkpoint.
    pub store: &'a dyn WeightStore,
    /// The device.
    pub backend: &'a dyn GpuBackend,
    /// This rank's share ([`Shard::single`] on one device).
    pub shard: &'a Shard,
}

/// A tensor spec named `prefix + suffix`.
pub(crate) fn spec(prefix: &str, suffix: &str, shape: &[usize]) -> TensorSpec {
    TensorSpec { name: format!("{prefix}{suffix}"), shape: shape.to_vec() }
}
