//! Block bookkeeping of `PagedKvCache` at serving scale: the host work the scheduler does
//! around every step, which must stay far below a GPU decode step.
//!
//! - `reserve_drop`: 256 sequences of 2,048 tokens (blocks of 16: 32,768 blocks) reserved
//!   and then dropped, either in one `reserve` per sequence (admitting whole prompts) or one
//!   block at a time round-robin over the sequences (what decoding does as each sequence
//!   crosses a block boundary).
//! - `commit`: the prefix hash chain over the 128 full blocks of a 2,048-token sequence,
//!   on a cache that has not seen the tokens (hash and register every block) and on one
//!   that already holds them (hash and find the block already registered).
//! - `match_prefix`: a new 2,112-token prompt whose first 2,048 tokens are cached, matched
//!   on a warm cache while the prefix's owner still runs (refcounts only) and after it has
//!   finished (every block comes back out of the least-recently-freed list). The time
//!   includes dropping the new sequence, which returns the references it took.
//!
//! Throughput is `Throughput::Elements`: blocks for `reserve_drop`, tokens otherwise. The
//! pools are one layer of one 1-element head, since bookkeeping never reads them. `commit`
//! sets up each iteration on its own (`BatchSize::PerIteration`): a batch of reserved
//! sequences would not fit in one cache.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use met_cache::{DEFAULT_BLOCK_SIZE, KvCache, KvLayout, PagedKvCache, SequenceBlocks};
use met_kernels::{CpuBackend, DType};

const SEQS: usize = 256;
const SEQ_TOKENS: usize = 2048;
const BLOCKS_PER_SEQ: usize = SEQ_TOKENS / DEFAULT_BLOCK_SIZE;
/// Tokens a prompt adds after the shared prefix in `match_prefix`.
const OWN_TOKENS: usize = 64;

/// A cache of `blocks` blocks of 16 tokens with prefix caching on.
fn cache(blocks: usize) -> PagedKvCache {
    let layout = KvLayout { num_layers: 1, num_kv_heads: 1, head_dim: 1, dtype: DType::F32, state: None };
    PagedKvCache::new(&CpuBackend::new(), layout, DEFAULT_BLOCK_SIZE, blocks, true).expect("a valid cache")
}

/// `len` token ids starting at `first`, as distinct as a real prompt's blocks.
fn tokens(first: u32, len: usize) -> Vec<u32> {
    (first..).take(len).collect()
}

/// A sequence holding `tokens` with all of them computed and committed.
fn committed(c: &PagedKvCache, tokens: &[u32]) -> SequenceBlocks {
    let mut seq = c.new_sequence();
    c.reserve(&mut seq, tokens.len()).expect("the cache holds the sequence");
    c.commit(&mut seq, tokens, tokens.len());
    seq
}

/// 256 sequences of 2,048 tokens reserved and dropped, at once or a block at a time.
fn reserve_drop(c: &mut Criterion) {
    let kv = cache(SEQS * BLOCKS_PER_SEQ);
    let mut group = c.benchmark_group("reserve_drop");
    group.throughput(Throughput::Elements((SEQS * BLOCKS_PER_SEQ) as u64));
    group.bench_function(format!("{SEQS}x{SEQ_TOKENS}/at_once"), |b| {
        b.iter(|| {
            let seqs: Vec<SequenceBlocks> = (0..SEQS)
                .map(|_| {
                    let mut seq = kv.new_sequence();
                    kv.reserve(&mut seq, black_box(SEQ_TOKENS)).expect("blocks for every sequence");
                    seq
                })
                .collect();
            drop(seqs);
        });
    });
    group.bench_function(format!("{SEQS}x{SEQ_TOKENS}/block_by_block"), |b| {
        b.iter(|| {
            let mut seqs: Vec<SequenceBlocks> = (0..SEQS).map(|_| kv.new_sequence()).collect();
            for block in 1..=BLOCKS_PER_SEQ {
                for seq in &mut seqs {
                    kv.reserve(seq, black_box(block * DEFAULT_BLOCK_SIZE)).expect("blocks for every sequence");
                }
            }
            drop(seqs);
        });
    });
    assert_eq!(kv.num_free_blocks(), kv.num_blocks(), "every block came back");
    group.finish();
}

/// Hashing and registering the full blocks of one 2,048-token sequence.
fn commit(c: &mut Criterion) {
    let prompt = tokens(1000, SEQ_TOKENS);
    let mut group = c.benchmark_group("commit");
    group.throughput(Throughput::Elements(SEQ_TOKENS as u64));
    group.bench_function(format!("{SEQ_TOKENS}/new_prefix"), |b| {
        b.iter_batched(
            || {
                let kv = cache(BLOCKS_PER_SEQ);
                let mut seq = kv.new_sequence();
                kv.reserve(&mut seq, SEQ_TOKENS).expect("the cache holds the sequence");
                (kv, seq)
            },
            |(kv, mut seq)| {
                kv.commit(&mut seq, black_box(&prompt), SEQ_TOKENS);
                (kv, seq)
            },
            BatchSize::PerIteration,
        );
    });
    // Another sequence computed the same tokens into blocks of its own (prefix caching
    // was not used to admit this one): each block is hashed and found already registered.
    let kv = cache(2 * BLOCKS_PER_SEQ);
    let _owner = committed(&kv, &prompt);
    group.bench_function(format!("{SEQ_TOKENS}/known_prefix"), |b| {
        b.iter_batched(
            || {
                let mut seq = kv.new_sequence();
                kv.reserve(&mut seq, SEQ_TOKENS).expect("the cache holds the sequence");
                seq
            },
            |mut seq| {
                kv.commit(&mut seq, black_box(&prompt), SEQ_TOKENS);
                seq
            },
            BatchSize::PerIteration,
        );
    });
    group.finish();
}

/// Matching a prompt whose 2,048-token prefix is cached, with its owner alive or finished.
fn match_prefix(c: &mut Criterion) {
    let shared = tokens(1000, SEQ_TOKENS);
    let prompt: Vec<u32> = shared.iter().copied().chain(tokens(900_000, OWN_TOKENS)).collect();
    let mut group = c.benchmark_group("match_prefix");
    group.throughput(Throughput::Elements(prompt.len() as u64));
    for owner_alive in [true, false] {
        let kv = cache(4 * BLOCKS_PER_SEQ);
        let owner = committed(&kv, &shared);
        // Unrelated finished sequences fill the least-recently-freed list around the prefix.
        for i in 0..2 {
            drop(committed(&kv, &tokens(100_000 * (i + 1), SEQ_TOKENS)));
        }
        // With the owner finished, its blocks are the most recently freed.
        let owner = owner_alive.then_some(owner);
        let name = if owner.is_some() { "owner_running" } else { "owner_finished" };
        group.bench_function(format!("{}_of_{}/{name}", SEQ_TOKENS, prompt.len()), |b| {
            b.iter(|| {
                let mut seq = kv.new_sequence();
                let hit = kv.match_prefix(&mut seq, black_box(&prompt), prompt.len() - 1);
                assert_eq!(hit, SEQ_TOKENS, "the whole shared prefix is cached");
                // Dropped here, so that with the owner finished every iteration takes the
                // blocks out of the free list and puts them back.
                drop(seq);
            });
        });
        drop(owner);
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = reserve_drop, commit, match_prefix
}
criterion_main!(benches);
