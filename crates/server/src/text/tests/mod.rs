//! Tests of the text layer against transformers.
//!
//! They live inside the crate because `met-server` is a binary only: integration tests under
//! `tests/` cannot reach its modules. The fixtures are in `crates/server/tests/fixtures/`
//! and say how to regenerate themselves (`scripts/smollm2_reference.py`). Tests that need
//! the default model's GGUF print a note and pass when it is not installed (CI fetches it).

mod detokenizer_props;
mod gguf_metadata;
mod hf_dir;
mod smollm2_reference;
mod support;
mod template_fixtures;
mod user_text;

/// The server shares these across request tasks and blocking workers.
#[test]
fn text_types_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<crate::text::Tokenizer>();
    assert_send_sync::<crate::text::ChatTemplate>();
    assert_send_sync::<crate::text::Detokenizer>();
    assert_send_sync::<crate::text::TextError>();
}
