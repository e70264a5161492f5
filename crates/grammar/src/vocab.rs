//! The vocabulary as llguidance sees it: every token's bytes in a trie, the end-of-sequence
//! tokens, and tokenization of text back to ids (for grammars that force literal text).
//!
//! Token bytes come from the tokenizer's own `tokenizer.json` form through llguidance's
//! reader (byte-level BPE, or SentencePiece with byte fallback); special tokens are marked
//! so that no grammar matches their text. Ids the model has past the tokenizer's vocabulary
//! become special placeholders, which are never allowed.

use std::sync::Arc;

use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::GrammarError;

/// The token environment of `tokenizer` for `vocab_size` logits.
pub(crate) fn token_env(tokenizer: &met_text::Tokenizer, vocab_size: usize) -> Result<TokEnv, GrammarError> {
    let fail = |msg: String| GrammarError::Tokenizer(msg);
    let json = tokenizer.to_json().map_err(|e| fail(e.to_string()))?;
    let value: serde_json::Value = serde_json::from_str(&json).map_err(|e| fail(e.to_string()))?;
    let mut bytes = llguidance::token_bytes_from_tokenizer_json(&value).map_err(|e| fail(e.to_string()))?;
    if bytes.len() > vocab_size {
        return Err(fail(format!("the tokenizer has {} tokens, the model {vocab_size}", bytes.len())));
    }
    for id in bytes.len()..vocab_size {
        bytes.push(placeholder(id));
    }
    // Ids that are special to the tokenizer but were not in its added-token list.
    for (id, b) in bytes.iter_mut().enumerate() {
        if b.first() != Some(&TokTrie::SPECIAL_TOKEN_MARKER) && tokenizer.is_special(id as u32) {
            b.insert(0, TokTrie::SPECIAL_TOKEN_MARKER);
        }
    }
    let eos = tokenizer.eos_ids();
    let Some(&first) = eos.first() else { return Err(fail("it has no end-of-sequence token".into())) };
    let info = TokRxInfo::new(vocab_size as u32, first);
    let trie = TokTrie::from(&info, &bytes).with_eos_tokens(eos);
    Ok(Arc::new(Env { trie, tokenizer: tokenizer.clone() }))
}

/// The bytes of an id the tokenizer lacks: a special token no text reaches.
fn placeholder(id: usize) -> Vec<u8> {
    let mut name = format!(".<[{id}]>").into_bytes();
    name[0] = TokTrie::SPECIAL_TOKEN_MARKER;
    name
}

struct Env {
    trie: TokTrie,
    tokenizer: met_text::Tokenizer,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Text the trie cannot split itself (invalid UTF-8) falls back to its greedy walk.
        self.trie.tokenize_with_greedy_fallback(s, |text| self.tokenizer.encode_plain(text).unwrap_or_default())
    }
}
