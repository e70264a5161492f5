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
//! [`SamplingParams`] are the per-request sampling settings every backend implements.

mod engine;
mod error;
mod fields;
mod generation;
mod home;
mod model;
mod sampling;

pub use engine::{EngineConfig, InvalidEngineConfig};
pub use error::ConfigError;
pub use fields::{ConfigJson, RawConfig};
pub use generation::GenerationConfig;
pub use home::{DEFAULT_MODEL_FILE, default_model_for_test, default_model_path, met_home};
pub use model::{Activation, ArchDefaults, ModelConfig, MoeConfig, NormPlacement, NormWeight, RopeConfig, RopeScaling};
pub use sampling::{InvalidSampling, MAX_TOP_LOGPROBS, SamplingParams};
