//! Properties of the incremental detokenizer, on a SentencePiece vocabulary with byte
//! fallback (always) and on the default model's byte-level vocabulary (when installed):
//! random id sequences, including characters spelled as one byte token per UTF-8 byte.

use proptest::prelude::*;

use super::support::{smollm2, tiny_llama, tiny_llama_tokens};
use crate::gguf_tokenizer::byte_alphabet;
use crate::{Detokenizer, Tokenizer};

/// Characters of 1-4 UTF-8 bytes, emoji among them.
fn any_char() -> impl Strategy<Value = char> {
    prop_oneof![
        proptest::char::range('a', 'z'),
        proptest::char::range('\u{e0}', '\u{ff}'),
        proptest::char::range('\u{4e00}', '\u{4e80}'),
        proptest::char::range('\u{1f600}', '\u{1f64f}'),
        Just('\u{200d}'),
        Just(' '),
    ]
}

/// How a vocabulary spells one byte as a token id.
type ByteIds = Vec<u32>;

fn llama_byte_ids() -> ByteIds {
    (0..=255u32).map(|b| b + 4).collect()
}

/// Bytes that never occur in UTF-8 (0xC0, 0xC1, 0xF5-0xFF) may be missing from a byte-level
/// vocabulary; the generated characters never need them.
fn byte_level_ids(tokenizer: &Tokenizer) -> ByteIds {
    byte_alphabet().into_iter().map(|c| tokenizer.token_id(&c.to_string()).unwrap_or(u32::MAX)).collect()
}

/// A sequence made of segments: any id of the vocabulary (possibly a stray byte), or a
/// whole character spelled byte by byte.
fn id_sequence(vocab: u32, byte_ids: ByteIds, complete_only: bool) -> impl Strategy<Value = Vec<u32>> {
    let spelled = any_char().prop_map(move |c| {
        let mut buf = [0u8; 4];
        c.encode_utf8(&mut buf).bytes().map(|b| byte_ids[usize::from(b)]).collect::<Vec<u32>>()
    });
    let any_id = (0..vocab).prop_map(|id| vec![id]);
    let segment = if complete_only { spelled.boxed() } else { prop_oneof![2 => any_id, 1 => spelled].boxed() };
    proptest::collection::vec(segment, 0..24).prop_map(|segments| segments.concat())
}

/// Streams `ids`, checking after every step that what was emitted is a prefix of the
/// one-shot decode of all of them (text once emitted never changes); returns the chunks.
fn stream_checked(tokenizer: &Tokenizer, ids: &[u32], skip: bool) -> Result<Vec<String>, TestCaseError> {
    let full = tokenizer.decode(ids, skip).unwrap();
    let mut detokenizer = Detokenizer::new(tokenizer, skip);
    let mut chunks = Vec::new();
    let mut emitted = String::new();
    for (i, &id) in ids.iter().enumerate() {
        let chunk = detokenizer.push(id).unwrap();
        emitted.push_str(&chunk);
        chunks.push(chunk);
        prop_assert!(full.starts_with(&emitted), "after {} ids: emitted {emitted:?}, final {full:?}", i + 1);
    }
    chunks.push(detokenizer.finish().unwrap());
    Ok(chunks)
}

/// The invariant: the chunks concatenate to the one-shot decode, so each is the slice of it
/// at its place, and holds U+FFFD only where the one-shot decode does.
fn check_stream(tokenizer: &Tokenizer, ids: &[u32]) -> Result<(), TestCaseError> {
    for skip in [false, true] {
        let full = tokenizer.decode(ids, skip).unwrap();
        let chunks = stream_checked(tokenizer, ids, skip)?;
        let mut at = 0;
        for chunk in &chunks {
            let place = full.get(at..at + chunk.len());
            prop_assert_eq!(place, Some(chunk.as_str()), "chunk at byte {} of {:?}", at, full);
            at += chunk.len();
        }
        prop_assert_eq!(at, full.len(), "concatenation is shorter than {:?}", full);
    }
    Ok(())
}

fn no_replacement_emitted(tokenizer: &Tokenizer, ids: &[u32]) -> Result<(), TestCaseError> {
    let chunks = stream_checked(tokenizer, ids, false)?;
    for chunk in &chunks {
        prop_assert!(!chunk.contains('\u{fffd}'), "{chunk:?} in {chunks:?}");
    }
    Ok(())
}

