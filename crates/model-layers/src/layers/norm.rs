//! RMSNorm weights as the recipe's [`NormWeight`] says to apply them.
//!
//! Llama's norms multiply the normalised value, cast to the model dtype, by `w`
//! (`LlamaRMSNorm`); Gemma's multiply the f32 normalised value by `1 + w` and cast after
//! (`GemmaRMSNorm`, weights stored around 0). The backend's `rms_norm` does the first with
//! a weight in its float dtype and the second with an f32 weight, so a Gemma norm is
//! loaded as `1 + w` in f32, computed on the host as transformers computes
//! `1.0 + weight.float()`.

use met_config::NormWeight;
use met_kernels::{DType, GpuBackend, HostTensor, Tensor};
use met_model_weights::{WeightStore, load};

use crate::Result;

/// Loads the norm weight `name` for use with the backend's `rms_norm`.
///
/// # Errors
/// When the tensor is missing or the device fails.
pub fn load_norm(store: &dyn WeightStore, name: &str, backend: &dyn GpuBackend, kind: NormWeight) -> Result<Tensor> {
    match kind {
        NormWeight::Plain => Ok(load(store, name, backend)?),
        NormWeight::UnitOffset => {
            let (mut w, shape) = match store.uniform_run(name) {
                Some(run) => (run.host_values(), vec![run.len]),
                None => {
                    let host = store.host(name)?;
                    (host.to_f32_vec()?, host.shape().to_vec())
                }
            };
            w.iter_mut().for_each(|v| *v += 1.0);
            Ok(backend.upload(&HostTensor::from_f32(&w, &shape), DType::F32)?)
        }
    }
}
