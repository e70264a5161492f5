//! `TensorParallelModel`: the engine's one [`Model`] over the ranks of a tensor-parallel
//! group, so the scheduler, the KV cache's block manager and sampling stay single.
//!
//! Each rank is a worker thread that owns its shard of the model (a [`DecoderModel`] on its
//! own backend) and runs what it is sent, in order. A step hands every rank the same batch
//! and that rank's pools of the one KV cache, waits for all of them, and returns rank 0's
//! logits: every rank has the full logits after the head's all-gather, and rank 0's live on
//! the backend the engine samples with.
//!
//! Invariants: one step runs at a time, so every rank receives the same work in the same
//! order and its collectives pair with the other ranks'. A rank that fails aborts the group,
//! so no rank waits for it forever, and the model refuses every later step with a device
//! error (a group whose rank failed mid-step is in no state to continue), which the engine
//! treats as its own fault rather than a request's.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};

use met_cache::{KvCache, KvLayout, KvPools};
use met_config::ModelConfig;
use met_kernels::{Collective, GpuBackend, Tensor};
use met_model_weights::WeightStore;

use super::{Shard, check_world};
use crate::attention::attention_backend;
use crate::graphs::{GraphCapture, GraphSettings};
use crate::layers::decoder::{DecoderModel, StepIds, check_batch, check_cache};
use crate::models::check_store;
use crate::{ForwardBatch, LoadOptions, Model, ModelError, Result};

/// Checks `store` against `cfg`, then loads rank `i`'s share of the model onto
/// `backends[i]`, joined by `collectives[i]` (one of each per rank, in rank order; ranks
/// load in parallel), and starts a worker thread per rank.
///
/// # Errors
/// [`ModelError::Unsupported`] when `cfg` does not divide among the ranks
/// ([`check_world`]); [`ModelError::Parallel`] for mismatched ranks or a worker that cannot
/// start; the preflight report or any load failure.
pub fn load_tensor_parallel(
    cfg: &ModelConfig,
    store: &dyn WeightStore,
    backends: &[Arc<dyn GpuBackend>],
    collectives: &[Arc<dyn Collective>],
    options: &LoadOptions,
) -> Result<Box<dyn Model>> {
    let world = backends.len();
    let ranks_in_order = collectives.iter().enumerate().all(|(i, c)| c.rank() == i && c.world_size() == world);
    if collectives.len() != world || !ranks_in_order {
        return Err(ModelError::Parallel(format!(
            "{world} backends need one collective each, ranks 0 to {} of a group of {world}",
            world.saturating_sub(1)
        )));
    }
    check_world(cfg, world)?;
    check_store(cfg, store)?;
    let dequantized = crate::models::fp8_view(cfg, store);
    let store: &dyn WeightStore = dequantized.as_ref().map_or(store, |v| v);
    let shards = collectives.iter().map(|c| Shard::of(cfg, Arc::clone(c))).collect::<Result<Vec<_>>>()?;
    let load = |(shard, backend): (Shard, &Arc<dyn GpuBackend>)| {
        let attention = attention_backend(options.attention_backend, Arc::clone(backend));
        DecoderModel::load_shard(cfg, store, Arc::clone(backend), attention, shard)?
            .with_kv_cache_dtype(options.kv_cache_dtype)
    };
    let models = thread::scope(|s| {
        let loading: Vec<_> = shards.into_iter().zip(backends).map(|rank| s.spawn(move || load(rank))).collect();
        loading.into_iter().map(|h| h.join().unwrap_or_else(|panic| resume_unwind(panic))).collect::<Result<Vec<_>>>()
    })?;
    Ok(Box::new(TensorParallelModel::start(models, collectives.to_vec())?))
}

/// Work for one rank's thread.
type Task = Box<dyn FnOnce(&DecoderModel) + Send>;

/// What every rank runs in a step, given its rank and its shard.
type Work<T> = dyn Fn(usize, &DecoderModel) -> Result<T> + Send + Sync;

