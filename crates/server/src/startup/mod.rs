//! Startup: turning settings and a model into a running engine, in the numbered phases of
//! DESIGN §3. Each phase logs one line (`[ N] name (ms): detail`); `met serve` runs them in
//! order, and `/health` answers 503 until phase 11.
//!
//! | # | phase | where |
//! |---|---|---|
//! | 0 | settings: flags become `met-config` types, checked once | `cli` |
//! | 1–5 | resolve, config, device, topology, weights | [`load::load_weights`] ([`topology::open`] for 3–4) |
//! | 6 | KV cache: one sizing rule, then the allocation | [`kv_budget::cache_size`], [`engine::build_engine`] |
//! | 7 | warm-up: CUDA graphs of decode steps | [`engine::build_engine`] |
//! | 8 | tokenizer, chat template, end-of-sequence tokens | [`load::TextSource::load`] |
//! | 9–11 | engine thread, router, ready | `serve` |
//!
//! `met generate` and the benches take [`load::load`] (phases 1–5 and 8 at once: they need
//! the tokenizer to know their prompts' lengths) and then the same phases 6 and 7.

pub mod engine;
pub mod kv_budget;
pub mod load;
pub mod topology;
