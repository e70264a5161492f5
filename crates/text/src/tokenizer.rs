//! [`Tokenizer`]: text to token ids and back, as transformers does it.
//!
//! A thin layer over `tokenizers::Tokenizer` that adds what transformers keeps beside the
//! backend: the named special tokens (bos, eos, unk, pad), whether encoding adds bos/eos,
//! every id that ends generation, and the chat template. Two sources build one:
//! a Hugging Face directory ([`Tokenizer::from_hf_dir`], here) and GGUF metadata
//! (`Tokenizer::from_gguf`, in `gguf_tokenizer.rs`).
//!
//! **Invariant:** special-token text in the input (`<|im_start|>`) always becomes that
//! token, whatever `add_special_tokens` says; that flag only controls the bos/eos the
//! tokenizer adds around the text. A rendered chat prompt already holds its special tokens,
//! so it is encoded with `add_special_tokens = false`, as `apply_chat_template` does.
//!
//! Transformers 5 no longer applies `clean_up_tokenization_spaces` to BPE tokenizers, and
//! no modern LLM tokenizer is anything else, so decoding never cleans up spaces.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use serde_json::Value;
use tokenizers::AddedToken;

use super::TextError;

/// A special token: its id and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialToken {
    /// The token id.
    pub id: u32,
    /// The token's text, as a chat template writes it (`<|im_end|>`).
    pub text: String,
}

/// The named special tokens of a tokenizer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// Beginning of sequence.
    pub bos: Option<SpecialToken>,
    /// End of sequence (of a turn, for chat models).
    pub eos: Option<SpecialToken>,
    /// Unknown token.
    pub unk: Option<SpecialToken>,
    /// Padding token.
    pub pad: Option<SpecialToken>,
}

/// Where the bos/eos that `encode(_, true)` adds come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// The backend's own post-processor (a `tokenizer.json` that declares one).
    Backend,
    /// Added here from the flags, as transformers rebuilds the post-processor when
    /// `add_bos_token` / `add_eos_token` are given.
    Flags {
        /// Prepend bos.
        add_bos: bool,
        /// Append eos.
        add_eos: bool,
    },
}

/// Everything a [`Tokenizer`] is built from.
pub(crate) struct TokenizerParts {
    /// The `tokenizers` pipeline (model, pre-tokenizer, decoder, added tokens).
    pub(crate) backend: tokenizers::Tokenizer,
    /// The named special tokens.
    pub(crate) specials: SpecialTokens,
    /// Who adds bos/eos.
    pub(crate) framing: Framing,
    /// Extra ids that end generation besides eos (from `generation_config.json`).
    pub(crate) extra_eos_ids: Vec<u32>,
    /// The chat template source.
    pub(crate) chat_template: Option<String>,
}

/// A tokenizer with its special tokens and chat template. Cheap to clone (shared).
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<Inner>,
}