proptest! {
    #[test]
    fn sentencepiece_stream_equals_one_shot_decode(ids in id_sequence(tiny_llama_tokens().len() as u32, llama_byte_ids(), false)) {
        check_stream(&tiny_llama(), &ids)?;
    }

    #[test]
    fn sentencepiece_complete_characters_never_emit_replacement(ids in id_sequence(260, llama_byte_ids(), true)) {
        no_replacement_emitted(&tiny_llama(), &ids)?;
    }
}

/// Runs `check` over sequences of the default model's vocabulary, if it is installed (a
/// strategy needs the tokenizer, so this drives proptest's runner by hand).
fn run_byte_level(complete_only: bool, check: fn(&Tokenizer, &[u32]) -> Result<(), TestCaseError>) {
    let Some(tokenizer) = smollm2() else { return };
    let strategy = id_sequence(tokenizer.vocab_size() as u32, byte_level_ids(tokenizer), complete_only);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(128));
    if let Err(e) = runner.run(&strategy, |ids| check(tokenizer, &ids)) {
        panic!("{e}");
    }
}

#[test]
fn byte_level_stream_equals_one_shot_decode() {
    run_byte_level(false, check_stream);
}

#[test]
fn byte_level_complete_characters_never_emit_replacement() {
    run_byte_level(true, no_replacement_emitted);
}

#[test]
fn a_byte_fallback_character_is_held_until_its_run_ends() {
    let tokenizer = tiny_llama();
    let mut detokenizer = Detokenizer::new(&tokenizer, true);
    assert_eq!(detokenizer.push(1).unwrap(), "", "bos is skipped");
    assert_eq!(detokenizer.push(275).unwrap(), "hello", "the first piece loses its ▁ prefix");
    // Even complete, the emoji's bytes wait for a non-byte token: one more byte could still
    // turn the whole run into U+FFFDs.
    let emoji: Vec<String> = [0xF0u32, 0x9F, 0x98, 0x8A].iter().map(|b| detokenizer.push(b + 4).unwrap()).collect();
    assert_eq!(emoji, ["", "", "", ""]);
    assert_eq!(detokenizer.push(279).unwrap(), "😊 world", "later pieces keep their space");
    assert_eq!(detokenizer.push(0xE2 + 4).unwrap(), "");
    assert_eq!(detokenizer.finish().unwrap(), "\u{fffd}", "an unfinished character is flushed as decode has it");
    assert_eq!(tokenizer.decode(detokenizer.ids(), true).unwrap(), "hello😊 world\u{fffd}");
}

#[test]
fn a_valid_byte_run_turned_invalid_is_never_emitted_early() {
    // `<0x61>` alone decodes to "a", but `<0x61><0xC3>` followed by a piece decodes to
    // "��" plus the piece: the run is one unit, so "a" must not be emitted on its own.
    let tokenizer = tiny_llama();
    let ids = [0x61 + 4, 0xC3 + 4, 280];
    let full = tokenizer.decode(&ids, false).unwrap();
    assert_eq!(full, "\u{fffd}\u{fffd} a");
    let mut detokenizer = Detokenizer::new(&tokenizer, false);
    let chunks: Vec<String> = ids.iter().map(|&id| detokenizer.push(id).unwrap()).collect();
    assert_eq!(chunks, ["", "", full.as_str()]);
    assert_eq!(detokenizer.finish().unwrap(), "");
}

#[test]
fn a_byte_level_character_is_emitted_as_soon_as_it_is_complete() {
    let Some(tokenizer) = smollm2() else { return };
    let byte_ids = byte_level_ids(tokenizer);
    let mut detokenizer = Detokenizer::new(tokenizer, false);
    let pushed: Vec<String> = "😊".bytes().map(|b| detokenizer.push(byte_ids[usize::from(b)]).unwrap()).collect();
    assert_eq!(pushed, ["", "", "", "😊"]);
    assert_eq!(detokenizer.push(byte_ids[0xE2]).unwrap(), "");
    assert_eq!(
        detokenizer.push(byte_ids[usize::from(b'a')]).unwrap(),
        "\u{fffd}a",
        "a broken sequence is final once followed"
    );
    assert_eq!(detokenizer.finish().unwrap(), "");
}
