//! Weight-loading progress for `met serve`: a progress bar over the checkpoint's tensors
//! when stderr is a terminal, nothing otherwise (the phase's log line says it all).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::startup::load::WeightProgress;

/// A [`WeightProgress`] drawing a bar on stderr, or hidden when stderr is not a terminal.
#[derive(Debug)]
pub struct WeightBar {
    bar: ProgressBar,
}

impl WeightBar {
    /// A bar on stderr if it is a terminal.
    pub fn for_stderr() -> Self {
        let bar = if std::io::stderr().is_terminal() {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template("[ 5] weights {bar:40} {pos}/{len} tensors {elapsed}")
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar
        } else {
            ProgressBar::hidden()
        };
        Self { bar }
    }
}

impl WeightProgress for WeightBar {
    fn start(&self, tensors: usize) {
        self.bar.set_length(tensors as u64);
    }

    fn tensor(&self, _name: &str) {
        self.bar.inc(1);
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
