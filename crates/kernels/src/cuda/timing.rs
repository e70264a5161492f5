//! Device time by kernel without a profiler (`MET_KERNEL_TIMES=1`): every kernel launched
//! outside a graph capture, and every cuBLAS and cuBLASLt product, is bracketed by two
//! timing events on the compute stream, and [`KernelTimes::table`] (which the engine calls
//! after each step, through `GpuBackend::kernel_times`) waits for them and sums the times
//! by kernel name. The events stand between consecutive kernels, so a kernel no longer
//! starts during its predecessor's tail: the times are those of the kernels one after
//! another, each whole, and the step runs slower than without them. For where a step's
//! device time goes on machines where Nsight Systems is not installed; graphs replay
//! untimed, so decode steps are timed under `--enforce-eager`.

use cudarc::driver::sys::{CUevent_flags, CUstreamCaptureStatus};
use cudarc::driver::{CudaEvent, CudaStream};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt::Write as _;

use super::drv;
use crate::error::{Error, Result};

/// The timed launches of a step, in order, until [`KernelTimes::table`] takes them.
pub(super) struct KernelTimes {
    pending: Mutex<Vec<(&'static str, CudaEvent, CudaEvent)>>,
}

/// Kernels a table names; the rest are summed in one line.
const SHOWN: usize = 16;

impl KernelTimes {
    /// On when `MET_KERNEL_TIMES` is `1`; an error for any other value but unset, empty or `0`.
    pub(super) fn from_env() -> Result<Option<Self>> {
        const VAR: &str = "MET_KERNEL_TIMES";
        match std::env::var(VAR).as_deref() {
            Err(_) | Ok("" | "0") => Ok(None),
            Ok("1") => Ok(Some(Self { pending: Mutex::new(Vec::new()) })),
            Ok(other) => Err(Error::InvalidArgument(format!("{VAR}={other}: expected 0 or 1"))),
        }
    }

    /// Runs `launch` (which queues work on `stream`) between two timing events, unless the
    /// stream is capturing a graph.
    pub(super) fn around(
        &self,
        stream: &CudaStream,
        name: &'static str,
        launch: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        if capturing(stream) {
            return launch();
        }
        let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(drv)?;
        launch()?;
        let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(drv)?;
        self.pending.lock().push((name, start, end));
        Ok(())
    }

    /// The timed launches since the last call, waited for: their count and device time, then
    /// per kernel name (largest total first) launches, total milliseconds and mean
    /// microseconds. `None` when nothing was timed.
    pub(super) fn table(&self) -> Result<Option<String>> {
        let pending = std::mem::take(&mut *self.pending.lock());
        if pending.is_empty() {
            return Ok(None);
        }
        let mut by_name: HashMap<&'static str, (usize, f64)> = HashMap::new();
        let mut total = 0.0f64;
        for (name, start, end) in &pending {
            let ms = f64::from(start.elapsed_ms(end).map_err(drv)?);
            let entry = by_name.entry(name).or_default();
            entry.0 += 1;
            entry.1 += ms;
            total += ms;
        }
        let mut rows: Vec<_> = by_name.into_iter().collect();
        rows.sort_by(|a, b| b.1.1.total_cmp(&a.1.1).then(a.0.cmp(b.0)));
        let mut out = format!("{} launches, {total:.3} ms:", pending.len());
        for (name, (count, ms)) in rows.iter().take(SHOWN) {
            let _ = write!(out, " {name} x{count} {ms:.3} ms ({:.1} us);", 1e3 * ms / *count as f64);
        }
        if rows.len() > SHOWN {
            let (count, ms) = rows[SHOWN..].iter().fold((0, 0.0), |(c, t), (_, (n, ms))| (c + n, t + ms));
            let _ = write!(out, " {} more kernels x{count} {ms:.3} ms;", rows.len() - SHOWN);
        }
        Ok(Some(out))
    }
}

/// Whether `stream` is recording a graph (then nothing is timed: events would become
/// graph nodes).
fn capturing(stream: &CudaStream) -> bool {
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: `stream` is a live stream of this context; `status` outlives the call.
    let asked = unsafe { cudarc::driver::sys::cuStreamIsCapturing(stream.cu_stream(), &raw mut status) };
    asked.result().is_err() || status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
}