struct Inner {
    backend: tokenizers::Tokenizer,
    specials: SpecialTokens,
    add_bos: bool,
    add_eos: bool,
    manual_framing: bool,
    /// The decoder turns `<0xNN>` tokens into bytes (SentencePiece byte fallback).
    byte_fallback: bool,
    eos_ids: Vec<u32>,
    chat_template: Option<String>,
    /// The backend with special-token text left as text, built on first use.
    plain: OnceLock<tokenizers::Tokenizer>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("specials", &self.inner.specials)
            .field("add_bos", &self.inner.add_bos)
            .field("add_eos", &self.inner.add_eos)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Assembles a tokenizer; registers the named special tokens the backend does not know
    /// as special added tokens (transformers does the same).
    pub(crate) fn from_parts(parts: TokenizerParts) -> Result<Self, TextError> {
        let TokenizerParts { mut backend, specials, framing, extra_eos_ids, chat_template } = parts;
        let named = [&specials.bos, &specials.eos, &specials.unk, &specials.pad];
        let missing: Vec<AddedToken> = named
            .into_iter()
            .flatten()
            .filter(|t| !backend.get_added_vocabulary().get_vocab().contains_key(&t.text))
            .map(|t| AddedToken::from(t.text.clone(), true))
            .collect();
        backend.add_special_tokens(missing).map_err(tokenizer_error)?;
        let manual_framing = matches!(framing, Framing::Flags { .. });
        if manual_framing {
            backend.with_post_processor(None::<tokenizers::PostProcessorWrapper>);
        }
        let mut eos_ids: Vec<u32> = specials.eos.iter().map(|t| t.id).collect();
        for id in extra_eos_ids {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
        let byte_fallback = backend.get_decoder().is_some_and(has_byte_fallback);
        let mut inner = Inner {
            backend,
            specials,
            add_bos: false,
            add_eos: false,
            manual_framing,
            byte_fallback,
            eos_ids,
            chat_template,
            plain: OnceLock::new(),
        };
        match framing {
            Framing::Flags { add_bos, add_eos } => {
                inner.add_bos = add_bos && inner.specials.bos.is_some();
                inner.add_eos = add_eos && inner.specials.eos.is_some();
            }
            Framing::Backend => {
                // Report what the backend's post-processor does, measured on empty text.
                let framed = inner.backend.encode_fast("", true).map(|e| e.get_ids().to_vec()).unwrap_or_default();
                let id = |t: &Option<SpecialToken>| t.as_ref().map(|t| t.id);
                inner.add_bos = id(&inner.specials.bos).is_some_and(|b| framed.first() == Some(&b));
                inner.add_eos = id(&inner.specials.eos).is_some_and(|e| framed.last() == Some(&e));
            }
        }
        Ok(Self { inner: Arc::new(inner) })
    }

    /// Loads `tokenizer.json` from a Hugging Face model directory, with
    /// `tokenizer_config.json` (special tokens, `add_bos_token`/`add_eos_token`,
    /// `chat_template`), `chat_template.jinja` (which wins over the config's template) and
    /// `generation_config.json` (extra eos ids) where present.
    ///
    /// # Errors
    /// [`TextError`] naming the file that is missing or malformed.
    pub fn from_hf_dir(dir: &Path) -> Result<Self, TextError> {
        let json_path = dir.join("tokenizer.json");
        let backend = tokenizers::Tokenizer::from_file(&json_path).map_err(|e| {
            if json_path.exists() {
                TextError::file(&json_path, e.to_string())
            } else {
                TextError::file(&json_path, "not found (met needs a fast tokenizer's tokenizer.json)")
            }
        })?;
        let config_path = dir.join("tokenizer_config.json");
        let config = match read_optional(&config_path)? {
            Some(text) => parse_object(&config_path, &text)?,
            None => serde_json::Map::new(),
        };
        let specials = hf_special_tokens(&backend, &config_path, &config)?;
        let flag = |key: &str| config.get(key).and_then(Value::as_bool);
        let framing = match (flag("add_bos_token"), flag("add_eos_token")) {
            (None, None) if backend.get_post_processor().is_some() => Framing::Backend,
            (bos, eos) => Framing::Flags { add_bos: bos.unwrap_or(false), add_eos: eos.unwrap_or(false) },
        };
        let template_path = dir.join("chat_template.jinja");
        let chat_template = match read_optional(&template_path)? {
            Some(text) => Some(text),
            None => hf_chat_template(&config_path, config.get("chat_template"))?,
        };
        let generation_path = dir.join("generation_config.json");
        let extra_eos_ids = if generation_path.exists() {
            met_config::GenerationConfig::from_file(&generation_path)?.eos_token_ids
        } else {
            Vec::new()
        };
        Self::from_parts(TokenizerParts { backend, specials, framing, extra_eos_ids, chat_template })
    }

    /// Token ids of `text`. Special-token text in it becomes those tokens;
    /// `add_special_tokens` adds the bos/eos this tokenizer frames a sequence with.
    ///
    /// # Errors
    /// [`TextError::Tokenizer`] if the backend fails (it does not on valid vocabularies).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TextError> {
        let inner = &self.inner;
        let encoding = inner.backend.encode_fast(text, add_special_tokens).map_err(tokenizer_error)?;
        if !(inner.manual_framing && add_special_tokens) {
            return Ok(encoding.get_ids().to_vec());
        }
        let bos = inner.specials.bos.as_ref().filter(|_| inner.add_bos).map(|t| t.id);
        let eos = inner.specials.eos.as_ref().filter(|_| inner.add_eos).map(|t| t.id);
        Ok(bos.into_iter().chain(encoding.get_ids().iter().copied()).chain(eos).collect())
    }

