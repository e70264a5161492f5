//! Tests of the text layer against transformers.
//!
//! They live inside the crate because they reach private modules (the template's Python
//! formatting, the GGUF tokenizer's parts). The fixtures are in `crates/server/tests/fixtures/`,
//! shared with the server's tests and the live suite,
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
    assert_send_sync::<crate::Tokenizer>();
    assert_send_sync::<crate::ChatTemplate>();
    assert_send_sync::<crate::Detokenizer>();
    assert_send_sync::<crate::TextError>();
}
