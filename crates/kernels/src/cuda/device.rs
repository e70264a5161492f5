//! One CUDA device: its context, the single compute stream, and device memory.
//!
//! Memory comes from the driver's stream-ordered allocator (`cuMemAllocAsync` /
//! `cuMemFreeAsync`) on the compute stream, with the pool's release threshold at its maximum,
//! so freed blocks stay cached in the pool and later allocations of any size reuse them
//! without a device synchronisation. Because every kernel, copy, allocation and free is
//! issued on that one stream, a buffer freed by the host while kernels that read it are
//! still queued is only reused by work queued after them: stream order is the only
//! synchronisation memory needs. When an allocation fails, the pool's cached blocks are
//! returned to the driver (after a synchronisation) and the allocation is tried once more.
//!
//! While a graph is recorded, the recording thread's allocations come from the graph arena
//! instead ([`super::arena`]), so the recorded step holds no allocation or free nodes.
//!
//! Small copies between host and device (a step's inputs, its sampled tokens) go through
//! pinned host memory ([`Staging`]): from pageable memory the driver stages each copy
//! itself, synchronously, on the host's time (measured: 3 to 6 µs less host time per
//! batch-1 decode step, `bench/results/gpu-pinned-staging-2026-12-01`). The copies live in
//! [`transfer`]; the staging state stays here, beside the teardown that frees it.
//!
//! A second stream, the side stream, runs work whose inputs are already made beside the
//! compute stream's later work, forked off before it and joined before its results are read
//! ([`Device::fork`], [`Device::join`]): a LoRA shrink beside the base product it will be
//! added to. Memory it writes is freed only after the compute stream has waited for it
//! ([`Device::alloc_side`]).
//!
//! Every entry point binds the context to the calling thread first, so the backend can be
//! used from any thread (loading on one, the engine on another).

mod transfer;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::{self, ThreadId};
use std::time::Instant;

use parking_lot::Mutex;

use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DriverError, result};

use super::arena::Offsets;
use super::drv;
use crate::backend::MemoryInfo;
use crate::error::{Error, Result};

/// The context, the compute stream and the facts about the device.
pub(crate) struct Device {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Work issued between a [`Self::fork`] and the [`Self::join`] after it runs here,
    /// beside the compute stream's.
    side: Arc<CudaStream>,
    /// The compute stream's point the side stream waits for, and the side stream's point the
    /// compute stream waits for (recorded anew at each fork and join).
    forked: CudaEvent,
    joined: CudaEvent,
    /// Whether the side stream holds work the compute stream has not waited for.
    side_pending: AtomicBool,
    pool: sys::CUmemoryPool,
    /// `cudaGetDeviceProperties().name`.
    pub(crate) name: String,
    /// Compute capability (major, minor).
    pub(crate) capability: (i32, i32),
    /// Streaming multiprocessors.
    pub(crate) multiprocessors: i32,
    /// The CUDA device ordinal.
    pub(crate) ordinal: usize,
    /// Nanoseconds the host has spent waiting for the device: in [`Self::synchronize`] and
    /// in downloads.
    waited_ns: AtomicU64,
    graph_memory: Mutex<GraphMemory>,
    staging: Mutex<Staging>,
    /// Landing buffers of [`transfer::LaterCopy`]s that are not in use.
    landings: Mutex<Vec<Landing>>,
}

/// Pinned host memory for small copies. `up` is a ring: an upload is copied into it at
/// `head` and queued from there, so the host returns at once. Its bytes must stay until the
/// copy has run: they are reused only once `tail` has passed them, which a synchronisation
/// of the stream does (every plain download synchronises it) and so does the wait for a
/// [`transfer::LaterCopy`], for the bytes staged before it was queued. A plain download
/// lands in `down`, is waited for, then copied out. Both are allocated on first use; copies
/// that do not fit take the pageable path.
struct Staging {
    up: *mut u8,
    /// Bytes staged since the buffer was made, gaps at the end of a lap included: the next
    /// upload goes at `head % STAGING_BYTES`, or at the next lap's start when it would not
    /// fit before the end.
    head: u64,
    /// Staged bytes before this count have been copied to the device.
    tail: u64,
    down: *mut u8,
}

