//! `EngineSetup`: how startup builds the engine around a loaded model (phases 6, 7 and 9):
//! what the scheduler reads, how large the KV cache is, which decode steps CUDA graphs
//! capture, and speculative decoding.

use crate::engine::{EngineConfig, InvalidSetting};
use crate::speculative::{SpeculativeConfig, SpeculativeMethod};

/// Everything startup needs to build an engine besides the model and its devices.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineSetup {
    /// What the scheduler reads.
    pub engine: EngineConfig,
    /// KV cache blocks; `None`: sized from the device's memory and the expected work.
    pub kv_blocks: Option<usize>,
    /// Share of the device memory left free after a warm-up step that the KV cache may take
    /// (devices with memory of their own).
    pub gpu_memory_utilization: f64,
    /// The longest context a decode step replayed from a CUDA graph may hold; `None`: every
    /// step runs eagerly.
    pub cuda_graph_max_context: Option<usize>,
    /// Speculative decoding, when on.
    pub speculative: Option<SpeculativeConfig>,
}

impl EngineSetup {
    /// `engine` with the KV cache sized from memory, graphs up to `graph_max_context`, no
    /// speculation.
    pub fn new(engine: EngineConfig, graph_max_context: usize) -> Self {
        Self {
            engine,
            kv_blocks: None,
            gpu_memory_utilization: 0.9,
            cuda_graph_max_context: Some(graph_max_context),
            speculative: None,
        }
    }

    /// Checks every setting, and that speculative decoding has what its method needs.
    ///
    /// # Errors
    /// The first bad setting, naming its flag.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        self.engine.validate()?;
        let u = self.gpu_memory_utilization;
        if !(u > 0.0 && u <= 1.0) {
            return Err(InvalidSetting::new("gpu-memory-utilization", format!("`{u}` is not a fraction in (0, 1]")));
        }
        let Some(speculative) = &self.speculative else { return Ok(()) };
        speculative.validate()?;
        if speculative.method == SpeculativeMethod::Draft && speculative.draft_model.is_none() {
            return Err(InvalidSetting::new("draft-model", "--speculative draft needs one"));
        }
        Ok(())
    }

    /// Refuses settings a model split over `tensor_parallel_size` ranks cannot serve:
    /// self-speculation needs the model's first layers as a draft of its own, which a split
    /// model does not offer.
    ///
    /// # Errors
    /// `--speculative self` with more than one rank.
    pub fn check_world(&self, tensor_parallel_size: usize) -> Result<(), InvalidSetting> {
        let self_spec = self.speculative.as_ref().is_some_and(|s| s.method == SpeculativeMethod::SelfSpec);
        if self_spec && tensor_parallel_size > 1 {
            let msg = format!(
                "not available with --tensor-parallel-size {tensor_parallel_size} (a split model cannot run its first \
                 layers as its own draft); use --speculative ngram or draft"
            );
            return Err(InvalidSetting::new("speculative self", msg));
        }
        Ok(())
    }
}
