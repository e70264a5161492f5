//! Shared test helpers: fixture paths, the default model's tokenizer, a tiny SentencePiece
//! vocabulary in GGUF form.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use met_model_weights::{GgufFile, GgufValue};

use crate::Tokenizer;

/// `crates/server/tests/fixtures/<rel>`: the references the server's tests and the live
/// suite share (`scripts/smollm2_reference.py` writes them).
pub(super) fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../server/tests/fixtures").join(rel)
}

/// A fixture file parsed as JSON.
pub(super) fn fixture_json(rel: &str) -> serde_json::Value {
    let path = fixture(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The default model's tokenizer (SmolLM2-135M-Instruct GGUF from the met home), or `None`
/// with a printed note when the file is not installed.
pub(super) fn smollm2() -> Option<&'static Tokenizer> {
    static TOKENIZER: OnceLock<Option<Tokenizer>> = OnceLock::new();
    let loaded = TOKENIZER.get_or_init(|| {
        let path = met_config::default_model_for_test()?;
        let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Some(Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
    });
    loaded.as_ref()
}

pub(super) fn string(s: &str) -> GgufValue {
    GgufValue::String(s.to_owned())
}

pub(super) fn strings<'a>(items: impl IntoIterator<Item = &'a str>) -> GgufValue {
    GgufValue::Array(items.into_iter().map(string).collect())
}

/// The vocabulary of [`tiny_llama_metadata`]: specials, the 256 byte tokens, then pieces.
pub(super) fn tiny_llama_tokens() -> Vec<String> {
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>", "<|turn|>"].map(String::from).to_vec();
    tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    let pieces = [
        "▁", "h", "e", "l", "o", "w", "r", "d", "a", "é", "▁h", "he", "ll", "llo", "hello", "▁hello", "▁w", "or",
        "orld", "▁world", "▁a", "<think>",
    ];
    tokens.extend(pieces.map(String::from));
    tokens
}

/// GGUF metadata of a tiny SentencePiece-style (`llama`) tokenizer with byte fallback and
/// no merges (they are derived from the scores), like the Llama 2 family's files.
pub(super) fn tiny_llama_metadata() -> BTreeMap<String, GgufValue> {
    let tokens = tiny_llama_tokens();
    let types: Vec<GgufValue> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let ty = match (i, t.as_str()) {
                (0, _) => 2,
                (1..=3, _) => 3,
                (_, "<think>") => 4,
                (_, t) if t.starts_with("<0x") => 6,
                _ => 1,
            };
            GgufValue::I32(ty)
        })
        .collect();
    // Longer pieces score higher, so they merge first; byte tokens and specials score 0.
    let scores: Vec<GgufValue> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| GgufValue::F32(if i < 260 { 0.0 } else { -100.0 + t.chars().count() as f32 }))
        .collect();
    BTreeMap::from([
        ("tokenizer.ggml.model".into(), string("llama")),
        ("tokenizer.ggml.tokens".into(), strings(tokens.iter().map(String::as_str))),
        ("tokenizer.ggml.scores".into(), GgufValue::Array(scores)),
        ("tokenizer.ggml.token_type".into(), GgufValue::Array(types)),
        ("tokenizer.ggml.bos_token_id".into(), GgufValue::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), GgufValue::U32(2)),
        ("tokenizer.ggml.unknown_token_id".into(), GgufValue::U32(0)),
    ])
}

/// The tokenizer of [`tiny_llama_metadata`].
pub(super) fn tiny_llama() -> Tokenizer {
    Tokenizer::from_gguf_metadata(&tiny_llama_metadata()).unwrap()
}
