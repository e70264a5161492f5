//! What structured output costs per token on the CPU, measured in isolation from the rest of
//! a step: llguidance's mask for the next token plus advancing past the drawn one, over the
//! tokens of valid instances of JSON Schemas, with a real vocabulary; and `mask_logits`,
//! the masking op the engine runs before sampling, on a logits row of that vocabulary.
//!
//!     cargo run --release -p met-grammar --example mask_cost -- MODEL.gguf
//!
//! The engine computes the masks on a thread of their own while the forward pass runs, so on
//! a machine with a core to spare the first figure is hidden; `mask_logits` is not.

use std::time::Instant;

use met_grammar::{GrammarSpec, Grammars};
use met_kernels::{CpuBackend, DType, GpuBackend, HostTensor, SampleRow};
use serde_json::json;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).ok_or("usage: mask_cost MODEL.gguf")?;
    let gguf = met_model_weights::GgufFile::open(std::path::Path::new(&path))?;
    let tokenizer = met_text::Tokenizer::from_gguf(&gguf)?;
    let vocab = tokenizer.vocab_size();
    let started = Instant::now();
    let grammars = Grammars::new(&tokenizer, vocab)?;
    println!("vocabulary {vocab}: grammar engine built in {:.1} ms", started.elapsed().as_secs_f64() * 1e3);
    let name = json!({"type": "string", "maxLength": 40});
    let cases = [
        (
            json!({"type": "object", "properties": {"name": name, "age": {"type": "integer", "minimum": 0, "maximum": 130}},
                   "required": ["name", "age"], "additionalProperties": false}),
            r#"{"name":"Alice Smith","age":30}"#,
        ),
        (
            json!({"type": "object", "properties": {"city": name, "country": name,
                   "population": {"type": "integer", "minimum": 0, "maximum": 100000000}},
                   "required": ["city", "country", "population"], "additionalProperties": false}),
            r#"{"city":"Paris","country":"France","population":2102650}"#,
        ),
        (
            json!({"type": "object", "properties": {"title": name, "items": {"type": "array", "items": name, "maxItems": 4},
                   "done": {"type": "boolean"}}, "required": ["title", "items", "done"], "additionalProperties": false}),
            r#"{"title":"Morning","items":["Wake up at seven","Make coffee and toast","Read the news"],"done":false}"#,
        ),
    ];
    let mut per_token = Vec::new();
    for (schema, instance) in &cases {
        let started = Instant::now();
        let constraint = grammars.compile(&GrammarSpec::JsonSchema(schema.clone()))?;
        let compile_ms = started.elapsed().as_secs_f64() * 1e3;
        let ids = tokenizer.encode_plain(instance)?;
        for round in 0..20 {
            let mut state = constraint.0.start();
            let mut mask = vec![0u32; vocab.div_ceil(32)];
            for &id in &ids {
                let t = Instant::now();
                mask.fill(0);
                state.fill_mask(&mut mask)?;
                assert!(mask[id as usize / 32] >> (id % 32) & 1 == 1, "token {id} of a valid instance is masked");
                state.accept(id)?;
                if round > 0 {
                    per_token.push(t.elapsed().as_secs_f64() * 1e6);
                }
            }
            assert!(state.is_complete(), "{instance} completes its schema");
        }
        println!("schema compiled in {compile_ms:.2} ms; {} tokens: {instance}", ids.len());
    }
    per_token.sort_by(f64::total_cmp);
    let mean = per_token.iter().sum::<f64>() / per_token.len() as f64;
    println!(
        "mask + advance per token: mean {mean:.1} us, p50 {:.1} us, p90 {:.1} us, p99 {:.1} us ({} tokens)",
        percentile(&per_token, 0.5),
        percentile(&per_token, 0.9),
        percentile(&per_token, 0.99),
        per_token.len()
    );

    let b = CpuBackend::new();
    let logits: Vec<f32> = (0..vocab).map(|i| ((i * 7919) % 1000) as f32 / 100.0).collect();
    let logits = b.upload(&HostTensor::from_f32(&logits, &[1, vocab]), DType::F32)?;
    let rows = b.upload(&HostTensor::from_u32(&[0], &[1]), DType::U32)?;
    let bits = vec![0x5555_5555u32; vocab.div_ceil(32)];
    let params = met_config::SamplingParams::greedy();
    let row = SampleRow {
        logits_row: 0,
        params: &params,
        prompt: &[],
        output: &[],
        seed: 0,
        step: 0,
        banned: &[],
        draft: None,
    };
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..500 {
        let t = Instant::now();
        let masks = b.upload(&HostTensor::from_u32(&bits, &[1, bits.len()]), DType::U32)?;
        let masked = b.mask_logits(&logits, &rows, &masks)?;
        b.sample(&masked, std::slice::from_ref(&row))?;
        with.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        b.sample(&logits, std::slice::from_ref(&row))?;
        without.push(t.elapsed().as_secs_f64() * 1e6);
    }
    with.sort_by(f64::total_cmp);
    without.sort_by(f64::total_cmp);
    println!(
        "greedy sample of one row: {:.1} us plain, {:.1} us with the mask uploaded and applied (medians)",
        percentile(&without, 0.5),
        percentile(&with, 0.5)
    );
    Ok(())
}
