//! The attention-backend seam: how a model's layers attend over the paged KV cache.
//!
//! A backend is a family of kernels with its own step metadata. Once per step, `prepare`
//! turns the step's layout (a [`StepLayout`]: query rows and context length of each
//! sequence, block tables, cache slots, all on the host) into what its kernels read; then
//! `attend` runs once per layer, after the layer's prologue (`GpuBackend::qkv_rotary_write`)
//! has written this step's K/V into the slots. A CUDA graph replays a recorded step with
//! new contents through `refresh`, which rewrites the prepared metadata in place. The model
//! builds the layout from its batch and knows nothing else about the backend.
//!
//! - `flash` (the default): [`GpuBackend::flash_attention`], the device's fastest kernels.
//! - `paged`: [`GpuBackend::paged_attention`], the reference the other is tested against.
//!
//! Adding a backend: implement [`AttentionBackend`] (honouring every field of
//! [`AttentionParams`]: GQA, scale, sliding window, soft-cap), add a variant to
//! [`AttentionBackendKind`] (in `met-config`, where the command line finds its name) and an
//! arm to [`attention_backend`]; `tests/ops/attention.rs` is where its kernels meet the f64
//! reference.

use std::sync::Arc;

use crate::backend::{AttentionMeta, AttentionParams, GpuBackend};
use crate::error::{Error, Result};
use crate::{DType, HostTensor, Tensor};

/// One step's attention layout, on the host.
#[derive(Debug, Clone, Copy)]
pub struct StepLayout<'a> {
    /// `[seqs + 1]`: sequence `s` owns query rows `cu_seqlens_q[s] .. cu_seqlens_q[s + 1]`.
    pub cu_seqlens_q: &'a [u32],
    /// `[seqs]`: each sequence's context after this step's writes.
    pub seq_lens: &'a [u32],
    /// `[seqs, max_blocks]`: each sequence's blocks, padded.
    pub block_tables: &'a [u32],
    /// Width of `block_tables`.
    pub max_blocks: usize,
    /// `[t]`: the cache slot of each query row (`block · block_size + offset`).
    pub slots: &'a [u32],
}

impl StepLayout<'_> {
    fn seqs(&self) -> usize {
        self.seq_lens.len()
    }

    /// Longest query and context of the step.
    fn max_lens(&self) -> (usize, usize) {
        let q = self.cu_seqlens_q.windows(2).map(|w| (w[1] - w[0]) as usize).max().unwrap_or(0);
        (q, self.seq_lens.iter().copied().max().unwrap_or(0) as usize)
    }
}

/// A step's metadata on the device, as [`AttentionBackend::prepare`] made it.
#[derive(Debug, Clone)]
pub struct StepMetadata {
    /// Query/context layout and block tables.
    pub attention: AttentionMeta,
    /// `u32 [t]`: cache slot of each row.
    pub slots: Tensor,
}

/// One way to compute attention over the paged KV cache.
pub trait AttentionBackend: Send + Sync + std::fmt::Debug {
    /// The name it is selected by (`--attention-backend`).
    fn name(&self) -> &'static str;

