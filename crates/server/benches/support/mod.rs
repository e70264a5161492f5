//! Shared by the `met-server` benches: a tokenizer, SmolLM2's chat template, a long
//! generated text and a multi-turn conversation.
//!
//! The tokenizer is the default model's (SmolLM2-135M-Instruct, from its GGUF under the met
//! home) when it is installed. Otherwise, and always for benches that need a vocabulary the
//! mock model can match, it is a byte-level BPE built in memory from GGUF metadata (the
//! `gpt2` path SmolLM2 takes too): the 256 byte tokens, SmolLM2's three control tokens at
//! its ids, and merges that spell common English words and code tokens whole, with
//! SmolLM2's chat template from the committed transformers reference.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashSet};

use met_model_weights::{GgufFile, GgufValue};
use met_text::{ChatMessage, Tokenizer};

/// llama.cpp's `token_type` of a normal and of a control token.
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;

/// SmolLM2's control tokens, at its ids: unk, bos, eos.
const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// Words and pieces the in-memory vocabulary spells as one token each (a leading space
/// is part of the token, as in GPT-2's vocabulary).
#[rustfmt::skip]
const WORDS: &[&str] = &[
    " the", " of", " and", " to", " a", " in", " is", " that", " for", " it", " as", " with", " on", " be", " by",
    " this", " are", " or", " from", " at", " an", " not", " which", " can", " have", " has", " will", " one",
    " each", " when", " than", " its", " into", " more", " only", " so", " do", " if", " no", " all", " we", " you",
    " model", " token", " tokens", " text", " cache", " block", " blocks", " request", " server", " stream",
    " engine", " batch", " step", " prompt", " answer", " memory", " time", " first", " last", " new", " every",
    " sequence", " attention", " layer", " weights", " decode", " length", " number", " string", " value", "ing",
    "ed", "er", "es", "ly", "tion", " fn", " let", " mut", " return", " for", " in", " if", " else", " match",
    " self", " Some", " None", " Ok", " Err", " =", " ==", " ->", " =>", " {", " }", "()", "();", " //", "\n",
    "\n\n", "    ", "        ", ".", ",", ":", ";", " (", ")", " \"", "\"", " 1", " 2", " 3", " 4", " 5", " 0",
    "The", "In", "A", " Paris", " France", " capital", " city", " river", " km", " café", " naïve", " über", " 東京",
    " 日本", " 😊", " 🚀",
];

/// GPT-2's printable spelling of byte `b` (its `bytes_to_unicode`): printable Latin-1
/// bytes stand for themselves, the others for code points from U+0100 in byte order.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(0x100 + rank).expect("a code point below U+0144")
}

fn spell(text: &str) -> Vec<String> {
    text.bytes().map(|b| byte_char(b).to_string()).collect()
}

/// The in-memory vocabulary and merges: each word of [`WORDS`] is merged left to right,
/// one byte at a time, so its every prefix is a token.
fn vocabulary() -> (Vec<String>, Vec<String>) {
    let mut tokens: Vec<String> = SPECIALS.map(String::from).to_vec();
    tokens.extend((0..=255u8).map(|b| byte_char(b).to_string()));
    let mut known: HashSet<String> = tokens.iter().cloned().collect();
    let mut merges = Vec::new();
    for word in WORDS {
        let mut pieces = spell(word).into_iter();
        let Some(mut left) = pieces.next() else { continue };
        for right in pieces {
            let joined = format!("{left}{right}");
            if known.insert(joined.clone()) {
                merges.push(format!("{left} {right}"));
                tokens.push(joined.clone());
            }
            left = joined;
        }
    }
    (tokens, merges)
}

fn strings(items: impl IntoIterator<Item = String>) -> GgufValue {
    GgufValue::Array(items.into_iter().map(GgufValue::String).collect())
}

/// SmolLM2-135M-Instruct's chat template, from the committed transformers reference.
pub fn smollm2_template() -> String {
    let reference: serde_json::Value =
        serde_json::from_str(include_str!("../../tests/fixtures/smollm2/reference.json")).expect("valid JSON");
    reference["special"]["chat_template"].as_str().expect("the reference records the template").to_owned()
}

