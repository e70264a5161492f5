//! Decode steps with LoRA adapters replayed from CUDA graphs give the eager steps' logits,
//! bit for bit, while the adapters change between replays.
//!
//! Compiled with the `cuda` feature and run on the GPU machine. The llama fixture is
//! loaded twice on the GPU, each copy with its own adapter slots and the fixture's two
//! PEFT adapters (`tests/fixtures/lora`: rank 8, and rank 16 rank-stabilised), and so are
//! the hybrids with theirs (gated attention's split `q_proj`, the Gated DeltaNet
//! projections, the dense MLP or shared expert, Qwen3-Next's routed experts; their state
//! pools end equal too) and qwen3_moe with its adapters on routed experts; graphs are
//! captured on one copy only, after its slots are attached. Both run the same greedy steps,
//! in which every sequence moves to another adapter (or the base model) at every step, and
//! halfway one adapter is unloaded and another loaded into the slot it freed, so replays
//! read slots rewritten since the recording. Every step's logits must be equal, not close:
//! a replay issues the eager step's kernels, base and padding rows are skipped by the
//! LoRA kernels, and each adapted row's delta is computed from that row alone.

#![cfg(feature = "cuda")]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use met_cache::{KvCache, PagedKvCache, SequenceBlocks, StateSizing};
use met_config::ModelConfig;
use met_kernels::{CudaBackend, GpuBackend};
use met_model_layers::lora::{Adapter, LoraAdapter, LoraLimits, LoraPool};
use met_model_layers::runner::argmax;
use met_model_layers::{ForwardBatch, GraphCapture, GraphSettings, LoadOptions, LogitRows, Model, load_model};
use met_model_weights::SafetensorsStore;

const STEPS: usize = 16;
/// The step before which adapter 0 is unloaded and adapter 2 loaded into its slot.
const SWAP: usize = 8;

/// The fixtures: the parent of `MET_HF_FIXTURES` when set (the GPU bundle points it at the tree's).
fn fixtures() -> PathBuf {
    std::env::var_os("MET_HF_FIXTURES")
        .map(|hf| PathBuf::from(hf).join(".."))
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"))
}

/// A base fixture (under `hf/`), the folder of its adapters and their names.
#[derive(Clone, Copy)]
struct Fixture {
    base: &'static str,
    lora: &'static str,
    adapters: [&'static str; 2],
}

const LLAMA: Fixture = Fixture { base: "llama", lora: "lora", adapters: ["r8", "r16_rslora"] };

/// One copy of the model with its slots, cache and adapters (`None` once unloaded).
struct Side {
    fixture: Fixture,
    backend: Arc<dyn GpuBackend>,
    model: Box<dyn Model>,
    cfg: ModelConfig,
    kv: PagedKvCache,
    pool: Arc<LoraPool>,
    adapters: Vec<Option<Adapter>>,
}

/// A sequence: its tokens, how many the cache holds, its blocks.
type Seq = (Vec<u32>, usize, SequenceBlocks);

impl Side {
    fn new(fixture: Fixture, backend: &Arc<dyn GpuBackend>, graphs: bool) -> Self {
        let dir = fixtures().join("hf").join(fixture.base);
        let cfg = met_model_layers::models::read_config(&dir.join("config.json")).unwrap();
        let store = SafetensorsStore::open(&dir).unwrap();
        let model = load_model(&cfg, &store, Arc::clone(backend), &LoadOptions::default()).unwrap();
        let pool = LoraPool::new(&cfg, Arc::clone(backend), LoraLimits { max_rank: 16 }, 3).unwrap();
        model.attach_lora(Arc::clone(&pool)).unwrap();
        let layout = model.kv_layout();
        let states = layout.state.map(|_| StateSizing { sequences: 8, snapshots: 0, interval: 0, rollback: 0 });
        let kv = PagedKvCache::with_states(&[&**backend], layout, 4, 512, false, states).unwrap();
        if graphs {
            let settings = GraphSettings { batch_sizes: vec![1, 2, 4, 8], max_context: 4096 };
            let capture = model.capture_graphs(&kv, &settings).unwrap();
            assert!(matches!(capture, GraphCapture::Captured { .. }), "{capture}");
        }
        let mut side = Self { fixture, backend: Arc::clone(backend), model, cfg, kv, pool, adapters: Vec::new() };
        for name in fixture.adapters {
            side.load(name);
        }
        side
    }

    fn load(&mut self, name: &str) {
        let dir = fixtures().join(self.fixture.lora).join(name);
        self.adapters.push(Some(Arc::new(LoraAdapter::load(name, &dir, &self.cfg, &self.pool).unwrap())));
    }

    fn sequences(&mut self, prompts: &[Vec<u32>]) -> Vec<Seq> {
        prompts.iter().map(|p| (p.clone(), 0, self.kv.new_sequence())).collect()
    }