    /// Uploads the metadata of a step once, for every layer.
    ///
    /// # Errors
    /// When the upload fails.
    fn prepare(&self, layout: &StepLayout<'_>) -> Result<StepMetadata>;

    /// Rewrites `step`, prepared for a layout of the same shape (sequences, rows), to hold
    /// `layout`, in place: what a CUDA graph reads when it replays. The layout's block
    /// tables may be narrower than the prepared ones: they fill the first columns, and the
    /// others, past every sequence's blocks, are never read.
    ///
    /// # Errors
    /// On a layout of another shape, or when the writes fail.
    fn refresh(&self, step: &StepMetadata, layout: &StepLayout<'_>) -> Result<()>;

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

/// Which attention backend a model runs (`flash`, the default, or `paged`).
pub use met_config::AttentionBackendKind;

/// The attention backend `kind`, on `backend`.
pub fn attention_backend(kind: AttentionBackendKind, backend: Arc<dyn GpuBackend>) -> Arc<dyn AttentionBackend> {
    let op = match kind {
        AttentionBackendKind::Flash => Op::Flash,
        AttentionBackendKind::Paged => Op::Paged,
    };
    Arc::new(DeviceOp { op, shared: Shared { backend } })
}

/// The metadata both backends read: FlashAttention's paged varlen layout.
struct Shared {
    backend: Arc<dyn GpuBackend>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("backend", &self.backend.name()).finish()
    }
}

impl Shared {
    fn prepare(&self, l: &StepLayout<'_>) -> Result<StepMetadata> {
        let b = &self.backend;
        let u32s = |data: &[u32], dims: &[usize]| b.upload(&HostTensor::from_u32(data, dims), DType::U32);
        let (max_seqlen_q, max_seqlen_k) = l.max_lens();
        let attention = AttentionMeta {
            cu_seqlens_q: u32s(l.cu_seqlens_q, &[l.seqs() + 1])?,
            seq_lens: u32s(l.seq_lens, &[l.seqs()])?,
            block_tables: u32s(l.block_tables, &[l.seqs(), l.max_blocks])?,
            max_seqlen_q,
            max_seqlen_k,
        };
        Ok(StepMetadata { attention, slots: u32s(l.slots, &[l.slots.len()])? })
    }

    fn refresh(&self, step: &StepMetadata, l: &StepLayout<'_>) -> Result<()> {
        let b = &self.backend;
        let m = &step.attention;
        let shape = |t: &Tensor| t.dims().iter().product::<usize>();
        let width = m.block_tables.dims().get(1).copied().unwrap_or(0);
        if shape(&m.cu_seqlens_q) != l.cu_seqlens_q.len()
            || shape(&m.seq_lens) != l.seq_lens.len()
            || l.max_blocks > width
            || l.block_tables.len() != l.seqs() * l.max_blocks
            || shape(&step.slots) != l.slots.len()
        {
            return Err(Error::InvalidArgument("a step refreshed with a layout of another shape".into()));
        }
        b.write_u32(&m.cu_seqlens_q, l.cu_seqlens_q)?;
        b.write_u32(&m.seq_lens, l.seq_lens)?;
        if l.max_blocks == width {
            b.write_u32(&m.block_tables, l.block_tables)?;
        } else {
            b.write_u32_columns(&m.block_tables, l.block_tables, l.max_blocks)?;
        }
        b.write_u32(&step.slots, l.slots)
    }
}

/// Which of the device's two attention ops a backend attends through.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// [`GpuBackend::paged_attention`], the reference.
    Paged,
    /// [`GpuBackend::flash_attention`], the device's fastest kernels. Its tiled kernel's
    /// tile table is derived inside the op from the host copy of the layout.
    Flash,
}

/// A backend made of one device op over the shared metadata.
#[derive(Debug)]
struct DeviceOp {
    op: Op,
    shared: Shared,
}

impl AttentionBackend for DeviceOp {
    fn name(&self) -> &'static str {
        match self.op {
            Op::Paged => "paged",
            Op::Flash => "flash",
        }
    }

    fn prepare(&self, layout: &StepLayout<'_>) -> Result<StepMetadata> {
        self.shared.prepare(layout)
    }

    fn refresh(&self, step: &StepMetadata, layout: &StepLayout<'_>) -> Result<()> {
        self.shared.refresh(step, layout)
    }

    fn attend(
        &self,
        q: &Tensor,
        (k, v): (&Tensor, &Tensor),
        step: &StepMetadata,
        p: &AttentionParams,
    ) -> Result<Tensor> {
        let b = &self.shared.backend;
        match self.op {
            Op::Paged => b.paged_attention(q, k, v, &step.attention, p),
            Op::Flash => b.flash_attention(q, k, v, &step.attention, p),
        }
    }
}
