//! The result of `met bench serve`: one JSON document that says what was measured, where,
//! when and how (command line, server, model, dataset, met version and commit, date,
//! machine) and every figure of every ladder point; and the table printed from it.
//!
//! The JSON is the interface: `met bench plot` reads it back, and results of met and of a
//! peer server measured with the same flags compare field by field. Latencies are in
//! milliseconds, throughputs per second, and a figure that could not be measured (no request
//! completed) is `null`.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::metrics::{Figures, Slo, Summary};

/// Everything one `met bench serve` invocation measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchResult {
    /// The name of this result in plots (`--label`).
    pub label: Option<String>,
    /// The command line, as given.
    pub command_line: Vec<String>,
    /// `--base-url`, as given.
    pub base_url: String,
    /// `completions` or `chat`.
    pub endpoint: String,
    /// The model id sent with each request.
    pub model: String,
    /// Where the prompts came from.
    pub dataset: DatasetInfo,
    /// Goodput objectives.
    pub slo: Slo,
    /// Warm-up requests per ladder point.
    pub num_warmup: usize,
    /// `--timeout-s`.
    pub timeout_s: f64,
    /// `--max-duration-s`.
    pub max_duration_s: f64,
    /// The `met` that measured (`CARGO_PKG_VERSION`).
    pub met_version: String,
    /// `git rev-parse HEAD` in the directory met bench ran in, if that is a checkout.
    pub git_commit: Option<String>,
    /// When the benchmark started (RFC 3339, UTC).
    pub date: String,
    /// The machine the load generator ran on.
    pub machine: Machine,
    /// One entry per ladder point that ran, in ladder order.
    pub runs: Vec<RunResult>,
}

/// The dataset settings of a result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetInfo {
    /// `random`, `jsonl` or `sharegpt`.
    pub name: String,
    /// The file, for `jsonl` and `sharegpt`.
    pub path: Option<String>,
    /// Random prompt tokens after the prefix (`random` only).
    pub input_len: Option<usize>,
    /// Tokens generated per request, when fixed for every request.
    pub output_len: Option<usize>,
    /// Shared prefix tokens (`random` only).
    pub prefix_len: Option<usize>,
    /// The half-open range random ids were drawn from (`random` only).
    pub random_ids: Option<[u32; 2]>,
    /// Measured requests per ladder point.
    pub num_prompts: usize,
    /// `--seed`.
    pub seed: u64,
    /// Whether every request asked for exactly `max_tokens` (`ignore_eos`).
    pub ignore_eos: bool,
}

/// Where the load generator ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// The host name, when the system says.
    pub hostname: Option<String>,
    /// The CPU model (`/proc/cpuinfo`), when the system says.
    pub cpu: Option<String>,
    /// Logical cores available to the process.
    pub cores: usize,
}

impl Machine {
    /// This machine.
    pub fn detect() -> Self {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let hostname = read("/proc/sys/kernel/hostname")
            .or_else(|| std::env::var("HOSTNAME").ok())
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty());
        let cpu = read("/proc/cpuinfo").and_then(|info| {
            info.lines().find_map(|l| {
                l.split_once(':').filter(|(k, _)| k.trim() == "model name").map(|(_, v)| v.trim().to_owned())
            })
        });
        Self { hostname, cpu, cores: std::thread::available_parallelism().map_or(1, usize::from) }
    }
}

/// The commit checked out where met runs, or `None` outside a git checkout.
pub fn git_commit() -> Option<String> {
    let out = std::process::Command::new("git").args(["rev-parse", "HEAD"]).output().ok()?;
    let commit = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !commit.is_empty()).then_some(commit)
}

/// One ladder point of a result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// Requests in flight, for a concurrency ladder.
    pub concurrency: Option<usize>,
    /// Requests per second, for a request-rate ladder.
    pub request_rate: Option<f64>,
    /// Gamma shape of the arrivals, for a request-rate ladder.
    pub burstiness: Option<f64>,
    /// Whether `--max-duration-s` cut this point short.
    pub stopped_early: bool,
    /// Warm-up requests that failed (not counted in the figures).
    pub warmup_failed: usize,
    /// Every figure.
    #[serde(flatten)]
    pub figures: Figures,
    /// Speculative decoding over the measured requests, from the server's `/metrics`
    /// before and after them; `None` for a server that does not report it (not met).
    #[serde(default)]
    pub speculative: Option<SpeculativeFigures>,
}

/// Speculative decoding over one ladder point, from the differences of met's
/// `met_spec_decode_*` counters across it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpeculativeFigures {
    /// Sequence steps that verified proposed tokens.
    pub drafts: u64,
    /// Proposed tokens verified.
    pub draft_tokens: u64,
    /// Proposed tokens accepted.
    pub accepted_tokens: u64,
    /// `accepted_tokens / draft_tokens`; `None` without drafts.
    pub acceptance_rate: Option<f64>,
    /// Tokens a sequence gained per verifying step, the target's own token included:
    /// `1 + accepted_tokens / drafts`; `None` without drafts.
    pub tokens_per_step: Option<f64>,
}

