//! `Linear`: `x · Wᵀ + b`, possibly fused from several checkpoint projections.

use met_kernels::{GpuBackend, Tensor};
use met_model_weights::{WeightStore, load_concat};

use crate::Result;

/// A projection whose weight is `[out, in]` as in PyTorch's `nn.Linear`.
#[derive(Debug, Clone)]
pub struct Linear {
    /// `[out, in]`.
    pub weight: Tensor,
    /// `[out]`, when the projection has a bias.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// Loads the projections named `{prefix}{part}.weight` for each part, stacked along
    /// the output dimension into one fused projection (and their `.bias` when `bias`).
    ///
    /// # Errors
    /// When a tensor is missing or the parts disagree on the input dimension.
    pub fn load_fused(
        store: &dyn WeightStore,
        backend: &dyn GpuBackend,
        prefix: &str,
        parts: &[&str],
        bias: bool,
    ) -> Result<Self> {
        let names = |kind: &str| parts.iter().map(|p| format!("{prefix}{p}.{kind}")).collect::<Vec<_>>();
        let load = |names: Vec<String>| {
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            load_concat(store, &refs, backend)
        };
        Ok(Self { weight: load(names("weight"))?, bias: if bias { Some(load(names("bias"))?) } else { None } })
    }

    /// `x [t, in] -> [t, out]`.
    ///
    /// # Errors
    /// On a shape mismatch.
    pub fn forward(&self, backend: &dyn GpuBackend, x: &Tensor) -> Result<Tensor> {
        Ok(backend.matmul(x, &self.weight, self.bias.as_ref())?)
    }
}
