//! Prompt lookup: propose what followed the sequence's last few tokens the last time they
//! appeared in it (Saxena's prompt lookup decoding, vLLM's `ngram` method).
//!
//! The suffix of `n` tokens is searched for in everything before it, prompt and generated
//! text alike, for each `n` from the longest to the shortest of the range; the first `n`
//! with a match wins, and among its matches the most recent one, whose continuation is the
//! likeliest to still hold. A search is a backwards scan, linear in the sequence for each
//! `n`: a few thousand comparisons per step at the context lengths a CPU serves, nothing
//! next to a forward pass.

use std::ops::RangeInclusive;

use crate::{Proposal, ProposalContext, Proposer};

/// Prompt lookup over suffixes whose lengths are in a range, longest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NgramProposer {
    lengths: RangeInclusive<usize>,
}

impl NgramProposer {
    /// Matches suffixes of `lengths` tokens, the longest first.
    ///
    /// # Panics
    /// If the range is empty or starts at 0.
    pub fn new(lengths: RangeInclusive<usize>) -> Self {
        assert!(
            *lengths.start() > 0 && !lengths.is_empty(),
            "n-gram lengths {lengths:?} must be a range of positive n"
        );
        Self { lengths }
    }

    /// The start of the most recent earlier occurrence of the last `n` tokens of
    /// `tokens` that has at least one token after it, if any.
    fn find(tokens: &[u32], n: usize) -> Option<usize> {
        let len = tokens.len();
        if n >= len {
            return None;
        }
        let suffix = &tokens[len - n..];
        // Candidates start before the suffix itself, so a continuation always exists.
        (0..len - n).rev().find(|&i| &tokens[i..i + n] == suffix)
    }
}

impl Proposer for NgramProposer {
    fn name(&self) -> &'static str {
        "ngram"
    }

    fn propose(&mut self, ctx: &ProposalContext<'_>, out: &mut Proposal) {
        out.clear();
        if ctx.max_tokens == 0 {
            return;
        }
        let tokens = ctx.tokens;
        for n in self.lengths.clone().rev() {
            if let Some(start) = Self::find(tokens, n) {
                let from = start + n;
                let to = (from + ctx.max_tokens).min(tokens.len());
                out.tokens.extend_from_slice(&tokens[from..to]);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn propose(lengths: RangeInclusive<usize>, tokens: &[u32], max_tokens: usize) -> Vec<u32> {
        let mut out = Proposal { tokens: vec![99], probs: None };
        let ctx = ProposalContext { sequence: 0, tokens, prompt_len: tokens.len(), max_tokens, target: None };
        NgramProposer::new(lengths).propose(&ctx, &mut out);
        assert!(out.probs.is_none(), "prompt lookup proposes certain tokens");
        out.tokens
    }

    #[test]
    fn proposes_what_followed_the_suffix() {
        // `3 4` appeared before, followed by `5 6 7`.
        assert_eq!(propose(1..=3, &[1, 2, 3, 4, 5, 6, 7, 8, 3, 4], 3), [5, 6, 7]);
        // The continuation stops at the end of the sequence.
        assert_eq!(propose(1..=3, &[1, 2, 3, 4, 5, 6, 7, 8, 3, 4], 10), [5, 6, 7, 8, 3, 4]);
        assert_eq!(propose(1..=3, &[1, 2, 3, 4, 5, 6, 7, 8, 3, 4], 0), Vec::<u32>::new());
    }

    #[test]
    fn the_longest_suffix_wins_over_a_more_recent_shorter_one() {
        // `4` alone last appeared before 9; `3 4` appeared before 5.
        let tokens = [3, 4, 5, 0, 4, 9, 3, 4];
        assert_eq!(propose(1..=2, &tokens, 1), [5]);
        assert_eq!(propose(1..=1, &tokens, 1), [9]);
    }

    #[test]
    fn the_most_recent_match_wins() {
        assert_eq!(propose(2..=2, &[1, 2, 7, 1, 2, 8, 1, 2], 1), [8]);
    }

    #[test]
    fn no_match_means_no_proposal() {
        assert_eq!(propose(1..=4, &[1, 2, 3, 4], 4), Vec::<u32>::new());
        assert_eq!(propose(2..=4, &[1, 2, 3, 1], 4), Vec::<u32>::new(), "one-token matches are out of range");
        assert_eq!(propose(1..=4, &[5], 4), Vec::<u32>::new());
        assert_eq!(propose(1..=4, &[], 4), Vec::<u32>::new());
    }

    #[test]
    fn a_repeated_token_proposes_more_of_it() {
        assert_eq!(propose(1..=3, &[7, 7, 7, 7], 5), [7]);
        assert_eq!(propose(1..=1, &[7, 7], 5), [7]);
    }

    #[test]
    #[should_panic(expected = "must be a range of positive n")]
    fn zero_length_ngrams_are_refused() {
        NgramProposer::new(0..=2);
    }

    proptest! {
        /// Whatever it proposes follows, in the sequence, an earlier copy of the suffix it
        /// matched, and is never longer than asked.
        #[test]
        fn proposals_continue_an_earlier_copy_of_the_suffix(
            tokens in prop::collection::vec(0u32..4, 0..40),
            max in 0usize..6,
        ) {
            let got = propose(1..=3, &tokens, max);
            prop_assert!(got.len() <= max);
            if !got.is_empty() {
                let len = tokens.len();
                let explained = (1..=3usize).filter(|&n| n < len).any(|n| {
                    (0..len - n).any(|i| tokens[i..i + n] == tokens[len - n..] && tokens[i + n..].starts_with(&got))
                });
                prop_assert!(explained, "{:?} proposes {:?}", tokens, got);
            } else if max > 0 && tokens.len() > 1 {
                // No proposal only when even the last token never appeared before.
                let last = tokens[tokens.len() - 1];
                prop_assert!(!tokens[..tokens.len() - 1].contains(&last));
            }
        }
    }
}
