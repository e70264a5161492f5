//! [`Generation`]: the engine's token events of one HTTP request (one engine request per
//! prompt, `n` continuations each) turned into per-choice text deltas.
//!
//! Each choice has its own [`Detokenizer`] (never splits a character) and a held-back
//! tail: text that may be the start of a stop string is not released until the next token
//! shows it is not. Stop strings are matched on the released-plus-held text, so they match
//! across token boundaries and never reach the client. When every choice of an engine
//! request has finished (by a stop string, EOS or length), its [`RequestStream`] is dropped:
//! that is the engine's cancellation path, and it returns the sequence's KV blocks. Dropping
//! a `Generation` (a client that went away) cancels everything it still holds the same way.

use futures_util::future::select_all;
use met_scheduler::{FinishReason, GeneratedToken, RequestStream, TokenEvent};

use super::error::ApiError;
use super::options::{LogprobsShape, TextOptions};
use super::wire::{PromptTokensDetails, Usage};
use met_text::{Detokenizer, TextError, Tokenizer};

/// Why a choice ended, as OpenAI names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// A stop string, a stop token or EOS.
    Stop,
    /// `max_tokens` or the context.
    Length,
}

impl Finish {
    /// OpenAI's `finish_reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
        }
    }
}

/// A generated token's logprob with its text, for either response shape.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely alternatives: text, bytes, logprob.
    pub top: Vec<(String, Vec<u8>, f32)>,
    /// Characters of the choice's tokens before this one (the legacy `text_offset`).
    pub text_offset: usize,
}

/// What one choice gained from one engine event.
#[derive(Debug, Clone, PartialEq)]
pub struct ChoiceDelta {
    /// The choice: `prompt * n + continuation`.
    pub index: usize,
    /// Newly released text.
    pub text: String,
    /// Logprobs of the tokens this event brought.
    pub logprobs: Vec<TokenLogprob>,
    /// Set on the choice's last delta.
    pub finish: Option<Finish>,
    /// The stop string that ended the choice, if one did.
    pub stop_sequence: Option<String>,
}

/// One choice's decoding state.
struct Choice {
    detokenizer: Detokenizer,
    /// Decoded text not released yet: it may begin a stop string.
    held: String,
    finished: bool,
    tokens: usize,
    /// Characters of the tokens' own texts so far (the legacy `text_offset`).
    token_chars: usize,
}

/// The choices of one HTTP request, fed by its engine requests' streams.
pub struct Generation {
    streams: Vec<Option<RequestStream>>,
    choices: Vec<Choice>,
    n: usize,
    prompt_tokens: usize,
    cached: Vec<usize>,
    tokenizer: Tokenizer,
    stop: Vec<String>,
    logprobs: LogprobsShape,
}

impl Generation {
    /// Follows `streams` (one per prompt, each with `text.n` continuations) whose prompts
    /// have `prompt_tokens` tokens in all.
    pub fn new(streams: Vec<RequestStream>, prompt_tokens: usize, tokenizer: &Tokenizer, text: &TextOptions) -> Self {
        let choices = (0..streams.len() * text.n)
            .map(|_| Choice {
                detokenizer: Detokenizer::new(tokenizer, text.skip_special_tokens),
                held: String::new(),
                finished: false,
                tokens: 0,
                token_chars: 0,
            })
            .collect();
        Self {
            cached: vec![0; streams.len()],
            streams: streams.into_iter().map(Some).collect(),
            choices,
            n: text.n,
            prompt_tokens,
            tokenizer: tokenizer.clone(),
            stop: text.stop.clone(),
            logprobs: text.logprobs,
        }
    }

    /// Number of choices.
    pub fn num_choices(&self) -> usize {
        self.choices.len()
    }

    /// The next delta of any choice, or `None` once every choice has finished.
    ///
    /// # Errors
    /// The engine failed or stopped; the generation is over after that.
    pub async fn next(&mut self) -> Option<Result<ChoiceDelta, ApiError>> {
        loop {
            let (request, event) = self.next_event().await?;
            let result = match event {
                Some(event) => self.apply(request, event),
                None => self.closed(request),
            };
            match result {
                Ok(Some(delta)) => return Some(Ok(delta)),
                Ok(None) => {}
                Err(e) => {
                    self.streams.clear();
                    return Some(Err(e));
                }
            }
        }
    }

