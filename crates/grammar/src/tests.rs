//! The grammar engine over a small byte-level BPE vocabulary (every byte, a few merges that
//! JSON uses, two special tokens): random walks through each kind of grammar, taking any
//! token its masks allow, must end in text the grammar accepts, and bad grammars must be
//! refused with a message that names the problem.

use serde_json::{Value, json};

use super::{GrammarError, GrammarSpec, Grammars};
use met_scheduler::ConstraintState;

const EOS: u32 = 1;
const MERGES: [(&str, &str); 6] = [("{", "\""), ("\"", ":"), ("n", "a"), ("na", "m"), ("nam", "e"), ("t", "r")];

/// GPT-2's byte-to-character map of byte-level BPE.
fn byte_char(b: u8) -> char {
    let direct = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if direct(b) {
        return char::from(b);
    }
    let k = (0..b).filter(|&x| !direct(x)).count() as u32;
    char::from_u32(256 + k).unwrap()
}

fn spell(s: &str) -> String {
    s.bytes().map(byte_char).collect()
}

fn tokenizer() -> (met_text::Tokenizer, tempfile::TempDir) {
    let mut vocab = serde_json::Map::new();
    vocab.insert("<|endoftext|>".into(), json!(0));
    vocab.insert("<|im_end|>".into(), json!(1));
    for b in 0..=255u8 {
        vocab.insert(byte_char(b).to_string(), json!(vocab.len()));
    }
    for (a, b) in MERGES {
        vocab.insert(spell(&format!("{a}{b}")), json!(vocab.len()));
    }
    let merges: Vec<String> = MERGES.iter().map(|(a, b)| format!("{} {}", spell(a), spell(b))).collect();
    let added = |id: u32, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
               "normalized": false, "special": true})
    };
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [added(0, "<|endoftext|>"), added(1, "<|im_end|>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges},
    });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    std::fs::write(dir.path().join("tokenizer_config.json"), json!({"eos_token": "<|im_end|>"}).to_string()).unwrap();
    (met_text::Tokenizer::from_hf_dir(dir.path()).unwrap(), dir)
}

/// SplitMix64, for the walks' choices.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn allowed(mask: &[u32]) -> Vec<u32> {
    (0..mask.len() as u32 * 32).filter(|&t| mask[t as usize / 32] >> (t % 32) & 1 == 1).collect()
}

/// Takes allowed tokens at random (the end token, when allowed, half the time; one of
/// `prefer`, when allowed, two times in three), until the constraint completes or the end
/// token is drawn: the text.
fn walk(state: &mut dyn ConstraintState, tok: &met_text::Tokenizer, vocab: usize, seed: u64, prefer: &[u32]) -> String {
    let mut rng = seed;
    let mut ids = Vec::new();
    for _ in 0..400 {
        let mut mask = vec![0u32; vocab.div_ceil(32)];
        state.fill_mask(&mut mask).unwrap();
        let choices = allowed(&mask);
        assert!(!choices.is_empty(), "a mask allows nothing after {:?}", tok.decode(&ids, false));
        assert!(choices.iter().all(|&t| (t as usize) < vocab));
        let ends = choices.contains(&EOS);
        let preferred: Vec<u32> = prefer.iter().copied().filter(|t| choices.contains(t)).collect();
        let pick = if ends && next(&mut rng).is_multiple_of(2) {
            EOS
        } else if !preferred.is_empty() && !next(&mut rng).is_multiple_of(3) {
            preferred[next(&mut rng) as usize % preferred.len()]
        } else {
            let others: Vec<u32> = choices.iter().copied().filter(|&t| t != EOS).collect();
            if others.is_empty() { EOS } else { others[next(&mut rng) as usize % others.len()] }
        };
        if pick == EOS {
            return tok.decode(&ids, false).unwrap();
        }
        state.accept(pick).unwrap();
        ids.push(pick);
        if state.is_complete() {
            return tok.decode(&ids, false).unwrap();
        }
    }
    panic!("no end after 400 tokens: {:?}", tok.decode(&ids, false));
}

fn walks(spec: &GrammarSpec, n: u64, prefer: &str) -> Vec<String> {
    let (tok, _dir) = tokenizer();
    // The model has more logits than the tokenizer has tokens: those are never allowed.
    let vocab = tok.vocab_size() + 7;
    let grammars = Grammars::new(&tok, vocab).unwrap();
    let constraint = grammars.compile(spec).unwrap();
    let prefer: Vec<u32> = prefer.chars().map(|c| tok.encode(&c.to_string(), false).unwrap()[0]).collect();
    (0..n).map(|seed| walk(&mut *constraint.0.start(), &tok, vocab, seed, &prefer)).collect()
}

