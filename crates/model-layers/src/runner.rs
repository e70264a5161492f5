//! A static-batch greedy generation loop: the bare forward pass, with no scheduler.
//!
//! Every prompt advances each step, by a prefill chunk while it has unprocessed prompt
//! tokens and by one decode row after, so one step can mix both. It is the reference the
//! serving engine is checked against, and what the equivalence tests drive.

use met_cache::{KvCache, SequenceBlocks};
use met_kernels::GpuBackend;

use crate::{ForwardBatch, LogitRows, Model, ModelError, Result};

/// Settings of [`generate_greedy`].
#[derive(Debug, Clone, Default)]
pub struct GreedyOptions {
    /// Tokens to generate per prompt (fewer if a stop token comes first).
    pub max_new_tokens: usize,
    /// Longest prompt chunk per step; `None` prefills each prompt in one step.
    pub prefill_chunk: Option<usize>,
    /// How many `(token, logprob)` pairs to report per generated token.
    pub top_logprobs: usize,
    /// Tokens that end a sequence (kept in its output).
    pub stop_tokens: Vec<u32>,
}

/// The output for one prompt.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Generation {
    /// Generated token ids.
    pub tokens: Vec<u32>,
    /// Per generated token, the best `top_logprobs` candidates, best first.
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
}

struct Sequence {
    tokens: Vec<u32>,
    cached: usize,
    blocks: SequenceBlocks,
    out: Generation,
    done: bool,
}

/// Greedily continues every prompt, all in one batch.
///
/// # Errors
/// [`ModelError::Batch`] for an empty prompt; [`ModelError::OutOfBlocks`] when the cache
/// cannot hold the batch; any forward error.
pub fn generate_greedy(
    model: &dyn Model,
    backend: &dyn GpuBackend,
    kv: &mut dyn KvCache,
    prompts: &[Vec<u32>],
    options: &GreedyOptions,
) -> Result<Vec<Generation>> {
    if let Some(i) = prompts.iter().position(Vec::is_empty) {
        return Err(ModelError::Batch(format!("prompt {i} is empty")));
    }
    let chunk = options.prefill_chunk.unwrap_or(usize::MAX).max(1);
    let mut seqs: Vec<Sequence> = prompts
        .iter()
        .map(|p| Sequence {
            tokens: p.clone(),
            cached: 0,
            blocks: kv.new_sequence(),
            out: Generation::default(),
            done: options.max_new_tokens == 0,
        })
        .collect();
    loop {
        let mut batch = ForwardBatch::new();
        let mut stepped = Vec::new();
        for (i, s) in seqs.iter_mut().enumerate().filter(|(_, s)| !s.done) {
            let n = (s.tokens.len() - s.cached).min(chunk);
            kv.reserve(&mut s.blocks, s.cached + n)?;
            let completes = s.cached + n == s.tokens.len();
            let rows = if completes { LogitRows::Last } else { LogitRows::None };
            batch.push(&s.tokens[s.cached..s.cached + n], s.cached, &s.blocks, rows);
            stepped.push((i, n, completes));
        }
        if batch.is_empty() {
            break;
        }
        let logits = backend.download_f32(&model.forward(&batch, kv)?)?;
        let mut rows = logits.chunks_exact(model.vocab_size());
        for (i, n, completes) in stepped {
            let s = &mut seqs[i];
            s.cached += n;
            if !completes {
                continue;
            }
            let row = rows.next().expect("one logits row per completed sequence");
            let token = argmax(row);
            s.tokens.push(token);
            s.out.tokens.push(token);
            if options.top_logprobs > 0 {
                s.out.top_logprobs.push(top_logprobs(row, options.top_logprobs));
            }
            s.done = s.out.tokens.len() >= options.max_new_tokens || options.stop_tokens.contains(&token);
        }
    }
    Ok(seqs.into_iter().map(|s| s.out).collect())
}

/// Index of the largest value; the first one on ties (as `torch.argmax`).
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as u32
}

/// The `k` most likely tokens of a logits row with their log-probabilities, best first.
pub fn top_logprobs(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_total = max + row.iter().map(|x| (x - max).exp()).sum::<f32>().ln();
    let mut order: Vec<u32> = (0..row.len() as u32).collect();
    let k = k.min(row.len());
    let by_logit = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    if k < order.len() {
        order.select_nth_unstable_by(k, by_logit);
        order.truncate(k);
    }
    order.sort_by(by_logit);
    order.into_iter().map(|i| (i, row[i as usize] - log_total)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_the_first_maximum() {
        assert_eq!(argmax(&[0.0, 2.0, 2.0, 1.0]), 1);
    }

    #[test]
    fn top_logprobs_are_sorted_log_probabilities() {
        let row = [1.0f32, 3.0, 2.0, 0.0];
        let top = top_logprobs(&row, 2);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 2]);
        let total: f32 = row.iter().map(|x| x.exp()).sum();
        assert!((top[0].1 - (3f32.exp() / total).ln()).abs() < 1e-6);
        assert_eq!(top_logprobs(&row, 10).len(), 4);
    }
}
