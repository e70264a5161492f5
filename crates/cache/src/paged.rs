//! `PagedKvCache`: per-layer K/V pools of fixed-size blocks, on one device or one set per
//! tensor-parallel rank under a single block manager.

use std::sync::Arc;

use met_kernels::GpuBackend;
use parking_lot::Mutex;

use crate::block::BlockPool;
use crate::state::StateSlots;
use crate::{CacheError, KvCache, KvLayout, KvPools, OutOfBlocks, SequenceBlocks, StateSizing, StateUsage};

/// The paged KV cache: `num_blocks` blocks of `block_size` tokens in every layer's pools,
/// on one device or, for a tensor-parallel model, on each rank's device.
pub struct PagedKvCache {
    layout: KvLayout,
    block_size: usize,
    /// One set of pools per rank.
    ranks: Vec<KvPools>,
    blocks: Arc<Mutex<BlockPool>>,
}

impl PagedKvCache {
    /// Allocates zeroed pools of `num_blocks` blocks on `backend`, with the prefix cache
    /// on or off.
    ///
    /// # Errors
    /// [`CacheError::Config`] for a zero block size or block count;
    /// [`CacheError::Kernels`] when the device cannot hold the pools.
    pub fn new(
        backend: &dyn GpuBackend,
        layout: KvLayout,
        block_size: usize,
        num_blocks: usize,
        prefix_caching: bool,
    ) -> Result<Self, CacheError> {
        Self::sharded(&[backend], layout, block_size, num_blocks, prefix_caching)
    }

    /// [`Self::new`] for a tensor-parallel model: pools of `layout` (one rank's heads) on
    /// each rank's backend, in rank order, under one block manager, so that a block id and
    /// a slot mean the same tokens on every rank.
    ///
    /// # Errors
    /// As [`Self::new`], and [`CacheError::Config`] for no backend.
    pub fn sharded(
        backends: &[&dyn GpuBackend],
        layout: KvLayout,
        block_size: usize,
        num_blocks: usize,
        prefix_caching: bool,
    ) -> Result<Self, CacheError> {
        if layout.state.is_some() {
            return Err(CacheError::Config("a layout with recurrent state needs state slots (`with_states`)".into()));
        }
        Self::with_states(backends, layout, block_size, num_blocks, prefix_caching, None)
    }

    /// [`Self::sharded`] for any layout: with recurrent state, `states` says how many slots
    /// to allocate per state pool (it must be given then, and only then).
    ///
    /// # Errors
    /// As [`Self::sharded`], and [`CacheError::Config`] when `states` and the layout
    /// disagree, or no sequence slot is asked for.
    pub fn with_states(
        backends: &[&dyn GpuBackend],
        layout: KvLayout,
        block_size: usize,
        num_blocks: usize,
        prefix_caching: bool,
        states: Option<StateSizing>,
    ) -> Result<Self, CacheError> {
        match (&layout.state, &states) {
            (Some(_), Some(s)) if s.sequences > 0 => {}
            (None, None) => {}
            _ => {
                return Err(CacheError::Config(format!(
                    "state sizing {states:?} does not fit the layout's recurrent state {:?}",
                    layout.state
                )));
            }
        }
        if block_size == 0 || num_blocks == 0 || backends.is_empty() {
            return Err(CacheError::Config(format!(
                "{num_blocks} blocks of {block_size} tokens on {} ranks hold nothing",
                backends.len()
            )));
        }
        if u32::try_from(num_blocks * block_size).is_err() {
            return Err(CacheError::Config(format!("{num_blocks} blocks of {block_size} overflow u32 slots")));
        }
        let dims = [num_blocks, block_size, layout.num_kv_heads, layout.head_dim];
        let pools = |b: &&dyn GpuBackend| {
            let layers = (0..layout.num_layers)
                .map(|_| Ok((b.zeros(&dims, layout.dtype)?, b.zeros(&dims, layout.dtype)?)))
                .collect::<Result<_, met_kernels::Error>>()?;
            let state_pools = match (layout.state, states) {
                (Some(s), Some(sizing)) => {
                    let slots = sizing.slots();
                    let [c, w] = s.conv;
                    let [h, dk, dv] = s.recurrent;
                    (0..s.num_layers)
                        .map(|_| {
                            Ok((
                                b.zeros(&[slots, c, w], s.conv_dtype)?,
                                b.zeros(&[slots, h, dk, dv], s.recurrent_dtype)?,
                            ))
                        })
                        .collect::<Result<_, met_kernels::Error>>()?
                }
                _ => Vec::new(),
            };
            Ok::<_, met_kernels::Error>(KvPools::with_states(layers, state_pools))
        };
        let ranks = backends.iter().map(pools).collect::<Result<_, _>>()?;
        let pool = BlockPool::new(num_blocks, prefix_caching, states.map(StateSlots::new));
        Ok(Self { layout, block_size, ranks, blocks: Arc::new(Mutex::new(pool)) })
    }

