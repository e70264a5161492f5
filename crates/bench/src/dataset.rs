//! The prompts `met bench serve` sends: random token ids of exact lengths, a JSONL file of
//! prompts, or ShareGPT conversations (the JSON vLLM's `benchmark_serving` reads).
//!
//! Random prompts are token-id arrays, which `/v1/completions` takes as `prompt` (OpenAI's
//! API, vLLM, SGLang, llama-server and met), so the server sees exactly `--prefix-len +
//! --input-len` tokens whatever its tokenizer; `ignore_eos` and `min_tokens` hold the output
//! length. Each ladder point gets fresh random prompts (the shared prefix stays the same),
//! so a prefix cache warmed by one point does not flatter the next. Files are read once and
//! cycled when a point asks for more requests than they hold.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use crate::args::{DatasetKind, IdRange};
use crate::rng::Rng;

/// Output tokens per request when nothing else says.
pub const DEFAULT_OUTPUT_LEN: usize = 128;

/// A prompt as the server receives it.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Text, tokenized by the server.
    Text(String),
    /// Token ids, used as they are.
    Ids(Vec<u32>),
}

/// One request of the workload.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRequest {
    /// What to send.
    pub prompt: Prompt,
    /// Its length in tokens, when known without the server's tokenizer (ids).
    pub prompt_tokens: Option<usize>,
    /// `max_tokens`.
    pub max_tokens: usize,
    /// Send `ignore_eos` and `min_tokens = max_tokens`, so the output is exactly that long.
    pub exact_length: bool,
}

/// What the dataset flags asked for (also recorded in the result file).
#[derive(Debug, Clone)]
pub struct DatasetSpec {
    /// Which dataset.
    pub kind: DatasetKind,
    /// Its file, for `jsonl` and `sharegpt`.
    pub path: Option<PathBuf>,
    /// Random prompt tokens after the prefix.
    pub input_len: usize,
    /// `--output-len`, when given.
    pub output_len: Option<usize>,
    /// Shared random prefix tokens.
    pub prefix_len: usize,
    /// Random ids are drawn from here.
    pub ids: IdRange,
    /// The seed of everything random.
    pub seed: u64,
    /// `ignore_eos` for file datasets.
    pub ignore_eos: bool,
}

/// A loaded dataset, ready to hand out requests.
#[derive(Debug)]
pub struct Dataset {
    spec: DatasetSpec,
    /// The file's requests (empty for `random`).
    items: Vec<BenchRequest>,
    /// The shared prefix of random prompts.
    prefix: Vec<u32>,
}

/// Salts that keep the random streams of different purposes apart.
const PREFIX_STREAM: u64 = 1;
const WARMUP_STREAM: u64 = 1 << 32;

impl Dataset {
    /// Reads the file (if any) and draws the shared prefix.
    ///
    /// # Errors
    /// A missing `--dataset-path`, a file that cannot be read or holds no usable prompt (the
    /// error names the file and line), or lengths that make no request.
    pub fn load(spec: DatasetSpec) -> Result<Self> {
        let items = match spec.kind {
            DatasetKind::Random => {
                if spec.input_len + spec.prefix_len == 0 {
                    bail!("--input-len and --prefix-len are both 0: a random prompt needs a token");
                }
                Vec::new()
            }
            DatasetKind::Jsonl => read_jsonl(required_path(&spec)?, &spec)?,
            DatasetKind::Sharegpt => read_sharegpt(required_path(&spec)?, &spec)?,
        };
        if spec.output_len == Some(0) {
            bail!("--output-len must be at least 1");
        }
        let mut rng = Rng::derived(spec.seed, PREFIX_STREAM);
        let prefix = (0..spec.prefix_len).map(|_| rng.range(spec.ids.lo, spec.ids.hi)).collect();
        Ok(Self { spec, items, prefix })
    }

    /// The settings it was loaded with.
    pub fn spec(&self) -> &DatasetSpec {
        &self.spec
    }

    /// Whether some prompt is token ids (only `/v1/completions` takes those).
    pub fn has_id_prompts(&self) -> bool {
        self.spec.kind == DatasetKind::Random || self.items.iter().any(|r| matches!(r.prompt, Prompt::Ids(_)))
    }