impl Staging {
    /// Every staged byte has been copied: the stream was synchronised.
    fn drained(&mut self) {
        self.tail = self.head;
    }
}

/// A pinned landing buffer of [`STAGED_MAX`] bytes for a [`transfer::LaterCopy`], with the
/// event that marks the copy's end; kept for the next copy once waited for.
struct Landing {
    host: *mut u8,
    event: sys::CUevent,
}

/// Bytes of each staging buffer, and the largest copy staged.
const STAGING_BYTES: usize = 1 << 20;
const STAGED_MAX: usize = 64 << 10;

/// The graph arena: one plain allocation shared by every graph's recorded ops.
#[derive(Default)]
struct GraphMemory {
    offsets: Offsets,
    /// The arena (0 before the first recording sized it) and its bytes.
    base: CUdeviceptr,
    bytes: usize,
    /// Whether a graph holds addresses inside the current arena.
    used: bool,
    /// Earlier, smaller arenas that graphs still point into; freed with the device.
    retired: Vec<CUdeviceptr>,
    /// The thread recording a graph, whose allocations come from here.
    recording: Option<ThreadId>,
}

/// How a recording's memory fitted the arena.
pub(crate) enum ArenaFit {
    /// Every allocation came from the arena.
    Fits,
    /// Some came from the pool; an arena of this many bytes would have held them all.
    Needs(usize),
}

// SAFETY: the pool handle is a driver object usable from any thread; the other fields are
// `Send + Sync` cudarc handles and plain data.
unsafe impl Send for Device {}
// SAFETY: as above; the driver synchronises concurrent calls on one pool.
unsafe impl Sync for Device {}

