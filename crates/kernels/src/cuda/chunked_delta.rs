//! The chunked (WY) form of the gated delta rule on the GPU, for steps with a long
//! sequence: the host half of `recurrent.cu`'s `gated_delta_chunk_*` kernels.
//!
//! The fused recurrent kernel walks a sequence one row at a time, so a 16k-token prompt is
//! 16k dependent steps per head. The chunked form does what depends on one chunk alone for
//! every chunk at once (`prep`), and leaves only one step per chunk of [`GDR_CHUNK`] rows
//! to walk in order (`scan`). The host cuts each sequence into chunks (after every snapshot
//! row too, so a snapshot is a chunk's end state), and runs them in waves of at most
//! [`WAVE_CHUNKS`] chunks, which bounds the scratch the prep leaves for the scan: a
//! sequence cut by a wave carries its state to the next wave in its slot. The plan is a
//! host table uploaded per call, so a graph being recorded takes the fused form instead.

use cudarc::driver::LaunchConfig;

use super::recurrent::DeltaDims;
use super::{CudaBackend, launch, ptr};
use crate::DType;
use crate::Tensor;
use crate::backend::NO_STATE_SLOT;
use crate::check::SeqRun;
use crate::error::{Error, Result};

/// The kernels of the chunked form, looked up at startup: the prep, the scan, and the scan
/// built for 128 by 128 heads (Qwen3.5/3.6, Qwen3-Next).
pub(super) const KERNELS: [&str; 3] =
    ["gated_delta_chunk_prep_bf16", "gated_delta_chunk_scan_bf16", "gated_delta_chunk_scan_bf16_k128_v128"];

/// A sequence takes the chunked form from this many rows; shorter ones in the same step
/// take the fused kernel. A sequence's own rows decide, never its neighbours', so its bits
/// do not depend on what shares its step. Measured on the H200 at Qwen3.6's heads, one
/// layer (`bench/results/device-2026-12-05d/`), fused against chunked: a lone sequence of
/// 32 rows 0.056 ms against 0.086, of 64 rows 0.110 against 0.098, of 128 rows 0.215
/// against 0.117; 64 sequences of 32 rows 0.48 against 1.75, of 64 rows 0.94 against 1.99.
/// So a lone prompt crosses over near 60 rows, and a burst of prefix-hit tails of fewer
/// than 64 rows runs fused, several times faster than chunked.
pub(super) const CHUNKED_FROM: usize = 64;

/// [`CHUNKED_FROM`], or `MET_CHUNKED_FROM=N` (rows, at least 1), for measuring a burst of
/// prefix-hit tails and lone prompts under another crossover (the scratch is held from the
/// first step either way: [`hold_full_wave`]).
pub(super) fn chunked_from_env() -> Result<usize> {
    const VAR: &str = "MET_CHUNKED_FROM";
    match std::env::var(VAR).as_deref() {
        Err(_) | Ok("") => Ok(CHUNKED_FROM),
        Ok(v) => match v.parse::<usize>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(Error::InvalidArgument(format!("{VAR}={v}: expected a count of rows, at least 1"))),
        },
    }
}

/// `GDR_CHUNK`, `GDR_THREADS`, `GDR_COLS`, `GDR_SCAN_WARPS`, `GDR_S_LD` and `GDR_QK_LD` of
/// `recurrent.cu`.
const GDR_CHUNK: usize = 64;
const GDR_THREADS: usize = 256;
const GDR_COLS: usize = 32;
const GDR_SCAN_WARPS: usize = 4;
const GDR_S_LD: usize = GDR_COLS + 8;
const GDR_QK_LD: usize = GDR_CHUNK + 4;

/// Chunks of one wave. The scratch of a wave is `WAVE_CHUNKS · h_v ·` [`scratch_floats`]
/// f32s: 340 MB for Qwen3.6's 32 value heads of 128, the size a default warm-up step of
/// 8,192 tokens allocates, so the KV budget sees it.
const WAVE_CHUNKS: usize = 128;

/// Floats of one (chunk, head) scratch (`gdr_scratch_floats`).
fn scratch_floats(dk: usize, dv: usize) -> usize {
    GDR_CHUNK * (dv + dk) + GDR_CHUNK * GDR_CHUNK + 4 * GDR_CHUNK
}

/// Dynamic shared memory of the prep kernel: gamma (f64) and beta, the keys and the
/// queries at a stride of `dk + 4`, and KK.
fn prep_shared(dk: usize) -> usize {
    8 * GDR_CHUNK + 4 * GDR_CHUNK + 2 * 4 * GDR_CHUNK * (dk + 4) + 4 * GDR_CHUNK * GDR_CHUNK
}

/// Dynamic shared memory of the scan kernel: the state tile, a chunk's rows (at their
/// widest stride, `dk + 8`), QK and delta, with the strides that keep fragments off bank
/// conflicts.
fn scan_shared(dk: usize) -> usize {
    4 * (dk * GDR_S_LD + GDR_CHUNK * (dk + 8) + GDR_CHUNK * GDR_QK_LD + GDR_CHUNK * GDR_S_LD)
}

