//! CUDA graphs: the ops a closure issues are captured from the compute stream into a graph,
//! instantiated once, and replayed with one launch.
//!
//! Capture runs in thread-local mode, so only this thread's calls are recorded and checked.
//! Memory the captured ops allocate and free becomes the graph's own (graph memory nodes,
//! with addresses fixed across replays); a tensor that must outlive the recording is made
//! before it and written inside it.

use std::sync::Arc;

use cudarc::driver::CudaGraph;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use parking_lot::Mutex;

use super::device::Device;
use super::{CudaBackend, drv};
use crate::backend::Graph;
use crate::error::{Error, Result};

/// A captured, instantiated graph of the compute stream.
struct StreamGraph {
    /// cudarc's graph is not thread safe; replays are serialised here.
    graph: Mutex<CudaGraph>,
    device: Arc<Device>,
}

// SAFETY: the graph's driver handles may be used from any thread as long as calls on them are
// serialised, which the mutex does.
unsafe impl Send for StreamGraph {}
// SAFETY: as above.
unsafe impl Sync for StreamGraph {}

impl Graph for StreamGraph {
    fn replay(&self) -> Result<()> {
        self.device.bind()?;
        self.graph.lock().launch().map_err(drv)
    }
}

pub(super) fn capture(b: &CudaBackend, record: &mut dyn FnMut() -> Result<()>) -> Result<Box<dyn Graph>> {
    // Work queued before the capture is not part of it; let it finish first.
    b.dev.synchronize()?;
    let stream = b.dev.stream();
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(drv)?;
    let recorded = record();
    let ended = stream.end_capture(CUgraphInstantiate_flags(0));
    recorded.map_err(|e| Error::Device(format!("while capturing a graph: {e}")))?;
    let graph = ended.map_err(drv)?.ok_or_else(|| Error::Device("the graph capture recorded nothing".into()))?;
    graph.upload().map_err(drv)?;
    Ok(Box::new(StreamGraph { graph: Mutex::new(graph), device: Arc::clone(&b.dev) }))
}