    /// How many blocks fit in `bytes` of device memory.
    pub fn blocks_for_bytes(layout: &KvLayout, block_size: usize, bytes: usize) -> usize {
        bytes / layout.bytes_per_block(block_size).max(1)
    }
}

impl KvCache for PagedKvCache {
    fn layout(&self) -> KvLayout {
        self.layout
    }

    fn block_size(&self) -> usize {
        self.block_size
    }

    fn num_blocks(&self) -> usize {
        self.blocks.lock().num_blocks()
    }

    fn num_free_blocks(&self) -> usize {
        self.blocks.lock().num_free()
    }

    fn new_sequence(&self) -> SequenceBlocks {
        SequenceBlocks::new(Arc::clone(&self.blocks), self.block_size)
    }

    fn reserve(&self, seq: &mut SequenceBlocks, tokens: usize) -> Result<(), OutOfBlocks> {
        seq.grow(tokens)
    }

    fn prefix_caching(&self) -> bool {
        self.blocks.lock().prefix_caching()
    }

    fn match_prefix(&self, seq: &mut SequenceBlocks, tokens: &[u32], limit: usize) -> usize {
        seq.match_prefix(tokens, limit)
    }

    fn commit(&self, seq: &mut SequenceBlocks, tokens: &[u32], computed: usize) {
        seq.commit(tokens, computed);
    }

    fn allow_rollback(&self, seq: &mut SequenceBlocks, from: usize, to: usize) -> bool {
        seq.allow_rollback(from, to)
    }

    fn fork(&self, seq: &SequenceBlocks, tokens: usize) -> SequenceBlocks {
        seq.fork(tokens)
    }

    fn state_usage(&self) -> Option<StateUsage> {
        let layout = self.layout.state?;
        self.blocks.lock().states.as_ref().map(|s| s.usage(&layout))
    }

    fn num_ranks(&self) -> usize {
        self.ranks.len()
    }

    fn pools(&self, rank: usize) -> &KvPools {
        &self.ranks[rank]
    }
}

#[cfg(test)]
mod tests {
    use met_kernels::{CpuBackend, DType};
    use proptest::prelude::*;

    use super::*;

    fn cache(blocks: usize) -> PagedKvCache {
        cache_with(blocks, true)
    }

    fn cache_with(blocks: usize, prefix_caching: bool) -> PagedKvCache {
        let layout = KvLayout { num_layers: 2, num_kv_heads: 2, head_dim: 4, dtype: DType::F32, state: None };
        PagedKvCache::new(&CpuBackend::new(), layout, 4, blocks, prefix_caching).unwrap()
    }

    #[test]
    fn pools_have_the_paged_shape() {
        let c = cache(3);
        let (k, v) = c.layer(1);
        assert_eq!(k.dims(), [3, 4, 2, 4]);
        assert_eq!(v.dims(), [3, 4, 2, 4]);
    }

    #[test]
    fn reserve_maps_slots_through_the_block_table() {
        let c = cache(4);
        let mut a = c.new_sequence();
        let mut b = c.new_sequence();
        c.reserve(&mut a, 3).unwrap();
        c.reserve(&mut b, 5).unwrap();
        c.reserve(&mut a, 6).unwrap();
        assert_eq!(a.block_ids().len(), 2);
        assert_eq!(b.block_ids().len(), 2);
        let block = |s: &SequenceBlocks, i: usize| s.block_ids()[i].0;
        assert_eq!(a.slot(0), block(&a, 0) * 4);
        assert_eq!(a.slot(5), block(&a, 1) * 4 + 1);
        assert_eq!(b.slot(4), block(&b, 1) * 4);
        assert_eq!(c.num_free_blocks(), 0);
    }

    #[test]
    fn reserve_is_all_or_nothing() {
        let c = cache(2);
        let mut a = c.new_sequence();
        let err = c.reserve(&mut a, 9).unwrap_err();
        assert_eq!(err, OutOfBlocks { needed: 3, free: 2 });
        assert!(a.block_ids().is_empty());
        assert_eq!(c.num_free_blocks(), 2);
    }

    #[test]
    fn truncating_returns_the_blocks_past_the_kept_tokens() {
        let c = cache(4);
        let mut a = c.new_sequence();
        c.reserve(&mut a, 13).unwrap();
        let head = a.block_ids()[..2].to_vec();
        a.truncate(6);
        assert_eq!(a.block_ids(), head, "6 tokens keep the first two blocks");
        assert_eq!(c.num_free_blocks(), 2);
        a.truncate(8);
        assert_eq!(a.block_ids().len(), 2, "truncating never grows");
        a.truncate(0);
        assert_eq!(c.num_free_blocks(), 4);
        c.reserve(&mut a, 5).unwrap();
        assert_eq!(c.num_free_blocks(), 2);
    }

