//! The attention-backend seam.
//!
//! One call per layer: attend for the whole varlen batch through the block tables, after
//! the layer's prologue (`GpuBackend::qkv_rotary_write`) has written this step's K/V into
//! their cache slots. The metadata of a step is prepared once and shared by every layer.
//! [`PagedAttention`] implements the seam with the device's own `paged_attention` op;
//! faster kernels plug in as other backends, chosen at startup by name.
//!
//! Adding a backend: implement [`AttentionBackend`] (honouring every field of
//! [`AttentionParams`]: GQA, scale, sliding window, soft-cap), add its name to
//! [`ATTENTION_BACKENDS`] and an arm to [`attention_backend`]; `--attention-backend`
//! then offers it.

use std::sync::Arc;

use met_kernels::{AttentionMeta, AttentionParams, DType, GpuBackend, HostTensor, Tensor};

use crate::{ForwardBatch, ModelError, Result};

/// Device-side metadata of one forward step, shared by all layers.
#[derive(Debug, Clone)]
pub struct StepMetadata {
    /// Query/context layout and block tables.
    pub attention: AttentionMeta,
    /// `u32 [t]`: cache slot of each row.
    pub slots: Tensor,
}

/// One way to compute attention over the paged KV cache.
pub trait AttentionBackend: Send + Sync {
    /// The name it is selected by (`--attention-backend`).
    fn name(&self) -> &'static str;

    /// Uploads the metadata of `batch` once per step.
    ///
    /// # Errors
    /// When the upload fails.
    fn prepare(&self, batch: &ForwardBatch) -> Result<StepMetadata>;

    /// Attention of `q [t, h, d]` over the layer's pools, which already hold this step's
    /// keys and values: `[t, h, d]`.
    ///
    /// # Errors
    /// On mismatched shapes or device failure.
    fn attend(
        &self,
        q: &Tensor,
        cache: (&Tensor, &Tensor),
        step: &StepMetadata,
        params: &AttentionParams,
    ) -> Result<Tensor>;
}

/// Names accepted by [`attention_backend`], the default first.
pub const ATTENTION_BACKENDS: &[&str] = &["flash", "paged"];

/// The attention backend called `name`.
///
/// # Errors
/// [`ModelError::Unsupported`] for an unknown name, listing the known ones.
pub fn attention_backend(name: &str, backend: Arc<dyn GpuBackend>) -> Result<Arc<dyn AttentionBackend>> {
    match name {
        "paged" => Ok(Arc::new(PagedAttention { backend })),
        "flash" => Ok(Arc::new(FlashAttention(PagedAttention { backend }))),
        other => Err(ModelError::Unsupported(format!(
            "unknown attention backend `{other}` (available: {})",
            ATTENTION_BACKENDS.join(", ")
        ))),
    }
}

/// Attention through the device backend's own paged-attention op.
#[derive(Debug)]
pub struct PagedAttention {
    backend: Arc<dyn GpuBackend>,
}

impl PagedAttention {
    /// Paged attention on `backend`.
    pub fn new(backend: Arc<dyn GpuBackend>) -> Self {
        Self { backend }
    }
}

impl AttentionBackend for PagedAttention {
    fn name(&self) -> &'static str {
        "paged"
    }

    fn prepare(&self, batch: &ForwardBatch) -> Result<StepMetadata> {
        let seqs = &batch.sequences;
        let max_blocks = seqs.iter().map(|s| s.blocks.len()).max().unwrap_or(0).max(1);
        let tables = batch.padded_block_tables(max_blocks);
        let seq_lens = batch.context_lens();
        let b = &self.backend;
        let attention = AttentionMeta {
            cu_seqlens_q: b.upload(&HostTensor::from_u32(&batch.cu_seqlens_q(), &[seqs.len() + 1]), DType::U32)?,
            seq_lens: b.upload(&HostTensor::from_u32(&seq_lens, &[seqs.len()]), DType::U32)?,
            block_tables: b.upload(&HostTensor::from_u32(&tables, &[seqs.len(), max_blocks]), DType::U32)?,
            max_seqlen_q: seqs.iter().map(|s| s.query_len).max().unwrap_or(0),
            max_seqlen_k: seqs.iter().map(|s| s.context_len).max().unwrap_or(0),
        };
        let slots = b.upload(&HostTensor::from_u32(&batch.slot_mapping, &[batch.slot_mapping.len()]), DType::U32)?;
        Ok(StepMetadata { attention, slots })
    }

    fn attend(
        &self,
        q: &Tensor,
        (k_cache, v_cache): (&Tensor, &Tensor),
        step: &StepMetadata,
        params: &AttentionParams,
    ) -> Result<Tensor> {
        Ok(self.backend.paged_attention(q, k_cache, v_cache, &step.attention, params)?)
    }
}

/// Attention through the device's fastest kernels ([`GpuBackend::flash_attention`]), over
/// the same step metadata as [`PagedAttention`], which stays the reference it is tested
/// against.
#[derive(Debug)]
pub struct FlashAttention(PagedAttention);

impl AttentionBackend for FlashAttention {
    fn name(&self) -> &'static str {
        "flash"
    }

    fn prepare(&self, batch: &ForwardBatch) -> Result<StepMetadata> {
        self.0.prepare(batch)
    }

    fn attend(
        &self,
        q: &Tensor,
        (k_cache, v_cache): (&Tensor, &Tensor),
        step: &StepMetadata,
        params: &AttentionParams,
    ) -> Result<Tensor> {
        Ok(self.0.backend.flash_attention(q, k_cache, v_cache, &step.attention, params)?)
    }
}
