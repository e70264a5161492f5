//! A draft model: a second, smaller [`Model`] with the target's vocabulary, run greedily
//! for `k` tokens ahead of the target, with its own paged KV cache.
//!
//! The draft's cache tracks, per sequence, the tokens whose K/V it holds. Before each
//! proposal it keeps the longest prefix of them that the sequence still has (accepted
//! drafts stay, rejected ones and anything after them go: their blocks are handed back with
//! `SequenceBlocks::truncate`), computes what is missing in one pass (the prompt on the
//! first proposal, afterwards the target's own token and whatever else the sequence gained),
//! and then one row per draft token. A sequence's draft state lives until the engine says
//! it left ([`Proposer::forget`]); its blocks are a guard, so dropping the state frees them.
//! When the draft's pool is full, the sequence gets no proposal that step.
//!
//! It proposes the draft's argmax as point masses, exact for every request (see
//! `met_kernels::DraftToken`); sampled drafts with their distributions are not done yet.

use std::collections::HashMap;
use std::sync::Arc;

use met_cache::{KvCache, PagedKvCache, SequenceBlocks};
use met_kernels::GpuBackend;
use met_model_layers::{ForwardBatch, LogitRows, Model};

use crate::{Proposal, ProposalContext, Proposer, SpeculativeError, greedy_token};

/// Drafts with a second model in a cache of its own.
pub struct DraftModelProposer {
    model: Box<dyn Model>,
    backend: Arc<dyn GpuBackend>,
    kv: PagedKvCache,
    /// Per sequence: the tokens whose K/V the draft's cache holds, and their blocks.
    seqs: HashMap<u64, (Vec<u32>, SequenceBlocks)>,
    /// Reused between passes.
    batch: ForwardBatch,
}

impl DraftModelProposer {
    /// Drafts with `model` on `backend` for a target of `target_vocab` tokens, in a cache of
    /// `blocks` blocks of `block_size` tokens.
    ///
    /// # Errors
    /// [`SpeculativeError::Invalid`] naming `--draft-model` when the vocabularies differ
    /// (the two must share a tokenizer), the draft has recurrent layers, or the cache
    /// cannot be allocated.
    pub fn new(
        model: Box<dyn Model>,
        backend: Arc<dyn GpuBackend>,
        target_vocab: usize,
        blocks: usize,
        block_size: usize,
    ) -> Result<Self, SpeculativeError> {
        let bad = |msg: String| SpeculativeError::Invalid(met_config::InvalidSetting::new("draft-model", msg));
        if model.vocab_size() != target_vocab {
            return Err(bad(format!(
                "the draft model has a vocabulary of {} tokens, the target {target_vocab}; they must share a tokenizer",
                model.vocab_size()
            )));
        }
        if model.kv_layout().state.is_some() {
            // The draft keeps sequences across proposals and cuts them back to what the
            // target accepted, which a recurrent state cannot do without rollback copies.
            return Err(bad("a draft model with recurrent (linear-attention) layers is not supported".into()));
        }
        let kv = PagedKvCache::new(&*backend, model.kv_layout(), block_size, blocks, false)
            .map_err(|e| bad(format!("the draft's KV cache: {e}")))?;
        Ok(Self { model, backend, kv, seqs: HashMap::new(), batch: ForwardBatch::default() })
    }

    /// Runs `tokens` from position `start` through the draft and returns its next token;
    /// `None` when the pass fails.
    fn next(&mut self, blocks: &SequenceBlocks, tokens: &[u32], start: usize) -> Option<u32> {
        self.batch.clear();
        self.batch.push(tokens, start, blocks, LogitRows::Last);
        let logits = self.model.forward(&self.batch, &mut self.kv).ok()?;
        greedy_token(&*self.backend, &logits)
    }
}

impl Proposer for DraftModelProposer {
    fn name(&self) -> &'static str {
        "draft"
    }

    fn propose(&mut self, ctx: &ProposalContext<'_>, out: &mut Proposal) {
        out.clear();
        let (tokens, k) = (ctx.tokens, ctx.max_tokens);
        if tokens.is_empty() || k == 0 || tokens.len() + k > self.model.max_context() {
            return;
        }
        let (mut cached, mut blocks) =
            self.seqs.remove(&ctx.sequence).unwrap_or_else(|| (Vec::new(), self.kv.new_sequence()));
        // Keep the K/V of the prefix the sequence still has; the last token is always rerun,
        // as its logits give the first draft token.
        let common = cached.iter().zip(tokens).take_while(|(a, b)| a == b).count().min(tokens.len() - 1);
        cached.truncate(common);
        blocks.truncate(common);
        // The last draft token is proposed, never run.
        if self.kv.reserve(&mut blocks, tokens.len() + k - 1).is_err() {
            return;
        }
        let mut token = match self.next(&blocks, &tokens[common..], common) {
            Some(t) => t,
            None => return,
        };
        cached.extend_from_slice(&tokens[common..]);
        out.tokens.push(token);
        while out.tokens.len() < k {
            let Some(next) = self.next(&blocks, &[token], cached.len()) else { break };
            cached.push(token);
            token = next;
            out.tokens.push(token);
        }
        self.seqs.insert(ctx.sequence, (cached, blocks));
    }

    fn forget(&mut self, sequence: u64) {
        self.seqs.remove(&sequence);
    }
}

impl std::fmt::Debug for DraftModelProposer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraftModelProposer").field("sequences", &self.seqs.len()).finish_non_exhaustive()
    }
}