/// The widest key heads the chunked kernels take on a device of compute capability `cc`:
/// 256 needs Hopper's 227 KiB of shared memory a block (147 KiB for the prep), 128 fits
/// every device from Ampere on (83 KiB).
fn widest_keys(cc: (i32, i32)) -> usize {
    if cc.0 >= 9 { 256 } else { 128 }
}

/// Lets the chunked kernels use the shared memory their widest key heads need.
pub(super) fn raise_shared_memory(
    kernels: &std::collections::HashMap<&'static str, cudarc::driver::CudaFunction>,
    cc: (i32, i32),
) -> Result<()> {
    use cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
    let dk = widest_keys(cc);
    let sizes = [prep_shared(dk), scan_shared(dk), scan_shared(128)];
    for (name, bytes) in KERNELS.iter().zip(sizes) {
        let func = kernels.get(name).ok_or_else(|| Error::Device(format!("kernel `{name}` was not loaded")))?;
        func.set_attribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes as i32)
            .map_err(|e| Error::Device(format!("{name}: shared memory: {e:?}")))?;
    }
    Ok(())
}

/// A step's chunks (`GdrChunk`: first flat row, rows, snapshot slot) and its sequences as
/// (first chunk, end chunk, state slot).
#[derive(Debug, Default, PartialEq, Eq)]
struct Plan {
    chunks: Vec<[u32; 3]>,
    groups: Vec<(usize, usize, u32)>,
}

impl Plan {
    /// Cuts every run into chunks of at most [`GDR_CHUNK`] rows that end at each of its
    /// snapshots; a second snapshot of the same row is a chunk of no rows.
    fn new(runs: &[SeqRun]) -> Self {
        let mut plan = Self::default();
        for run in runs {
            let (first, len) = (plan.chunks.len(), run.end - run.start);
            let mut at = 0;
            for &(rows, slot) in &run.snapshots {
                plan.cut(run.start, &mut at, rows, slot as u32);
            }
            if at < len {
                plan.cut(run.start, &mut at, len, NO_STATE_SLOT);
            }
            plan.groups.push((first, plan.chunks.len(), run.slot.map_or(NO_STATE_SLOT, |s| s as u32)));
        }
        plan
    }

    /// Chunks from row `at` of a run to row `to`, the last one's state copied to `snap`.
    fn cut(&mut self, start: usize, at: &mut usize, to: usize, snap: u32) {
        if *at == to {
            self.chunks.push([(start + to) as u32, 0, snap]);
        }
        while *at < to {
            let n = GDR_CHUNK.min(to - *at);
            let last = *at + n == to;
            self.chunks.push([(start + *at) as u32, n as u32, if last { snap } else { NO_STATE_SLOT }]);
            *at += n;
        }
    }

    /// The waves: each one's chunk range and its groups' chunk ranges within the wave, with
    /// their slots. `None` when a wave would cut a sequence without a slot, whose state
    /// could not cross to the next wave.
    fn waves(&self) -> Option<Vec<(std::ops::Range<usize>, Vec<u32>)>> {
        let n = self.chunks.len();
        let mut waves = vec![];
        for w0 in (0..n).step_by(WAVE_CHUNKS) {
            let w1 = (w0 + WAVE_CHUNKS).min(n);
            let mut groups = vec![];
            for &(a, b, slot) in &self.groups {
                let (lo, hi) = (a.max(w0), b.min(w1));
                if lo >= hi {
                    continue;
                }
                if slot == NO_STATE_SLOT && (a < w0 || b > w1) {
                    return None;
                }
                groups.extend([(lo - w0) as u32, (hi - w0) as u32, slot]);
            }
            waves.push((w0..w1, groups));
        }
        Some(waves)
    }
}

/// Takes the scratch of a full wave at these heads from the device's pool once, and gives
/// it back: the pool keeps that memory, so the first step (the KV budget's warm-up, whose
/// short sequences may all take the fused form) leaves it out of the budget whatever the
/// crossover, and no later long prompt finds the memory given to the cache.
fn hold_full_wave(b: &CudaBackend, hv: usize, dk: usize, dv: usize) -> Result<()> {
    let floats = WAVE_CHUNKS * hv * scratch_floats(dk, dv);
    if b.chunked_held.fetch_max(floats, std::sync::atomic::Ordering::Relaxed) < floats {
        drop(b.alloc(&[floats], DType::F32)?);
    }
    Ok(())
}

/// The step's operands as the launches take them.
pub(super) struct Launch<'a> {
    pub(super) qkv: &'a Tensor,
    pub(super) a: &'a Tensor,
    pub(super) gb: &'a Tensor,
    pub(super) a_log: &'a Tensor,
    pub(super) dt_bias: &'a Tensor,
    pub(super) state: &'a Tensor,
    pub(super) out: &'a Tensor,
}

