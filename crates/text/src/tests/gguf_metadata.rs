//! GGUF tokenizers built from metadata: a tiny SentencePiece (`llama`) vocabulary checked
//! against transformers, and the errors for missing or bad keys.
//!
//! The expected ids come from transformers 5.24's GGUF loader on the same vocabulary:
//! `convert_gguf_tokenizer("llama", {"tokenizer_type": "llama", "tokens": ..., "scores": ...,
//! "token_type": ..., "bos_token_id": 1, "eos_token_id": 2, "unk_token_id": 0})` wrapped in
//! `TokenizersBackend(tokenizer_object=..., bos_token="<s>", eos_token="</s>",
//! unk_token="<unk>", add_bos_token=True)`, then `encode` / `decode`.

use met_model_weights::GgufValue;

use super::support::{string, strings, tiny_llama, tiny_llama_metadata};
use crate::{TextError, Tokenizer};

struct Case {
    text: &'static str,
    ids: &'static [u32],
    decoded: &'static str,
    decoded_skip: &'static str,
}

const CASES: &[Case] = &[
    Case {
        text: "hello world",
        ids: &[270, 262, 273, 276, 277, 263, 267],
        decoded: "hello world",
        decoded_skip: "hello world",
    },
    Case {
        text: " hello  world",
        ids: &[270, 262, 273, 260, 276, 277, 263, 267],
        decoded: "hello  world",
        decoded_skip: "hello  world",
    },
    Case {
        text: "héllo wörld 😊",
        ids: &[270, 269, 273, 276, 199, 186, 266, 263, 267, 260, 244, 163, 156, 142],
        decoded: "héllo wörld 😊",
        decoded_skip: "héllo wörld 😊",
    },
    Case {
        text: "<|turn|>hello<think>a</s>",
        ids: &[3, 274, 281, 268, 2],
        decoded: "<|turn|>hello<think>a</s>",
        decoded_skip: "hello<think>a",
    },
    Case { text: "", ids: &[], decoded: "", decoded_skip: "" },
    Case { text: "a", ids: &[280], decoded: "a", decoded_skip: "a" },
];

#[test]
fn sentencepiece_vocabulary_tokenizes_like_transformers() {
    let tokenizer = tiny_llama();
    assert!(tokenizer.add_bos(), "llama vocabularies add bos unless the file says otherwise");
    assert_eq!(tokenizer.bos().map(|t| (t.id, t.text.as_str())), Some((1, "<s>")));
    assert_eq!(tokenizer.eos_ids(), [2]);
    for case in CASES {
        assert_eq!(tokenizer.encode(case.text, false).unwrap(), case.ids, "{:?}", case.text);
        let with_bos: Vec<u32> = [1].iter().chain(case.ids).copied().collect();
        assert_eq!(tokenizer.encode(case.text, true).unwrap(), with_bos, "{:?}", case.text);
        assert_eq!(tokenizer.decode(case.ids, false).unwrap(), case.decoded, "{:?}", case.text);
        assert_eq!(tokenizer.decode(&with_bos, true).unwrap(), case.decoded_skip, "{:?}", case.text);
    }
    assert!(tokenizer.is_special(3), "control tokens are special");
    assert!(!tokenizer.is_special(281), "user-defined tokens are added but not special");
    assert_eq!(tokenizer.token_text(279).as_deref(), Some("▁world"));
}

#[test]
fn add_space_prefix_false_drops_the_leading_marker() {
    let mut metadata = tiny_llama_metadata();
    metadata.insert("tokenizer.ggml.add_space_prefix".into(), GgufValue::Bool(false));
    metadata.insert("tokenizer.ggml.add_bos_token".into(), GgufValue::Bool(false));
    let tokenizer = Tokenizer::from_gguf_metadata(&metadata).unwrap();
    // "a" alone is the piece `a` (268), not `▁a` (280), and decoding keeps a leading space.
    assert_eq!(tokenizer.encode("a", true).unwrap(), [268]);
    assert_eq!(tokenizer.decode(&[280], false).unwrap(), " a");
}

fn error_of(metadata: &std::collections::BTreeMap<String, GgufValue>) -> TextError {
    Tokenizer::from_gguf_metadata(metadata).expect_err("metadata should be rejected")
}

#[test]
fn missing_keys_are_named() {
    for key in ["tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.scores"] {
        let mut metadata = tiny_llama_metadata();
        metadata.remove(key);
        let err = error_of(&metadata);
        assert!(matches!(&err, TextError::MissingKey { key: k } if k == key), "{err}");
        assert!(err.to_string().contains(key), "{err}");
    }
    let mut metadata = tiny_llama_metadata();
    metadata.insert("tokenizer.ggml.model".into(), string("gpt2"));
    let err = error_of(&metadata);
    assert!(err.to_string().contains("tokenizer.ggml.merges"), "byte-level BPE needs merges: {err}");
}

#[test]
fn unsupported_model_is_named() {
    let mut metadata = tiny_llama_metadata();
    metadata.insert("tokenizer.ggml.model".into(), string("bert"));
    let err = error_of(&metadata);
    assert!(matches!(&err, TextError::UnsupportedModel { model } if model == "bert"), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("tokenizer.ggml.model") && msg.contains("bert"), "{msg}");
}

