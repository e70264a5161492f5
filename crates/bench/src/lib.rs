//! met-bench: the instrument met's speed claims are measured with, usable against any
//! OpenAI-compatible server (met, vLLM, SGLang, llama.cpp's `llama-server`). It knows no met
//! crate: it speaks HTTP and reads result files, nothing else.
//!
//! [`serve()`] is a load generator after vLLM's `bench serve`: it streams every request,
//! times each chunk, and reports TTFT, TPOT, ITL and end-to-end latency (mean, p50, p90,
//! p99), request and token throughput, goodput under SLOs and errors by kind, one table row
//! and one JSON entry per ladder point (a concurrency ladder, or request rates with
//! gamma-distributed arrivals). [`plot::plot_files`] draws result files side by side.
//! `met bench serve` and `met bench plot` are thin callers of these.
//!
//! It is bounded: `num_prompts` (plus `num_warmup`) requests per point, `timeout_s` per
//! request, `max_duration_s` for everything; and it only ever connects to the host of
//! `base_url`. Bad settings and files are errors, naming the flag or file, before the first
//! request. Errors are messages for whoever runs the benchmark, so they are `anyhow` errors,
//! as in the binaries.
//!
//! Modules: [`args`] (what a run is), `dataset` (prompts), [`rng`] (seeded streams, gamma
//! arrivals), `sse` (the event decoder), `client` (HTTP and per-chunk timing), `runner` (one
//! ladder point under its arrival pattern), `serve` (the ladder), [`metrics`] (records to
//! figures), [`report`] (the JSON result, the table, the machine) and [`plot`] (the SVG).
//! `met bench throughput` and `latency` drive met's engine without HTTP; they live with the
//! engine in `met-server` and share [`report`], [`metrics`] and [`rng`].

pub mod args;
mod client;
mod dataset;
pub mod metrics;
pub mod plot;
pub mod report;
pub mod rng;
mod runner;
mod serve;
mod sse;

pub use args::{DatasetKind, Endpoint, IdRange, ServeArgs};
pub use serve::serve;
