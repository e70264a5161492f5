//! Block bookkeeping: the shared pool of free blocks and per-sequence block tables.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::OutOfBlocks;

/// A physical block of the K/V pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

/// Refcounts and the free list, shared by the cache and every live [`SequenceBlocks`].
#[derive(Debug)]
pub(crate) struct BlockPool {
    refcount: Vec<u32>,
    /// Free blocks, oldest release first, so recently freed blocks are reused last.
    free: VecDeque<BlockId>,
}

impl BlockPool {
    pub(crate) fn new(num_blocks: usize) -> Self {
        Self { refcount: vec![0; num_blocks], free: (0..num_blocks as u32).map(BlockId).collect() }
    }

    pub(crate) fn num_blocks(&self) -> usize {
        self.refcount.len()
    }

    pub(crate) fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Takes `n` free blocks, each with refcount 1, or none at all.
    pub(crate) fn allocate(&mut self, n: usize) -> Result<Vec<BlockId>, OutOfBlocks> {
        if n > self.free.len() {
            return Err(OutOfBlocks { needed: n, free: self.free.len() });
        }
        let blocks: Vec<BlockId> = self.free.drain(..n).collect();
        for b in &blocks {
            debug_assert_eq!(self.refcount[b.0 as usize], 0, "free block {b:?} was referenced");
            self.refcount[b.0 as usize] = 1;
        }
        Ok(blocks)
    }

    /// Drops one reference to each block; blocks reaching zero become free.
    pub(crate) fn release(&mut self, blocks: &[BlockId]) {
        for &b in blocks {
            let rc = &mut self.refcount[b.0 as usize];
            assert!(*rc > 0, "block {b:?} released more often than referenced");
            *rc -= 1;
            if *rc == 0 {
                self.free.push_back(b);
            }
        }
    }
}

/// The blocks of one sequence, in logical order. Dropping it frees them.
#[derive(Debug)]
pub struct SequenceBlocks {
    blocks: Vec<BlockId>,
    block_size: usize,
    pool: Arc<Mutex<BlockPool>>,
}

impl SequenceBlocks {
    pub(crate) fn new(pool: Arc<Mutex<BlockPool>>, block_size: usize) -> Self {
        Self { blocks: Vec::new(), block_size, pool }
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
        if needed > 0 {
            let new = self.pool.lock().allocate(needed)?;
            self.blocks.extend(new);
        }
        Ok(())
    }
}

impl Drop for SequenceBlocks {
    fn drop(&mut self) {
        self.pool.lock().release(&self.blocks);
    }
}
