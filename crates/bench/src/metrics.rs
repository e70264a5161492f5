//! What one ladder point measured, from per-request records to the figures of the report.
//!
//! Definitions follow vLLM's `benchmark_serving`, so numbers are comparable side by side:
//! TTFT is the time from sending a request to its first content chunk; TPOT is `(e2e -
//! ttft) / (output_tokens - 1)` per request (undefined for one-token outputs); ITL is every
//! gap between consecutive content chunks, pooled over requests; E2E is send to the end of
//! the stream. Percentiles interpolate linearly between order statistics (numpy's
//! default). Throughputs divide by the point's wall time, first send to last completion.
//! Goodput is the rate of requests that met every SLO given.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Why a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ErrorKind {
    /// No connection could be made.
    Connect,
    /// The connection closed or failed before a response came.
    NoResponse,
    /// The response status was not 2xx.
    Status(u16),
    /// The body broke SSE or its data was not the JSON of a chunk.
    MalformedSse,
    /// The server sent an error object in the stream.
    ErrorEvent,
    /// The stream stopped (closed cleanly or dropped) before `[DONE]` or a finish reason.
    EndedEarly,
    /// The request took longer than `--timeout-s`.
    Timeout,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Connect => f.write_str("connect"),
            Self::NoResponse => f.write_str("no response"),
            Self::Status(code) => write!(f, "http {code}"),
            Self::MalformedSse => f.write_str("malformed sse"),
            Self::ErrorEvent => f.write_str("error event"),
            Self::EndedEarly => f.write_str("stream ended early"),
            Self::Timeout => f.write_str("timeout"),
        }
    }
}

/// The timings of a request that completed, in seconds from its send.
#[derive(Debug, Clone, PartialEq)]
pub struct Timing {
    /// Time to the first content chunk (the end of the stream if none came).
    pub ttft: f64,
    /// Time to the end of the stream.
    pub e2e: f64,
    /// Gaps between consecutive content chunks.
    pub itl: Vec<f64>,
    /// Prompt tokens: the server's `usage`, else the dataset's own count, else 0.
    pub prompt_tokens: usize,
    /// Output tokens: the server's `usage`, else the number of content chunks.
    pub output_tokens: usize,
}

impl Timing {
    /// Time per output token after the first; `None` for outputs of one token or none.
    pub fn tpot(&self) -> Option<f64> {
        (self.output_tokens > 1).then(|| (self.e2e - self.ttft) / (self.output_tokens - 1) as f64)
    }
}

/// Service-level objectives for goodput, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Slo {
    /// Most time to first token.
    pub ttft_ms: Option<f64>,
    /// Most time per output token.
    pub tpot_ms: Option<f64>,
}

impl Slo {
    /// Whether any objective was given (else goodput is not reported).
    pub fn is_set(&self) -> bool {
        self.ttft_ms.is_some() || self.tpot_ms.is_some()
    }

    /// Whether `t` met every objective given. A one-token output has no TPOT and meets any
    /// TPOT objective.
    pub fn met_by(&self, t: &Timing) -> bool {
        let ttft_ok = self.ttft_ms.is_none_or(|slo| t.ttft * 1e3 <= slo);
        let tpot_ok = self.tpot_ms.is_none_or(|slo| t.tpot().is_none_or(|tpot| tpot * 1e3 <= slo));
        ttft_ok && tpot_ok
    }
}

/// Mean and percentiles of one latency, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl Summary {
    /// The summary of `seconds`, reported in milliseconds; `None` when there are none.
    pub fn of_seconds(seconds: &[f64]) -> Option<Self> {
        if seconds.is_empty() {
            return None;
        }
        let mut ms: Vec<f64> = seconds.iter().map(|s| s * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        let mean = ms.iter().sum::<f64>() / ms.len() as f64;
        Some(Self { mean, p50: percentile(&ms, 50.0), p90: percentile(&ms, 90.0), p99: percentile(&ms, 99.0) })
    }
}

/// The `q`th percentile (0-100) of ascending `sorted`, interpolating linearly between the
/// two nearest ranks (numpy's default `linear` method). `NaN` for an empty slice.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    let Some(last) = sorted.len().checked_sub(1) else { return f64::NAN };
    let rank = q.clamp(0.0, 100.0) / 100.0 * last as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}

/// One request's outcome.
pub type Record = Result<Timing, ErrorKind>;

/// Every figure of one ladder point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    /// Requests that completed.
    pub completed: usize,
    /// Requests that failed, of every kind.
    pub failed: usize,
    /// Requests cancelled by `--max-duration-s` (neither completed nor failed).
    pub cancelled: usize,
    /// Failures by kind (`"http 500"`, `"timeout"`, ...).
    pub errors: BTreeMap<String, usize>,
    /// Wall time of the point: first send to last completion.
    pub duration_s: f64,
    /// Prompt tokens of completed requests.
    pub input_tokens: u64,
    /// Output tokens of completed requests.
    pub output_tokens: u64,
    /// Completed requests per second.
    pub request_throughput: f64,
    /// Output tokens per second.
    pub output_throughput: f64,
    /// Prompt and output tokens per second.
    pub total_token_throughput: f64,
    /// Requests per second that met every SLO; `None` without an SLO.
    pub goodput: Option<f64>,
    /// Time to first token.
    pub ttft_ms: Option<Summary>,
    /// Time per output token.
    pub tpot_ms: Option<Summary>,
    /// Inter-token latency (gaps between content chunks).
    pub itl_ms: Option<Summary>,
    /// End-to-end latency.
    pub e2e_ms: Option<Summary>,
}

