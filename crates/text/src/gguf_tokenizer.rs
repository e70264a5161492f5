//! [`Tokenizer::from_gguf`]: rebuilds a tokenizer from llama.cpp's GGUF metadata keys.
//!
//! A GGUF carries no `tokenizer.json`, only the vocabulary, merges, scores, token types and
//! special ids. This follows transformers' GGUF loader (`integrations/gguf/
//! gguf_tokenizer_mapping.py`, 5.x), so that the ids equal what `AutoTokenizer.from_pretrained
//! (..., gguf_file=...)` produces:
//!
//! - `gpt2`: byte-level BPE (`GPT2Tokenizer`): tokens not spelled in the byte alphabet are
//!   respelled from their UTF-8 bytes; the split regex comes from `tokenizer.ggml.pre` where
//!   transformers knows one (llama3, qwen2, tekken, gpt-4o families) and is GPT-2's built-in
//!   one otherwise (`gpt-2`, `default`, `smollm`: SmolLM's vocabulary holds no merge that
//!   joins a digit to anything, so llama.cpp's extra digit split changes no id).
//! - `llama`: SentencePiece-style BPE with byte fallback (`LlamaTokenizer`): merges from the
//!   file, or derived from the vocabulary ordered by score. The `▁` prefix follows
//!   `tokenizer.ggml.add_space_prefix` (default true), as llama.cpp does; transformers
//!   always adds it.
//!
//! Control tokens (`token_type` 3) become special added tokens, user-defined ones (4) plain
//! added tokens, so their text is never cut into pieces.
//!
//! **Boundary:** errors name the metadata key.

use std::collections::{BTreeMap, HashMap, HashSet};

use met_model_weights::GgufValue;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use super::TextError;
use super::tokenizer::{Framing, SpecialToken, SpecialTokens, Tokenizer, TokenizerParts};

/// llama.cpp's `token_type` for a control token (`<|im_start|>`).
const CONTROL: i64 = 3;
/// llama.cpp's `token_type` for a user-defined added token (`<think>`).
const USER_DEFINED: i64 = 4;

const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
const GPT4O_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// The split regex of a `tokenizer.ggml.pre` value, as transformers maps them; `None`
/// means GPT-2's own (the byte-level pre-tokenizer's built-in regex).
fn split_regex(pre: &str) -> Option<&'static str> {
    Some(match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2"
        | "jina-v5-nano" | "dbrx" | "smaug-bpe" => LLAMA3_SPLIT,
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" => QWEN2_SPLIT,
        "qwen35" => QWEN35_SPLIT,
        "tekken" => TEKKEN_SPLIT,
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => GPT4O_SPLIT,
        _ => return None,
    })
}

/// Typed reads of the tokenizer keys; every error names the key.
struct Metadata<'a>(&'a BTreeMap<String, GgufValue>);