/// The byte-level BPE described in the module docs, built from GGUF metadata in memory.
pub fn in_memory_tokenizer() -> Tokenizer {
    let (tokens, merges) = vocabulary();
    let types = tokens
        .iter()
        .enumerate()
        .map(|(i, _)| GgufValue::I32(if i < SPECIALS.len() { CONTROL } else { NORMAL }))
        .collect();
    let metadata = BTreeMap::from([
        ("tokenizer.ggml.model".into(), GgufValue::String("gpt2".into())),
        ("tokenizer.ggml.tokens".into(), strings(tokens)),
        ("tokenizer.ggml.token_type".into(), GgufValue::Array(types)),
        ("tokenizer.ggml.merges".into(), strings(merges)),
        ("tokenizer.ggml.unknown_token_id".into(), GgufValue::U32(0)),
        ("tokenizer.ggml.bos_token_id".into(), GgufValue::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), GgufValue::U32(2)),
        ("tokenizer.ggml.padding_token_id".into(), GgufValue::U32(2)),
        ("tokenizer.ggml.add_bos_token".into(), GgufValue::Bool(false)),
        ("tokenizer.chat_template".into(), GgufValue::String(smollm2_template())),
    ]);
    Tokenizer::from_gguf_metadata(&metadata).expect("the in-memory vocabulary is valid")
}

/// The default model's tokenizer, or `None` with a printed note when it is not installed
/// or cannot be read.
fn default_model_tokenizer() -> Option<Tokenizer> {
    let path = met_config::default_model_path()?;
    if !path.is_file() {
        eprintln!(
            "note: the default model is not installed at {}; using an in-memory byte-level BPE \
             (`cargo xtask fetch-default-model` installs it)",
            path.display()
        );
        return None;
    }
    let tokenizer = GgufFile::open(&path)
        .map_err(|e| e.to_string())
        .and_then(|file| Tokenizer::from_gguf(&file).map_err(|e| e.to_string()));
    match tokenizer {
        Ok(tokenizer) => Some(tokenizer),
        Err(e) => {
            eprintln!("note: {}: {e}; using an in-memory byte-level BPE", path.display());
            None
        }
    }
}

/// The default model's tokenizer when installed, else the in-memory one, with the name
/// the bench IDs carry (results of the two are not comparable).
pub fn tokenizer() -> (Tokenizer, &'static str) {
    match default_model_tokenizer() {
        Some(tokenizer) => (tokenizer, "smollm2"),
        None => (in_memory_tokenizer(), "in_memory_bpe"),
    }
}

/// A paragraph of what a chat model generates: prose, a code block, numbers, accents,
/// CJK and emoji (multi-byte characters that span several byte-level tokens).
const PARAGRAPH: &str = "The capital of France is Paris, a city on the river Seine of about 2,100,000 people \
    (12.4 million in the metropolitan area). In Paris you can have a café au lait, read a naïve \
    novel über alles, or fly to 東京 (Tokyo), the capital of 日本, in about 14 hours 🚀. Each answer \
    is a sequence of tokens: the engine decodes one step at a time, and the server streams the \
    text as it comes 😊.\n\nHere is the same idea in Rust:\n\n```rust\nfn next_token(cache: &mut \
    Cache, prompt: &[u32]) -> Option<u32> {\n    let step = cache.step(prompt)?;\n    if step.is_done() \
    {\n        return None;\n    }\n    Some(step.token)\n}\n```\n\nThat is all: 3 steps, 4 blocks, \
    5 layers and 0 errors.\n\n";

/// About `tokens` tokens of generated text (paragraphs repeated), as token ids.
pub fn generated_ids(tokenizer: &Tokenizer, tokens: usize) -> Vec<u32> {
    let mut ids = Vec::with_capacity(tokens + 512);
    while ids.len() < tokens {
        ids.extend(tokenizer.encode(PARAGRAPH, false).expect("the text encodes"));
    }
    ids.truncate(tokens);
    ids
}

/// A conversation of a system prompt and `turns` user/assistant exchanges, the last user
/// message unanswered (the prompt of the next reply).
pub fn conversation(turns: usize) -> Vec<ChatMessage> {
    let mut messages = vec![ChatMessage::text(
        "system",
        "You are a helpful assistant. Answer briefly and precisely, and show code when asked.",
    )];
    for turn in 0..turns {
        messages.push(ChatMessage::text(
            "user",
            format!("Question {turn}: what is the capital of France, and how far is it from the sea?"),
        ));
        if turn + 1 < turns {
            messages.push(ChatMessage::text("assistant", PARAGRAPH));
        }
    }
    messages
}