/// A rank's result, or its panic.
type Outcome<T> = thread::Result<Result<T>>;

/// One rank's worker thread and the channel that feeds it.
struct Worker {
    tasks: Option<mpsc::Sender<Task>>,
    thread: Option<JoinHandle<()>>,
}

/// A model split across the ranks of a tensor-parallel group (see the module docs).
pub struct TensorParallelModel {
    workers: Vec<Worker>,
    group: Vec<Arc<dyn Collective>>,
    /// Held for a whole step.
    step: Mutex<()>,
    /// The first rank to fail, and how; set once.
    failure: Arc<Mutex<Option<(usize, String)>>>,
    vocab_size: usize,
    kv_layout: KvLayout,
    max_context: usize,
}

impl TensorParallelModel {
    /// Starts a worker thread per rank, each owning its shard.
    fn start(models: Vec<DecoderModel>, group: Vec<Arc<dyn Collective>>) -> Result<Self> {
        let (vocab_size, kv_layout, max_context) =
            (models[0].vocab_size(), models[0].kv_layout(), models[0].max_context());
        let spawn = |(rank, model): (usize, DecoderModel)| {
            let (tasks, inbox) = mpsc::channel::<Task>();
            let thread = thread::Builder::new()
                .name(format!("met-rank-{rank}"))
                .spawn(move || inbox.into_iter().for_each(|task| task(&model)))
                .map_err(|e| ModelError::Parallel(format!("starting the thread of rank {rank}: {e}")))?;
            Ok(Worker { tasks: Some(tasks), thread: Some(thread) })
        };
        Ok(Self {
            workers: models.into_iter().enumerate().map(spawn).collect::<Result<_>>()?,
            group,
            step: Mutex::new(()),
            failure: Arc::new(Mutex::new(None)),
            vocab_size,
            kv_layout,
            max_context,
        })
    }

    /// Ranks in the group.
    pub fn world_size(&self) -> usize {
        self.workers.len()
    }

    /// Runs `work` on every rank at once and returns rank 0's result, after every rank has
    /// finished. A rank's failure aborts the group and ends tensor parallelism for good.
    fn on_every_rank<T: Send + 'static>(
        &self,
        work: impl Fn(usize, &DecoderModel) -> Result<T> + Send + Sync + 'static,
    ) -> Result<T> {
        let _one_step = lock(&self.step);
        if let Some((rank, why)) = lock(&self.failure).clone() {
            return Err(stopped(rank, &why));
        }
        let work: Arc<Work<T>> = Arc::new(work);
        let (results, outcomes) = mpsc::channel();
        for (rank, worker) in self.workers.iter().enumerate() {
            let task = self.task(rank, Arc::clone(&work), results.clone());
            if worker.tasks.as_ref().is_none_or(|t| t.send(task).is_err()) {
                // The ranks already sent this step wait in a collective: wake them.
                self.group[rank].abort();
                let why = "its worker thread has stopped";
                lock(&self.failure).get_or_insert((rank, why.into()));
                return Err(stopped(rank, why));
            }
        }
        drop(results);
        let mut by_rank: Vec<Option<Outcome<T>>> = self.workers.iter().map(|_| None).collect();
        for (rank, outcome) in outcomes {
            by_rank[rank] = Some(outcome);
        }
        self.rank_zero(by_rank)
    }

    /// Rank `rank`'s share of a step: runs `work`, and on failure records it and aborts the
    /// group before reporting its outcome to `results`.
    fn task<T: Send + 'static>(
        &self,
        rank: usize,
        work: Arc<Work<T>>,
        results: mpsc::Sender<(usize, Outcome<T>)>,
    ) -> Task {
        let (failure, collective) = (Arc::clone(&self.failure), Arc::clone(&self.group[rank]));
        Box::new(move |model| {
            let outcome = catch_unwind(AssertUnwindSafe(|| work(rank, model)));
            if let Some(why) = failure_of(&outcome) {
                // Recorded before the abort, so the rank that failed first is the one named,
                // not a rank the abort woke.
                lock(&failure).get_or_insert((rank, why));
                collective.abort();
            }
            // The step waits for every rank's outcome, so the receiver is still there.
            let _ = results.send((rank, outcome));
        })
    }

    /// Rank 0's result when every rank succeeded; else the first failing rank's error (or
    /// its panic, resumed here so the engine sees a panicking step).
    fn rank_zero<T>(&self, by_rank: Vec<Option<Outcome<T>>>) -> Result<T> {
        let mut failure = lock(&self.failure);
        if let Some(rank) = by_rank.iter().position(Option::is_none) {
            let why = "its worker thread has stopped".to_string();
            failure.get_or_insert((rank, why.clone()));
            return Err(stopped(rank, &why));
        }
        let index = failure.as_ref().map_or(0, |(rank, _)| *rank);
        drop(failure);
        let mut outcomes: Vec<Outcome<T>> = by_rank.into_iter().flatten().collect();
        match outcomes.swap_remove(index) {
            Ok(result) => result,
            Err(panic) => resume_unwind(panic),
        }
    }
}

