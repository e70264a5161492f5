//! The text layer: tokenizers, chat templates and incremental detokenization.
//!
//! The engine sees token ids only; this module is where text turns into ids and back, and
//! it is checked against transformers, the reference for what a model was trained on:
//!
//! - [`Tokenizer`] (`tokenizer.rs`, `gguf_tokenizer.rs`): from a Hugging Face directory
//!   (`tokenizer.json` + configs) or from GGUF metadata; `encode`/`decode` equal to
//!   transformers' ids and text.
//! - [`ChatTemplate`] (`chat.rs`, `pyfmt.rs`): Jinja chat templates rendered byte for byte as
//!   `apply_chat_template` renders them.
//! - [`Detokenizer`] (`detokenizer.rs`): streaming decode that never splits a character.
//! - [`encode_chat`] (`user_text.rs`): a rendered chat prompt's ids, optionally with
//!   special-token text in user messages kept as text.
//!
//! Rendering and encoding are CPU work that can take milliseconds for long prompts; the
//! server runs them on a blocking worker, never on the async reactor (DESIGN §4 step 2).
//! The serving path encodes a rendered prompt with `add_special_tokens = false`: the
//! template writes its own bos.
//!
//! **Boundary:** no HTTP and no engine types here; errors are one [`TextError`] naming the
//! file, GGUF key or template line. A fork can use this crate alone, e.g. to render and
//! tokenize a chat as the server would, with the embedded default model's GGUF:
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use met_text::{ChatMessage, ChatTemplate, RenderOptions, Tokenizer, encode_chat};
//!
//! # let Some(path) = met_config::default_model_for_test() else { return Ok(()) };
//! let gguf = met_model_weights::GgufFile::open(&path)?;
//! let tokenizer = Tokenizer::from_gguf(&gguf)?;
//! let template = ChatTemplate::from_tokenizer(&tokenizer)?.expect("the model ships a chat template");
//! let messages = [ChatMessage::text("user", "What is the capital of France?")];
//! let options = RenderOptions { add_generation_prompt: true, ..RenderOptions::default() };
//! let prompt = template.render(&messages, &options)?;
//! assert!(prompt.ends_with("<|im_start|>assistant\n"));
//! let ids = encode_chat(&tokenizer, &template, &messages, &options, false)?;
//! assert_eq!(tokenizer.decode(&ids, false)?, prompt);
//! # Ok(())
//! # }
//! ```

mod chat;
mod detokenizer;
mod error;
mod gguf_tokenizer;
mod pyfmt;
mod tokenizer;
mod user_text;

#[cfg(test)]
mod tests;

pub use chat::{ChatMessage, ChatTemplate, Clock, MessageContent, RenderOptions};
pub use detokenizer::Detokenizer;
pub use error::TextError;
pub use tokenizer::{SpecialToken, SpecialTokens, Tokenizer};
pub use user_text::encode_chat;