impl<'a> Metadata<'a> {
    fn get(&self, key: &str) -> Result<&'a GgufValue, TextError> {
        self.0.get(key).ok_or_else(|| TextError::MissingKey { key: key.to_owned() })
    }

    fn str(&self, key: &str) -> Result<&'a str, TextError> {
        let value = self.get(key)?;
        value
            .as_str()
            .ok_or_else(|| TextError::invalid_key(key, format!("expected a string, found {}", value.type_name())))
    }

    fn opt_str(&self, key: &str) -> Result<Option<&'a str>, TextError> {
        self.0.contains_key(key).then(|| self.str(key)).transpose()
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>, TextError> {
        let Some(value) = self.0.get(key) else { return Ok(None) };
        let flag = value.as_bool();
        flag.map(Some)
            .ok_or_else(|| TextError::invalid_key(key, format!("expected a bool, found {}", value.type_name())))
    }

    fn opt_id(&self, key: &str, vocab_len: usize) -> Result<Option<u32>, TextError> {
        let Some(value) = self.0.get(key) else { return Ok(None) };
        match value.as_u64().and_then(|v| u32::try_from(v).ok()) {
            Some(id) if (id as usize) < vocab_len => Ok(Some(id)),
            Some(id) => Err(TextError::invalid_key(key, format!("id {id} is outside the vocabulary of {vocab_len}"))),
            None => Err(TextError::invalid_key(key, format!("expected a token id, found {value}"))),
        }
    }

    fn array(&self, key: &str) -> Result<&'a [GgufValue], TextError> {
        let value = self.get(key)?;
        value
            .as_array()
            .ok_or_else(|| TextError::invalid_key(key, format!("expected an array, found {}", value.type_name())))
    }

    fn strings(&self, key: &str) -> Result<Vec<&'a str>, TextError> {
        self.array(key)?
            .iter()
            .enumerate()
            .map(|(i, v)| v.as_str().ok_or_else(|| TextError::invalid_key(key, format!("element {i} is not a string"))))
            .collect()
    }

    /// An optional per-token array, which must then have one element per token.
    fn per_token<T>(
        &self,
        key: &str,
        len: usize,
        read: impl Fn(&GgufValue) -> Option<T>,
    ) -> Result<Option<Vec<T>>, TextError> {
        if !self.0.contains_key(key) {
            return Ok(None);
        }
        let values = self.array(key)?;
        if values.len() != len {
            let msg = format!("{} elements for {len} tokens", values.len());
            return Err(TextError::invalid_key(key, msg));
        }
        let read_one = |(i, v): (usize, &GgufValue)| {
            read(v).ok_or_else(|| TextError::invalid_key(key, format!("element {i}: unexpected {}", v.type_name())))
        };
        values.iter().enumerate().map(read_one).collect::<Result<Vec<T>, _>>().map(Some)
    }
}

impl Tokenizer {
    /// Builds the tokenizer a GGUF file describes.
    ///
    /// # Errors
    /// [`TextError::MissingKey`] / [`TextError::InvalidKey`] naming the key,
    /// [`TextError::UnsupportedModel`] for a `tokenizer.ggml.model` other than `gpt2` and
    /// `llama`.
    pub fn from_gguf(file: &met_model_weights::GgufFile) -> Result<Self, TextError> {
        Self::from_gguf_metadata(file.metadata())
    }

    /// Builds a tokenizer from GGUF metadata (the `tokenizer.*` keys).
    ///
    /// # Errors
    /// As [`Tokenizer::from_gguf`].
    pub fn from_gguf_metadata(metadata: &BTreeMap<String, GgufValue>) -> Result<Self, TextError> {
        let meta = Metadata(metadata);
        let model = meta.str("tokenizer.ggml.model")?;
        if !matches!(model, "gpt2" | "llama") {
            return Err(TextError::UnsupportedModel { model: model.to_owned() });
        }
        let tokens = meta.strings("tokenizer.ggml.tokens")?;
        let types = meta.per_token("tokenizer.ggml.token_type", tokens.len(), GgufValue::as_i64)?;
        let mut built = match model {
            "gpt2" => byte_level(&meta, &tokens)?,
            _ => sentencepiece(&meta, &tokens)?,
        };
        let specials = special_tokens(&meta, &built.spelled)?;
        let default_bos = model == "llama";
        let add_bos = meta.opt_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(default_bos);
        let add_eos = meta.opt_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
        let chat_template = meta.opt_str("tokenizer.chat_template")?.map(str::to_owned);
        add_typed_tokens(&mut built, &tokens, types.as_deref())?;
        Self::from_parts(TokenizerParts {
            backend: built.backend,
            specials,
            framing: Framing::Flags { add_bos, add_eos },
            extra_eos_ids: Vec::new(),
            chat_template,
        })
    }
}

/// A backend under construction, with the vocabulary as the backend spells it.
struct Built {
    backend: tokenizers::Tokenizer,
    spelled: Vec<String>,
    byte_level: bool,
}

