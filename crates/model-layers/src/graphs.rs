//! Decode steps replayed from graphs.
//!
//! A decode step at batch size `n` issues the same ops on tensors of the same shapes
//! whatever the tokens are, so the backend can record it once (`GpuBackend::capture`) and
//! replay it with one launch, which removes the per-op launch cost that dominates small
//! models and small batches. At startup a graph is captured for each size in
//! [`GraphSettings::batch_sizes`]; a decode-only step of `n <= max` sequences then runs the
//! smallest graph of size `>= n`, its spare rows padding (slot past the pool, so they write
//! nothing to the cache; a context of one token). Steps with prompt rows, longer contexts
//! than the graphs' block tables hold, or another cache run eagerly.
//!
//! Each graph owns its inputs (token ids, positions, slots, context lengths, block tables
//! of a fixed width), written from the host before each replay, and its logits, copied out
//! after. The step's rows are computed independently of each other, so a replay at `n` =
//! the graph's size gives the eager step's logits bit for bit; padded replays do too where
//! the kernels do not depend on the batch size (the CUDA backend's decode products up to 4
//! rows, its decode attention within a size class bounded by graph sizes) and agree as
//! closely as cuBLAS's choices for the two sizes do elsewhere.
//!
//! A hybrid model's graph also owns its recurrent layers' state slots, written per replay;
//! padding rows take no slot, so they start from a zero state and keep none. What a graph
//! cannot record, because it varies per step, runs around the replay: zeroing or restoring
//! the slots of sequences that start in the step before it, copying snapshots out after.
//!
//! A model serving LoRA adapters records its graphs with its adapter slots
//! ([`crate::lora::LoraPool`]) and a row-slot tensor of its own, written per replay like
//! the recurrent slots: each row's adapter slot, [`met_kernels::NO_LORA_SLOT`] for base
//! and padding rows. Adapters loaded or unloaded between replays change only what the
//! slots hold, never what was recorded. A model without slots replays only steps without
//! adapters.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use met_cache::KvPools;
use met_kernels::{DType, Graph, HostTensor, Tensor};

use crate::attention::{BatchLayout, StepLayout, widest_table};
use crate::layers::decoder::{DecoderModel, DeviceStep, StepIds};
use crate::layers::mixer::{self, RecurrentStep};
use crate::lora::StepLora;
use crate::{ForwardBatch, Model, Result};

/// The batch sizes captured by default: padding a step up to the next one wastes at most
/// half of it (a third from 16 rows on).
pub const DEFAULT_BATCH_SIZES: &[usize] = &[1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256];

/// The longest context a replayed step may hold by default; longer ones run eagerly.
pub const DEFAULT_MAX_CONTEXT: usize = 8192;

/// What to capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphSettings {
    /// Decode batch sizes to record.
    pub batch_sizes: Vec<usize>,
    /// The longest context a replayed step may hold (it sizes the graphs' block tables).
    pub max_context: usize,
}

impl GraphSettings {
    /// The default sizes up to `max_num_seqs` (and `max_num_seqs` itself), contexts to
    /// [`DEFAULT_MAX_CONTEXT`].
    pub fn up_to(max_num_seqs: usize) -> Self {
        let mut batch_sizes: Vec<usize> = DEFAULT_BATCH_SIZES.iter().copied().filter(|&s| s <= max_num_seqs).collect();
        if max_num_seqs < DEFAULT_BATCH_SIZES[DEFAULT_BATCH_SIZES.len() - 1] && !batch_sizes.contains(&max_num_seqs) {
            batch_sizes.push(max_num_seqs);
        }
        Self { batch_sizes, max_context: DEFAULT_MAX_CONTEXT }
    }
}

/// What [`Model::capture_graphs`] did, for the startup log.
#[derive(Debug, Clone, PartialEq)]
pub enum GraphCapture {
    /// Graphs recorded for these batch sizes.
    Captured {
        /// Batch sizes, ascending.
        sizes: Vec<usize>,
        /// Longest context a replay takes.
        max_context: usize,
        /// Seconds the capture took, warm-up included.
        seconds: f64,
        /// Device memory the graphs took (free memory before minus after), when known.
        bytes: Option<i64>,
    },
    /// Nothing recorded, and why.
    Skipped(String),
}

impl fmt::Display for GraphCapture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Captured { sizes, max_context, seconds, bytes } => {
                let mib = bytes.map_or_else(|| "unknown".to_string(), |b| format!("{:.0} MiB", b as f64 / 1048576.0));
                write!(
                    f,
                    "{} decode graphs captured in {seconds:.2} s (batch sizes {sizes:?}, contexts to {max_context} \
                     tokens, {mib} of device memory)",
                    sizes.len()
                )
            }
            Self::Skipped(why) => write!(f, "no graphs: {why}"),
        }
    }
}

