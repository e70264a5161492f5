//! Copies between the host and a [`Device`]: uploads (whole or into the first columns of
//! wider rows), downloads that wait, and downloads queued to land later
//! ([`LaterCopy`]).
//!
//! Small copies go through the device's pinned staging buffers (`Staging`, whose rules the
//! parent module states): the bytes of an upload are copied into the ring and queued from
//! there, so the host returns at once, and stay untouched until a synchronisation or a
//! later copy's wait shows them copied. Larger copies, and every copy of a thread recording
//! a graph, take the pageable path, which the driver stages itself.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use cudarc::driver::{result, sys};

use super::{Device, DeviceBuffer, Landing, STAGED_MAX, STAGING_BYTES};
use crate::cuda::drv;
use crate::error::Result;

impl Device {
    /// Copies host data into `dst` (which holds at least its bytes), ordered on the stream.
    pub(crate) fn upload<T: Copy>(&self, dst: &DeviceBuffer, src: &[T]) -> Result<()> {
        let bytes = size_of_val(src);
        assert!(bytes <= dst.bytes, "upload of {bytes} bytes into a buffer of {}", dst.bytes);
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        let staged = self.staged(src, |staged| {
            // SAFETY: `dst` is a live allocation of at least `bytes`; the `bytes` staged bytes
            // stay untouched until the stream is synchronised (see `Staging`).
            unsafe { result::memcpy_htod_async(dst.ptr, std::slice::from_raw_parts(staged, bytes), self.cu_stream()) }
                .map_err(drv)
        })?;
        if staged {
            return Ok(());
        }
        // SAFETY: `dst` is a live allocation of at least `bytes`; from pageable memory the
        // call returns once `src` has been staged, so `src` may be freed afterwards.
        unsafe { result::memcpy_htod_async(dst.ptr, src, self.cu_stream()) }.map_err(drv)
    }

    /// Copies `src`, rows of `width` elements, into the first `width` columns of the rows of
    /// `dst`, `pitch` elements apart, ordered on the stream; the other columns keep their
    /// values. One 2-D copy: a CUDA graph's block tables are as wide as its longest
    /// context, while a step's sequences fill only their first columns.
    pub(crate) fn upload_columns<T: Copy>(
        &self,
        dst: &DeviceBuffer,
        pitch: usize,
        src: &[T],
        width: usize,
    ) -> Result<()> {
        let rows = src.len().checked_div(width).unwrap_or(0);
        let elem = size_of::<T>();
        assert!(
            rows * width == src.len() && width <= pitch && rows * pitch * elem <= dst.bytes,
            "{} elements in rows of {width} into a buffer of {} bytes at a pitch of {pitch}",
            src.len(),
            dst.bytes
        );
        if rows == 0 {
            return Ok(());
        }
        self.bind()?;
        let copy = |host: *const u8| {
            let copy = sys::CUDA_MEMCPY2D {
                srcXInBytes: 0,
                srcY: 0,
                srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_HOST,
                srcHost: host.cast(),
                srcDevice: 0,
                srcArray: std::ptr::null_mut(),
                srcPitch: width * elem,
                dstXInBytes: 0,
                dstY: 0,
                dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                dstHost: std::ptr::null_mut(),
                dstDevice: dst.ptr,
                dstArray: std::ptr::null_mut(),
                dstPitch: pitch * elem,
                WidthInBytes: width * elem,
                Height: rows,
            };
            // SAFETY: the source holds `rows` rows of `width * elem` bytes (pinned staging, kept
            // until the stream is synchronised, or `src`, which the call stages before it
            // returns); the destination rows lie inside `dst` (checked above).
            unsafe { sys::cuMemcpy2DAsync_v2(&copy, self.cu_stream()) }.result().map_err(drv)
        };
        if self.staged(src, copy)? {
            return Ok(());
        }
        copy(src.as_ptr().cast())
    }