    /// Token counts so far (final once [`Generation::next`] returned `None`).
    pub fn usage(&self) -> Usage {
        let completion_tokens = self.choices.iter().map(|c| c.tokens).sum();
        Usage {
            prompt_tokens: self.prompt_tokens,
            completion_tokens,
            total_tokens: self.prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: self.cached.iter().sum() },
        }
    }

    /// The next event of any live stream, with the stream's position.
    async fn next_event(&mut self) -> Option<(usize, Option<TokenEvent>)> {
        let live: Vec<_> = self
            .streams
            .iter_mut()
            .enumerate()
            .filter_map(|(i, s)| s.as_mut().map(|s| Box::pin(async move { (i, s.next().await) })))
            .collect();
        if live.is_empty() {
            return None;
        }
        let (next, _, _) = select_all(live).await;
        Some(next)
    }

    /// A stream ended: fine if all its choices finished, an error otherwise.
    fn closed(&mut self, request: usize) -> Result<Option<ChoiceDelta>, ApiError> {
        self.streams[request] = None;
        let unfinished = self.request_choices(request).iter().any(|c| !c.finished);
        if unfinished { Err(ApiError::unavailable("the engine stopped before the request finished")) } else { Ok(None) }
    }

    fn request_choices(&self, request: usize) -> &[Choice] {
        &self.choices[request * self.n..(request + 1) * self.n]
    }

    fn apply(&mut self, request: usize, event: TokenEvent) -> Result<Option<ChoiceDelta>, ApiError> {
        if event.index == 0 {
            self.cached[request] = event.cached_prompt_tokens;
        }
        let index = request * self.n + event.index;
        if self.choices[index].finished {
            return Ok(None);
        }
        let mut delta =
            ChoiceDelta { index, text: String::new(), logprobs: Vec::new(), finish: None, stop_sequence: None };
        if let Some(token) = &event.token {
            if self.logprobs != LogprobsShape::Off {
                let logprob = self.token_logprob(token, self.choices[index].token_chars);
                self.choices[index].token_chars += logprob.token.chars().count();
                delta.logprobs.push(logprob);
            }
            let choice = &mut self.choices[index];
            choice.tokens += 1;
            let text = choice.detokenizer.push(token.id).map_err(text_error)?;
            choice.held.push_str(&text);
        }
        let engine_finish = match event.finish {
            None => None,
            Some(FinishReason::Stop) => Some(Finish::Stop),
            Some(FinishReason::Length) => Some(Finish::Length),
            Some(FinishReason::Cancelled) => return Err(ApiError::unavailable("the engine shut down")),
            Some(FinishReason::Error(msg)) => return Err(ApiError::internal(format!("generation failed: {msg}"))),
        };
        let choice = &mut self.choices[index];
        if engine_finish.is_some() {
            let rest = choice.detokenizer.finish().map_err(text_error)?;
            choice.held.push_str(&rest);
        }
        // The earliest match; of two at one place, the one listed first.
        let matched = self.stop.iter().filter_map(|s| Some((choice.held.find(s.as_str())?, s))).min_by_key(|m| m.0);
        if let Some((at, stop)) = matched {
            choice.held.truncate(at);
            delta.finish = Some(Finish::Stop);
            delta.stop_sequence = Some(stop.clone());
        } else {
            delta.finish = engine_finish;
        }
        let release = if delta.finish.is_some() { choice.held.len() } else { releasable(&choice.held, &self.stop) };
        delta.text = choice.held.drain(..release).collect();
        if delta.finish.is_some() {
            choice.finished = true;
            if self.request_choices(request).iter().all(|c| c.finished) {
                // Cancels whatever the engine still runs for this request (siblings of a
                // choice that ended on a stop string) and frees its blocks.
                self.streams[request] = None;
            }
        }
        let empty = delta.text.is_empty() && delta.logprobs.is_empty() && delta.finish.is_none();
        Ok((!empty).then_some(delta))
    }

    fn token_logprob(&self, token: &GeneratedToken, text_offset: usize) -> TokenLogprob {
        let (text, bytes) = token_text(&self.tokenizer, token.id);
        let top = token
            .top_logprobs
            .iter()
            .map(|&(id, logprob)| {
                let (text, bytes) = token_text(&self.tokenizer, id);
                (text, bytes, logprob)
            })
            .collect();
        TokenLogprob { token: text, bytes, logprob: token.logprob.unwrap_or(f32::NAN), top, text_offset }
    }
}