/// One recorded decode step.
struct DecodeGraph {
    size: usize,
    /// Every input the recording reads (the graph holds their addresses, so they live as
    /// long as it does); block tables are `u32 [size, max_blocks]`.
    step: DeviceStep,
    /// `[size, vocab]` in the model's logits dtype, written by the replay.
    logits: Tensor,
    graph: Box<dyn Graph>,
}

/// Every recorded size of one model over one cache.
pub(crate) struct DecodeGraphs {
    /// Ascending by size.
    graphs: Vec<DecodeGraph>,
    /// Width of the block tables.
    max_blocks: usize,
    /// The cache's first key pool: replays only run on the cache they were recorded with.
    pool: Tensor,
    /// Steps replayed so far.
    replays: AtomicU64,
}

/// The slot of padding rows: past any pool, so the KV write skips them.
const NO_SLOT: u32 = u32::MAX;

impl DecodeGraphs {
    /// Records every size of `settings` that the cache can hold, largest first.
    pub(crate) fn capture(
        model: &DecoderModel,
        kv: &KvPools,
        settings: &GraphSettings,
    ) -> Result<(Self, GraphCapture)> {
        let b = &**model.backend();
        let start = Instant::now();
        let free_before = b.memory_info().map(|m| m.free);
        let block_size = kv.block_size();
        let slots_in_pool = kv.num_blocks() * block_size;
        let max_context = settings.max_context.min(model.max_context()).min(slots_in_pool).max(1);
        let max_blocks = max_context.div_ceil(block_size);
        let mut sizes: Vec<usize> =
            settings.batch_sizes.iter().copied().filter(|&s| s > 0 && s <= slots_in_pool).collect();
        sizes.sort_unstable();
        sizes.dedup();
        let mut graphs = Vec::with_capacity(sizes.len());
        for &size in sizes.iter().rev() {
            graphs.push(record(model, kv, size, max_blocks, model.vocab_size())?);
        }
        graphs.reverse();
        b.synchronize()?;
        let bytes = free_before.zip(b.memory_info().map(|m| m.free)).map(|(a, z)| a as i64 - z as i64);
        let report = GraphCapture::Captured {
            sizes,
            max_context: max_blocks * block_size,
            seconds: start.elapsed().as_secs_f64(),
            bytes,
        };
        Ok((Self { graphs, max_blocks, pool: kv.layer(0).0.clone(), replays: AtomicU64::new(0) }, report))
    }

    /// Runs `batch` from a graph when it is a decode step that one holds: `Ok(None)` when it
    /// must run eagerly.
    pub(crate) fn replay(
        &self,
        model: &DecoderModel,
        batch: &ForwardBatch,
        kv: &KvPools,
        ids: StepIds<'_>,
    ) -> Result<Option<Tensor>> {
        let n = batch.sequences.len();
        let Some(g) = self.graphs.iter().find(|g| g.size >= n) else { return Ok(None) };
        let decode_only = n > 0
            && batch.num_tokens() == n
            && batch.logit_rows.len() == n
            && batch.logit_rows.iter().enumerate().all(|(i, &r)| r as usize == i);
        let fits = batch.sequences.iter().all(|s| s.blocks.len() <= self.max_blocks);
        // A graph's adapters are its slots' stacks, and deltas on experts where the pool
        // keeps device tables of them.
        let adapters_fit = batch.adapter_runs.is_empty()
            || (g.step.lora.is_some()
                && batch
                    .adapter_runs
                    .iter()
                    .all(|r| !r.adapter.adapts_experts() || r.adapter.pool().graphs_follow_experts()));
        if !decode_only || !fits || !adapters_fit || !kv.layer(0).0.same_storage(&self.pool) {
            return Ok(None);
        }
        let b = &**model.backend();
        let pad = |values: &[u32], fill: u32| -> Vec<u32> {
            let mut v = Vec::with_capacity(g.size);
            v.extend_from_slice(values);
            v.resize(g.size, fill);
            v
        };
        let step = &g.step;
        match ids {
            StepIds::Host => b.write_u32(&step.ids, &model.local_ids(&pad(&batch.token_ids, 0)))?,
            // Padding rows take the first row's token: any id in the vocabulary will do.
            StepIds::Fed { tokens, rows } => b.copy_into(&b.gather_u32(tokens, &pad(rows, rows[0]))?, &step.ids)?,
        }
        b.write_u32(&step.positions, &pad(&batch.positions, 0))?;
        // Padding rows: one token each at no slot, reading block 0 (their one-token
        // context), as recorded. Only the batch's widest table of columns is written: the
        // recorded tables are `max_blocks` wide, and a step's sequences read only their own
        // blocks (at 256 sequences, 24 KiB a step instead of 512).
        let width = widest_table(batch);
        let mut layout = BatchLayout::of(batch, width);
        layout.cu_seqlens_q = (0..=g.size as u32).collect();
        layout.seq_lens = pad(&layout.seq_lens, 1);
        layout.block_tables.resize(g.size * width, 0);
        model.attention().refresh(&step.meta, &layout.with_slots(&pad(&batch.slot_mapping, NO_SLOT)))?;
        if let Some(recurrent) = &step.recurrent {
            mixer::before_replay(b, kv, batch)?;
            recurrent.write_slots(b, &batch.state_slots)?;
        }
        if let Some(lora) = &step.lora {
            lora.write_rows(b, batch)?;
        }
        g.graph.replay()?;
        if step.recurrent.is_some() {
            mixer::after_replay(b, kv, batch)?;
        }
        self.replays.fetch_add(1, Ordering::Relaxed);
        Ok(Some(b.copy_rows(&g.logits, n)?))
    }

