//! Block bookkeeping: the shared pool of blocks, the prefix cache over full blocks, and
//! per-sequence block tables.
//!
//! A block is *free* when no sequence references it. Free blocks that hold a full,
//! hashed block of tokens stay findable by their hash (the prefix cache) until they are
//! handed out again; those are evicted least recently freed first, after blocks that
//! hold nothing reusable.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::OutOfBlocks;
use crate::state::{SequenceState, StateSlots};

/// A physical block of the K/V pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

/// Identity of a full block's contents: the hash chain up to it and its own tokens.
/// Hits compare the tokens too, so a hash collision can never alias two prefixes that
/// differ in this block.
#[derive(Debug, Clone, PartialEq, Eq)]
struct BlockKey {
    parent: u64,
    tokens: Box<[u32]>,
}

/// Chains `parent` with one block of tokens.
pub(crate) fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

#[derive(Debug, Default)]
struct BlockState {
    refcount: u32,
    /// Set while the block is registered in the prefix cache.
    hash: Option<u64>,
    /// Position in `free_cached` while free and hashed.
    freed_at: u64,
}

/// Refcounts, free lists and the prefix cache, shared by the cache and every live
/// [`SequenceBlocks`].
#[derive(Debug)]
pub(crate) struct BlockPool {
    blocks: Vec<BlockState>,
    /// Free blocks holding nothing reusable.
    free_plain: Vec<BlockId>,
    /// Free blocks still in the prefix cache, least recently freed first.
    free_cached: BTreeMap<u64, BlockId>,
    tick: u64,
    /// Hash of a full block → the block holding it, with its key for verification.
    cached: HashMap<u64, (BlockId, BlockKey)>,
    prefix_caching: bool,
    /// The recurrent-state slots of a hybrid model's cache.
    pub(crate) states: Option<StateSlots>,
}

impl BlockPool {
    pub(crate) fn new(num_blocks: usize, prefix_caching: bool, states: Option<StateSlots>) -> Self {
        Self {
            states,
            blocks: (0..num_blocks).map(|_| BlockState::default()).collect(),
            // Reversed so that `pop` hands out low ids first.
            free_plain: (0..num_blocks as u32).rev().map(BlockId).collect(),
            free_cached: BTreeMap::new(),
            tick: 0,
            cached: HashMap::new(),
            prefix_caching,
        }
    }

    pub(crate) fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    pub(crate) fn num_free(&self) -> usize {
        self.free_plain.len() + self.free_cached.len()
    }

    pub(crate) fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    /// Takes `n` free blocks, each with refcount 1, or none at all. Evicts cached blocks
    /// only when no plain free block is left.
    pub(crate) fn allocate(&mut self, n: usize) -> Result<Vec<BlockId>, OutOfBlocks> {
        if n > self.num_free() {
            return Err(OutOfBlocks { needed: n, free: self.num_free() });
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let b = match self.free_plain.pop() {
                Some(b) => b,
                None => {
                    let (_, b) = self.free_cached.pop_first().expect("counted above");
                    let hash = self.blocks[b.0 as usize].hash.take().expect("cached blocks are hashed");
                    self.cached.remove(&hash);
                    if let Some(states) = &mut self.states {
                        states.forget(hash);
                    }
                    b
                }
            };
            let state = &mut self.blocks[b.0 as usize];
            debug_assert_eq!(state.refcount, 0, "free block {b:?} was referenced");
            state.refcount = 1;
            out.push(b);
        }
        Ok(out)
    }

    /// A free snapshot slot, taking back the least recently freed snapshot of a block no
    /// sequence holds when none is free.
    fn take_snapshot_slot(&mut self) -> Option<u32> {
        let states = self.states.as_mut()?;
        if let Some(slot) = states.take_snapshot_slot() {
            return Some(slot);
        }
        let hash = self
            .free_cached
            .values()
            .filter_map(|b| self.blocks[b.0 as usize].hash)
            .find(|h| states.snapshot(*h).is_some())?;
        states.forget(hash);
        states.take_snapshot_slot()
    }

    /// Adds a reference to blocks some sequence already holds.
    pub(crate) fn share(&mut self, blocks: &[BlockId]) {
        for b in blocks {
            let state = &mut self.blocks[b.0 as usize];
            assert!(state.refcount > 0, "sharing unreferenced block {b:?}");
            state.refcount += 1;
        }
    }