    /// Token ids of `text` with special-token text in it kept as text: `<|im_start|>` becomes
    /// the ids of its characters, not the control token. No bos/eos is added.
    ///
    /// # Errors
    /// As [`Tokenizer::encode`].
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>, TextError> {
        let plain = self.inner.plain.get_or_init(|| {
            let mut backend = self.inner.backend.clone();
            backend.set_encode_special_tokens(true);
            backend
        });
        Ok(plain.encode_fast(text, false).map_err(tokenizer_error)?.get_ids().to_vec())
    }

    /// The text of every special token (`<|im_start|>`): what [`Tokenizer::encode`] turns into
    /// a control token wherever it appears.
    #[must_use]
    pub fn special_texts(&self) -> Vec<String> {
        let added = self.inner.backend.get_added_tokens_decoder();
        added.values().filter(|t| t.special && !t.content.is_empty()).map(|t| t.content.clone()).collect()
    }

    /// The text of `ids`; unknown ids are left out, and special tokens too when
    /// `skip_special_tokens`. Invalid UTF-8 (an incomplete character) becomes U+FFFD.
    ///
    /// # Errors
    /// [`TextError::Tokenizer`] if the backend's decoder fails.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TextError> {
        self.inner.backend.decode(ids, skip_special_tokens).map_err(tokenizer_error)
    }

    /// The vocabulary entry of `id`, as the backend spells it (`Ġhello` for byte-level
    /// BPE, `▁hello` for SentencePiece), or `None` for an id outside the vocabulary.
    #[must_use]
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.inner.backend.id_to_token(id)
    }

    /// The id of a vocabulary entry or added token, spelled as [`Tokenizer::token_text`].
    #[must_use]
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.backend.token_to_id(text)
    }

    /// Number of ids, added tokens included.
    #[must_use]
    pub fn vocab_size(&self) -> usize {
        self.inner.backend.get_vocab_size(true)
    }

    /// Whether `id` is a special token (skipped by `decode(_, true)`).
    #[must_use]
    pub fn is_special(&self, id: u32) -> bool {
        let added = self.inner.backend.get_added_vocabulary();
        added.simple_id_to_token(id).is_some_and(|t| added.is_special_token(&t))
    }

    /// Whether `id` is a byte-fallback token (`<0xE2>`) that the decoder turns into a raw
    /// byte. A run of them decodes as one unit: if the run is not valid UTF-8, every byte of
    /// it becomes U+FFFD, even bytes that were a valid character on their own.
    pub(crate) fn is_fallback_byte(&self, id: u32) -> bool {
        self.inner.byte_fallback
            && self.inner.backend.id_to_token(id).is_some_and(|t| {
                t.len() == 6 && t.starts_with("<0x") && t.ends_with('>') && u8::from_str_radix(&t[3..5], 16).is_ok()
            })
    }

    /// The named special tokens.
    #[must_use]
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.inner.specials
    }

    /// Beginning-of-sequence token.
    #[must_use]
    pub fn bos(&self) -> Option<&SpecialToken> {
        self.inner.specials.bos.as_ref()
    }

    /// End-of-sequence token.
    #[must_use]
    pub fn eos(&self) -> Option<&SpecialToken> {
        self.inner.specials.eos.as_ref()
    }

    /// Padding token.
    #[must_use]
    pub fn pad(&self) -> Option<&SpecialToken> {
        self.inner.specials.pad.as_ref()
    }

    /// Every id that ends generation: eos first, then those of `generation_config.json`.
    #[must_use]
    pub fn eos_ids(&self) -> &[u32] {
        &self.inner.eos_ids
    }

    /// Whether `encode(_, true)` starts with bos.
    #[must_use]
    pub fn add_bos(&self) -> bool {
        self.inner.add_bos
    }

    /// Whether `encode(_, true)` ends with eos.
    #[must_use]
    pub fn add_eos(&self) -> bool {
        self.inner.add_eos
    }

    /// The backend pipeline as `tokenizer.json` text (model, vocabulary, added tokens,
    /// decoder): what tools that read Hugging Face tokenizers, such as a grammar engine's
    /// token trie, are built from, whichever source this tokenizer came from.
    ///
    /// # Errors
    /// [`TextError::Tokenizer`] if the backend cannot be serialised.
    pub fn to_json(&self) -> Result<String, TextError> {
        self.inner.backend.to_string(false).map_err(tokenizer_error)
    }

    /// The model's chat template source, if it ships one.
    #[must_use]
    pub fn chat_template(&self) -> Option<&str> {
        self.inner.chat_template.as_deref()
    }
}