/// How much of `held` can be released: all but its longest suffix that is a proper prefix
/// of a stop string (a match may still complete there).
fn releasable(held: &str, stop: &[String]) -> usize {
    let longest = stop.iter().map(String::len).max().unwrap_or(0);
    let start = held.len().saturating_sub(longest.saturating_sub(1));
    held.char_indices()
        .map(|(i, _)| i)
        .filter(|&i| i >= start)
        .find(|&i| stop.iter().any(|s| s.starts_with(&held[i..])))
        .unwrap_or(held.len())
}

/// A token's text and bytes. A token holding part of a character decodes to U+FFFD; its
/// bytes then come from the vocabulary entry (byte-level BPE's printable alphabet, or a
/// SentencePiece `<0xNN>` byte token) when it spells them.
fn token_text(tokenizer: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let text = tokenizer.decode(&[id], false).unwrap_or_default();
    if !text.contains(char::REPLACEMENT_CHARACTER) {
        let bytes = text.as_bytes().to_vec();
        return (text, bytes);
    }
    let raw = tokenizer.token_text(id).and_then(|piece| spelled_bytes(&piece));
    let bytes = raw.unwrap_or_else(|| text.as_bytes().to_vec());
    (text, bytes)
}

/// The bytes a vocabulary entry spells: `<0xNN>`, or GPT-2's byte-to-character alphabet.
fn spelled_bytes(piece: &str) -> Option<Vec<u8>> {
    if let Some(hex) = piece.strip_prefix("<0x").and_then(|p| p.strip_suffix('>')) {
        return u8::from_str_radix(hex, 16).ok().map(|b| vec![b]);
    }
    piece.chars().map(byte_level_byte).collect()
}

/// Inverse of GPT-2's `bytes_to_unicode`: printable bytes stand for themselves, the other 68
/// (0-32, 127-160, 173) are shifted to U+0100.. in order.
fn byte_level_byte(c: char) -> Option<u8> {
    match u32::from(c) {
        c @ (33..=126 | 161..=172 | 174..=255) => u8::try_from(c).ok(),
        c @ 256..=288 => u8::try_from(c - 256).ok(),
        c @ 289..=322 => u8::try_from(c - 289 + 127).ok(),
        323 => Some(173),
        _ => None,
    }
}

fn text_error(e: TextError) -> ApiError {
    ApiError::internal(format!("detokenizing: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_back_text_is_the_longest_possible_stop_start() {
        let stop = vec!["</s>".to_owned(), "aab".to_owned()];
        assert_eq!(releasable("hello", &stop), 5);
        assert_eq!(releasable("hello </", &stop), 6);
        assert_eq!(releasable("xaa", &stop), 1);
        assert_eq!(releasable("a", &stop), 0);
        assert_eq!(releasable("é<", &stop), "é".len());
        assert_eq!(releasable("anything", &[]), 8);
    }

    #[test]
    fn gpt2_alphabet_inverts() {
        assert_eq!(byte_level_byte('a'), Some(b'a'));
        assert_eq!(byte_level_byte('Ġ'), Some(b' ')); // U+0120
        assert_eq!(byte_level_byte('Ċ'), Some(b'\n')); // U+010A
        assert_eq!(byte_level_byte('ġ'), Some(127)); // U+0121
        assert_eq!(byte_level_byte('ł'), Some(160)); // U+0142
        assert_eq!(byte_level_byte('Ń'), Some(173)); // U+0143
        assert_eq!(spelled_bytes("<0xE2>"), Some(vec![0xE2]));
        assert_eq!(spelled_bytes("▁x"), None);
    }
}
