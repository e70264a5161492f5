//! `Linear`: `x · Wᵀ + b`, possibly fused from several checkpoint projections, and under
//! tensor parallelism this rank's share of it (column-parallel: its output rows;
//! row-parallel: its input columns, the partial products summed across ranks).

use super::Loader;
use crate::Result;
use crate::parallel::{Param, Reduce};
use met_kernels::{GpuBackend, Tensor};

/// A projection whose weight is `[out, in]` as in PyTorch's `nn.Linear`.
#[derive(Debug, Clone)]
pub struct Linear {
    /// `[out, in]` (this rank's share).
    pub weight: Tensor,
    /// `[out]`, when the projection has a bias (and, row-parallel, on rank 0 only).
    pub bias: Option<Tensor>,
    /// The all-reduce after a row-parallel product.
    reduce: Reduce,
}

impl Linear {
    /// Loads this rank's share of the projections `{prefix}{part}.weight`, stacked along
    /// the output dimension into one fused projection (and their `.bias` when `bias`).
    /// The parts share one kind of sharding: several column-parallel parts (q/k/v,
    /// gate/up), or one row-parallel part.
    ///
    /// # Errors
    /// When a tensor is missing, a share falls outside it, or the parts disagree on the
    /// input dimension.
    pub fn load(l: &Loader<'_>, prefix: &str, parts: &[Param], bias: bool) -> Result<Self> {
        let names = |kind: &str| parts.iter().map(|p| (p.at(prefix, kind), p.sharding)).collect::<Vec<_>>();
        let (store, backend) = (l.store, l.backend);
        Ok(Self {
            weight: l.shard.load_fused(store, backend, &names(".weight"))?,
            bias: if bias { l.shard.load_bias(store, backend, &names(".bias"))? } else { None },
            reduce: l.shard.reduce_for(parts[0].sharding),
        })
    }

    /// `x [t, in] -> [t, out]`, summed across ranks when row-parallel.
    ///
    /// # Errors
    /// On a shape mismatch or a failed collective.
    pub fn forward(&self, backend: &dyn GpuBackend, x: &Tensor) -> Result<Tensor> {
        self.reduce.apply(backend.matmul(x, &self.weight, self.bias.as_ref())?)
    }

    /// Whether [`Self::forward`] is the product alone: no bias, no sum across ranks.
    pub fn is_plain(&self) -> bool {
        self.bias.is_none() && self.reduce.is_identity()
    }
}
