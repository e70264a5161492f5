//! Integration tests of met-model-weights, as one test binary (one link, not six).
//!
//! Fixtures are written at test time into temp dirs with the `safetensors` crate's own
//! serializer, or byte by byte for malformed files; nothing is checked in.

mod common;
mod concat;
mod corrupt;
mod dummy;
mod preflight;
mod store;