impl Device {
    /// Opens device `ordinal`: its primary context, a new non-blocking stream, and the
    /// device's memory pool set to keep freed memory cached.
    pub(crate) fn open(ordinal: usize) -> Result<Arc<Self>> {
        let ctx = CudaContext::new(ordinal).map_err(drv)?;
        // SAFETY: met tracks no cudarc `CudaSlice`s: all memory is raw pointers ordered by
        // the one stream, so cudarc's per-slice events are never needed.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(drv)?;
        let side = ctx.new_stream().map_err(drv)?;
        let (forked, joined) = (ctx.new_event(None).map_err(drv)?, ctx.new_event(None).map_err(drv)?);
        let attr = |a| ctx.attribute(a).map_err(drv);
        let capability = (
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let multiprocessors = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        if attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)? == 0 {
            return Err(Error::Device(format!("CUDA device {ordinal} does not support stream-ordered memory pools")));
        }
        // SAFETY: `cu_device` comes from the context just created; the attribute takes a u64.
        let pool = unsafe {
            let pool = result::device::get_mem_pool(ctx.cu_device()).map_err(drv)?;
            let mut threshold = u64::MAX;
            result::mem_pool::set_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&raw mut threshold).cast(),
            )
            .map_err(drv)?;
            pool
        };
        let name = ctx.name().map_err(drv)?;
        Ok(Arc::new(Self {
            ctx,
            stream,
            side,
            forked,
            joined,
            side_pending: AtomicBool::new(false),
            pool,
            name,
            capability,
            multiprocessors,
            ordinal,
            waited_ns: AtomicU64::new(0),
            graph_memory: Mutex::new(GraphMemory::default()),
            staging: Mutex::new(Staging { up: std::ptr::null_mut(), head: 0, tail: 0, down: std::ptr::null_mut() }),
            landings: Mutex::new(Vec::new()),
        }))
    }

    /// Makes the context current on this thread.
    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(drv)
    }

    /// The compute stream.
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The side stream ([`Self::fork`]).
    pub(crate) fn side_stream(&self) -> &Arc<CudaStream> {
        &self.side
    }

    /// Makes the side stream start after everything issued on the compute stream so far:
    /// what is issued on it next runs beside the compute stream's later work, until
    /// [`Self::join`]. Recorded into a graph, this forks the graph's branch.
    pub(crate) fn fork(&self) -> Result<()> {
        self.bind()?;
        self.forked.record(&self.stream).map_err(drv)?;
        self.side.wait(&self.forked).map_err(drv)?;
        self.side_pending.store(true, Ordering::Release);
        Ok(())
    }

    /// Makes the compute stream's later work wait for everything issued on the side
    /// stream (nothing when nothing is pending there).
    pub(crate) fn join(&self) -> Result<()> {
        self.join_driver().map_err(drv)
    }

    fn join_driver(&self) -> std::result::Result<(), DriverError> {
        if !self.side_pending.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        self.ctx.bind_to_thread()?;
        self.joined.record(&self.side)?;
        self.stream.wait(&self.joined)
    }

    /// As [`Self::alloc`], for memory the side stream writes: before the buffer is freed,
    /// the compute stream waits for the side stream, so no later work reuses the memory
    /// while a side kernel may still write it (a step that fails between the fork and the
    /// join drops its buffers unjoined).
    pub(crate) fn alloc_side(self: &Arc<Self>, bytes: usize) -> Result<DeviceBuffer> {
        let mut buffer = self.alloc(bytes)?;
        buffer.side = true;
        Ok(buffer)
    }

    /// The context.
    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    fn cu_stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    /// `bytes` of uninitialised device memory, ordered on the stream (from the graph arena
    /// while this thread records a graph).
    pub(crate) fn alloc(self: &Arc<Self>, bytes: usize) -> Result<DeviceBuffer> {
        if bytes == 0 {
            return Ok(DeviceBuffer {
                ptr: 0,
                bytes,
                device: Arc::clone(self),
                range: None,
                pooled: false,
                side: false,
                _parent: None,
            });
        }
        self.bind()?;
        let mut range = None;
        {
            let mut g = self.graph_memory.lock();
            if g.recording == Some(thread::current().id()) {
                let (start, len) = g.offsets.take(bytes);
                if start + len <= g.bytes {
                    let ptr = g.base + start as u64;
                    return Ok(DeviceBuffer {
                        ptr,
                        bytes,
                        device: Arc::clone(self),
                        range: Some((start, len)),
                        pooled: false,
                        side: false,
                        _parent: None,
                    });
                }
                // Past the arena: pool memory (an allocation node of the graph), while the
                // range still counts towards the size the arena should have.
                range = Some((start, len));
            }
        }
        let buffer = self.alloc_pooled(bytes);
        if buffer.is_err()
            && let Some((start, len)) = range
        {
            self.graph_memory.lock().offsets.give(start, len);
        }
        buffer.map(|mut b| {
            b.range = range;
            b
        })
    }

    fn alloc_pooled(self: &Arc<Self>, bytes: usize) -> Result<DeviceBuffer> {
        // SAFETY: the stream is live; the memory is only used through the returned buffer.
        let first = unsafe { result::malloc_async(self.cu_stream(), bytes) };
        let ptr = match first {
            Ok(ptr) => ptr,
            Err(DriverError(sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY)) => {
                // Give the cached blocks back to the driver and try once more. The wait and
                // the pool's regrowth after it cost a step dearly: a step that needs more
                // memory than the KV budget left free says so.
                tracing::warn!(
                    bytes,
                    "device memory full: the step waits for the device and the memory pool gives its cached blocks back"
                );
                self.synchronize()?;
                // SAFETY: the pool belongs to this device; trimming frees only unused blocks.
                unsafe { result::mem_pool::trim_to(self.pool, 0) }.map_err(drv)?;
                // SAFETY: as above.
                unsafe { result::malloc_async(self.cu_stream(), bytes) }
                    .map_err(|e| Error::Device(format!("out of device memory allocating {bytes} bytes ({e})")))?
            }
            Err(e) => return Err(drv(e)),
        };
        Ok(DeviceBuffer { ptr, bytes, device: Arc::clone(self), range: None, pooled: true, side: false, _parent: None })
    }

    /// Starts taking this thread's allocations from the graph arena, for a recording.
    pub(crate) fn begin_graph_memory(&self) -> Result<()> {
        let mut g = self.graph_memory.lock();
        if g.recording.is_some() || g.offsets.live() != 0 {
            return Err(Error::Device("a graph recording began while another one's memory was in use".into()));
        }
        g.offsets.reset_peak();
        g.recording = Some(thread::current().id());
        Ok(())
    }

    /// Ends the recording's arena use. Fails if one of its allocations is still alive:
    /// graphs share the arena, so a tensor made during a recording must not outlive it.
    pub(crate) fn end_graph_memory(&self) -> Result<ArenaFit> {
        let mut g = self.graph_memory.lock();
        g.recording = None;
        if g.offsets.live() != 0 {
            return Err(Error::Device(format!(
                "{} tensors made while recording a graph outlived the recording",
                g.offsets.live()
            )));
        }
        if g.offsets.peak() <= g.bytes {
            g.used = true;
            Ok(ArenaFit::Fits)
        } else {
            Ok(ArenaFit::Needs(g.offsets.peak()))
        }
    }

    /// Replaces the arena by one of `bytes` (outside any recording). The old one is freed
    /// unless a graph points into it.
    pub(crate) fn grow_graph_memory(&self, bytes: usize) -> Result<()> {
        self.bind()?;
        self.synchronize()?;
        // SAFETY: a plain allocation, owned by the arena until the device is dropped.
        let base = unsafe { result::malloc_sync(bytes) }
            .map_err(|e| Error::Device(format!("out of device memory for {bytes} bytes of graph memory ({e})")))?;
        let mut g = self.graph_memory.lock();
        let old = std::mem::replace(&mut g.base, base);
        if old != 0 {
            if g.used {
                g.retired.push(old);
            } else {
                // SAFETY: no graph and no live buffer points into it (none is live outside a
                // recording), and the device is idle.
                unsafe { result::free_sync(old) }.map_err(drv)?;
            }
        }
        g.bytes = bytes;
        g.used = false;
        Ok(())
    }

    /// Whether this thread is recording a graph (whose copies may not come from host memory
    /// that changes later).
    pub(crate) fn recording_here(&self) -> bool {
        self.graph_memory.lock().recording == Some(thread::current().id())
    }
    /// Sets the first `bytes` bytes of `dst` to zero.
    pub(crate) fn zero(&self, dst: &DeviceBuffer, bytes: usize) -> Result<()> {
        assert!(bytes <= dst.bytes, "zeroing {bytes} bytes of a buffer of {}", dst.bytes);
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `dst` is a live allocation of at least `bytes`.
        unsafe { result::memset_d8_async(dst.ptr, 0, bytes, self.cu_stream()) }.map_err(drv)
    }

    /// Copies `bytes` from `src` to `dst` on the device.
    pub(crate) fn copy(&self, src: &DeviceBuffer, dst: &DeviceBuffer, bytes: usize) -> Result<()> {
        assert!(bytes <= src.bytes && bytes <= dst.bytes, "device copy of {bytes} bytes out of bounds");
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both are live allocations of at least `bytes`.
        unsafe { result::memcpy_dtod_async(dst.ptr, src.ptr, bytes, self.cu_stream()) }.map_err(drv)
    }

    /// Copies `bytes` bytes from device address `src` to `dst`, or zeroes them without a
    /// source: one driver call, for a graph being recorded.
    ///
    /// # Safety
    /// Both ranges lie inside live allocations of this device and do not overlap.
    pub(crate) unsafe fn copy_or_zero_raw(&self, src: Option<u64>, dst: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        match src {
            // SAFETY: the caller's contract: both ranges are live and disjoint.
            Some(src) => unsafe { result::memcpy_dtod_async(dst, src, bytes, self.cu_stream()) },
            // SAFETY: the caller's contract: the range is live.
            None => unsafe { result::memset_d8_async(dst, 0, bytes, self.cu_stream()) },
        }
        .map_err(drv)
    }

    /// Waits for everything issued on the stream (and on the side stream before it).
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.join()?;
        self.bind()?;
        let start = Instant::now();
        let mut s = self.staging.lock();
        let done = self.stream.synchronize().map_err(drv);
        if done.is_ok() {
            s.drained();
        }
        self.waited_ns.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        done
    }

    /// Total time the host has waited for the device.
    pub(crate) fn waited(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.waited_ns.load(Ordering::Relaxed))
    }

    /// Free and total device memory. Memory cached by the pool counts as in use: it is
    /// held for this process's next allocations.
    pub(crate) fn memory_info(&self) -> Result<MemoryInfo> {
        self.bind()?;
        let (free, total) = self.ctx.mem_get_info().map_err(drv)?;
        Ok(MemoryInfo { free, total })
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.ctx.record_err(self.ctx.bind_to_thread());
        let s = self.staging.get_mut();
        let landings = std::mem::take(self.landings.get_mut());
        for host in [s.up, s.down].into_iter().chain(landings.iter().map(|l| l.host)).filter(|p| !p.is_null()) {
            // SAFETY: allocated by `malloc_host` and freed once, after every copy (the
            // stream is idle once every buffer and graph is gone).
            self.ctx.record_err(unsafe { result::free_host(host.cast()) });
        }
        for l in &landings {
            // SAFETY: created by `event::create`, destroyed once; no copy waits for it.
            self.ctx.record_err(unsafe { result::event::destroy(l.event) });
        }
        let g = self.graph_memory.get_mut();
        for ptr in g.retired.drain(..).chain((g.base != 0).then_some(g.base)) {
            // SAFETY: arena allocations are freed only here, once every buffer (each holds
            // the device) and graph is gone.
            self.ctx.record_err(unsafe { result::free_sync(ptr) });
        }
    }
}