fn byte_level(meta: &Metadata<'_>, tokens: &[&str]) -> Result<Built, TextError> {
    let alphabet = byte_alphabet();
    let in_alphabet: HashSet<char> = alphabet.iter().copied().collect();
    let spelled: Vec<String> = tokens
        .iter()
        .map(|t| {
            if t.chars().all(|c| in_alphabet.contains(&c)) {
                (*t).to_owned()
            } else {
                t.bytes().map(|b| alphabet[usize::from(b)]).collect()
            }
        })
        .collect();
    let merges = file_merges(meta)?.ok_or_else(|| TextError::MissingKey { key: "tokenizer.ggml.merges".into() })?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab_of(&spelled), merges)
        .build()
        .map_err(|e| TextError::invalid_key("tokenizer.ggml.merges", e.to_string()))?;
    let mut backend = tokenizers::Tokenizer::new(bpe);
    let pre = meta.opt_str("tokenizer.ggml.pre")?.unwrap_or("default");
    let pre_tokenizer: PreTokenizerWrapper = match split_regex(pre) {
        Some(regex) => {
            let split = Split::new(SplitPattern::Regex(regex.to_owned()), SplitDelimiterBehavior::Isolated, false)
                .map_err(|e| TextError::invalid_key("tokenizer.ggml.pre", format!("split regex of `{pre}`: {e}")))?;
            PreSequence::new(vec![split.into(), ByteLevel::new(false, true, false).into()]).into()
        }
        None => ByteLevel::new(false, true, true).into(),
    };
    backend.with_pre_tokenizer(Some(pre_tokenizer));
    backend.with_decoder(Some(ByteLevel::default()));
    Ok(Built { backend, spelled, byte_level: true })
}

