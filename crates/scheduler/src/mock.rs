//! `MockModel`: a deterministic stand-in for a transformer, for tests and benchmarks of
//! the engine without a device.
//!
//! It writes each row's token id and position into its own table at the row's KV slot
//! (as a real model writes K/V that depend on both), and computes the logits of a
//! position from the entries it reads back through the sequence's block table, so a
//! scheduling or caching bug that hands a sequence the wrong blocks, or blocks computed
//! at other positions, changes its output. The logits are a hash of that history; [`MockModel::reference_greedy`]
//! computes the same continuation without any cache, as the ground truth.
//!
//! [`Faults`] make it fail on purpose, for tests of the engine's fault isolation: each is
//! triggered by the first token of a sequence, so a test picks the victim by its prompt.

use std::sync::Arc;

use met_cache::{KvCache, KvLayout};
use met_kernels::{CpuBackend, DType, GpuBackend, HostTensor, Tensor};
use met_model_layers::{ForwardBatch, Model, ModelError};
use parking_lot::Mutex;

/// A model whose next-token logits are a hash of the context it reads from the cache.
pub struct MockModel {
    vocab_size: usize,
    max_context: usize,
    backend: Arc<dyn GpuBackend>,
    /// Token id and position written at each cache slot.
    slots: Mutex<Vec<(u32, u32)>>,
    /// Whether logits hash the whole context (tests) or only the last token (benchmarks
    /// of the scheduler, where the model should cost nothing).
    whole_context: bool,
    /// With `whole_context` off: the logits after each token, precomputed.
    last_token_logits: Vec<f32>,
    faults: Faults,
}

/// Failures a [`MockModel`] injects, each for the sequences whose first token (position 0)
/// is the one given. Only a mock that reads the whole context ([`MockModel::new`]) sees
/// the first token; [`MockModel::last_token_only`] ignores them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// The sequence's logits are all NaN, which the sampler refuses (a row fails).
    pub nan_logits: Option<u32>,
    /// The batch holding the sequence fails with [`ModelError::Batch`], as a model fails
    /// on input it cannot run.
    pub fail_batch: Option<u32>,
    /// The batch fails with a device error, which no one sequence owns.
    pub device_error: Option<u32>,
    /// The forward pass panics.
    pub panic: Option<u32>,
    /// Every forward pass takes at least this long: a slow model, for tests that must act
    /// while a request runs (not a fault).
    pub step_delay: Option<std::time::Duration>,
}

const UNWRITTEN: (u32, u32) = (u32::MAX, u32::MAX);

impl Faults {
    /// The fault of logits row `row`, whose sequence starts with `first`: `Err` for a
    /// failed batch, `Ok(true)` for NaN logits; it panics when told to.
    fn apply(&self, first: u32, row: u32) -> Result<bool, ModelError> {
        let hit = |trigger: Option<u32>| trigger == Some(first);
        if hit(self.panic) {
            panic!("mock fault: row {row} panics");
        }
        if hit(self.device_error) {
            return Err(met_kernels::Error::Device(format!("mock fault: row {row} broke the device")).into());
        }
        if hit(self.fail_batch) {
            return Err(ModelError::Batch(format!("mock fault: row {row} cannot run")));
        }
        Ok(hit(self.nan_logits))
    }
}

impl MockModel {
    /// A mock over `vocab_size` tokens with a context of `max_context`.
    pub fn new(vocab_size: usize, max_context: usize) -> Self {
        Self {
            vocab_size,
            max_context,
            backend: Arc::new(CpuBackend::new()),
            slots: Mutex::new(Vec::new()),
            whole_context: true,
            last_token_logits: Vec::new(),
            faults: Faults::default(),
        }
    }

    /// This mock, failing as `faults` say.
    pub fn with_faults(self, faults: Faults) -> Self {
        Self { faults, ..self }
    }

    /// A mock whose logits depend on the last token only: nearly free, for measuring the
    /// engine's own overhead.
    pub fn last_token_only(vocab_size: usize, max_context: usize) -> Self {
        let mock = Self::new(vocab_size, max_context);
        let table = (0..vocab_size as u32).flat_map(|t| mock.logits_of([(t, 0)])).collect();
        Self { whole_context: false, last_token_logits: table, ..mock }
    }

