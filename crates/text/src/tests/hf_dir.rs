//! Tokenizers from Hugging Face directories: a tiny byte-level BPE `tokenizer.json` written
//! with the `tokenizers` crate, plus the config files transformers reads beside it.

use std::path::Path;

use tokenizers::AddedToken;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::template::TemplateProcessing;

use crate::gguf_tokenizer::byte_alphabet;
use crate::{ChatMessage, ChatTemplate, RenderOptions, TextError, Tokenizer};

const SPECIALS: [&str; 4] = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"];

/// Writes `tokenizer.json`: the 256 byte symbols (ids 0-255), five merged pieces (256-260:
/// `he`, `ll`, `hell`, `hello`, `Ġw`), four special tokens (261-264: `<s>`, `</s>`,
/// `<|im_start|>`, `<|im_end|>`) and the plain added token `<tool>` (265); optionally a
/// post-processor that prepends `<s>`.
fn write_tokenizer_json(dir: &Path, with_post_processor: bool) {
    let mut vocab: Vec<String> = byte_alphabet().into_iter().map(String::from).collect();
    let merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("Ġ", "w")];
    vocab.extend(merges.iter().map(|(a, b)| format!("{a}{b}")));
    let vocab: tokenizers::models::bpe::Vocab = vocab.into_iter().enumerate().map(|(i, t)| (t, i as u32)).collect();
    let merges = merges.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect();
    let bpe = BPE::builder().vocab_and_merges(vocab, merges).build().unwrap();
    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    tokenizer.add_special_tokens(SPECIALS.map(|t| AddedToken::from(t, true))).unwrap();
    tokenizer.add_tokens([AddedToken::from("<tool>", false)]).unwrap();
    if with_post_processor {
        let bos = tokenizer.token_to_id("<s>").unwrap();
        let template = TemplateProcessing::builder()
            .try_single("<s> $A")
            .unwrap()
            .special_tokens(vec![("<s>", bos)])
            .build()
            .unwrap();
        tokenizer.with_post_processor(Some(template));
    }
    tokenizer.save(dir.join("tokenizer.json"), false).unwrap();
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

#[test]
fn configs_set_specials_framing_template_and_stop_ids() {
    let dir = tempfile::tempdir().unwrap();
    write_tokenizer_json(dir.path(), false);
    let config = r#"{"bos_token": {"__type": "AddedToken", "content": "<s>"}, "eos_token": "<|im_end|>",
        "pad_token": null, "add_bos_token": true, "chat_template": "from the config"}"#;
    write(dir.path(), "tokenizer_config.json", config);
    write(
        dir.path(),
        "chat_template.jinja",
        "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}{% endfor %}",
    );
    write(dir.path(), "generation_config.json", r#"{"eos_token_id": [264, 262]}"#);
    let tokenizer = Tokenizer::from_hf_dir(dir.path()).unwrap();

    let (bos, eos) = (tokenizer.bos().unwrap(), tokenizer.eos().unwrap());
    assert_eq!((bos.id, bos.text.as_str(), eos.id, eos.text.as_str()), (261, "<s>", 264, "<|im_end|>"));
    assert_eq!(tokenizer.pad(), None);
    assert_eq!(tokenizer.eos_ids(), [264, 262], "eos first, then generation_config's other ids");
    assert!(tokenizer.add_bos() && !tokenizer.add_eos());
    assert_eq!(tokenizer.vocab_size(), 266);

    let (hello, space_w, o, im_start, tool) = (259, 260, u32::from(b'o'), 263, 265);
    assert_eq!(tokenizer.encode("hello wo", true).unwrap(), [bos.id, hello, space_w, o]);
    assert_eq!(tokenizer.encode("hello wo", false).unwrap(), [hello, space_w, o]);
    let ids = tokenizer.encode("<|im_start|>hello<tool>", false).unwrap();
    assert_eq!(ids, [im_start, hello, tool], "added tokens in the text stay whole");
    assert_eq!(tokenizer.decode(&ids, false).unwrap(), "<|im_start|>hello<tool>");
    assert_eq!(tokenizer.decode(&ids, true).unwrap(), "hello<tool>", "only special tokens are skipped");
    assert!(tokenizer.is_special(im_start) && !tokenizer.is_special(tool) && !tokenizer.is_special(hello));

    assert_eq!(tokenizer.chat_template().map(|t| t.starts_with("{{ bos_token }}")), Some(true));
    let template = ChatTemplate::from_tokenizer(&tokenizer).unwrap().unwrap();
    let rendered = template.render(&[ChatMessage::text("user", "hi")], &RenderOptions::default()).unwrap();
    assert_eq!(rendered, "<s><user>hi<|im_end|>");
}

#[test]
fn a_tokenizer_json_post_processor_frames_when_the_config_is_silent() {
    let dir = tempfile::tempdir().unwrap();
    write_tokenizer_json(dir.path(), true);
    write(
        dir.path(),
        "tokenizer_config.json",
        r#"{"bos_token": "<s>", "eos_token": "</s>", "chat_template": [
        {"name": "tool_use", "template": "tools"}, {"name": "default", "template": "plain"}]}"#,
    );
    let tokenizer = Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert!(tokenizer.add_bos(), "measured from the post-processor");
    let hello = tokenizer.token_id("hello").unwrap();
    assert_eq!(tokenizer.encode("hello", true).unwrap(), [261, hello]);
    assert_eq!(tokenizer.encode("hello", false).unwrap(), [hello]);
    assert_eq!(tokenizer.chat_template(), Some("plain"), "the default of named templates");

    // An explicit flag replaces the post-processor, as transformers rebuilds it.
    write(dir.path(), "tokenizer_config.json", r#"{"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": false}"#);
    let tokenizer = Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert!(!tokenizer.add_bos());
    assert_eq!(tokenizer.encode("hello", true).unwrap(), [hello]);
    assert_eq!(tokenizer.chat_template(), None);
}

#[test]
fn errors_name_the_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let err = Tokenizer::from_hf_dir(dir.path()).unwrap_err();
    assert!(err.to_string().contains("tokenizer.json"), "{err}");

    write_tokenizer_json(dir.path(), false);
    write(dir.path(), "tokenizer_config.json", r#"{"bos_token": "<nope>"}"#);
    let err = Tokenizer::from_hf_dir(dir.path()).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, TextError::File { .. }), "{msg}");
    assert!(msg.contains("tokenizer_config.json") && msg.contains("bos_token") && msg.contains("<nope>"), "{msg}");

    write(dir.path(), "tokenizer_config.json", "[1, 2]");
    let msg = Tokenizer::from_hf_dir(dir.path()).unwrap_err().to_string();
    assert!(msg.contains("tokenizer_config.json") && msg.contains("not a JSON object"), "{msg}");

    write(dir.path(), "tokenizer_config.json", "{}");
    write(dir.path(), "generation_config.json", r#"{"eos_token_id": "x"}"#);
    let msg = Tokenizer::from_hf_dir(dir.path()).unwrap_err().to_string();
    assert!(msg.contains("generation_config.json") && msg.contains("eos_token_id"), "{msg}");
}
