//! [`encode_chat`]: a chat prompt's ids, optionally with user text that cannot forge
//! control tokens (`met serve --no-special-tokens-in-user-content`).
//!
//! A rendered prompt is encoded with special-token text parsed, so that the template's own
//! `<|im_start|>` becomes its token; as in transformers, the same then happens to such text
//! inside a user's message, which lets a user end their turn and write the system's. With
//! `plain_user_text`, each special-token string inside a user message is encoded as
//! ordinary text and nothing else changes: the tokenizer's added-token split cuts the text
//! at those places anyway, so the ids around them are the ones the default encoding gives
//! (for byte-level BPE, the default model's kind; a SentencePiece tokenizer that prepends a
//! word marker may add one after each such string), and a prompt without such strings
//! encodes exactly as by default.
//!
//! User messages are located in the rendered prompt by rendering again with a marker in place
//! of each user message's text and checking that putting the texts back (as they are, or
//! trimmed, as many templates do) gives the prompt exactly. A template that rewrites the text
//! some other way cannot be checked, and is an error rather than a silent fallback.

use std::cmp::Reverse;
use std::ops::Range;

use super::{ChatMessage, ChatTemplate, MessageContent, RenderOptions, TextError, Tokenizer};

/// Renders `messages` and encodes the prompt (no bos/eos added: the template writes its
/// own); with `plain_user_text`, special-token strings in user messages stay text.
///
/// # Errors
/// The template fails, the tokenizer fails, or (with `plain_user_text`, for a message that
/// holds special-token text) the template rewrites user text so it cannot be found.
pub fn encode_chat(
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
    messages: &[ChatMessage],
    options: &RenderOptions,
    plain_user_text: bool,
) -> Result<Vec<u32>, TextError> {
    let rendered = template.render(messages, options)?;
    if !plain_user_text {
        return tokenizer.encode(&rendered, false);
    }
    let specials = tokenizer.special_texts();
    let users: Vec<(usize, &str)> = messages
        .iter()
        .enumerate()
        .filter_map(|(i, m)| match (m.role.as_str(), &m.content) {
            ("user", Some(MessageContent::Text(text))) => Some((i, text.as_str())),
            _ => None,
        })
        .collect();
    let forging = users.iter().any(|(_, text)| specials.iter().any(|s| text.contains(s.as_str())));
    if !forging {
        return tokenizer.encode(&rendered, false);
    }
    let spans = user_spans(template, messages, options, &users, &rendered)?;
    let mut ids = Vec::with_capacity(rendered.len() / 3);
    let mut at = 0;
    for forged in special_strings_in(&rendered, &spans, &specials) {
        ids.extend(tokenizer.encode(&rendered[at..forged.start], false)?);
        ids.extend(tokenizer.encode_plain(&rendered[forged.clone()])?);
        at = forged.end;
    }
    ids.extend(tokenizer.encode(&rendered[at..], false)?);
    Ok(ids)
}

/// A marker no template writes: private-use characters around the message index.
fn marker(index: usize) -> String {
    format!("\u{F8FF}met-user-{index}\u{F8FF}")
}

/// Byte ranges of the user texts in `rendered`.
fn user_spans(
    template: &ChatTemplate,
    messages: &[ChatMessage],
    options: &RenderOptions,
    users: &[(usize, &str)],
    rendered: &str,
) -> Result<Vec<Range<usize>>, TextError> {
    let mut masked = messages.to_vec();
    for &(i, _) in users {
        masked[i].content = Some(MessageContent::Text(marker(i)));
    }
    let with_markers = template.render(&masked, options)?;
    [false, true].into_iter().find_map(|trim| put_back(&with_markers, users, trim, rendered)).ok_or_else(|| {
        TextError::Render(
            "this chat template rewrites user messages, so special-token text in them cannot be kept as text \
             (--no-special-tokens-in-user-content)"
                .into(),
        )
    })
}

/// The user texts' ranges, if putting them in place of the markers gives `rendered`.
fn put_back(with_markers: &str, users: &[(usize, &str)], trim: bool, rendered: &str) -> Option<Vec<Range<usize>>> {
    let mut out = String::with_capacity(rendered.len());
    let mut spans = Vec::with_capacity(users.len());
    let mut rest = with_markers;
    for &(i, text) in users {
        let text = if trim { text.trim() } else { text };
        let marker = marker(i);
        // A template may leave a message out; one it repeats keeps a marker, and fails below.
        let Some(at) = rest.find(&marker) else { continue };
        out.push_str(&rest[..at]);
        spans.push(out.len()..out.len() + text.len());
        out.push_str(text);
        rest = &rest[at + marker.len()..];
    }
    out.push_str(rest);
    (out == rendered).then_some(spans)
}

/// Where special-token strings occur inside `spans`, leftmost-longest and without overlaps
/// (the tokenizer's own matching), in order. One pass per special string, so a text full of
/// them costs linear time.
fn special_strings_in(rendered: &str, spans: &[Range<usize>], specials: &[String]) -> Vec<Range<usize>> {
    let mut found = Vec::new();
    for span in spans {
        let text = &rendered[span.clone()];
        let mut hits: Vec<(usize, usize)> = specials
            .iter()
            .flat_map(|special| text.match_indices(special.as_str()).map(|(at, hit)| (at, hit.len())))
            .collect();
        hits.sort_unstable_by_key(|&(at, len)| (at, Reverse(len)));
        let mut end = 0;
        for (at, len) in hits {
            if at >= end {
                found.push(span.start + at..span.start + at + len);
                end = at + len;
            }
        }
    }
    found
}