    /// `count` requests for ladder point `point` (measured, or its warm-up).
    pub fn requests(&self, point: usize, count: usize, warmup: bool) -> Vec<BenchRequest> {
        if self.spec.kind != DatasetKind::Random {
            return self.items.iter().cycle().take(count).cloned().collect();
        }
        let salt = point as u64 + 2 + if warmup { WARMUP_STREAM } else { 0 };
        let mut rng = Rng::derived(self.spec.seed, salt);
        let output_len = self.spec.output_len.unwrap_or(DEFAULT_OUTPUT_LEN);
        (0..count)
            .map(|_| {
                let mut ids = self.prefix.clone();
                ids.extend((0..self.spec.input_len).map(|_| rng.range(self.spec.ids.lo, self.spec.ids.hi)));
                BenchRequest {
                    prompt_tokens: Some(ids.len()),
                    prompt: Prompt::Ids(ids),
                    max_tokens: output_len,
                    exact_length: true,
                }
            })
            .collect()
    }
}

fn required_path(spec: &DatasetSpec) -> Result<&Path> {
    spec.path.as_deref().with_context(|| {
        format!(
            "--dataset {}: needs --dataset-path FILE",
            if spec.kind == DatasetKind::Jsonl { "jsonl" } else { "sharegpt" }
        )
    })
}

/// One line of a JSONL dataset.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonlLine {
    prompt: JsonlPrompt,
    max_tokens: Option<usize>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum JsonlPrompt {
    Text(String),
    Ids(Vec<u32>),
}

fn read_jsonl(path: &Path, spec: &DatasetSpec) -> Result<Vec<BenchRequest>> {
    let file = std::fs::File::open(path).with_context(|| format!("--dataset-path: cannot open {}", path.display()))?;
    let mut items = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let entry: JsonlLine = serde_json::from_str(&line).with_context(|| {
            format!("{}:{}: expected {{\"prompt\": \"...\", \"max_tokens\": N}}", path.display(), i + 1)
        })?;
        let max_tokens = entry.max_tokens.or(spec.output_len).unwrap_or(DEFAULT_OUTPUT_LEN);
        if max_tokens == 0 {
            bail!("{}:{}: max_tokens must be at least 1", path.display(), i + 1);
        }
        let (prompt, prompt_tokens) = match entry.prompt {
            JsonlPrompt::Text(text) => (Prompt::Text(text), None),
            JsonlPrompt::Ids(ids) => {
                let n = ids.len();
                (Prompt::Ids(ids), Some(n))
            }
        };
        items.push(BenchRequest { prompt, prompt_tokens, max_tokens, exact_length: spec.ignore_eos });
    }
    if items.is_empty() {
        bail!("{}: no prompts (expected one JSON object per line)", path.display());
    }
    Ok(items)
}

/// ShareGPT's layout: a list of conversations, each a list of turns.
#[derive(Deserialize)]
struct Conversation {
    #[serde(default)]
    conversations: Vec<Turn>,
}

#[derive(Deserialize)]
struct Turn {
    from: String,
    value: String,
}