/// `m` locked; a panic while it was held (a rank's, caught) leaves nothing half-done in it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Why an outcome failed, if it did.
fn failure_of<T>(outcome: &Outcome<T>) -> Option<String> {
    match outcome {
        Ok(Ok(_)) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(panic) => Some(match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
            (Some(s), _) => format!("panicked: {s}"),
            (_, Some(s)) => format!("panicked: {s}"),
            _ => "panicked".to_string(),
        }),
    }
}

/// The error of every step after rank `rank` failed: a device error, which the engine treats
/// as its own fault.
fn stopped(rank: usize, why: &str) -> ModelError {
    ModelError::Kernels(met_kernels::Error::Device(format!("tensor parallelism stopped: rank {rank} failed ({why})")))
}

impl Drop for TensorParallelModel {
    fn drop(&mut self) {
        // Closing each channel ends its worker's loop.
        for worker in &mut self.workers {
            drop(worker.tasks.take());
        }
        for worker in &mut self.workers {
            if let Some(thread) = worker.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

impl Model for TensorParallelModel {
    fn forward(&self, batch: &ForwardBatch, kv: &mut dyn KvCache) -> Result<Tensor> {
        check_cache(kv, self.kv_layout, self.world_size())?;
        check_batch(batch, self.max_context)?;
        // A rank maps ids outside its vocabulary share to a zero row, so an id outside
        // every share would quietly embed as zeros: refuse it here instead.
        if let Some(&id) = batch.token_ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            return Err(ModelError::Batch(format!("token id {id} is outside the vocabulary of {}", self.vocab_size)));
        }
        let batch = Arc::new(batch.clone());
        let pools = rank_pools(kv, self.world_size());
        self.on_every_rank(move |rank, model| model.forward_on(&batch, &pools[rank], StepIds::Host))
    }

    fn capture_graphs(&self, kv: &dyn KvCache, settings: &GraphSettings) -> Result<GraphCapture> {
        check_cache(kv, self.kv_layout, self.world_size())?;
        let (pools, settings) = (rank_pools(kv, self.world_size()), settings.clone());
        self.on_every_rank(move |rank, model| model.capture_on(&pools[rank], &settings))
    }

    fn graph_replays(&self) -> u64 {
        self.on_every_rank(|_, model| Ok(model.graph_replays())).unwrap_or(0)
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// One rank's share: its KV heads.
    fn kv_layout(&self) -> KvLayout {
        self.kv_layout
    }

    fn max_context(&self) -> usize {
        self.max_context
    }
}

/// Every rank's pools of `kv`, in rank order (handles, not copies).
fn rank_pools(kv: &dyn KvCache, ranks: usize) -> Arc<Vec<KvPools>> {
    Arc::new((0..ranks).map(|rank| kv.pools(rank).clone()).collect())
}