    /// The KV layout to build its cache with (one layer of one tiny head).
    pub fn layout() -> KvLayout {
        KvLayout { num_layers: 1, num_kv_heads: 1, head_dim: 2, dtype: DType::F32, state: None }
    }

    /// The logits after `history`, given as (token, position) entries.
    fn logits_of(&self, history: impl IntoIterator<Item = (u32, u32)>) -> Vec<f32> {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for (t, p) in history {
            h = mix(h ^ u64::from(t) ^ (u64::from(p) << 32));
        }
        (0..self.vocab_size as u64).map(|j| (mix(h ^ j) >> 40) as f32 / (1u64 << 24) as f32 * 10.0).collect()
    }

    /// The logits after the token sequence `history` (positions 0, 1, ...).
    pub fn logits(&self, history: &[u32]) -> Vec<f32> {
        self.logits_of(history.iter().enumerate().map(|(p, &t)| (t, p as u32)))
    }

    /// The greedy continuation of `prompt`, computed from scratch.
    pub fn reference_greedy(&self, prompt: &[u32], tokens: usize) -> Vec<u32> {
        let mut history = prompt.to_vec();
        for _ in 0..tokens {
            let logits = self.logits(&history);
            history.push(met_model_layers::runner::argmax(&logits));
        }
        history.split_off(prompt.len())
    }
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Model for MockModel {
    fn forward(&self, batch: &ForwardBatch, kv: &mut dyn KvCache) -> Result<Tensor, ModelError> {
        if let Some(delay) = self.faults.step_delay {
            std::thread::sleep(delay);
        }
        let bs = kv.block_size();
        let mut slots = self.slots.lock();
        slots.resize(kv.num_blocks() * bs, UNWRITTEN);
        for ((&slot, &token), &pos) in batch.slot_mapping.iter().zip(&batch.token_ids).zip(&batch.positions) {
            slots[slot as usize] = (token, pos);
        }
        // The sequence and position of every row.
        let mut owner = Vec::with_capacity(batch.num_tokens());
        for (s, seq) in batch.sequences.iter().enumerate() {
            owner.extend((seq.context_len - seq.query_len..seq.context_len).map(|p| (s, p)));
        }
        let mut logits = Vec::with_capacity(batch.logit_rows.len() * self.vocab_size);
        for &row in &batch.logit_rows {
            let (s, pos) = owner[row as usize];
            if !self.whole_context {
                let token = batch.token_ids[row as usize] as usize % self.vocab_size;
                logits
                    .extend_from_slice(&self.last_token_logits[token * self.vocab_size..(token + 1) * self.vocab_size]);
                continue;
            }
            let table = batch.block_table(s);
            let history: Vec<(u32, u32)> = (0..=pos).map(|j| slots[table[j / bs] as usize * bs + j % bs]).collect();
            if history.contains(&UNWRITTEN) {
                return Err(ModelError::Batch(format!("row {row} reads a cache slot nothing wrote")));
            }
            let nan = self.faults.apply(history[0].0, row)?;
            let start = logits.len();
            logits.extend(self.logits_of(history));
            if nan {
                logits[start..].fill(f32::NAN);
            }
        }
        Ok(self
            .backend
            .upload(&HostTensor::from_f32(&logits, &[batch.logit_rows.len(), self.vocab_size]), DType::F32)?)
    }

    fn feeds_tokens(&self) -> bool {
        true
    }

    /// Reads the ids through the backend's gather, then runs as [`Self::forward`].
    fn forward_fed(
        &self,
        batch: &ForwardBatch,
        tokens: &Tensor,
        rows: &[u32],
        kv: &mut dyn KvCache,
    ) -> Result<Tensor, ModelError> {
        let ids = self.backend.download_u32(&self.backend.gather_u32(tokens, rows)?)?;
        if ids.len() != batch.num_tokens() {
            return Err(ModelError::Batch(format!("{} fed ids for a batch of {} rows", ids.len(), batch.num_tokens())));
        }
        self.forward(&ForwardBatch { token_ids: ids, ..batch.clone() }, kv)
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn kv_layout(&self) -> KvLayout {
        Self::layout()
    }

    fn max_context(&self) -> usize {
        self.max_context
    }
}
