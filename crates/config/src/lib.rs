//! Typed, validated settings for met.
//!
//! [`ModelConfig`] is what a Hugging Face `config.json` says about an architecture, after
//! the defaults transformers applies and the checks it skips: every later crate reads this
//! type, never the JSON. Each architecture builds it in its own file in
//! `met-model-layers` (`models/<arch>.rs`, found by `model_type` in that crate's registry)
//! from a [`RawConfig`], the typed field reader kept here, starting from
//! [`ModelConfig::read_common`]; this crate knows no architecture by name.
//! [`GenerationConfig`] is `generation_config.json`.
//!
//! Both config layouts found in the wild parse to the same value: the classic one
//! (`rope_theta`, `rope_scaling`) and the one transformers 5 writes (`rope_parameters`).
//! Every error names the file and the dotted field.
//!
//! The settings a front end turns its flags into, once, live here too, so that startup and
//! every crate below it take typed values and never a command-line struct: [`LoadConfig`]
//! (which model, which device and kernels), [`EngineSetup`] (the engine around it:
//! [`EngineConfig`] for the scheduler, the KV cache's size, CUDA graphs,
//! [`SpeculativeConfig`]) and [`ServeConfig`] (the HTTP server, with its [`LoraConfig`]).
//! Each closed set of choices (`Policy`, `DeviceKind`, `QuantDots`, ...) is an enum whose
//! names the command line offers (with the `clap` feature, as clap's `ValueEnum`). A bad
//! setting is an [`InvalidSetting`] naming its flag.
//!
//! [`SamplingParams`] are the per-request sampling settings every backend implements; a
//! field a check refuses is named by a [`RequestField`], which each API dialect spells its
//! own way.

mod engine;
mod error;
mod fields;
mod generation;
mod home;
mod hybrid;
mod load;
mod lora;
mod model;
mod named;
mod quant;
mod request_field;
mod sampling;
mod serve;
mod setup;
mod speculative;

pub use engine::{AsyncScheduling, EngineConfig, InvalidSetting, Policy};
pub use error::ConfigError;
pub use fields::{ConfigJson, RawConfig};
pub use generation::GenerationConfig;
pub use home::{DEFAULT_MODEL_FILE, default_model_for_test, default_model_path, met_home};
pub use hybrid::{GdnProjections, LinearAttentionConfig};
pub use load::{AttentionBackendKind, DeviceKind, KvCacheDtype, LoadConfig, LoadFormat, QuantDots};
pub use lora::{DEFAULT_MAX_LORA_RANK, DEFAULT_MAX_LORAS, LoraConfig, LoraModulePath};
pub use model::{Activation, ArchDefaults, ModelConfig, MoeConfig, NormPlacement, NormWeight, RopeConfig, RopeScaling};
pub use named::UnknownName;
pub use quant::{QuantConfig, ScaleLayout};
pub use request_field::RequestField;
pub use sampling::{InvalidSampling, MAX_TOP_LOGPROBS, SamplingParams};
pub use serve::{DEFAULT_MAX_TOKENS, ReasoningParser, ServeConfig, ToolCallParser};
pub use setup::EngineSetup;
pub use speculative::{MAX_SPECULATIVE_TOKENS, SpeculativeConfig, SpeculativeMethod};
