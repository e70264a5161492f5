//! Building blocks shared by the architectures: linear projections, norm weights, rotary
//! frequencies, self-attention, dense and mixture-of-experts MLPs, and the decoder stack
//! built from a `ModelConfig` recipe.
//!
//! Each block declares the checkpoint tensors it reads (`tensors`) next to the code that
//! loads them (`load`), from one set of name constants, so preflight and loading cannot
//! disagree.

pub mod decoder;
pub mod linear;
pub mod mlp;
pub mod norm;
pub mod rotary;
pub mod self_attention;

use met_model_weights::TensorSpec;

/// A tensor spec named `prefix + suffix`.
pub(crate) fn spec(prefix: &str, suffix: &str, shape: &[usize]) -> TensorSpec {
    TensorSpec { name: format!("{prefix}{suffix}"), shape: shape.to_vec() }
}