    #[test]
    fn dropping_a_sequence_frees_its_blocks() {
        let c = cache(3);
        let mut a = c.new_sequence();
        c.reserve(&mut a, 12).unwrap();
        assert!(!c.can_allocate(1));
        drop(a);
        assert_eq!(c.num_free_blocks(), 3);
    }

    #[test]
    fn a_sharded_cache_holds_each_ranks_pools_under_one_block_table() {
        let layout = KvLayout { num_layers: 2, num_kv_heads: 1, head_dim: 4, dtype: DType::F32, state: None };
        let (a, b) = (CpuBackend::new(), CpuBackend::new());
        let c = PagedKvCache::sharded(&[&a, &b], layout, 4, 3, false).unwrap();
        assert_eq!(c.num_ranks(), 2);
        for rank in 0..2 {
            let pools = c.pools(rank);
            assert_eq!((pools.num_layers(), pools.num_blocks(), pools.block_size()), (2, 3, 4));
            assert_eq!(pools.layer(1).0.dims(), [3, 4, 1, 4]);
        }
        assert!(!c.pools(0).layer(0).0.same_storage(c.pools(1).layer(0).0), "each rank has its own pools");
        assert!(c.layer(1).0.same_storage(c.pools(0).layer(1).0), "`layer` is rank 0's");
        let mut s = c.new_sequence();
        c.reserve(&mut s, 9).unwrap();
        assert_eq!(c.num_free_blocks(), 0, "one reservation covers every rank");
        assert!(PagedKvCache::sharded(&[], layout, 4, 3, false).is_err());
    }

    #[test]
    fn zero_sized_caches_are_rejected() {
        let layout = KvLayout { num_layers: 1, num_kv_heads: 1, head_dim: 2, dtype: DType::F32, state: None };
        assert!(PagedKvCache::new(&CpuBackend::new(), layout, 0, 4, true).is_err());
        assert!(PagedKvCache::new(&CpuBackend::new(), layout, 16, 0, true).is_err());
    }

    /// Runs a sequence over `tokens`: match, reserve, commit everything.
    fn run(c: &PagedKvCache, tokens: &[u32]) -> (SequenceBlocks, usize) {
        let mut s = c.new_sequence();
        let hit = c.match_prefix(&mut s, tokens, tokens.len() - 1);
        c.reserve(&mut s, tokens.len()).unwrap();
        c.commit(&mut s, tokens, tokens.len());
        (s, hit)
    }

    #[test]
    fn namespaces_share_prefix_blocks_only_within_themselves() {
        let c = cache(16);
        let tokens: Vec<u32> = (0..9).collect();
        let in_ns = |ns: u64| {
            let mut s = c.new_sequence().in_namespace(ns);
            let hit = c.match_prefix(&mut s, &tokens, tokens.len() - 1);
            c.reserve(&mut s, tokens.len()).unwrap();
            c.commit(&mut s, &tokens, tokens.len());
            (s, hit)
        };
        let (_base, _) = in_ns(0);
        let (adapter, hit) = in_ns(7);
        assert_eq!(hit, 0, "an adapter's sequence reused the base model's blocks");
        let (_other, hit) = in_ns(8);
        assert_eq!(hit, 0, "one adapter's sequence reused another's blocks");
        let (_same, hit) = in_ns(7);
        assert_eq!(hit, 8, "two sequences of one adapter share their full blocks");
        let mut fork = c.fork(&adapter, 9);
        c.reserve(&mut fork, 9).unwrap();
        c.commit(&mut fork, &tokens, 9);
        let (_again, hit) = in_ns(0);
        assert_eq!(hit, 8, "the base model's blocks stay its own");
    }

    #[test]
    fn a_shared_prefix_reuses_full_blocks() {
        let c = cache(8);
        let a: Vec<u32> = (0..10).collect();
        let (sa, hit) = run(&c, &a);
        assert_eq!(hit, 0);
        let mut b = a[..8].to_vec();
        b.extend([99, 98, 97]);
        let (sb, hit) = run(&c, &b);
        assert_eq!(hit, 8, "two full blocks of 4 are shared");
        assert_eq!(sa.block_ids()[..2], sb.block_ids()[..2]);
        assert_ne!(sa.block_ids()[2], sb.block_ids()[2]);
        // 3 blocks for a + 1 new for b.
        assert_eq!(c.num_free_blocks(), 8 - 4);
    }