    /// One step of every sequence, `pick(i)` the adapter of sequence `i`: its logits, and
    /// each sequence's greedy token appended.
    fn step(&mut self, seqs: &mut [Seq], pick: impl Fn(usize) -> Option<usize>) -> Vec<f32> {
        let mut batch = ForwardBatch::new();
        for (i, (tokens, done, blocks)) in seqs.iter_mut().enumerate() {
            self.kv.reserve(blocks, tokens.len()).unwrap();
            batch.push(&tokens[*done..], *done, blocks, LogitRows::Last);
            if let Some(a) = pick(i) {
                batch.adapt_last(self.adapters[a].as_ref().expect("a loaded adapter"));
            }
            *done = tokens.len();
        }
        let logits = self.backend.download_f32(&self.model.forward(&batch, &mut self.kv).unwrap()).unwrap();
        for ((tokens, _, _), row) in seqs.iter_mut().zip(logits.chunks_exact(self.model.vocab_size())) {
            tokens.push(argmax(row));
        }
        logits
    }

    /// Unloads adapter 0 and loads another into the slot it frees.
    fn swap(&mut self) {
        let free = self.pool.free_slots();
        self.adapters[0] = None;
        assert_eq!(self.pool.free_slots(), free + 1, "an adapter no step holds frees its slot");
        self.load(self.fixture.adapters[0]);
    }
}

/// Prompts of the given lengths, token ids spread over the vocabulary.
fn prompts(lengths: &[usize], vocab: usize) -> Vec<Vec<u32>> {
    lengths
        .iter()
        .enumerate()
        .map(|(p, &n)| (0..n).map(|i| ((i * 7919 + p * 104_729 + 13) % vocab) as u32).collect())
        .collect()
}

/// Sequence `i`'s adapter at `step`: base, then each loaded adapter, in turn.
fn pick(step: usize, i: usize) -> Option<usize> {
    let choices = if step < SWAP { [None, Some(0), Some(1)] } else { [None, Some(2), Some(1)] };
    choices[(i + step) % 3]
}

fn check(fixture: Fixture, lengths: &[usize]) -> u64 {
    let backend: Arc<dyn GpuBackend> = Arc::new(CudaBackend::new().expect("these tests need a CUDA GPU"));
    let (mut eager, mut graphed) = (Side::new(fixture, &backend, false), Side::new(fixture, &backend, true));
    let prompts = prompts(lengths, eager.cfg.vocab_size);
    let (mut eager_seqs, mut graphed_seqs) = (eager.sequences(&prompts), graphed.sequences(&prompts));
    let before = graphed.model.graph_replays();
    for step in 0..STEPS {
        if step == SWAP {
            eager.swap();
            graphed.swap();
        }
        let want = eager.step(&mut eager_seqs, |i| pick(step, i));
        let got = graphed.step(&mut graphed_seqs, |i| pick(step, i));
        assert!(got == want, "{} lengths {lengths:?}, step {step}: graphed logits differ from eager", fixture.base);
    }
    let states = |side: &Side| -> Vec<Vec<f32>> {
        side.kv.pools(0).state_pools().iter().map(|p| side.backend.download_f32(p).unwrap()).collect()
    };
    assert!(states(&eager) == states(&graphed), "{}: the state pools differ", fixture.base);
    let replays = graphed.model.graph_replays() - before;
    eprintln!(
        "GPU-LORA-GRAPHS {} lengths {lengths:?}: {replays} of {STEPS} steps replayed; equal to eager",
        fixture.base
    );
    replays
}

/// Four sequences fill the 4-row graph; three are padded into it, the padding rows at no
/// slot.
#[test]
fn lora_decode_graphs_equal_eager_as_adapters_change() {
    assert_eq!(check(LLAMA, &[10, 37, 90, 5]), STEPS as u64 - 1);
    assert_eq!(check(LLAMA, &[12, 61, 3]), STEPS as u64 - 1);
}

/// The hybrids' adapters replay too, Qwen3-Next's on its routed experts included (their
/// deltas read from the pool's device tables).
#[test]
fn hybrid_lora_decode_graphs_equal_eager_as_adapters_change() {
    for (base, lora) in
        [("qwen3_5", "lora_qwen3_5"), ("qwen3_5_moe", "lora_qwen3_5_moe"), ("qwen3_next", "lora_qwen3_next")]
    {
        let fixture = Fixture { base, lora, adapters: ["all", "linear"] };
        assert_eq!(check(fixture, &[12, 61, 3]), STEPS as u64 - 1);
    }
}

/// Adapters on routed experts, in both of PEFT's layouts, replay as the slots change.
#[test]
fn expert_lora_decode_graphs_equal_eager_as_adapters_change() {
    let fixture = Fixture { base: "qwen3_moe", lora: "lora_moe", adapters: ["params", "modules"] };
    assert_eq!(check(fixture, &[10, 37, 90, 5]), STEPS as u64 - 1);
}