/// Runs the step's sequences of `from` rows or more in the chunked form if it should: key
/// heads the device's kernels take (a multiple of 16, the scan's tensor-core tiles), no graph
/// being recorded and a plan whose waves keep every state. Returns whether it ran; the
/// shorter sequences are the caller's.
pub(super) fn try_run(
    b: &CudaBackend,
    ops: &Launch<'_>,
    runs: &[SeqRun],
    dims: DeltaDims,
    from: usize,
) -> Result<bool> {
    const OP: &str = "gated_delta_rule";
    let (hv, dk, dv) = (dims.hv as usize, dims.dk as usize, dims.dv as usize);
    if dk > widest_keys(b.dev.capability) || dk % 16 != 0 || b.dev.recording_here() {
        return Ok(false);
    }
    hold_full_wave(b, hv, dk, dv)?;
    let long: Vec<SeqRun> = runs.iter().filter(|r| r.end - r.start >= from).cloned().collect();
    if long.is_empty() {
        return Ok(false);
    }
    let scan_kernel = if (dk, dv) == (128, 128) { KERNELS[2] } else { KERNELS[1] };
    let (prep_kernel, [prep_bytes, scan_bytes]) = (KERNELS[0], [prep_shared(dk), scan_shared(dk)]);
    let plan = Plan::new(&long);
    let Some(waves) = plan.waves() else { return Ok(false) };
    let per = scratch_floats(dk, dv);
    let scratch = b.alloc(&[plan.chunks.len().min(WAVE_CHUNKS) * hv * per], DType::F32)?;
    let mut at = [0u64; 8];
    for (p, t) in at.iter_mut().zip([ops.qkv, ops.a, ops.gb, ops.a_log, ops.dt_bias, ops.state, ops.out, &scratch]) {
        *p = ptr(OP, t)?;
    }
    let [q, ap, bp, alog, dtb, sp, op_, scr] = at;
    for (range, groups) in waves {
        let flat: Vec<u32> = plan.chunks[range.clone()].iter().flatten().copied().collect();
        let (chunks, table) = (b.upload_u32(&flat, &[range.len(), 3])?, b.upload_u32(&groups, &[groups.len() / 3, 3])?);
        let (ct, gt) = (ptr(OP, &chunks)?, ptr(OP, &table)?);
        let prep = LaunchConfig {
            grid_dim: (range.len() as u32, hv as u32, 1),
            block_dim: (GDR_THREADS as u32, 1, 1),
            shared_mem_bytes: prep_bytes as u32,
        };
        launch!(b, prep_kernel, prep, [q, ap, bp, alog, dtb, ct, scr, dims])?;
        let scan = LaunchConfig {
            grid_dim: (dv.div_ceil(GDR_COLS) as u32, hv as u32, (groups.len() / 3) as u32),
            block_dim: ((GDR_SCAN_WARPS * 32) as u32, 1, 1),
            shared_mem_bytes: scan_bytes as u32,
        };
        launch!(b, scan_kernel, scan, [q, scr, ct, gt, sp, op_, dims])?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(start: usize, end: usize, slot: Option<usize>, snapshots: &[(usize, usize)]) -> SeqRun {
        SeqRun { start, end, slot, snapshots: snapshots.to_vec() }
    }

    const NO: u32 = NO_STATE_SLOT;

    #[test]
    fn chunks_end_at_snapshots_and_every_64_rows() {
        let plan = Plan::new(&[run(0, 1, Some(3), &[]), run(1, 151, Some(0), &[(10, 5), (10, 6), (100, 7)])]);
        let want = vec![[0, 1, NO], [1, 10, 5], [11, 0, 6], [11, 64, NO], [75, 26, 7], [101, 50, NO]];
        assert_eq!(plan.chunks, want);
        assert_eq!(plan.groups, vec![(0, 1, 3), (1, 6, 0)]);
    }

    #[test]
    fn waves_cut_sequences_with_slots_only() {
        let long = |slot| Plan::new(&[run(0, 64 * (WAVE_CHUNKS + 1), slot, &[])]);
        let waves = long(Some(2)).waves().expect("a sequence with a slot crosses waves");
        assert_eq!(waves.len(), 2);
        assert_eq!(waves[0], (0..WAVE_CHUNKS, vec![0, WAVE_CHUNKS as u32, 2]));
        assert_eq!(waves[1], (WAVE_CHUNKS..WAVE_CHUNKS + 1, vec![0, 1, 2]));
        assert_eq!(long(None).waves(), None);
        assert!(Plan::new(&[run(0, 64 * WAVE_CHUNKS, None, &[])]).waves().is_some());
    }

    #[test]
    fn shared_memory_fits_the_devices_it_is_raised_on() {
        assert!(prep_shared(256) <= 227 * 1024 && scan_shared(256) <= 227 * 1024);
        assert!(prep_shared(128) <= 99 * 1024 && scan_shared(128) <= 99 * 1024);
    }
}