#[test]
fn json_schema_walks_end_in_valid_instances() {
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
            "ok": {"type": "boolean"}
        },
        "required": ["name", "age", "ok"],
        "additionalProperties": false
    });
    for text in walks(&GrammarSpec::JsonSchema(schema), 40, "") {
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        let o = v.as_object().unwrap();
        assert!(o.keys().all(|k| ["name", "age", "tags", "ok"].contains(&k.as_str())), "{text}");
        assert!(o["name"].as_str().is_some_and(|s| s.chars().count() <= 6), "{text}");
        assert!(o["age"].as_u64().is_some_and(|a| a <= 120), "{text}");
        assert!(o["ok"].is_boolean(), "{text}");
        if let Some(tags) = o.get("tags") {
            let tags = tags.as_array().unwrap();
            assert!(tags.len() <= 3 && tags.iter().all(|t| t == "a" || t == "b"), "{text}");
        }
        assert!(!text.contains(' ') || o["name"].as_str().unwrap().contains(' '), "whitespace outside strings: {text}");
    }
}

#[test]
fn json_object_walks_end_in_objects() {
    for text in walks(&GrammarSpec::JsonObject, 20, "\"}]1") {
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(v.is_object(), "{text}");
    }
}

#[test]
fn regex_and_choice_walks_end_in_matches() {
    for text in walks(&GrammarSpec::Regex("[ab]{2,4}-[0-9]+!".into()), 30, "") {
        let (head, tail) = text.split_once('-').unwrap_or_else(|| panic!("{text}"));
        assert!((2..=4).contains(&head.len()) && head.chars().all(|c| c == 'a' || c == 'b'), "{text}");
        let digits = tail.strip_suffix('!').unwrap_or_else(|| panic!("{text}"));
        assert!(!digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit()), "{text}");
    }
    let choices = vec!["yes".to_string(), "no".into(), "not sure \"quoted\"".into()];
    let mut seen = std::collections::BTreeSet::new();
    for text in walks(&GrammarSpec::Choice(choices.clone()), 30, "") {
        assert!(choices.contains(&text), "{text:?}");
        seen.insert(text);
    }
    assert_eq!(seen.len(), 3, "every choice is reachable");
}

#[test]
fn lark_walks_end_in_sentences() {
    let lark = r#"start: "(" expr ")"
expr: NUMBER | NUMBER "+" expr
NUMBER: /[1-9]/"#;
    for text in walks(&GrammarSpec::Lark(lark.into()), 30, ")") {
        let inner = text.strip_prefix('(').and_then(|t| t.strip_suffix(')')).unwrap_or_else(|| panic!("{text}"));
        assert!(inner.split('+').all(|n| n.len() == 1 && ('1'..='9').contains(&n.chars().next().unwrap())), "{text}");
    }
}

#[test]
fn the_end_token_is_allowed_only_where_the_output_is_complete() {
    let (tok, _dir) = tokenizer();
    let vocab = tok.vocab_size();
    let grammars = Grammars::new(&tok, vocab).unwrap();
    let mut state = grammars.compile(&GrammarSpec::Regex("ab+".into())).unwrap().0.start();
    let mut mask = vec![0u32; vocab.div_ceil(32)];
    let id = |s: &str| tok.encode(s, false).unwrap()[0];
    for (token, ends) in [("a", false), ("b", true), ("b", true)] {
        mask.fill(0);
        state.fill_mask(&mut mask).unwrap();
        assert!(allowed(&mask).contains(&id(token)));
        assert!(!allowed(&mask).contains(&0), "a special token other than eos is allowed");
        state.accept(id(token)).unwrap();
        mask.fill(0);
        state.fill_mask(&mut mask).unwrap();
        assert_eq!(allowed(&mask).contains(&EOS), ends, "after {token}");
    }
    assert!(state.accept(id("a")).is_err(), "a token the mask refuses is refused");
}

#[test]
fn bad_grammars_are_refused_with_a_message() {
    let (tok, _dir) = tokenizer();
    let grammars = Grammars::new(&tok, tok.vocab_size()).unwrap();
    let refuse = |spec: GrammarSpec, says: &str| match grammars.compile(&spec) {
        Err(GrammarError::Invalid(msg)) => assert!(msg.to_lowercase().contains(says), "{spec:?}: {msg}"),
        other => panic!("{spec:?}: {other:?}"),
    };
    refuse(GrammarSpec::JsonSchema(json!({"type": "nonsense"})), "nonsense");
    refuse(GrammarSpec::JsonSchema(json!({"type": "integer", "minimum": 5, "maximum": 1})), "unsatisfiable");
    refuse(GrammarSpec::JsonSchema(json!({"$ref": "#/$defs/missing"})), "missing");
    refuse(GrammarSpec::Regex("(ab".into()), "");
    refuse(GrammarSpec::Lark("start: ( ".into()), "");
    refuse(GrammarSpec::Choice(Vec::new()), "empty");
}

#[test]
fn a_tokenizer_without_an_end_token_is_refused() {
    let (tok, dir) = tokenizer();
    std::fs::write(dir.path().join("tokenizer_config.json"), "{}").unwrap();
    let bare = met_text::Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert!(matches!(Grammars::new(&bare, bare.vocab_size()), Err(GrammarError::Tokenizer(_))));
    assert!(matches!(Grammars::new(&tok, tok.vocab_size() - 1), Err(GrammarError::Tokenizer(_))));
}