/// The first human turn and the reply after it; conversations without one are skipped
/// (as vLLM does), then the rest are shuffled by `--seed`.
fn read_sharegpt(path: &Path, spec: &DatasetSpec) -> Result<Vec<BenchRequest>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("--dataset-path: cannot read {}", path.display()))?;
    let conversations: Vec<Conversation> = serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: expected ShareGPT JSON, a list of {{\"conversations\": [{{\"from\", \"value\"}}]}}",
            path.display()
        )
    })?;
    let mut items: Vec<BenchRequest> = conversations
        .iter()
        .filter_map(|c| {
            let human = c.conversations.iter().position(|t| matches!(t.from.as_str(), "human" | "user"))?;
            let reply = c.conversations.get(human + 1).filter(|t| matches!(t.from.as_str(), "gpt" | "assistant"))?;
            let prompt = &c.conversations[human].value;
            if prompt.is_empty() {
                return None;
            }
            let max_tokens = spec.output_len.unwrap_or((reply.value.chars().count() / 4).max(1));
            Some(BenchRequest {
                prompt: Prompt::Text(prompt.clone()),
                prompt_tokens: None,
                max_tokens,
                exact_length: spec.ignore_eos,
            })
        })
        .collect();
    if items.is_empty() {
        bail!("{}: no conversation has a human turn followed by a gpt turn", path.display());
    }
    Rng::derived(spec.seed, PREFIX_STREAM).shuffle(&mut items);
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: DatasetKind, path: Option<PathBuf>) -> DatasetSpec {
        DatasetSpec {
            kind,
            path,
            input_len: 8,
            output_len: None,
            prefix_len: 4,
            ids: IdRange { lo: 100, hi: 200 },
            seed: 3,
            ignore_eos: false,
        }
    }

    #[test]
    fn random_prompts_share_the_prefix_and_have_exact_lengths() {
        let data = Dataset::load(spec(DatasetKind::Random, None)).unwrap();
        let first = data.requests(0, 5, false);
        assert_eq!(first, data.requests(0, 5, false), "seeded");
        let ids = |r: &BenchRequest| match &r.prompt {
            Prompt::Ids(ids) => ids.clone(),
            Prompt::Text(_) => panic!("ids"),
        };
        for r in &first {
            let prompt = ids(r);
            assert_eq!((prompt.len(), r.prompt_tokens, r.max_tokens, r.exact_length), (12, Some(12), 128, true));
            assert_eq!(prompt[..4], ids(&first[0])[..4], "shared prefix");
            assert!(prompt.iter().all(|id| (100..200).contains(id)));
        }
        assert_ne!(ids(&first[0])[4..], ids(&first[1])[4..]);
        let next = data.requests(1, 5, false);
        assert_eq!(ids(&next[0])[..4], ids(&first[0])[..4]);
        assert_ne!(next, first, "each ladder point gets fresh prompts");
        assert_ne!(data.requests(0, 5, true), first, "warm-ups differ from measured prompts");
    }

    #[test]
    fn files_parse_cycle_and_fail_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let jsonl = dir.path().join("p.jsonl");
        std::fs::write(&jsonl, "{\"prompt\": \"hi\", \"max_tokens\": 3}\n\n{\"prompt\": [1, 2]}\n").unwrap();
        let data = Dataset::load(spec(DatasetKind::Jsonl, Some(jsonl.clone()))).unwrap();
        let r = data.requests(0, 3, false);
        assert_eq!((r[0].max_tokens, r[1].max_tokens, r[1].prompt_tokens), (3, 128, Some(2)));
        assert_eq!(r[2], r[0], "cycled");
        assert!(data.has_id_prompts());

        std::fs::write(&jsonl, "{\"prompt\": \"a\"}\n{\"text\": 1}\n").unwrap();
        let err = format!("{:#}", Dataset::load(spec(DatasetKind::Jsonl, Some(jsonl.clone()))).unwrap_err());
        assert!(err.contains("p.jsonl:2"), "{err}");
        let err = format!("{:#}", Dataset::load(spec(DatasetKind::Jsonl, None)).unwrap_err());
        assert!(err.contains("--dataset-path"), "{err}");
        let missing = dir.path().join("missing.json");
        let err = format!("{:#}", Dataset::load(spec(DatasetKind::Sharegpt, Some(missing))).unwrap_err());
        assert!(err.contains("missing.json"), "{err}");

        let share = dir.path().join("s.json");
        let conv = serde_json::json!([
            {"conversations": [{"from": "human", "value": "question"}, {"from": "gpt", "value": "a".repeat(40)}]},
            {"conversations": [{"from": "human", "value": "alone"}]},
            {"id": "no turns"},
        ]);
        std::fs::write(&share, conv.to_string()).unwrap();
        let data = Dataset::load(spec(DatasetKind::Sharegpt, Some(share.clone()))).unwrap();
        let r = data.requests(0, 2, false);
        assert_eq!(r[0].prompt, Prompt::Text("question".into()));
        assert_eq!((r[0].max_tokens, r[0].prompt_tokens, r.len()), (10, None, 2));
        assert!(!data.has_id_prompts());
        let mut fixed = spec(DatasetKind::Sharegpt, Some(share));
        fixed.output_len = Some(7);
        assert_eq!(Dataset::load(fixed).unwrap().requests(0, 1, false)[0].max_tokens, 7);
    }
}