#[test]
fn malformed_keys_are_named() {
    let bad: [(&str, GgufValue, &str); 5] = [
        ("tokenizer.ggml.model", GgufValue::U32(1), "expected a string"),
        ("tokenizer.ggml.tokens", strings(["a"]), "elements for 1 tokens"),
        ("tokenizer.ggml.token_type", GgufValue::Array(vec![GgufValue::I32(1)]), "elements for"),
        ("tokenizer.ggml.bos_token_id", GgufValue::U32(100_000), "outside the vocabulary"),
        ("tokenizer.ggml.add_bos_token", string("yes"), "expected a bool"),
    ];
    for (key, value, want) in bad {
        let mut metadata = tiny_llama_metadata();
        metadata.insert(key.into(), value);
        let msg = error_of(&metadata).to_string();
        // A one-token vocabulary makes the per-token arrays the wrong length: the error names
        // whichever key disagrees with it.
        assert!(msg.contains("tokenizer.ggml.") && msg.contains(want), "{key}: {msg}");
        if key != "tokenizer.ggml.tokens" {
            assert!(msg.contains(key), "{key}: {msg}");
        }
    }
}

#[test]
fn byte_level_merges_must_be_pairs() {
    let metadata = std::collections::BTreeMap::from([
        ("tokenizer.ggml.model".to_owned(), string("gpt2")),
        ("tokenizer.ggml.tokens".to_owned(), strings(["a", "b", "ab"])),
        ("tokenizer.ggml.merges".to_owned(), strings(["ab"])),
    ]);
    let msg = error_of(&metadata).to_string();
    assert!(msg.contains("tokenizer.ggml.merges") && msg.contains("not a pair"), "{msg}");
}

/// `ő` (C5 91) in GPT-2's byte alphabet: two symbols, the second one shifted past U+0100.
fn spelled_o_double_acute() -> (String, String) {
    let alphabet = crate::gguf_tokenizer::byte_alphabet();
    (alphabet[0xC5].to_string(), alphabet[0x91].to_string())
}

/// A byte-level vocabulary: the 256 byte symbols, `12`, `123`, `1234`, a raw (not
/// byte-spelled) `ő`, and two tokens marked control: `<|eot|>` and a mislabelled `<|a b|>`.
fn tiny_gpt2_metadata(pre: Option<&str>) -> std::collections::BTreeMap<String, GgufValue> {
    let mut tokens: Vec<String> = crate::gguf_tokenizer::byte_alphabet().into_iter().map(String::from).collect();
    tokens.extend(["12", "123", "1234", "ő", "<|eot|>", "<|a b|>"].map(String::from));
    let types = (0..tokens.len()).map(|i| GgufValue::I32(if i >= 260 { 3 } else { 1 })).collect();
    let (first, second) = spelled_o_double_acute();
    let merge = format!("{first} {second}");
    let mut metadata = std::collections::BTreeMap::from([
        ("tokenizer.ggml.model".to_owned(), string("gpt2")),
        ("tokenizer.ggml.tokens".to_owned(), strings(tokens.iter().map(String::as_str))),
        ("tokenizer.ggml.merges".to_owned(), strings(["1 2", "12 3", "123 4", merge.as_str()])),
        ("tokenizer.ggml.token_type".to_owned(), GgufValue::Array(types)),
        ("tokenizer.ggml.eos_token_id".to_owned(), GgufValue::U32(260)),
    ]);
    if let Some(pre) = pre {
        metadata.insert("tokenizer.ggml.pre".into(), string(pre));
    }
    metadata
}

#[test]
fn the_split_regex_follows_tokenizer_ggml_pre() {
    // GPT-2's regex keeps a digit run whole, Llama 3's cuts it in threes, Qwen 2's in ones.
    let cases: [(Option<&str>, &[u32]); 5] = [
        (None, &[258]),
        (Some("smollm"), &[258]),
        (Some("llama-bpe"), &[257, 52]),
        (Some("llama3"), &[257, 52]),
        (Some("qwen2"), &[49, 50, 51, 52]),
    ];
    for (pre, want) in cases {
        let tokenizer = Tokenizer::from_gguf_metadata(&tiny_gpt2_metadata(pre)).unwrap();
        assert_eq!(tokenizer.encode("1234", false).unwrap(), want, "{pre:?}");
        assert_eq!(tokenizer.decode(want, false).unwrap(), "1234", "{pre:?}");
    }
}

#[test]
fn byte_level_respells_raw_tokens_and_skips_mislabelled_controls() {
    let tokenizer = Tokenizer::from_gguf_metadata(&tiny_gpt2_metadata(None)).unwrap();
    let (first, second) = spelled_o_double_acute();
    assert_eq!(tokenizer.token_text(259), Some(format!("{first}{second}")), "stored as its bytes' symbols");
    assert_eq!(tokenizer.encode("ő", false).unwrap(), [259]);
    assert_eq!(tokenizer.decode(&[259], false).unwrap(), "ő");
    assert!(!tokenizer.add_bos(), "byte-level vocabularies add no bos by default");
    assert_eq!(tokenizer.encode("x<|eot|>", true).unwrap(), [u32::from(b'x'), 260]);
    assert!(tokenizer.is_special(260));
    assert_eq!(tokenizer.decode(&[u32::from(b'x'), 260], true).unwrap(), "x");
    // `<|a b|>` holds a space, which no byte-level token can: a converter's mislabel, left out.
    assert!(!tokenizer.is_special(261));
    assert_ne!(tokenizer.encode("<|a b|>", false).unwrap(), [261]);
}
