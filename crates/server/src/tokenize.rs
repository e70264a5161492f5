//! `met tokenize`: text to token ids (a JSON array) or ids to text, with the tokenizer of
//! the resolved model.

use anyhow::{Result, bail};

use crate::startup::load::load_tokenizer;

/// What to tokenize or decode.
#[derive(Debug, Clone, Copy)]
pub enum Input<'a> {
    /// Text to encode, with the tokenizer's special tokens (bos) around it or not.
    Text {
        /// The text.
        text: &'a str,
        /// Whether to add the special tokens.
        special_tokens: bool,
    },
    /// Token ids to decode.
    Ids(&'a [u32]),
}

/// Runs `met tokenize` on `input` with the tokenizer of `model` (the default model when
/// `None`).
///
/// # Errors
/// A model without a tokenizer, or an id outside its vocabulary.
pub fn run(model: Option<&str>, input: &Input<'_>) -> Result<()> {
    let tokenizer = load_tokenizer(model)?;
    match *input {
        Input::Ids(ids) => {
            if let Some(id) = ids.iter().find(|&&id| id as usize >= tokenizer.vocab_size()) {
                bail!("--decode: token id {id} is outside the vocabulary of {}", tokenizer.vocab_size());
            }
            println!("{}", tokenizer.decode(ids, false)?);
        }
        Input::Text { text, special_tokens } => {
            println!("{}", serde_json::to_string(&tokenizer.encode(text, special_tokens)?)?);
        }
    }
    Ok(())
}