impl Figures {
    /// The figures of `records` over `duration_s` of wall time.
    pub fn compute(records: &[Record], cancelled: usize, duration_s: f64, slo: &Slo) -> Self {
        let done: Vec<&Timing> = records.iter().filter_map(|r| r.as_ref().ok()).collect();
        let mut errors = BTreeMap::new();
        for kind in records.iter().filter_map(|r| r.as_ref().err()) {
            *errors.entry(kind.to_string()).or_insert(0) += 1;
        }
        let input_tokens = done.iter().map(|t| t.prompt_tokens as u64).sum::<u64>();
        let output_tokens = done.iter().map(|t| t.output_tokens as u64).sum::<u64>();
        let per_s = |x: f64| if duration_s > 0.0 { x / duration_s } else { 0.0 };
        let series = |f: &dyn Fn(&Timing) -> Option<f64>| done.iter().filter_map(|t| f(t)).collect::<Vec<_>>();
        let itl: Vec<f64> = done.iter().flat_map(|t| t.itl.iter().copied()).collect();
        let good = done.iter().filter(|t| slo.met_by(t)).count();
        Self {
            completed: done.len(),
            failed: records.len() - done.len(),
            cancelled,
            errors,
            duration_s,
            input_tokens,
            output_tokens,
            request_throughput: per_s(done.len() as f64),
            output_throughput: per_s(output_tokens as f64),
            total_token_throughput: per_s((input_tokens + output_tokens) as f64),
            goodput: slo.is_set().then(|| per_s(good as f64)),
            ttft_ms: Summary::of_seconds(&series(&|t| Some(t.ttft))),
            tpot_ms: Summary::of_seconds(&series(&Timing::tpot)),
            itl_ms: Summary::of_seconds(&itl),
            e2e_ms: Summary::of_seconds(&series(&|t| Some(t.e2e))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let v = [1.0, 2.0, 3.0, 4.0];
        // numpy.percentile([1, 2, 3, 4], [0, 50, 90, 99, 100]) = [1, 2.5, 3.7, 3.97, 4]
        for (q, want) in [(0.0, 1.0), (50.0, 2.5), (90.0, 3.7), (99.0, 3.97), (100.0, 4.0)] {
            assert!((percentile(&v, q) - want).abs() < 1e-12, "q{q}: {}", percentile(&v, q));
        }
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert!(percentile(&[], 50.0).is_nan());
        assert_eq!(Summary::of_seconds(&[]), None);
        let s = Summary::of_seconds(&[0.003, 0.001, 0.002]).unwrap();
        assert!((s.mean - 2.0).abs() < 1e-9 && (s.p50 - 2.0).abs() < 1e-9 && (s.p90 - 2.8).abs() < 1e-9);
    }

    fn timing(ttft: f64, e2e: f64, output_tokens: usize) -> Timing {
        Timing { ttft, e2e, itl: vec![0.01; output_tokens.saturating_sub(1)], prompt_tokens: 10, output_tokens }
    }

    #[test]
    fn figures_count_tokens_errors_and_goodput() {
        let records = [
            Ok(timing(0.1, 1.1, 11)),
            Ok(timing(0.5, 0.5, 1)),
            Ok(timing(0.2, 4.2, 5)),
            Err(ErrorKind::Status(500)),
            Err(ErrorKind::Status(500)),
            Err(ErrorKind::Timeout),
        ];
        let slo = Slo { ttft_ms: Some(300.0), tpot_ms: Some(200.0) };
        let f = Figures::compute(&records, 2, 2.0, &slo);
        assert_eq!((f.completed, f.failed, f.cancelled), (3, 3, 2));
        assert_eq!(f.errors, BTreeMap::from([("http 500".into(), 2), ("timeout".into(), 1)]));
        assert_eq!((f.input_tokens, f.output_tokens), (30, 17));
        assert_eq!((f.request_throughput, f.output_throughput, f.total_token_throughput), (1.5, 8.5, 23.5));
        // Only the first meets both: the second misses TTFT, the third TPOT (1 s per token).
        assert_eq!(f.goodput, Some(0.5));
        let tpot = f.tpot_ms.unwrap();
        assert!((tpot.p50 - 550.0).abs() < 1e-9, "100 ms and 1000 ms: {tpot:?}");
        assert_eq!(Figures::compute(&records, 0, 2.0, &Slo::default()).goodput, None);
    }
}