impl SpeculativeFigures {
    /// The figures between two `/metrics` texts, or `None` when either lacks the counters.
    pub fn between(before: &str, after: &str) -> Option<Self> {
        let delta = |name: &str| Some(counter(after, name)?.saturating_sub(counter(before, name)?));
        let drafts = delta("met_spec_decode_drafts_total")?;
        let draft_tokens = delta("met_spec_decode_draft_tokens_total")?;
        let accepted_tokens = delta("met_spec_decode_accepted_tokens_total")?;
        Some(Self::from_counts(drafts, draft_tokens, accepted_tokens))
    }

    /// The figures of these counts.
    pub fn from_counts(drafts: u64, draft_tokens: u64, accepted_tokens: u64) -> Self {
        let ratio = |num: u64, den: u64| (den > 0).then(|| num as f64 / den as f64);
        Self {
            drafts,
            draft_tokens,
            accepted_tokens,
            acceptance_rate: ratio(accepted_tokens, draft_tokens),
            tokens_per_step: ratio(accepted_tokens, drafts).map(|r| 1.0 + r),
        }
    }
}

/// The value of the unlabelled counter `name` in a Prometheus text exposition.
fn counter(text: &str, name: &str) -> Option<u64> {
    let value = text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))?;
    value.trim().parse::<f64>().ok().map(|v| v as u64)
}

impl RunResult {
    /// `c=4` or `r=2.5`.
    pub fn load_name(&self) -> String {
        match (self.concurrency, self.request_rate) {
            (Some(c), _) => format!("c={c}"),
            (None, Some(r)) => format!("r={r}"),
            (None, None) => "?".into(),
        }
    }
}

impl BenchResult {
    /// Writes the result as pretty JSON.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn write_json(&self, path: &Path) -> Result<()> {
        let json = serde_json::to_string_pretty(self)?;
        std::fs::write(path, json + "\n").with_context(|| format!("--output: cannot write {}", path.display()))
    }

    /// Reads a result written by [`BenchResult::write_json`].
    ///
    /// # Errors
    /// The file cannot be read or is not a `met bench serve` result.
    pub fn read_json(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("{} is not a `met bench serve --output` result", path.display()))
    }
}

/// The table's header line.
pub fn table_header() -> String {
    format!(
        "{:<8} {:>6} {:>5} {:>8} {:>10} {:>10} {:>17} {:>17} {:>17} {:>17} {:>8}",
        "load",
        "ok",
        "fail",
        "req/s",
        "out tok/s",
        "all tok/s",
        "TTFT ms p50/p99",
        "TPOT ms p50/p99",
        "ITL ms p50/p99",
        "E2E ms p50/p99",
        "goodput"
    )
}

/// One table line per ladder point, then a line per point that had errors.
pub fn table_row(run: &RunResult) -> String {
    let f = &run.figures;
    let pair = |s: &Option<Summary>| s.map_or_else(|| "-".to_owned(), |s| format!("{:.1}/{:.1}", s.p50, s.p99));
    let mut row = format!(
        "{:<8} {:>6} {:>5} {:>8.2} {:>10.1} {:>10.1} {:>17} {:>17} {:>17} {:>17} {:>8}",
        run.load_name(),
        f.completed,
        f.failed,
        f.request_throughput,
        f.output_throughput,
        f.total_token_throughput,
        pair(&f.ttft_ms),
        pair(&f.tpot_ms),
        pair(&f.itl_ms),
        pair(&f.e2e_ms),
        f.goodput.map_or_else(|| "-".to_owned(), |g| format!("{g:.2}")),
    );
    if !f.errors.is_empty() || f.cancelled > 0 || run.warmup_failed > 0 {
        let mut notes: Vec<String> = f.errors.iter().map(|(kind, n)| format!("{kind} ×{n}")).collect();
        if f.cancelled > 0 {
            notes.push(format!("cancelled by --max-duration-s ×{}", f.cancelled));
        }
        if run.warmup_failed > 0 {
            notes.push(format!("failed warm-ups ×{}", run.warmup_failed));
        }
        let _ = write!(row, "\n{:<8} {}", "", notes.join(", "));
    }
    row
}

/// The whole table of a result.
pub fn table(result: &BenchResult) -> String {
    let mut table = table_header();
    for run in &result.runs {
        table.push('\n');
        table.push_str(&table_row(run));
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speculative_figures_are_the_counters_differences() {
        let before = "met_spec_decode_drafts_total 10\nmet_spec_decode_draft_tokens_total 40\n\
                      met_spec_decode_accepted_tokens_total 20\n";
        let after = "# TYPE x counter\nmet_spec_decode_drafts_total 30\nmet_spec_decode_draft_tokens_total 120\n\
                     met_spec_decode_accepted_tokens_total 80\n";
        let f = SpeculativeFigures::between(before, after).unwrap();
        assert_eq!((f.drafts, f.draft_tokens, f.accepted_tokens), (20, 80, 60));
        assert_eq!(f.acceptance_rate, Some(0.75));
        assert_eq!(f.tokens_per_step, Some(4.0));
        let idle = SpeculativeFigures::between(before, before).unwrap();
        assert_eq!((idle.acceptance_rate, idle.tokens_per_step), (None, None));
        assert_eq!(SpeculativeFigures::between("", after), None, "a server without the counters");
    }
}