    /// Drops one reference to each block, last block first, so that the tail of a
    /// sequence (the least shareable part) is evicted before its head.
    pub(crate) fn release(&mut self, blocks: &[BlockId]) {
        for &b in blocks.iter().rev() {
            let state = &mut self.blocks[b.0 as usize];
            assert!(state.refcount > 0, "block {b:?} released more often than referenced");
            state.refcount -= 1;
            if state.refcount > 0 {
                continue;
            }
            if state.hash.is_some() {
                self.tick += 1;
                state.freed_at = self.tick;
                self.free_cached.insert(self.tick, b);
            } else {
                self.free_plain.push(b);
            }
        }
    }

    /// The cached block holding `tokens` after the chain `parent`, referenced once more.
    fn lookup(&mut self, parent: u64, tokens: &[u32]) -> Option<(BlockId, u64)> {
        let hash = chain_hash(parent, tokens);
        let (b, key) = self.cached.get(&hash)?;
        if key.parent != parent || *key.tokens != *tokens {
            return None;
        }
        let b = *b;
        let state = &mut self.blocks[b.0 as usize];
        if state.refcount == 0 {
            self.free_cached.remove(&state.freed_at);
        }
        state.refcount += 1;
        Some((b, hash))
    }

    /// Registers `block` as holding `tokens` after the chain `parent`, unless an equal
    /// block is already registered. Returns the block's chain hash.
    fn register(&mut self, block: BlockId, parent: u64, tokens: &[u32]) -> u64 {
        let hash = chain_hash(parent, tokens);
        if self.prefix_caching && !self.cached.contains_key(&hash) && self.blocks[block.0 as usize].hash.is_none() {
            self.blocks[block.0 as usize].hash = Some(hash);
            self.cached.insert(hash, (block, BlockKey { parent, tokens: tokens.into() }));
        }
        hash
    }
}

/// The blocks of one sequence, in logical order. Dropping it releases them.
#[derive(Debug)]
pub struct SequenceBlocks {
    blocks: Vec<BlockId>,
    /// Chain hashes of the leading full blocks whose contents are final.
    hashes: Vec<u64>,
    /// The parent of its first block in the hash chain ([`Self::in_namespace`]).
    root: u64,
    block_size: usize,
    pool: Arc<Mutex<BlockPool>>,
    /// Its recurrent-state slot and snapshots (hybrid models' caches only).
    state: SequenceState,
}

impl SequenceBlocks {
    pub(crate) fn new(pool: Arc<Mutex<BlockPool>>, block_size: usize) -> Self {
        Self { blocks: Vec::new(), hashes: Vec::new(), root: 0, block_size, pool, state: SequenceState::default() }
    }

    /// The same empty table, its hash chain started from `namespace` rather than from the
    /// base model's 0: the K/V of one token prefix differs between namespaces (a LoRA
    /// adapter's sequences and the base model's), so sequences share prefix blocks only
    /// within one. Forks keep the namespace.
    ///
    /// # Panics
    /// If the table already holds blocks.
    #[must_use]
    pub fn in_namespace(mut self, namespace: u64) -> Self {
        assert!(self.blocks.is_empty(), "a namespace is chosen before the first block");
        self.root = if namespace == 0 { 0 } else { chain_hash(namespace, &[]) };
        self
    }

    /// The recurrent-state slot of this sequence: `None` before it first reserved room, and
    /// always for a cache without recurrent state.
    pub fn state_slot(&self) -> Option<u32> {
        self.state.slot
    }

    /// The snapshot slot this sequence's state starts from, and the tokens it covers (the
    /// cached prefix it matched); `None` when it starts from the zero state.
    pub fn state_restore(&self) -> Option<(u32, usize)> {
        self.state.restore
    }

    /// Snapshots to take: `(tokens, slot)` asks the step that computes token `tokens - 1`
    /// to copy the state after it into `slot`. Ascending.
    pub fn planned_snapshots(&self) -> &[(usize, u32)] {
        &self.state.planned
    }

    /// The coming speculative step's rollback copies, as [`Self::planned_snapshots`].
    pub fn rollback_snapshots(&self) -> &[(usize, u32)] {
        &self.state.rollback
    }

