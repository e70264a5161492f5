//! The text layer's hot paths, per request and per generated token.
//!
//! - `detokenize`: a 2,048-token generated answer (prose, code, numbers, accents, CJK and
//!   emoji) through `Detokenizer::push`, one id at a time, as the server streams it; next to
//!   one `Tokenizer::decode` of all the ids (what the incremental decode's window costs
//!   beyond it). Throughput in tokens.
//! - `chat_template`: a system prompt and 8 user/assistant exchanges rendered with
//!   SmolLM2's template (`ChatTemplate::render`, as transformers' `apply_chat_template`),
//!   and rendered then encoded, which is the whole prompt path of a chat request.
//!   Throughput in prompt bytes.
//!
//! The tokenizer is the default model's when it is installed (bench IDs say `smollm2`),
//! else a byte-level BPE built in memory (`in_memory_bpe`); see `support/mod.rs`. Stop
//! strings are matched in the `wire` bench: their matcher is private to `met serve`.

mod support;

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use met_text::{ChatTemplate, Detokenizer, RenderOptions};

/// Tokens of the generated answer.
const TOKENS: usize = 2048;
/// User turns of the conversation.
const TURNS: usize = 8;

/// Incremental detokenization of a long answer, next to decoding it in one call.
fn detokenize(c: &mut Criterion) {
    let (tokenizer, source) = support::tokenizer();
    let ids = support::generated_ids(&tokenizer, TOKENS);
    let whole = tokenizer.decode(&ids, true).expect("the ids decode");
    let mut group = c.benchmark_group("detokenize");
    group.throughput(Throughput::Elements(ids.len() as u64));
    group.bench_function(format!("{source}/incremental_{TOKENS}"), |b| {
        b.iter(|| {
            let mut detokenizer = Detokenizer::new(&tokenizer, true);
            let mut text = String::with_capacity(whole.len());
            for &id in black_box(&ids) {
                text.push_str(&detokenizer.push(id).expect("decodes"));
            }
            text.push_str(&detokenizer.finish().expect("decodes"));
            text
        });
    });
    let mut detokenizer = Detokenizer::new(&tokenizer, true);
    let mut streamed: String = ids.iter().map(|&id| detokenizer.push(id).expect("decodes")).collect();
    streamed.push_str(&detokenizer.finish().expect("decodes"));
    assert_eq!(streamed, whole, "the streamed text is the one-shot decode");
    group.bench_function(format!("{source}/one_shot_{TOKENS}"), |b| {
        b.iter(|| tokenizer.decode(black_box(&ids), true).expect("decodes"));
    });
    group.finish();
}

/// A multi-turn conversation rendered, and rendered then tokenized.
fn chat_template(c: &mut Criterion) {
    let (tokenizer, source) = support::tokenizer();
    let template = match ChatTemplate::from_tokenizer(&tokenizer) {
        Ok(Some(template)) => template,
        Ok(None) => {
            eprintln!("note: skipped chat_template: the {source} tokenizer ships no chat template");
            return;
        }
        Err(e) => {
            eprintln!("note: skipped chat_template: the {source} template does not compile: {e}");
            return;
        }
    };
    let messages = support::conversation(TURNS);
    let options = RenderOptions { add_generation_prompt: true, ..RenderOptions::default() };
    let rendered = template.render(&messages, &options).expect("the conversation renders");
    let mut group = c.benchmark_group("chat_template");
    group.throughput(Throughput::Bytes(rendered.len() as u64));
    let name = format!("{}_messages", messages.len());
    group.bench_function(format!("{source}/render_{name}"), |b| {
        b.iter(|| template.render(black_box(&messages), &options).expect("renders"));
    });
    group.bench_function(format!("{source}/render_encode_{name}"), |b| {
        b.iter(|| {
            let prompt = template.render(black_box(&messages), &options).expect("renders");
            tokenizer.encode(&prompt, false).expect("encodes")
        });
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = detokenize, chat_template
}
criterion_main!(benches);
