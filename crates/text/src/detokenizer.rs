//! [`Detokenizer`]: token ids in, one at a time; text out, never a broken character.
//!
//! Decoding token by token does not work: a character may span several byte tokens
//! (`<0xF0><0x9F><0x98><0x8A>`, or byte-level pieces of an emoji), and SentencePiece decoders
//! strip the leading space of the first token they see. So each step decodes a short window
//! of ids twice, with and without the new ones, and emits the difference (the prefix /
//! read offset technique of TGI and vLLM):
//!
//! ```text
//! ids:  ... | prefix_offset .. read_offset | read_offset .. end |
//!             already emitted (context)      not yet emitted
//! ```
//!
//! The difference is held back while the window's text ends in U+FFFD (an incomplete
//! character), and released by [`Detokenizer::finish`] at the end of the stream even then.
//! With SentencePiece byte fallback it is also held while the last token is a `<0xNN>` byte:
//! the decoder turns a whole run of byte tokens into U+FFFDs if the run is not valid UTF-8,
//! so a character already complete (`<0x61>` = `a`) can still turn into U+FFFD when the next
//! byte arrives, and is final only once a non-byte token ends the run.
//!
//! **Invariant:** the concatenation of everything [`Detokenizer::push`] and
//! [`Detokenizer::finish`] return equals `decode(all ids)` with the same
//! `skip_special_tokens`; every emitted chunk is a slice of that final text, so it holds
//! U+FFFD only where the final text does. Holding back text that may start a stop string is
//! the caller's job.

use super::{TextError, Tokenizer};

/// Incremental decoding of one sequence.
#[derive(Debug, Clone)]
pub struct Detokenizer {
    tokenizer: Tokenizer,
    skip_special_tokens: bool,
    ids: Vec<u32>,
    /// Start of the window decoded for context (the last emitted chunk's ids).
    prefix_offset: usize,
    /// End of what has been emitted.
    read_offset: usize,
    /// Bytes emitted so far, to resynchronise from a full decode if a window ever
    /// disagrees with its prefix.
    emitted: usize,
}

impl Detokenizer {
    /// A detokenizer for a new sequence (no ids yet).
    #[must_use]
    pub fn new(tokenizer: &Tokenizer, skip_special_tokens: bool) -> Self {
        Self {
            tokenizer: tokenizer.clone(),
            skip_special_tokens,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
            emitted: 0,
        }
    }

    /// Adds one generated id and returns the text it completes (often empty: an
    /// incomplete character, or a skipped special token).
    ///
    /// # Errors
    /// [`TextError::Tokenizer`] if the backend fails to decode.
    pub fn push(&mut self, id: u32) -> Result<String, TextError> {
        self.ids.push(id);
        self.advance(false)
    }

    /// Ends the stream: returns what is still held back, even an incomplete character
    /// (as U+FFFD, as the one-shot decode has it).
    ///
    /// # Errors
    /// [`TextError::Tokenizer`] if the backend fails to decode.
    pub fn finish(&mut self) -> Result<String, TextError> {
        self.advance(true)
    }

    /// Every id pushed so far.
    #[must_use]
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    fn advance(&mut self, flush: bool) -> Result<String, TextError> {
        let decode = |ids: &[u32]| self.tokenizer.decode(ids, self.skip_special_tokens);
        let prefix_text = decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let new_text = decode(&self.ids[self.prefix_offset..])?;
        let complete = !new_text.ends_with(char::REPLACEMENT_CHARACTER) && !self.byte_run_open();
        if new_text.len() <= prefix_text.len() || !(complete || flush) {
            return Ok(String::new());
        }
        let chunk = match new_text.strip_prefix(&prefix_text) {
            Some(chunk) => chunk.to_owned(),
            None => self.resync()?,
        };
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        self.emitted += chunk.len();
        Ok(chunk)
    }

    /// Whether the last id the decoder sees is a byte-fallback token (skipped special tokens
    /// are invisible to it, so they do not end a run).
    fn byte_run_open(&self) -> bool {
        let visible = self.ids.iter().rev().find(|&&id| !(self.skip_special_tokens && self.tokenizer.is_special(id)));
        visible.is_some_and(|&id| self.tokenizer.is_fallback_byte(id))
    }

    /// The unemitted tail of a full decode, for a window whose text does not extend its
    /// prefix (no decoder met does this; it keeps the output equal to the one-shot decode
    /// if one ever does).
    fn resync(&self) -> Result<String, TextError> {
        let full = self.tokenizer.decode(&self.ids, self.skip_special_tokens)?;
        Ok(full.get(self.emitted..).unwrap_or_default().to_owned())
    }
}
