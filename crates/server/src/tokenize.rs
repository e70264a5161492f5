//! `met tokenize`: text to token ids (a JSON array) or, with `--decode`, ids to text, with
//! the tokenizer of the resolved model.

use anyhow::{Result, bail};

use crate::cli::{TokenIds, TokenizeArgs};
use crate::startup::load::load_tokenizer;

/// Runs `met tokenize`.
pub fn run(args: &TokenizeArgs) -> Result<()> {
    let tokenizer = load_tokenizer(args.model.as_deref())?;
    match (&args.decode, &args.text) {
        (Some(TokenIds(ids)), _) => {
            if let Some(id) = ids.iter().find(|&&id| id as usize >= tokenizer.vocab_size()) {
                bail!("--decode: token id {id} is outside the vocabulary of {}", tokenizer.vocab_size());
            }
            println!("{}", tokenizer.decode(ids, false)?);
        }
        (None, Some(text)) => println!("{}", serde_json::to_string(&tokenizer.encode(text, !args.no_special_tokens)?)?),
        (None, None) => unreachable!("clap requires TEXT unless --decode is given"),
    }
    Ok(())
}