    /// Copies `src` into pinned staging memory and calls `enqueue` with its address there,
    /// under the staging lock, so no synchronisation can release the staged bytes before
    /// the copy that reads them is queued; false (and nothing done) when `src` must take
    /// the pageable path instead (too large, the buffer full, or a graph recording).
    fn staged<T: Copy>(&self, src: &[T], enqueue: impl FnOnce(*const u8) -> Result<()>) -> Result<bool> {
        let bytes = size_of_val(src);
        if bytes > STAGED_MAX || self.recording_here() {
            return Ok(false);
        }
        let mut s = self.staging.lock();
        let lap = STAGING_BYTES as u64;
        let mut at = s.head.next_multiple_of(64);
        if (at % lap) as usize + bytes > STAGING_BYTES {
            at = at.next_multiple_of(lap);
        }
        if at + bytes as u64 - s.tail > lap {
            return Ok(false);
        }
        if s.up.is_null() {
            // SAFETY: a plain pinned allocation, freed with the device.
            s.up = unsafe { result::malloc_host(STAGING_BYTES, 0) }.map_err(drv)?.cast();
        }
        let offset = (at % lap) as usize;
        // SAFETY: `offset + bytes` is inside the buffer, and no queued copy reads those bytes
        // (they lie within one lap past `tail`); `src` is `bytes` long and does not overlap.
        let staged = unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr().cast::<u8>(), s.up.add(offset), bytes);
            s.up.add(offset).cast_const()
        };
        enqueue(staged)?;
        s.head = at + bytes as u64;
        Ok(true)
    }

    /// Copies the first `dst.len()` elements of `src` to the host, waiting for them.
    pub(crate) fn download<T: Copy>(&self, src: &DeviceBuffer, dst: &mut [T]) -> Result<()> {
        let bytes = size_of_val(dst);
        assert!(bytes <= src.bytes, "download of {bytes} bytes from a buffer of {}", src.bytes);
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // Staged or not, the wait for the device happens inside: the whole download counts
        // as waiting. The staging lock is held across it, so no upload queues bytes that the
        // synchronisation below would wrongly count as copied.
        let start = Instant::now();
        let mut s = self.staging.lock();
        if bytes <= STAGED_MAX && !self.recording_here() {
            if s.down.is_null() {
                // SAFETY: a plain pinned allocation, freed with the device.
                s.down = unsafe { result::malloc_host(STAGING_BYTES, 0) }.map_err(drv)?.cast();
            }
            // SAFETY: `src` is a live allocation of at least `bytes`, and `down` holds them;
            // nothing else writes `down` while the lock is held.
            let done = unsafe {
                let staged = std::slice::from_raw_parts_mut(s.down, bytes);
                result::memcpy_dtoh_async(staged, src.ptr, self.cu_stream()).map_err(drv)
            }
            .and_then(|()| self.stream.synchronize().map_err(drv));
            if done.is_ok() {
                s.drained();
                // SAFETY: the copy has finished; `dst` is `bytes` long and does not overlap.
                unsafe { std::ptr::copy_nonoverlapping(s.down, dst.as_mut_ptr().cast::<u8>(), bytes) };
            }
            self.waited_ns.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
            return done;
        }
        // SAFETY: `src` is a live allocation of at least `bytes`; `dst` is exclusively
        // borrowed until the stream is synchronised below.
        let copied = unsafe { result::memcpy_dtoh_async(dst, src.ptr, self.cu_stream()) }.map_err(drv);
        let done = copied.and_then(|()| self.stream.synchronize().map_err(drv));
        if done.is_ok() {
            s.drained();
        }
        self.waited_ns.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        done
    }

    /// Queues a copy of the first `bytes` bytes of `src` to pinned host memory and returns
    /// at once, without waiting for the device; [`LaterCopy::wait_u32`] waits for the copy (and
    /// so for everything queued before it). `None` for more than [`STAGED_MAX`] bytes or
    /// inside a recording.
    pub(crate) fn download_later(self: &Arc<Self>, src: &DeviceBuffer, bytes: usize) -> Result<Option<LaterCopy>> {
        assert!(bytes <= src.bytes, "download of {bytes} bytes from a buffer of {}", src.bytes);
        if bytes > STAGED_MAX || self.recording_here() {
            return Ok(None);
        }
        self.bind()?;
        let landing = match self.landings.lock().pop() {
            Some(l) => l,
            None => {
                // SAFETY: a plain pinned allocation and a plain event, both freed with the device.
                let host = unsafe { result::malloc_host(STAGED_MAX, 0) }.map_err(drv)?.cast();
                let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
                match event {
                    Ok(event) => Landing { host, event },
                    Err(e) => {
                        // SAFETY: just allocated above and not used.
                        self.ctx.record_err(unsafe { result::free_host(host.cast()) });
                        return Err(drv(e));
                    }
                }
            }
        };
        let mut copy = LaterCopy { device: Arc::clone(self), landing: Some(landing), bytes, mark: 0 };
        let l = copy.landing.as_ref().expect("set above");
        // The staging lock orders the mark with every staged upload: those staged before it
        // are queued before the event.
        let s = self.staging.lock();
        // SAFETY: `src` holds `bytes`, and the landing buffer `STAGED_MAX >= bytes`; nothing
        // else touches the buffer until the copy is waited for or dropped.
        unsafe {
            let host = std::slice::from_raw_parts_mut(l.host, bytes);
            result::memcpy_dtoh_async(host, src.ptr, self.cu_stream()).map_err(drv)?;
            result::event::record(l.event, self.cu_stream()).map_err(drv)?;
        }
        copy.mark = s.head;
        Ok(Some(copy))
    }
}

/// A copy to the host queued by [`Device::download_later`].
pub(crate) struct LaterCopy {
    device: Arc<Device>,
    /// `None` once handed back.
    landing: Option<Landing>,
    bytes: usize,
    /// The staging head when the copy was queued: staged bytes before it are copied once
    /// this copy is.
    mark: u64,
}

// SAFETY: the landing buffer and event belong to this copy alone until it is handed back;
// the driver calls on them work from any thread once the context is bound.
unsafe impl Send for LaterCopy {}

impl LaterCopy {
    /// Waits for the copy and returns its bytes as `u32`s (the host waits counted as the
    /// device's, as a download's).
    pub(crate) fn wait_u32(self) -> Result<Vec<u32>> {
        let d = &self.device;
        d.bind()?;
        let start = Instant::now();
        let l = self.landing.as_ref().expect("a copy is waited for once");
        // SAFETY: the event was recorded after the copy on the device's stream.
        let done = unsafe { result::event::synchronize(l.event) }.map_err(drv);
        d.waited_ns.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        done?;
        {
            let mut s = d.staging.lock();
            s.tail = s.tail.max(self.mark);
        }
        let mut out = vec![0u32; self.bytes / 4];
        // SAFETY: the copy has finished; the landing buffer holds `bytes` bytes.
        unsafe { std::ptr::copy_nonoverlapping(l.host, out.as_mut_ptr().cast::<u8>(), out.len() * 4) };
        Ok(out)
    }
}

impl Drop for LaterCopy {
    fn drop(&mut self) {
        let Some(landing) = self.landing.take() else { return };
        let d = &self.device;
        // The buffer is reused only once the copy into it is over.
        let over = d.bind().and_then(|()| {
            // SAFETY: the event was recorded after the copy on the device's stream.
            unsafe { result::event::synchronize(landing.event) }.map_err(drv)
        });
        if over.is_ok() {
            d.landings.lock().push(landing);
        }
    }
}