    #[test]
    fn the_last_token_is_always_computed() {
        let c = cache(8);
        let a: Vec<u32> = (0..8).collect();
        let _keep = run(&c, &a);
        let (_, hit) = run(&c, &a);
        assert_eq!(hit, 4, "an exact repeat still computes its last block");
    }

    #[test]
    fn freed_blocks_stay_cached_until_evicted() {
        let c = cache(4);
        let a: Vec<u32> = (0..8).collect();
        drop(run(&c, &a));
        assert_eq!(c.num_free_blocks(), 4);
        let (s, hit) = run(&c, &[a.clone(), vec![50]].concat());
        assert_eq!(hit, 8);
        drop(s);
        // Fill the pool with other tokens: the cached blocks are evicted.
        let other: Vec<u32> = (100..116).collect();
        drop(run(&c, &other));
        let (_, hit) = run(&c, &[a, vec![50]].concat());
        assert_eq!(hit, 0);
    }

    #[test]
    fn prefix_caching_off_shares_nothing() {
        let c = cache_with(8, false);
        let a: Vec<u32> = (0..10).collect();
        let _keep = run(&c, &a);
        assert_eq!(run(&c, &a).1, 0);
        assert!(!c.prefix_caching());
    }

    #[test]
    fn forks_share_full_blocks_and_release_them_once_each() {
        let c = cache_with(8, false);
        let a: Vec<u32> = (0..10).collect();
        let (s, _) = run(&c, &a);
        let f = c.fork(&s, 10);
        assert_eq!(f.block_ids(), &s.block_ids()[..2]);
        assert_eq!(c.num_free_blocks(), 5);
        drop(s);
        assert_eq!(c.num_free_blocks(), 6, "only the unshared tail block is freed");
        drop(f);
        assert_eq!(c.num_free_blocks(), 8);
    }

    proptest! {
        /// Prefix matching never hands out a block whose contents differ from the
        /// matched tokens: each block's recorded writer must have written these tokens.
        #[test]
        fn prefix_hits_hold_the_matched_tokens(
            prompts in prop::collection::vec(prop::collection::vec(0u32..3, 1..20), 1..30),
            keep in prop::collection::vec(any::<bool>(), 30),
        ) {
            let c = cache(12);
            let mut contents: std::collections::HashMap<u32, Vec<u32>> = Default::default();
            let mut live = Vec::new();
            for (p, keep) in prompts.iter().zip(keep) {
                let mut s = c.new_sequence();
                let hit = c.match_prefix(&mut s, p, p.len() - 1);
                for (i, b) in s.block_ids().iter().enumerate() {
                    prop_assert_eq!(&contents[&b.0], &p[i * 4..(i + 1) * 4].to_vec());
                }
                if c.reserve(&mut s, p.len()).is_err() {
                    continue;
                }
                for (i, b) in s.block_ids().iter().enumerate().skip(hit / 4) {
                    let end = ((i + 1) * 4).min(p.len());
                    contents.insert(b.0, p[i * 4..end].to_vec());
                }
                c.commit(&mut s, p, p.len());
                if keep {
                    live.push(s);
                } else {
                    drop(s);
                }
                // Shared blocks count once per holder, so holders cover every used block.
                let held: usize = live.iter().map(|s: &SequenceBlocks| s.block_ids().len()).sum();
                prop_assert!(held >= 12 - c.num_free_blocks());
            }
            drop(live);
            prop_assert_eq!(c.num_free_blocks(), 12);
        }
    }

    proptest! {
        /// Random reserve/drop sequences keep held + free = total, never hand one block to
        /// two sequences, and free everything once every sequence is gone.
        #[test]
        fn blocks_are_conserved(ops in prop::collection::vec((0usize..6, 0usize..40, any::<bool>()), 1..60)) {
            let c = cache(16);
            let mut seqs: Vec<Option<SequenceBlocks>> = (0..6).map(|_| None).collect();
            for (i, tokens, drop_it) in ops {
                if drop_it {
                    seqs[i] = None;
                } else {
                    let s = seqs[i].get_or_insert_with(|| c.new_sequence());
                    let before = s.block_ids().to_vec();
                    match c.reserve(s, tokens) {
                        Ok(()) => prop_assert!(s.capacity() >= tokens),
                        Err(_) => prop_assert_eq!(s.block_ids(), &before[..]),
                    }
                }
                let mut held: Vec<u32> = seqs.iter().flatten().flat_map(|s| s.block_ids().iter().map(|b| b.0)).collect();
                let n = held.len();
                held.sort_unstable();
                held.dedup();
                prop_assert_eq!(held.len(), n, "a block is shared");
                prop_assert_eq!(n + c.num_free_blocks(), 16);
            }
            seqs.clear();
            prop_assert_eq!(c.num_free_blocks(), 16);
        }
    }
}