    /// Steps replayed so far.
    pub(crate) fn replays(&self) -> u64 {
        self.replays.load(Ordering::Relaxed)
    }
}

/// Warms up and records the decode step of `size` sequences.
fn record(model: &DecoderModel, kv: &KvPools, size: usize, max_blocks: usize, vocab: usize) -> Result<DecodeGraph> {
    let b = &**model.backend();
    let u32s = |data: &[u32], dims: &[usize]| b.upload(&HostTensor::from_u32(data, dims), DType::U32);
    // Recording-time contents: every row one token at its own slot of the (still empty)
    // cache, so each op's checks pass; replays overwrite them.
    let slots: Vec<u32> = (0..size as u32).collect();
    let cu: Vec<u32> = (0..=size as u32).collect();
    let tables = vec![0; size * max_blocks];
    let meta = model.attention().prepare(&StepLayout {
        cu_seqlens_q: &cu,
        seq_lens: &vec![1; size],
        block_tables: &tables,
        max_blocks,
        slots: &slots,
    })?;
    let step = DeviceStep {
        ids: u32s(&vec![0; size], &[size])?,
        positions: u32s(&vec![0; size], &[size])?,
        meta,
        logit_rows: None,
        logit_order: model.logit_order(size)?,
        recurrent: if model.is_hybrid() { Some(RecurrentStep::for_graph(b, size)?) } else { None },
        // Recorded with every row at no slot: the kernels' launches do not depend on it.
        lora: model.lora.get().map(|pool| StepLora::for_graph(b, pool, size)).transpose()?,
    };
    // One eager run first, so every kernel and library handle is loaded before recording.
    let eager = model.run(&step, kv)?;
    let logits = b.zeros(&[size, vocab], eager.dtype())?;
    b.copy_into(&eager, &logits)?;
    b.synchronize()?;
    let graph = b.capture(&mut || b.copy_into(&model.run(&step, kv).map_err(into_kernels)?, &logits))?;
    Ok(DecodeGraph { size, step, logits, graph })
}

/// A model error inside a recording, as the kernels error the capture reports.
fn into_kernels(e: crate::ModelError) -> met_kernels::Error {
    match e {
        crate::ModelError::Kernels(k) => k,
        other => met_kernels::Error::InvalidArgument(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_sizes_stop_at_max_num_seqs_and_include_it() {
        assert_eq!(GraphSettings::up_to(256).batch_sizes, DEFAULT_BATCH_SIZES);
        assert_eq!(GraphSettings::up_to(20).batch_sizes, [1, 2, 4, 8, 16, 20]);
        assert_eq!(GraphSettings::up_to(1).batch_sizes, [1]);
        assert_eq!(GraphSettings::up_to(1000).batch_sizes, DEFAULT_BATCH_SIZES);
        assert_eq!(GraphSettings::up_to(8).max_context, DEFAULT_MAX_CONTEXT);
    }

    /// The CUDA decode attention changes its warps per block at 2 and 32 sequences, its
    /// split length at 8 and 32 and its blocks per split at 32 and 64 (`decode_warps`,
    /// `FlashDecode::for_batch`, `decode_split_min`, `decode_grid_z` in met-kernels): a
    /// padded replay computes as its eager step only while those are capture sizes.
    #[test]
    fn the_decode_attention_classes_end_at_capture_sizes() {
        for class_end in [2, 8, 32, 64] {
            assert!(DEFAULT_BATCH_SIZES.contains(&class_end), "{class_end}");
        }
    }
}