fn has_byte_fallback(decoder: &tokenizers::DecoderWrapper) -> bool {
    match decoder {
        tokenizers::DecoderWrapper::ByteFallback(_) => true,
        tokenizers::DecoderWrapper::Sequence(seq) => seq.get_decoders().iter().any(has_byte_fallback),
        _ => false,
    }
}

fn tokenizer_error(e: tokenizers::Error) -> TextError {
    TextError::Tokenizer(e.to_string())
}

/// The file's text, or `None` when it does not exist.
fn read_optional(path: &Path) -> Result<Option<String>, TextError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TextError::Io { path: path.to_owned(), source }),
    }
}

fn parse_object(path: &Path, text: &str) -> Result<serde_json::Map<String, Value>, TextError> {
    match serde_json::from_str(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(TextError::file(path, "not a JSON object")),
        Err(e) => Err(TextError::file(path, format!("invalid JSON: {e}"))),
    }
}

/// The named special tokens of `tokenizer_config.json`. Each is a string or an
/// `AddedToken` object (`{"content": "<s>", ...}`), and must be in the vocabulary.
fn hf_special_tokens(
    backend: &tokenizers::Tokenizer,
    path: &Path,
    config: &serde_json::Map<String, Value>,
) -> Result<SpecialTokens, TextError> {
    let token = |key: &str| -> Result<Option<SpecialToken>, TextError> {
        let text = match config.get(key) {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Object(o)) => match o.get("content") {
                Some(Value::String(s)) => s.clone(),
                _ => return Err(TextError::file(path, format!("field `{key}`: no string `content`"))),
            },
            Some(other) => return Err(TextError::file(path, format!("field `{key}`: unexpected {other}"))),
        };
        let id = backend
            .token_to_id(&text)
            .ok_or_else(|| TextError::file(path, format!("field `{key}`: {text:?} is not in the vocabulary")))?;
        Ok(Some(SpecialToken { id, text }))
    };
    Ok(SpecialTokens {
        bos: token("bos_token")?,
        eos: token("eos_token")?,
        unk: token("unk_token")?,
        pad: token("pad_token")?,
    })
}

/// `chat_template` of `tokenizer_config.json`: a string, or a list of named templates of
/// which met uses `default`.
fn hf_chat_template(path: &Path, value: Option<&Value>) -> Result<Option<String>, TextError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(named)) => {
            let default = named.iter().find(|t| t.get("name").and_then(Value::as_str) == Some("default"));
            Ok(default.and_then(|t| t.get("template")).and_then(Value::as_str).map(str::to_owned))
        }
        Some(other) => Err(TextError::file(path, format!("field `chat_template`: unexpected {other}"))),
    }
}
