//! The default model's tokenizer and chat template against transformers: every case of
//! `tests/fixtures/smollm2/reference.json` (written by `scripts/smollm2_reference.py` from
//! `AutoTokenizer.from_pretrained(dir, gguf_file=...)`), both ways.

use serde_json::Value;

use super::support::{fixture_json, smollm2};
use crate::{ChatMessage, ChatTemplate, Detokenizer, RenderOptions, Tokenizer};

fn reference() -> Value {
    fixture_json("smollm2/reference.json")
}

fn ids(value: &Value) -> Vec<u32> {
    serde_json::from_value(value.clone()).unwrap()
}

fn str_of<'a>(case: &'a Value, key: &str) -> &'a str {
    case[key].as_str().unwrap_or_else(|| panic!("{}: no string `{key}`", case["name"]))
}

fn stream(tokenizer: &Tokenizer, ids: &[u32], skip_special_tokens: bool) -> String {
    let mut detokenizer = Detokenizer::new(tokenizer, skip_special_tokens);
    let mut text: String = ids.iter().map(|&id| detokenizer.push(id).unwrap()).collect();
    text.push_str(&detokenizer.finish().unwrap());
    text
}

#[test]
fn special_tokens_and_flags_match() {
    let Some(tokenizer) = smollm2() else { return };
    let special = &reference()["special"];
    let pairs = [
        ("bos", tokenizer.bos()),
        ("eos", tokenizer.eos()),
        ("pad", tokenizer.pad()),
        ("unk", tokenizer.special_tokens().unk.as_ref()),
    ];
    for (name, token) in pairs {
        let token = token.unwrap_or_else(|| panic!("no {name} token"));
        assert_eq!(token.text, str_of(special, &format!("{name}_token")), "{name}");
        assert_eq!(Some(u64::from(token.id)), special[format!("{name}_token_id")].as_u64(), "{name}");
    }
    assert_eq!(tokenizer.add_bos(), special["add_bos_token"].as_bool().unwrap());
    assert_eq!(tokenizer.add_eos(), special["add_eos_token"].as_bool().unwrap());
    assert_eq!(tokenizer.vocab_size() as u64, special["vocab_size"].as_u64().unwrap());
    assert_eq!(tokenizer.eos_ids(), ids(&special["generation_eos_token_ids"]));
    assert_eq!(tokenizer.chat_template(), special["chat_template"].as_str());
    let added = special["added_tokens"].as_object().unwrap();
    assert!(!added.is_empty());
    for (id, token) in added {
        let id: u32 = id.parse().unwrap();
        assert_eq!(tokenizer.token_text(id).as_deref(), token["content"].as_str(), "id {id}");
        assert_eq!(tokenizer.is_special(id), token["special"].as_bool().unwrap(), "id {id}");
    }
    assert!(!tokenizer.is_special(504), "an ordinary word is not special");
}

#[test]
fn every_tokenize_case_matches_both_ways() {
    let Some(tokenizer) = smollm2() else { return };
    let reference = reference();
    let cases = reference["tokenize"].as_array().unwrap();
    assert!(cases.len() >= 20, "the fixture lost its cases");
    for case in cases {
        let (name, text) = (&case["name"], str_of(case, "text"));
        let want = ids(&case["ids"]);
        assert_eq!(tokenizer.encode(text, false).unwrap(), want, "{name}: encode");
        assert_eq!(
            tokenizer.encode(text, true).unwrap(),
            ids(&case["ids_add_special_tokens"]),
            "{name}: encode+special"
        );
        let pieces: Vec<String> = want.iter().map(|&id| tokenizer.token_text(id).unwrap()).collect();
        assert_eq!(serde_json::to_value(&pieces).unwrap(), case["tokens"], "{name}: token texts");
        assert_eq!(tokenizer.decode(&want, false).unwrap(), str_of(case, "decoded"), "{name}: decode");
        let skipped = str_of(case, "decoded_skip_special_tokens");
        assert_eq!(tokenizer.decode(&want, true).unwrap(), skipped, "{name}: decode skipping specials");
        assert_eq!(stream(tokenizer, &want, true), skipped, "{name}: streamed decode");
    }
}

#[test]
fn every_chat_case_renders_and_tokenizes_identically() {
    let Some(tokenizer) = smollm2() else { return };
    let template = ChatTemplate::from_tokenizer(tokenizer).unwrap().expect("the GGUF ships a chat template");
    let reference = reference();
    let cases = reference["chat"].as_array().unwrap();
    assert!(cases.len() >= 8, "the fixture lost its cases");
    for case in cases {
        let name = &case["name"];
        let messages: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
        let options = RenderOptions {
            add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
            continue_final_message: case["continue_final_message"].as_bool().unwrap(),
            ..RenderOptions::default()
        };
        let rendered = template.render(&messages, &options).unwrap();
        assert_eq!(rendered, str_of(case, "rendered"), "{name}: rendered prompt");
        if let Some(open) = case.get("rendered_without_continue_final_message") {
            let closed = RenderOptions { continue_final_message: false, ..options };
            assert_eq!(template.render(&messages, &closed).unwrap(), open.as_str().unwrap(), "{name}: closed");
        }
        let prompt = ids(&case["prompt_ids"]);
        assert_eq!(tokenizer.encode(&rendered, false).unwrap(), prompt, "{name}: prompt ids");
        assert_eq!(tokenizer.decode(&prompt, false).unwrap(), rendered, "{name}: prompt decode");

        let generated = ids(&case["generated_ids"]);
        assert_eq!(tokenizer.decode(&generated, true).unwrap(), str_of(case, "generated_text"), "{name}");
        assert_eq!(tokenizer.decode(&generated, false).unwrap(), str_of(case, "generated_text_raw"), "{name}");
        assert_eq!(stream(tokenizer, &generated, true), str_of(case, "generated_text"), "{name}: streamed");
        assert_eq!(stream(tokenizer, &generated, false), str_of(case, "generated_text_raw"), "{name}: streamed");
    }
}
