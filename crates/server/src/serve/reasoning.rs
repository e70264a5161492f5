//! Reasoning kept apart from the answer: a choice's `<think>…</think>` text becomes
//! `reasoning_content` (the DeepSeek-R1 / Qwen3 convention), in JSON and as streaming
//! deltas, chosen by `--reasoning-parser`.
//!
//! - `qwen3`: reasoning only when the answer opens with `<think>` (Qwen3 templates write
//!   an empty block into the prompt when `chat_template_kwargs.enable_thinking` is false,
//!   and the answer is then all content).
//! - `deepseek_r1`: the answer starts inside the reasoning (R1 templates open `<think>` in
//!   the prompt); a leading `<think>` is dropped; everything before `</think>` is reasoning,
//!   and an answer cut before `</think>` is all reasoning.
//!
//! Tags split across deltas are held back until the next text shows what they are, as
//! stop strings are.

use super::tool_parser::partial_suffix;

use met_config::ReasoningParser;

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Nothing decided yet: the answer may still open with `<think>`.
    Start,
    Thinking,
    /// After `</think>`; `trim` while the answer's leading whitespace is being dropped.
    Answer {
        trim: bool,
    },
}

/// One choice's text split into reasoning and content.
#[derive(Debug)]
pub struct ReasoningSplit {
    kind: ReasoningParser,
    stage: Stage,
    held: String,
}

/// Reasoning and content text released together.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Split {
    /// Reasoning text.
    pub reasoning: String,
    /// Answer text.
    pub content: String,
}

impl ReasoningSplit {
    /// A split in format `kind`.
    pub fn new(kind: ReasoningParser) -> Self {
        Self { kind, stage: Stage::Start, held: String::new() }
    }

    /// Takes new text of the choice.
    pub fn push(&mut self, text: &str) -> Split {
        self.held.push_str(text);
        let mut out = Split::default();
        loop {
            match self.stage {
                Stage::Start => {
                    let t = self.held.trim_start();
                    if let Some(rest) = t.strip_prefix(OPEN) {
                        self.held = rest.to_owned();
                        self.stage = Stage::Thinking;
                    } else if OPEN.starts_with(t) {
                        return out;
                    } else {
                        self.stage = match self.kind {
                            ReasoningParser::Qwen3 => Stage::Answer { trim: false },
                            ReasoningParser::DeepSeekR1 => Stage::Thinking,
                        };
                    }
                }
                Stage::Thinking => match self.held.find(CLOSE) {
                    Some(at) => {
                        out.reasoning.push_str(&self.held[..at]);
                        self.held.drain(..at + CLOSE.len());
                        self.stage = Stage::Answer { trim: true };
                    }
                    None => {
                        let keep = partial_suffix(&self.held, CLOSE);
                        out.reasoning.extend(self.held.drain(..self.held.len() - keep));
                        return out;
                    }
                },
                Stage::Answer { trim } => {
                    let text = std::mem::take(&mut self.held);
                    let text = if trim { text.trim_start() } else { &text[..] };
                    if !text.is_empty() {
                        self.stage = Stage::Answer { trim: false };
                    }
                    out.content.push_str(text);
                    return out;
                }
            }
        }
    }

    /// Ends the choice: what was held back.
    pub fn finish(&mut self) -> Split {
        let held = std::mem::take(&mut self.held);
        match self.stage {
            Stage::Thinking => Split { reasoning: held, content: String::new() },
            Stage::Start if self.kind == ReasoningParser::DeepSeekR1 => {
                Split { reasoning: held, content: String::new() }
            }
            _ => Split { reasoning: String::new(), content: held },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every split of `text` into two deltas gives the same reasoning and content.
    fn split(kind: ReasoningParser, text: &str) -> (String, String) {
        let whole = {
            let mut s = ReasoningSplit::new(kind);
            let (a, b) = (s.push(text), s.finish());
            (a.reasoning + &b.reasoning, a.content + &b.content)
        };
        for cut in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
            let mut s = ReasoningSplit::new(kind);
            let parts = [s.push(&text[..cut]), s.push(&text[cut..]), s.finish()];
            let got = parts.iter().fold((String::new(), String::new()), |(r, c), p| (r + &p.reasoning, c + &p.content));
            assert_eq!(got, whole, "cut at {cut} of {text:?}");
        }
        whole
    }

    #[test]
    fn think_blocks_become_reasoning_whatever_the_deltas() {
        let qwen = ReasoningParser::Qwen3;
        assert_eq!(
            split(qwen, "<think>Paris is in France.</think>\n\nParis."),
            ("Paris is in France.".into(), "Paris.".into())
        );
        assert_eq!(split(qwen, "Just the answer <think> here"), (String::new(), "Just the answer <think> here".into()));
        assert_eq!(split(qwen, "<think>cut off"), ("cut off".into(), String::new()));
        let r1 = ReasoningParser::DeepSeekR1;
        assert_eq!(split(r1, "thinking first</think>answer"), ("thinking first".into(), "answer".into()));
        assert_eq!(split(r1, "<think>x</think> y"), ("x".into(), "y".into()));
        assert_eq!(split(r1, "never closed"), ("never closed".into(), String::new()));
    }
}
