//! Chat templates against Jinja2 under transformers: every template of
//! `tests/fixtures/templates/` over every conversation of its `reference.json` (written by
//! `scripts/smollm2_reference.py --only templates`), byte for byte, errors included; and
//! the line numbers of template errors.

use std::sync::Arc;

use serde_json::Value;

use super::support::{fixture, fixture_json};
use crate::{ChatMessage, ChatTemplate, Clock, RenderOptions, TextError};

/// The clock of the day the fixture was recorded, for `strftime_now`.
fn recorded_day(reference: &Value) -> Clock {
    let day = reference["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|c| c["renderings"]["namespace_system"]["strftime_now_date"].as_str())
        .expect("a case records the strftime_now date");
    let date = jiff::civil::Date::strptime("%d %b %Y", day).unwrap();
    let zoned = date.at(12, 0, 0, 0).to_zoned(jiff::tz::TimeZone::UTC).unwrap();
    Arc::new(move || zoned.clone())
}

fn options_of(case: &Value, specials: &Value) -> RenderOptions {
    let mut kwargs = serde_json::Map::new();
    // `ChatTemplate::new` takes bos/eos; transformers also passes unk/pad, as keyword arguments.
    for key in ["unk_token", "pad_token"] {
        kwargs.insert(key.into(), specials[key].clone());
    }
    kwargs.extend(case["extra_kwargs"].as_object().unwrap().clone());
    RenderOptions {
        add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
        continue_final_message: case["continue_final_message"].as_bool().unwrap(),
        tools: serde_json::from_value(case["tools"].clone()).unwrap(),
        documents: None,
        kwargs,
    }
}

#[test]
fn every_template_renders_every_case_like_transformers() {
    let reference = fixture_json("templates/reference.json");
    let specials = &reference["template_kwargs"];
    let clock = recorded_day(&reference);
    let mut checked = 0;
    for (name, file) in reference["templates"].as_object().unwrap() {
        let path = fixture(&format!("templates/{}", file.as_str().unwrap()));
        let source = std::fs::read_to_string(&path).unwrap();
        let (bos, eos) = (specials["bos_token"].as_str(), specials["eos_token"].as_str());
        let template = ChatTemplate::new(&source, bos, eos).unwrap().with_clock(Arc::clone(&clock));
        for case in reference["cases"].as_array().unwrap() {
            let case_name = &case["name"];
            let messages: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
            let result = template.render(&messages, &options_of(case, specials));
            let want = &case["renderings"][name];
            if let Some(rendered) = want["rendered"].as_str() {
                let got = result.unwrap_or_else(|e| panic!("{name} / {case_name}: {e}"));
                assert_eq!(got, rendered, "{name} / {case_name}");
            } else {
                let message = want["error"]["message"].as_str().expect("a rendering or an error");
                match result {
                    Err(TextError::Raised { msg, line }) => {
                        assert_eq!(msg, message, "{name} / {case_name}");
                        assert!(line.is_some(), "{name} / {case_name}: the error names its line");
                    }
                    other => panic!("{name} / {case_name}: want raise_exception({message:?}), got {other:?}"),
                }
            }
            checked += 1;
        }
    }
    assert!(checked >= 30, "the fixture lost its cases ({checked})");
}

#[test]
fn strftime_now_defaults_to_local_time() {
    let template = ChatTemplate::new("{{ strftime_now('%Y-%m-%d') }}", None, None).unwrap();
    let before = jiff::Zoned::now().strftime("%Y-%m-%d").to_string();
    let rendered = template.render(&[], &RenderOptions::default()).unwrap();
    let after = jiff::Zoned::now().strftime("%Y-%m-%d").to_string();
    assert!(rendered == before || rendered == after, "{rendered}");
}

#[test]
fn syntax_errors_name_the_line() {
    let err =
        ChatTemplate::new("line one\n{% for m in messages %}\n{{ m.content }\n{% endfor %}", None, None).unwrap_err();
    assert!(matches!(err, TextError::Template { line: Some(3), .. }), "{err:?}");
    assert!(err.to_string().starts_with("chat template line 3: syntax error"), "{err}");
}

#[test]
fn render_errors_name_the_line() {
    let template = ChatTemplate::new("a\nb\n{{ messages[0].content + 1 }}", None, None).unwrap();
    let err = template.render(&[ChatMessage::text("user", "x")], &RenderOptions::default()).unwrap_err();
    assert!(matches!(err, TextError::Template { line: Some(3), .. }), "{err:?}");
    assert!(err.to_string().contains("line 3"), "{err}");
}

#[test]
fn raise_exception_carries_the_message_and_line() {
    let source = "{% for m in messages %}\n{% if m.role == 'bot' %}\n{{ raise_exception('Roles must be user or assistant, not ' ~ m.role) }}\n{% endif %}\n{% endfor %}";
    let template = ChatTemplate::new(source, None, None).unwrap();
    let err = template.render(&[ChatMessage::text("bot", "x")], &RenderOptions::default()).unwrap_err();
    match &err {
        TextError::Raised { msg, line } => {
            assert_eq!(msg, "Roles must be user or assistant, not bot");
            assert_eq!(*line, Some(3));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(err.to_string(), "chat template line 3: Roles must be user or assistant, not bot");
}

#[test]
fn continue_final_message_needs_an_open_final_message() {
    let template = ChatTemplate::new("{% for m in messages %}{{ m.content }}{% endfor %}", None, None).unwrap();
    let prefill = RenderOptions { continue_final_message: true, ..RenderOptions::default() };
    let messages = [ChatMessage::text("user", "Hi"), ChatMessage::text("assistant", "Hel")];
    assert_eq!(template.render(&messages, &prefill).unwrap(), "HiHel");
    assert!(matches!(template.render(&[], &prefill), Err(TextError::Render(_))));
    let both = RenderOptions { add_generation_prompt: true, ..prefill.clone() };
    assert!(matches!(template.render(&messages, &both), Err(TextError::Render(_))));
    let mut shadowing = RenderOptions::default();
    shadowing.kwargs.insert("messages".into(), serde_json::json!([]));
    let err = template.render(&messages, &shadowing).unwrap_err();
    assert!(err.to_string().contains("`messages`"), "{err}");
    let dropping = ChatTemplate::new("{% for m in messages %}{{ m.role }}{% endfor %}content", None, None).unwrap();
    assert!(matches!(dropping.render(&messages, &prefill), Err(TextError::Render(_))));
}