fn sentencepiece(meta: &Metadata<'_>, tokens: &[&str]) -> Result<Built, TextError> {
    let spelled: Vec<String> = tokens.iter().map(|t| (*t).to_owned()).collect();
    let merges = match file_merges(meta)? {
        Some(merges) => merges,
        None => {
            let scores = meta
                .per_token("tokenizer.ggml.scores", tokens.len(), GgufValue::as_f64)?
                .ok_or_else(|| TextError::MissingKey { key: "tokenizer.ggml.scores".into() })?;
            merges_from_scores(&spelled, &scores)
        }
    };
    let bpe = BPE::builder()
        .vocab_and_merges(vocab_of(&spelled), merges)
        .fuse_unk(true)
        .byte_fallback(true)
        .build()
        .map_err(|e| TextError::invalid_key("tokenizer.ggml.tokens", e.to_string()))?;
    let mut backend = tokenizers::Tokenizer::new(bpe);
    let add_prefix_space = meta.opt_bool("tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
    let scheme = if add_prefix_space { PrependScheme::First } else { PrependScheme::Never };
    backend.with_pre_tokenizer(Some(Metaspace::new('▁', scheme, false)));
    let replace = Replace::new("▁", " ").map_err(|e| TextError::Tokenizer(e.to_string()))?;
    let mut decoders: Vec<DecoderWrapper> =
        vec![replace.into(), ByteFallback::default().into(), Fuse::default().into()];
    if add_prefix_space {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    backend.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(Built { backend, spelled, byte_level: false })
}

/// `{token: index}`; a token listed twice keeps its last index, as a Python dict would.
fn vocab_of(spelled: &[String]) -> Vocab {
    spelled.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect()
}

/// `tokenizer.ggml.merges` as pairs, if the file has them.
fn file_merges(meta: &Metadata<'_>) -> Result<Option<Vec<(String, String)>>, TextError> {
    const KEY: &str = "tokenizer.ggml.merges";
    if !meta.0.contains_key(KEY) {
        return Ok(None);
    }
    let pairs = meta.strings(KEY)?.into_iter().enumerate().map(|(i, merge)| {
        let (left, right) = merge
            .split_once(' ')
            .ok_or_else(|| TextError::invalid_key(KEY, format!("merge {i} ({merge:?}) is not a pair")))?;
        Ok((left.to_owned(), right.to_owned()))
    });
    pairs.collect::<Result<Vec<_>, _>>().map(Some)
}

/// The merges a SentencePiece vocabulary implies (transformers' `generate_merges` with
/// scores): every split of a token into two tokens, best score first, ties broken by the
/// shorter left piece, then the shorter right piece, then vocabulary order.
fn merges_from_scores(spelled: &[String], scores: &[f64]) -> Vec<(String, String)> {
    let vocab = vocab_of(spelled);
    // A Python dict built from (token, score) pairs: first position, last score.
    let mut first_seen: Vec<&str> = Vec::with_capacity(spelled.len());
    let mut score_of: HashMap<&str, f64> = HashMap::with_capacity(spelled.len());
    for (token, &score) in spelled.iter().zip(scores) {
        if score_of.insert(token, score).is_none() {
            first_seen.push(token);
        }
    }
    let mut merges: Vec<(&str, &str, f64)> = Vec::new();
    for token in first_seen {
        let mut local: Vec<(&str, &str)> = token
            .char_indices()
            .skip(1)
            .map(|(i, _)| token.split_at(i))
            .filter(|(l, r)| vocab.contains_key(*l) && vocab.contains_key(*r))
            .collect();
        local.sort_by_key(|(l, r)| (vocab[*l], vocab[*r]));
        merges.extend(local.into_iter().map(|(l, r)| (l, r, score_of[token])));
    }
    // Python's `sorted(..., reverse=True)` is stable: equal keys keep their order.
    merges.sort_by(|a, b| {
        let key = |m: &(&str, &str, f64)| (m.2, m.0.chars().count(), m.1.chars().count());
        let (ka, kb) = (key(a), key(b));
        kb.0.total_cmp(&ka.0).then(kb.1.cmp(&ka.1)).then(kb.2.cmp(&ka.2))
    });
    merges.into_iter().map(|(l, r, _)| (l.to_owned(), r.to_owned())).collect()
}

/// Registers control tokens as special added tokens and user-defined ones as plain added
/// tokens, by their text as the file spells it. In a byte-level vocabulary a control token
/// spelled outside the byte alphabet is a converter's mislabel and is skipped, and a
/// user-defined one is added only if the vocabulary holds it as spelled, as transformers does.
fn add_typed_tokens(built: &mut Built, tokens: &[&str], types: Option<&[i64]>) -> Result<(), TextError> {
    let Some(types) = types else { return Ok(()) };
    let in_alphabet: HashSet<char> = byte_alphabet().into_iter().collect();
    let spelled_ok = |t: &str| !built.byte_level || t.chars().all(|c| in_alphabet.contains(&c));
    let control: Vec<AddedToken> = tokens
        .iter()
        .zip(types)
        .filter(|(t, ty)| **ty == CONTROL && spelled_ok(t))
        .map(|(t, _)| AddedToken::from(*t, true))
        .collect();
    let known: HashSet<&str> = built.spelled.iter().map(String::as_str).collect();
    let user: Vec<AddedToken> = tokens
        .iter()
        .zip(types)
        .filter(|(t, ty)| **ty == USER_DEFINED && known.contains(**t))
        .map(|(t, _)| AddedToken::from(*t, false).normalized(false))
        .collect();
    built.backend.add_special_tokens(control).map_err(|e| TextError::Tokenizer(e.to_string()))?;
    built.backend.add_tokens(user).map_err(|e| TextError::Tokenizer(e.to_string()))?;
    Ok(())
}

/// bos/eos/unk/pad from their id keys.
fn special_tokens(meta: &Metadata<'_>, spelled: &[String]) -> Result<SpecialTokens, TextError> {
    let token = |key: &str| -> Result<Option<SpecialToken>, TextError> {
        let id = meta.opt_id(key, spelled.len())?;
        Ok(id.map(|id| SpecialToken { id, text: spelled[id as usize].clone() }))
    };
    Ok(SpecialTokens {
        bos: token("tokenizer.ggml.bos_token_id")?,
        eos: token("tokenizer.ggml.eos_token_id")?,
        unk: token("tokenizer.ggml.unknown_token_id")?,
        pad: token("tokenizer.ggml.padding_token_id")?,
    })
}

/// GPT-2's byte-to-character table: printable bytes stand for themselves, the rest are
/// shifted past U+0100 in byte order.
pub(crate) fn byte_alphabet() -> Vec<char> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut shifted = 0u32;
    (0..=255u8)
        .map(|b| {
            if printable(b) {
                char::from(b)
            } else {
                shifted += 1;
                char::from_u32(255 + shifted).unwrap_or(char::REPLACEMENT_CHARACTER)
            }
        })
        .collect()
}
