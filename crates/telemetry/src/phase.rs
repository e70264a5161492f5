//! The numbered startup phases of `met serve` (see ARCHITECTURE.md), each logged with its
//! duration when it ends.

use std::fmt;
use std::time::Instant;

/// A startup phase. The number is its position in the startup order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// CLI and environment validated into typed settings.
    Settings = 0,
    /// Model location resolved.
    Resolve = 1,
    /// `config.json` or GGUF metadata parsed.
    Config = 2,
    /// Device opened, memory budget, kernels compiled.
    Device = 3,
    /// World size and ranks.
    Topology = 4,
    /// Weights checked and loaded.
    Weights = 5,
    /// KV cache sized and allocated.
    KvCache = 6,
    /// Kernel warm-up and graph capture.
    Warmup = 7,
    /// Tokenizer, chat template and sampling defaults.
    Tokenizer = 8,
    /// Engine thread started.
    Engine = 9,
    /// HTTP router built.
    Router = 10,
    /// Listening.
    Ready = 11,
}

impl Phase {
    /// A short lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Settings => "settings",
            Self::Resolve => "resolve model",
            Self::Config => "model config",
            Self::Device => "device",
            Self::Topology => "topology",
            Self::Weights => "weights",
            Self::KvCache => "kv cache",
            Self::Warmup => "warm-up",
            Self::Tokenizer => "tokenizer",
            Self::Engine => "engine",
            Self::Router => "router",
            Self::Ready => "ready",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{:>2}] {}", *self as u8, self.name())
    }
}

/// Times a phase; [`PhaseTimer::done`] logs it with a detail line.
#[must_use = "call done() to report the phase"]
pub struct PhaseTimer {
    phase: Phase,
    start: Instant,
}

impl PhaseTimer {
    /// Starts timing `phase`.
    pub fn start(phase: Phase) -> Self {
        Self { phase, start: Instant::now() }
    }

    /// Logs the phase, its duration and `detail`.
    pub fn done(self, detail: impl fmt::Display) {
        let ms = self.start.elapsed().as_secs_f64() * 1e3;
        tracing::info!("{} ({ms:.0} ms): {detail}", self.phase);
    }
}