/// A device allocation, returned to the pool (stream-ordered) or the graph arena when
/// dropped.
pub(crate) struct DeviceBuffer {
    ptr: CUdeviceptr,
    bytes: usize,
    device: Arc<Device>,
    /// The graph arena range it holds, if it was made during a recording.
    range: Option<(usize, usize)>,
    /// Whether it is pool memory, to free.
    pooled: bool,
    /// Whether the side stream may write it ([`Device::alloc_side`]).
    side: bool,
    /// For a view into another tensor's memory ([`Self::view`]): that memory, held until
    /// the view is dropped.
    _parent: Option<Arc<crate::Storage>>,
}

impl DeviceBuffer {
    /// The device address (0 for an empty buffer).
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }

    /// `bytes` at `offset` of `parent`'s memory (`buf`), as a buffer that frees nothing and
    /// keeps `parent` alive.
    pub(crate) fn view(buf: &Self, parent: Arc<crate::Storage>, offset: usize, bytes: usize) -> Self {
        debug_assert!(offset + bytes <= buf.bytes);
        Self {
            ptr: buf.ptr + offset as u64,
            bytes,
            device: Arc::clone(&buf.device),
            range: None,
            pooled: false,
            side: false,
            _parent: Some(parent),
        }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.side {
            // A failure is recorded by the context and reported as the free's below.
            self.device.ctx.record_err(self.device.join_driver());
        }
        if let Some((start, len)) = self.range {
            self.device.graph_memory.lock().offsets.give(start, len);
        }
        if !self.pooled {
            return;
        }
        // A failure here leaves the memory to the context's teardown; it is recorded by
        // the context and reported by the next call that checks it.
        let ctx = &self.device.ctx;
        ctx.record_err(ctx.bind_to_thread());
        // SAFETY: the pointer came from `cuMemAllocAsync` and is freed once; work queued
        // earlier on the stream that reads it finishes before the free takes effect.
        ctx.record_err(unsafe { result::free_async(self.ptr, self.device.cu_stream()) });
    }
}