    /// See [`crate::KvCache::allow_rollback`].
    pub(crate) fn allow_rollback(&mut self, from: usize, to: usize) -> bool {
        self.state.rollback.clear();
        let pool = self.pool.lock();
        let (Some(states), Some(slot)) = (&pool.states, self.state.slot) else {
            return pool.states.is_none();
        };
        // The state after the step's last token is the sequence's own slot.
        for (j, tokens) in (from + 1..to).enumerate() {
            let Some(copy) = states.rollback_slot(slot, j) else {
                self.state.rollback.clear();
                return false;
            };
            self.state.rollback.push((tokens, copy));
        }
        true
    }

    /// The block table: physical block of each logical block.
    pub fn block_ids(&self) -> &[BlockId] {
        &self.blocks
    }

    /// Tokens the reserved blocks can hold.
    pub fn capacity(&self) -> usize {
        self.blocks.len() * self.block_size
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The flat pool slot (`block · block_size + offset`) of token position `pos`.
    ///
    /// # Panics
    /// If `pos` is past [`Self::capacity`]: reserve first.
    pub fn slot(&self, pos: usize) -> u32 {
        let block = self.blocks[pos / self.block_size].0 as usize;
        (block * self.block_size + pos % self.block_size) as u32
    }

    /// Grows the table to hold `tokens` tokens, all or nothing.
    pub(crate) fn grow(&mut self, tokens: usize) -> Result<(), OutOfBlocks> {
        let needed = tokens.div_ceil(self.block_size).saturating_sub(self.blocks.len());
        let shared = Arc::clone(&self.pool);
        let mut pool = shared.lock();
        let new_slot = match &mut pool.states {
            Some(states) if self.state.slot.is_none() => {
                Some(states.take_sequence_slot().ok_or(OutOfBlocks { needed: needed.max(1), free: 0 })?)
            }
            _ => None,
        };
        if needed > 0 {
            match pool.allocate(needed) {
                Ok(new) => self.blocks.extend(new),
                Err(e) => {
                    if let (Some(slot), Some(states)) = (new_slot, &mut pool.states) {
                        states.free_sequence_slot(slot);
                    }
                    return Err(e);
                }
            }
        }
        self.state.slot = self.state.slot.or(new_slot);
        self.plan_snapshots(&mut pool, tokens);
        Ok(())
    }

    /// Plans a snapshot at every `interval`-th block boundary up to `tokens` past what is
    /// already planned or cached, while snapshot slots last.
    fn plan_snapshots(&mut self, pool: &mut BlockPool, tokens: usize) {
        let interval = pool.states.as_ref().map_or(0, StateSlots::interval);
        if interval == 0 || !pool.prefix_caching() {
            return;
        }
        let every = interval * self.block_size;
        let done = self.state.planned.last().map_or(0, |p| p.0).max(self.hashes.len() * self.block_size);
        let mut at = (done / every + 1) * every;
        while at <= tokens {
            let Some(slot) = pool.take_snapshot_slot() else { return };
            self.state.planned.push((at, slot));
            at += every;
        }
    }

    /// Shrinks the table to the blocks that `tokens` tokens need, returning the rest to the
    /// pool: the slots of tokens a step computed but the sequence did not keep (rejected
    /// speculative tokens). Blocks registered in the prefix cache past the cut lose their
    /// place in this sequence's hash chain, so a later commit registers their replacements.
    pub fn truncate(&mut self, tokens: usize) {
        self.rewind_state(tokens);
        let keep = tokens.div_ceil(self.block_size);
        if keep >= self.blocks.len() {
            return;
        }
        let dropped = self.blocks.split_off(keep);
        self.hashes.truncate(tokens / self.block_size);
        let mut pool = self.pool.lock();
        pool.release(&dropped);
        let cut = self.state.planned.partition_point(|p| p.0 <= tokens);
        for (_, slot) in self.state.planned.drain(cut..) {
            pool.states.as_mut().expect("planned snapshots need state slots").free_snapshot_slot(slot);
        }
    }

    /// After a speculative step cut back to `tokens`: the next step starts from the
    /// rollback copy at `tokens` (none when the cut keeps every token the step computed).
    fn rewind_state(&mut self, tokens: usize) {
        if let Some(&(_, copy)) = self.state.rollback.iter().find(|r| r.0 == tokens) {
            self.state.restore = Some((copy, tokens));
        }
        self.state.rollback.clear();
    }

    /// Attaches cached blocks for the longest cached prefix of `tokens` (full blocks
    /// only, at most `limit` tokens). Only valid on an empty table. Returns the tokens
    /// covered.
    pub(crate) fn match_prefix(&mut self, tokens: &[u32], limit: usize) -> usize {
        assert!(self.blocks.is_empty(), "prefix matching needs an empty block table");
        let mut pool = self.pool.lock();
        if !pool.prefix_caching() {
            return 0;
        }
        let mut parent = self.root;
        for chunk in tokens[..limit.min(tokens.len())].chunks_exact(self.block_size) {
            let Some((b, hash)) = pool.lookup(parent, chunk) else { break };
            self.blocks.push(b);
            self.hashes.push(hash);
            parent = hash;
        }
        if let Some(states) = &pool.states {
            // A recurrent state resumes only where a snapshot holds it.
            let keep = self.hashes.iter().rposition(|h| states.snapshot(*h).is_some()).map_or(0, |i| i + 1);
            self.state.restore = keep
                .checked_sub(1)
                .map(|i| (states.snapshot(self.hashes[i]).expect("found above"), keep * self.block_size));
            let dropped = self.blocks.split_off(keep);
            self.hashes.truncate(keep);
            pool.release(&dropped);
        }
        self.blocks.len() * self.block_size
    }

    /// Registers the full blocks among the first `computed` tokens whose K/V is now in
    /// the cache, so later sequences can reuse them.
    pub(crate) fn commit(&mut self, tokens: &[u32], computed: usize) {
        let full = computed.min(tokens.len()) / self.block_size;
        if full <= self.hashes.len() {
            return;
        }
        let mut pool = self.pool.lock();
        if !pool.prefix_caching() {
            return;
        }
        for i in self.hashes.len()..full {
            let parent = self.hashes.last().copied().unwrap_or(self.root);
            let chunk = &tokens[i * self.block_size..(i + 1) * self.block_size];
            let hash = pool.register(self.blocks[i], parent, chunk);
            self.hashes.push(hash);
            let end = (i + 1) * self.block_size;
            if self.state.planned.first().is_some_and(|p| p.0 == end) {
                let (_, slot) = self.state.planned.remove(0);
                let registered = pool.cached.contains_key(&hash);
                let states = pool.states.as_mut().expect("planned snapshots need state slots");
                if registered { states.key(hash, slot) } else { states.free_snapshot_slot(slot) }
            }
        }
    }

    /// A new table sharing this one's first `tokens / block_size` full blocks.
    /// With recurrent state, only up to the last of those blocks that has a snapshot, which
    /// the new sequence starts from.
    pub(crate) fn fork(&self, tokens: usize) -> Self {
        let mut full = (tokens / self.block_size).min(self.blocks.len());
        let mut pool = self.pool.lock();
        let mut state = SequenceState::default();
        if let Some(states) = &pool.states {
            full = self.hashes[..full.min(self.hashes.len())]
                .iter()
                .rposition(|h| states.snapshot(*h).is_some())
                .map_or(0, |i| i + 1);
            state.restore = full
                .checked_sub(1)
                .map(|i| (states.snapshot(self.hashes[i]).expect("found above"), full * self.block_size));
        }
        let shared = self.blocks[..full].to_vec();
        pool.share(&shared);
        let hashes = self.hashes[..full.min(self.hashes.len())].to_vec();
        let (root, block_size, pool) = (self.root, self.block_size, Arc::clone(&self.pool));
        Self { blocks: shared, hashes, root, block_size, pool, state }
    }
}

impl Drop for SequenceBlocks {
    fn drop(&mut self) {
        let mut pool = self.pool.lock();
        pool.release(&self.blocks);
        if let Some(states) = &mut pool.states {
            if let Some(slot) = self.state.slot {
                states.free_sequence_slot(slot);
            }
            for &(_, slot) in &self.state.planned {
                states.free_snapshot_slot(slot);
            }
        }
    }
}
