//! KV writes and paged attention on the GPU.
//!
//! The checks are the CPU backend's (`cpu::attention::check_meta`), run on the host copies
//! of the metadata, so a bad slot, block or length is an error before any launch. Inputs —
//! the paged pools `[blocks, block_size, h_kv, d]` and the varlen metadata — are
//! FlashAttention's. Two ops share them:
//! - `paged_attention`, the reference: one scalar block per (query row, head), f32 throughout
//!   (`cuda/attention.cu`);
//! - `flash_attention`, the `flash` backend: tensor-core kernels for head dims 64 and 128,
//!   split-KV decode (`cuda/flash_decode.cu`) for decode steps and tiles for everything else
//!   (`cuda/flash_wgmma.cu` on Hopper, warpgroup MMA fed by a producer warpgroup;
//!   `cuda/flash.cu`, `mma.sync`, before it); the scalar split-KV decode kernel
//!   (`attention.cu`) for other head dims' decode steps, and the reference for the rest.
//!
//! Pools are bf16, or e4m3 on sm_90 (`--kv-cache-dtype fp8`): each element the value over
//! its layer's scale. Every kernel has an e4m3 form that widens the bytes exactly to bf16
//! and folds the scales into the score scale and the output (`AttnArgs::scale`, `v_scale`).

use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::{CudaBackend, expect_dtype, launch, ptr};
use crate::backend::{AttentionMeta, AttentionParams, KvScales, QkvPrologue};
use crate::cpu::attention::{MetaView, check_meta};
use crate::error::{Error, Result};
use crate::{DType, Tensor};

/// The fault variant whose attention reads e4m3 values under the keys' scale (`compile.rs`).
const KV_WRONG_SCALE: &str = "fp8-kv-wrong-scale";
/// Largest head dim the kernel handles (`ATTN_MAX_DIM`).
const MAX_HEAD_DIM: usize = 256;
/// Threads per block of the attention kernel (`ATTN_WARPS` warps).
const ATTN_THREADS: u32 = 128;

/// `AttnArgs` of `attention.cu`, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct AttnArgs {
    num_seqs: u32,
    max_blocks: u32,
    block_size: u32,
    h: u32,
    h_kv: u32,
    d: u32,
    window: u32,
    scale: f32,
    softcap: f32,
    split_min: u32,
    v_scale: f32,
}

// SAFETY: `AttnArgs` is `repr(C)` plain data with the field order and types of the CUDA
// struct of the same name (seven u32, two f32, a u32, an f32: no padding).
unsafe impl DeviceRepr for AttnArgs {}

pub(super) fn write_kv(
    b: &CudaBackend,
    (k, v): (&Tensor, &Tensor),
    (k_cache, v_cache): (&Tensor, &Tensor),
    slots: &Tensor,
    scales: KvScales,
) -> Result<()> {
    let crate::check::WriteKv { row, capacity } = crate::check::write_kv(k, v, k_cache, v_cache, slots)?;
    let t = slots.elem_count();
    for x in [k, v] {
        expect_dtype("write_kv", x, &[DType::BF16])?;
    }
    let pool = pool_dtype(b, "write_kv", k_cache, v_cache)?;
    crate::check::slots_in_pool(&b.host_u32("write_kv", slots)?, capacity)?;
    if t == 0 || row == 0 {
        return Ok(());
    }
    let op = "write_kv";
    let args = (ptr(op, k)?, ptr(op, v)?, ptr(op, k_cache)?, ptr(op, v_cache)?, ptr(op, slots)?);
    let cfg = LaunchConfig {
        grid_dim: (t as u32, 1, 1),
        block_dim: ((row.div_ceil(32) * 32).min(256) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let kernel = if pool == DType::F8E4M3 { "write_kv_e4m3" } else { "write_kv_bf16" };
    let scaled = (row as u32, capacity as u64, scales.k, scales.v);
    launch!(b, kernel, cfg, [args.0, args.1, args.2, args.3, args.4, scaled.0, scaled.1, scaled.2, scaled.3])
}

/// The element type of the pools `k_cache, v_cache`: both bf16, or both e4m3 on a device
/// with kernels for them.
fn pool_dtype(b: &CudaBackend, op: &'static str, k_cache: &Tensor, v_cache: &Tensor) -> Result<DType> {
    let dtype = k_cache.dtype();
    expect_dtype(op, k_cache, &[DType::BF16, DType::F8E4M3])?;
    expect_dtype(op, v_cache, &[dtype])?;
    if dtype == DType::F8E4M3 && !b.fp8_kv() {
        return Err(Error::InvalidArgument(format!("{op}: e4m3 KV pools need an sm_90 device")));
    }
    Ok(dtype)
}

/// `QkvArgs` of `attention.cu`, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct QkvArgs {
    h: u32,
    h_kv: u32,
    d: u32,
    half: u32,
    eps: f32,
    k_scale: f32,
    v_scale: f32,
    capacity: u64,
}

// SAFETY: `repr(C)` plain data laid out as the CUDA struct of the same name (four u32, three
// f32, four bytes of padding, a u64: both sides pad the same way).
unsafe impl DeviceRepr for QkvArgs {}

/// `QKV_WARPS` of `attention.cu`.
const QKV_WARPS: usize = 4;

/// The fused prologue: the same checks as the separate ops, then one kernel.
pub(super) fn qkv_rotary_write(
    b: &CudaBackend,
    qkv: &Tensor,
    p: &QkvPrologue<'_>,
    k_cache: &Tensor,
    v_cache: &Tensor,
    slots: &Tensor,
) -> Result<Tensor> {
    let op = "qkv_rotary_write";
    let (h, hkv, d) = (p.num_heads, p.num_kv_heads, p.head_dim);
    let heads = h + 2 * hkv;
    let qd = qkv.dims();
    if qd.len() != 2 || qd[1] != heads * d || h == 0 || hkv == 0 || h % hkv != 0 {
        return Err(Error::Shape { op, msg: format!("qkv {qd:?} is not [t, ({h} + 2·{hkv})·{d}]") });
    }
    if d > MAX_HEAD_DIM {
        return Err(Error::InvalidArgument(format!("{op}: head dim {d} exceeds {MAX_HEAD_DIM}")));
    }
    let t = qd[0];
    // Shapes as the separate ops see them, checked by their own rules.
    let (_, _, _, half) = crate::check::rotary(&qkv.reshape(&[t, heads, d])?, p.positions, p.inv_freq)?;
    let expected_row = hkv * d;
    let cd = k_cache.dims();
    if cd.len() != 4 || cd[2] * cd[3] != expected_row || v_cache.dims() != cd || slots.dims() != [t] {
        return Err(Error::Shape {
            op,
            msg: format!("pools {cd:?} / {:?} and slots {:?} for {t} rows of {hkv}x{d}", v_cache.dims(), slots.dims()),
        });
    }
    expect_dtype(op, qkv, &[DType::BF16])?;
    let fp8 = pool_dtype(b, op, k_cache, v_cache)? == DType::F8E4M3;
    expect_dtype(op, p.positions, &[DType::U32])?;
    expect_dtype(op, p.inv_freq, &[DType::F32])?;
    let mut f32_norms = false;
    if let Some((qn, kn)) = p.qk_norm {
        if qn.dtype() != kn.dtype() {
            return Err(Error::InvalidArgument(format!("{op}: q and k norm weights differ in dtype")));
        }
        f32_norms = qn.dtype() == DType::F32;
        for w in [qn, kn] {
            expect_dtype(op, w, &[DType::BF16, DType::F32])?;
            if w.dims() != [d] {
                return Err(Error::Shape { op, msg: format!("q/k norm weight {:?} for head dim {d}", w.dims()) });
            }
        }
    }
    let kernel = match (fp8, f32_norms) {
        (false, false) => "qkv_rotary_write_bf16",
        (false, true) => "qkv_rotary_write_bf16_nf32",
        (true, false) => "qkv_rotary_write_e4m3",
        (true, true) => "qkv_rotary_write_e4m3_nf32",
    };
    let capacity = cd[0] * cd[1];
    crate::check::slots_in_pool(&b.host_u32(op, slots)?, capacity)?;
    let out = b.alloc(&[t, h, d], DType::BF16)?;
    if t == 0 || d == 0 {
        return Ok(out);
    }
    let args = QkvArgs {
        h: h as u32,
        h_kv: hkv as u32,
        d: d as u32,
        half: half as u32,
        eps: p.eps,
        k_scale: p.kv_scales.k,
        v_scale: p.kv_scales.v,
        capacity: capacity as u64,
    };
    let (qn, kn) = match p.qk_norm {
        Some((qn, kn)) => (ptr(op, qn)?, ptr(op, kn)?),
        None => (0, 0),
    };
    let cfg = LaunchConfig {
        grid_dim: (t as u32, heads.div_ceil(QKV_WARPS) as u32, 1),
        block_dim: ((QKV_WARPS * 32) as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let src = (ptr(op, qkv)?, ptr(op, p.positions)?, ptr(op, p.inv_freq)?);
    let dst = (ptr(op, &out)?, ptr(op, k_cache)?, ptr(op, v_cache)?, ptr(op, slots)?);
    launch!(b, kernel, cfg, [src.0, qn, kn, src.1, src.2, dst.0, dst.1, dst.2, dst.3, args])?;
    Ok(out)
}

/// An attention call's operands, checked, with its output allocated.
struct Call {
    out: Tensor,
    args: AttnArgs,
    /// Host copies of `cu_seqlens_q` and `seq_lens`.
    cu: std::sync::Arc<[u32]>,
    lens: std::sync::Arc<[u32]>,
    /// Whether there is anything to compute.
    empty: bool,
    /// Whether the pools are e4m3.
    fp8: bool,
}

fn checked_call(
    b: &CudaBackend,
    op: &'static str,
    q: &Tensor,
    (k_cache, v_cache): (&Tensor, &Tensor),
    meta: &AttentionMeta,
    p: &AttentionParams,
) -> Result<Call> {
    let (h, hkv, d) = (p.num_heads, p.num_kv_heads, p.head_dim);
    let (t, block_size, blocks) = crate::check::attention(q, k_cache, v_cache, p)?;
    if d > MAX_HEAD_DIM {
        return Err(Error::InvalidArgument(format!("{op}: head dim {d} exceeds {MAX_HEAD_DIM}")));
    }
    expect_dtype(op, q, &[DType::BF16])?;
    let fp8 = pool_dtype(b, op, k_cache, v_cache)? == DType::F8E4M3;
    let scales = match (fp8, b.fault) {
        (false, _) => KvScales::UNIT,
        // The precision gate's deliberate bug: values under the keys' scale.
        (true, Some(KV_WRONG_SCALE)) => KvScales { v: p.kv_scales.k, ..p.kv_scales },
        (true, _) => p.kv_scales,
    };
    let (cu, lens, tables) =
        (b.host_u32(op, &meta.cu_seqlens_q)?, b.host_u32(op, &meta.seq_lens)?, b.host_u32(op, &meta.block_tables)?);
    let max_blocks = meta.block_tables.dims().get(1).copied().unwrap_or(0);
    check_meta(MetaView { cu: &cu, lens: &lens, tables: &tables, max_blocks }, t, block_size, blocks)?;
    let out = b.alloc(&[t, h, d], DType::BF16)?;
    let args = AttnArgs {
        num_seqs: lens.len() as u32,
        max_blocks: max_blocks as u32,
        block_size: block_size as u32,
        h: h as u32,
        h_kv: hkv as u32,
        d: d as u32,
        window: p.sliding_window.map_or(0, |w| w.min(u32::MAX as usize) as u32),
        // An e4m3 pool's keys are read unscaled: their scale multiplies the scores.
        scale: if fp8 { p.scale * scales.k } else { p.scale },
        softcap: p.softcap.unwrap_or(0.0),
        split_min: decode_split_min(lens.len()),
        v_scale: scales.v,
    };
    Ok(Call { out, args, cu, lens, empty: t == 0 || h == 0 || d == 0, fp8 })
}

/// The reference: one block per (query row, query head), scalar f32 (`paged_attention_bf16`).
pub(super) fn paged_attention(
    b: &CudaBackend,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &AttentionMeta,
    p: &AttentionParams,
) -> Result<Tensor> {
    let op = "paged_attention";
    let call = checked_call(b, op, q, (k_cache, v_cache), meta, p)?;
    if !call.empty {
        reference(b, &call, q, (k_cache, v_cache), meta)?;
    }
    Ok(call.out)
}

fn reference(
    b: &CudaBackend,
    call: &Call,
    q: &Tensor,
    (kc, vc): (&Tensor, &Tensor),
    meta: &AttentionMeta,
) -> Result<()> {
    let op = "paged_attention";
    let (t, h) = (q.dims()[0] as u32, call.args.h);
    let cfg = LaunchConfig { grid_dim: (t, h, 1), block_dim: (ATTN_THREADS, 1, 1), shared_mem_bytes: 0 };
    let ptrs = (ptr(op, &call.out)?, ptr(op, q)?, ptr(op, kc)?, ptr(op, vc)?);
    let meta_ptrs = (ptr(op, &meta.cu_seqlens_q)?, ptr(op, &meta.seq_lens)?, ptr(op, &meta.block_tables)?);
    launch!(
        b,
        if call.fp8 { "paged_attention_e4m3" } else { "paged_attention_bf16" },
        cfg,
        [ptrs.0, ptrs.1, ptrs.2, ptrs.3, meta_ptrs.0, meta_ptrs.1, meta_ptrs.2, call.args]
    )
}

/// The `flash` backend: for head dims 64, 128 and 256 the tensor-core kernels, split-KV decode
/// for decode steps and tiles for any other batch; for other head dims the scalar split-KV
/// kernel for decode steps and the reference for the rest, over bf16 or e4m3 pools alike.
pub(super) fn flash_attention(
    b: &CudaBackend,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &AttentionMeta,
    p: &AttentionParams,
) -> Result<Tensor> {
    let op = "flash_attention";
    let call = checked_call(b, op, q, (k_cache, v_cache), meta, p)?;
    if call.empty {
        return Ok(call.out);
    }
    let (h, hkv, d) = (p.num_heads, p.num_kv_heads, p.head_dim);
    let tiled = prefill_kernel(d, b.tiled_prefill, call.fp8);
    if b.batch_invariant {
        // Decode rows through the prefill tiles too: a row reads its keys in the same tiles,
        // in the same order, whether it is a decode row, a prompt's or a recomputed one, and
        // whatever the batch (no split of its keys chosen by the batch's size).
        match tiled {
            Some(tiled) => prefill(b, &call, tiled, q, (k_cache, v_cache), meta)?,
            None => reference(b, &call, q, (k_cache, v_cache), meta)?,
        }
        return Ok(call.out);
    }
    let decode_step = decode_applies(&call.cu, h, hkv, d);
    let shape = FlashDecode::for_batch(call.lens.len());
    // Head dim 256's decode kernels need Hopper's shared memory, as its tiles do.
    let served = d != 256 || b.tiled_prefill == TiledPrefill::Warpgroup;
    if let (true, true, Some(kernel)) = (decode_step, served, shape.kernel(d, call.fp8)) {
        let args = AttnArgs { split_min: flash_decode_split_min(call.lens.len()), ..call.args };
        let z = decode_grid_z(&call.lens, args, b.dev.recording_here());
        let launch = DecodeLaunch { kernel, warps: shape.warps, shared: shape.shared_bytes(d, call.fp8), z };
        decode(b, &call.out, (q, k_cache, v_cache), meta, args, launch)?;
    } else if decode_step {
        let z = decode_grid_z(&call.lens, call.args, b.dev.recording_here());
        let (seqs, bucket) = (call.lens.len(), (h / hkv).next_power_of_two());
        let kernel = decode_kernel(bucket, seqs, call.fp8);
        let launch = DecodeLaunch { kernel, warps: decode_warps(bucket, seqs), shared: 0, z };
        decode(b, &call.out, (q, k_cache, v_cache), meta, call.args, launch)?;
    } else if let Some(tiled) = tiled {
        prefill(b, &call, tiled, q, (k_cache, v_cache), meta)?;
    } else {
        reference(b, &call, q, (k_cache, v_cache), meta)?;
    }
    Ok(call.out)
}

/// A tiled prefill kernel and its launch shape.
#[derive(Debug, Clone, Copy)]
struct Tiled {
    kernel: &'static str,
    /// Packed (query, head) rows per block.
    rows: u32,
    threads: u32,
    shared: u32,
}

/// Keys per tile of both tiled kernels (`FL_BN`, `FW_BN`).
const FL_BN: usize = 64;
const FW_BN: usize = 128;
/// Stages of the Hopper kernel's K/V ring (`FW_STAGES`).
const FW_STAGES: usize = 3;
/// The Hopper kernel's keys per tile and stages at head dim 256 (`flash_wgmma.cu`).
const FW_BN_D256: usize = 64;
const FW_STAGES_D256: usize = 2;

/// Which tiled kernel family runs the prefill steps of the `flash` op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TiledPrefill {
    /// Warpgroup MMA fed by a producer warpgroup (`flash_wgmma.cu`, sm_90a): Hopper's.
    Warpgroup,
    /// `mma.sync` tiles (`flash.cu`): every other GPU's.
    MmaSync,
}

impl TiledPrefill {
    /// The family a device of compute capability `cc` runs.
    pub(crate) fn for_device(cc: (i32, i32)) -> Self {
        if cc.0 == 9 { Self::Warpgroup } else { Self::MmaSync }
    }
}

/// The tiled kernel of `family` for head dim `d` over bf16 or (`fp8`) e4m3 pools, if there
/// is one: the warpgroup kernel takes 128 rows a block with two consumer warpgroups and a
/// producer (shared memory: the query tile, a ring of K/V tiles, for e4m3 pools the
/// staging buffers of their bytes, 8-byte mbarriers, 1 KiB of alignment); the `mma.sync`
/// kernel 64 rows with 4 warps (the query tile and two buffers of keys and values, which
/// e4m3 pools fill through registers).
fn prefill_kernel(d: usize, family: TiledPrefill, fp8: bool) -> Option<Tiled> {
    let names = match (d, family) {
        (64, TiledPrefill::Warpgroup) => ["flash_prefill_wg_bf16_d64", "flash_prefill_wg_e4m3_d64"],
        (128, TiledPrefill::Warpgroup) => ["flash_prefill_wg_bf16_d128", "flash_prefill_wg_e4m3_d128"],
        (64, TiledPrefill::MmaSync) => ["flash_prefill_bf16_d64", "flash_prefill_e4m3_d64"],
        (128, TiledPrefill::MmaSync) => ["flash_prefill_bf16_d128", "flash_prefill_e4m3_d128"],
        // Head dim 256: the warpgroup kernel with tiles of 64 keys in two stages (2.6x the
        // `mma.sync` tiles it replaced, `bench/results/kernels-ab-2026-12-04`); other GPUs
        // have no tiled kernel for it.
        (256, TiledPrefill::Warpgroup) => ["flash_prefill_wg_bf16_d256", "flash_prefill_wg_e4m3_d256"],
        _ => return None,
    };
    let kernel = names[usize::from(fp8)];
    Some(match family {
        TiledPrefill::Warpgroup => {
            let (keys, stages, raw) = match (d, fp8) {
                (256, false) => (FW_BN_D256, FW_STAGES_D256, 0),
                (256, true) => (FW_BN_D256, FW_STAGES_D256, 1),
                (_, false) => (FW_BN, FW_STAGES, 0),
                (128, true) => (FW_BN, 2, 2),
                (_, true) => (FW_BN, FW_STAGES, 2),
            };
            let shared = (128 + 2 * stages * keys) * d * 2 + raw * 2 * keys * d + 2 * stages * 8 + 1024;
            Tiled { kernel, rows: 128, threads: 384, shared: shared as u32 }
        }
        TiledPrefill::MmaSync => Tiled { kernel, rows: 64, threads: 128, shared: ((64 + 4 * FL_BN) * d * 2) as u32 },
    })
}

/// A shape of the tensor-core decode kernel (`flash_decode.cu`): warps per block, each
/// taking 16 keys of a tile, with a ring of three tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FlashDecode {
    warps: u32,
}

/// Ring stages of both shapes (`S` of `flash_decode.cu`).
const FD_STAGES: usize = 3;
const FLASH_DECODE_SHAPES: [FlashDecode; 2] = [FlashDecode { warps: 4 }, FlashDecode { warps: 2 }];

impl FlashDecode {
    /// The shape for a batch of `seqs` sequences: four warps up to 32 sequences, two
    /// beyond. A large batch of short contexts is bound by each block's round trips (length,
    /// block table, then the keys) more than by the bytes; two-warp blocks take half the
    /// shared memory, so four of them fit an SM where two four-warp ones did. Measured on
    /// the H200 (`bench/results/gpu-decode-shapes-2026-12-02`): 256 sequences of 136 keys
    /// 61.4 → 50.1 µs a layer, of 384 keys 111.3 → 106.3; 64 of 4,096 unchanged (272 → 270);
    /// one of 4,096 25 µs against 15, hence four warps for small batches. The class ends at a
    /// CUDA-graph batch size (32), so a padded replay runs the shape its eager step runs.
    fn for_batch(seqs: usize) -> Self {
        FLASH_DECODE_SHAPES[usize::from(seqs > 32)]
    }

    /// Dynamic shared memory: the query tile's 16 rows and the ring of `FD_STAGES` buffers of
    /// 16 `warps` keys and values; over e4m3 pools the ring holds bytes, beside one widened
    /// bf16 tile of keys and of values.
    fn shared_bytes(self, d: usize, fp8: bool) -> u32 {
        let keys = 16 * self.warps as usize;
        let bytes = if fp8 { (32 + (2 * FD_STAGES + 4) * keys) * d } else { (16 + 2 * FD_STAGES * keys) * d * 2 };
        bytes as u32
    }

    /// The kernel for head dim `d` over bf16 or e4m3 pools, if there is one.
    fn kernel(self, d: usize, fp8: bool) -> Option<&'static str> {
        let [bf16, e4m3] = match (d, self.warps) {
            (64, 4) => ["flash_decode_bf16_d64_w4", "flash_decode_e4m3_d64_w4"],
            (128, 4) => ["flash_decode_bf16_d128_w4", "flash_decode_e4m3_d128_w4"],
            (64, 2) => ["flash_decode_bf16_d64_w2", "flash_decode_e4m3_d64_w2"],
            (128, 2) => ["flash_decode_bf16_d128_w2", "flash_decode_e4m3_d128_w2"],
            (256, 4) => ["flash_decode_bf16_d256_w4", "flash_decode_e4m3_d256_w4"],
            (256, 2) => ["flash_decode_bf16_d256_w2", "flash_decode_e4m3_d256_w2"],
            _ => return None,
        };
        Some(if fp8 { e4m3 } else { bf16 })
    }
}

/// The tensor-core decode kernel's shortest split for a batch of `seqs` sequences. Its
/// blocks stream whole tiles of 64 keys, each through a pipeline that takes a round trip
/// to fill, so splits are longer than the scalar kernel's: 64 keys up to 8 sequences (a few
/// sequences must still spread over the GPU), 512 up to 32, 2,048 beyond, where the batch
/// fills the GPU by itself and each split's fill and merge are pure cost. The classes end
/// at CUDA-graph batch sizes, as `decode_split_min`'s do.
fn flash_decode_split_min(seqs: usize) -> u32 {
    match seqs {
        0..=8 => 64,
        9..=32 => 512,
        _ => 2048,
    }
}

/// Lets the tensor-core kernels a device of compute capability `cc` can run use more than
/// the default 48 KiB of dynamic shared memory.
pub(super) fn raise_shared_memory(
    kernels: &std::collections::HashMap<&'static str, cudarc::driver::CudaFunction>,
    cc: (i32, i32),
) -> Result<()> {
    use cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
    // Every device can run the `mma.sync` tiles; the warpgroup ones only Hopper.
    let mut families = vec![TiledPrefill::MmaSync];
    if TiledPrefill::for_device(cc) == TiledPrefill::Warpgroup {
        families.push(TiledPrefill::Warpgroup);
    }
    let hopper = TiledPrefill::for_device(cc) == TiledPrefill::Warpgroup;
    // Head dim 256's kernels take up to 200 KiB: Hopper's 227 KiB hold them.
    let dims: &[usize] = if hopper { &[64, 128, 256] } else { &[64, 128] };
    for &d in dims {
        let mut sized: Vec<(&str, u32)> = FLASH_DECODE_SHAPES
            .iter()
            .flat_map(|f| [false, true].map(|fp8| (f.kernel(d, fp8).expect("a decode kernel"), f.shared_bytes(d, fp8))))
            .collect();
        for &family in &families {
            for fp8 in [false, true] {
                sized.extend(prefill_kernel(d, family, fp8).map(|tiled| (tiled.kernel, tiled.shared)));
            }
        }
        for (name, bytes) in sized {
            let func = kernels.get(name).ok_or_else(|| Error::Device(format!("kernel `{name}` was not loaded")))?;
            func.set_attribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes as i32)
                .map_err(|e| Error::Device(format!("{name}: shared memory: {e:?}")))?;
        }
    }
    Ok(())
}

/// The tiled kernel: one block per (tile of `tiled.rows` packed (query, head) rows of one
/// sequence, KV head). `tiles [seqs + 1]`, each sequence's first tile, is this backend's own
/// step metadata; a step whose sequences are one tile each passes none.
fn prefill(
    b: &CudaBackend,
    call: &Call,
    tiled: Tiled,
    q: &Tensor,
    (kc, vc): (&Tensor, &Tensor),
    meta: &AttentionMeta,
) -> Result<()> {
    let op = "flash_attention";
    let group = call.args.h / call.args.h_kv;
    let mut starts = Vec::with_capacity(call.cu.len());
    let mut total = 0u32;
    starts.push(0);
    for w in call.cu.windows(2) {
        total += ((w[1] - w[0]) * group).div_ceil(tiled.rows);
        starts.push(total);
    }
    if total == 0 {
        return Ok(());
    }
    let one_each = starts.iter().enumerate().all(|(i, &t)| t as usize == i);
    let tiles = if one_each { None } else { Some(b.upload_u32(&starts, &[starts.len()])?) };
    let tiles_ptr = match &tiles {
        Some(t) => ptr(op, t)?,
        None => 0,
    };
    let cfg = LaunchConfig {
        grid_dim: (total, call.args.h_kv, 1),
        block_dim: (tiled.threads, 1, 1),
        shared_mem_bytes: tiled.shared,
    };
    let ptrs = (ptr(op, &call.out)?, ptr(op, q)?, ptr(op, kc)?, ptr(op, vc)?);
    let meta_ptrs = (ptr(op, &meta.cu_seqlens_q)?, ptr(op, &meta.seq_lens)?, ptr(op, &meta.block_tables)?);
    launch!(
        b,
        tiled.kernel,
        cfg,
        [ptrs.0, ptrs.1, ptrs.2, ptrs.3, meta_ptrs.0, meta_ptrs.1, meta_ptrs.2, tiles_ptr, call.args]
    )
}

/// `DEC_SPLITS` and `DEC_MAX_GROUP` of `attention.cu`.
const DEC_SPLITS: usize = 16;
const DEC_MAX_GROUP: usize = 8;
/// Ticket counters of the decode kernel's merge, one per (sequence, KV head) of a step:
/// zero between launches (the merging block resets its own).
pub(super) const DECODE_COUNTERS: usize = 1 << 16;

/// The decode kernel's shortest split for a batch of `seqs` sequences: 16 keys up to 8
/// sequences, 64 up to 32, 256 beyond. The class boundaries are CUDA-graph batch sizes
/// (`model-layers` captures 8 and 32), so a step replayed from a graph padded to the next
/// size splits exactly as the eager step does.
fn decode_split_min(seqs: usize) -> u32 {
    match seqs {
        0..=8 => 16,
        9..=32 => 64,
        _ => 256,
    }
}

/// Warps per block of the decode kernel: 8 for one or two sequences (most SMs would idle)
/// with groups of up to 4 query heads, else 4. Measured on the H200 at batch 8, 8 warps
/// (one block per SM at their registers) lost 7 % to 4. The class ends at a CUDA-graph
/// batch size (2), so a padded replay runs the kernel its eager step runs.
fn decode_warps(group_bucket: usize, seqs: usize) -> u32 {
    if seqs <= 2 && group_bucket <= 4 { 8 } else { 4 }
}

/// The decode kernel for groups of up to `group_bucket` query heads over bf16 or e4m3
/// pools.
fn decode_kernel(group_bucket: usize, seqs: usize, fp8: bool) -> &'static str {
    let names = match (group_bucket, decode_warps(group_bucket, seqs)) {
        (1, 8) => ["decode_attention_bf16_g1_w8", "decode_attention_e4m3_g1_w8"],
        (2, 8) => ["decode_attention_bf16_g2_w8", "decode_attention_e4m3_g2_w8"],
        (4, 8) => ["decode_attention_bf16_g4_w8", "decode_attention_e4m3_g4_w8"],
        (1, _) => ["decode_attention_bf16_g1_w4", "decode_attention_e4m3_g1_w4"],
        (2, _) => ["decode_attention_bf16_g2_w4", "decode_attention_e4m3_g2_w4"],
        (4, _) => ["decode_attention_bf16_g4_w4", "decode_attention_e4m3_g4_w4"],
        _ => ["decode_attention_bf16_g8_w4", "decode_attention_e4m3_g8_w4"],
    };
    names[usize::from(fp8)]
}

/// Split blocks per (sequence, KV head) of a decode launch: each takes every `z`-th split of
/// its pair. Up to 32 sequences a block per split (16), so a few sequences spread over the
/// GPU; up to 64, 2; beyond, 1: the (sequence, KV head) pairs of a large batch fill the GPU
/// by themselves, and its blocks should not be mostly empty ones (with one block per
/// split, 256 sequences of short contexts queued 32k blocks, 15 of 16 with nothing to do,
/// and the launch took as long as the block scheduler needed for them). An eager step
/// lowers it to the most splits any of its sequences needs; a graph recording keeps the
/// class's figure, as its replays see other contexts. Which block computes a split changes
/// no result.
fn decode_grid_z(lens: &[u32], args: AttnArgs, recording: bool) -> u32 {
    let class = match lens.len() {
        0..=32 => DEC_SPLITS as u32,
        33..=64 => 2,
        _ => 1,
    };
    if recording {
        return class;
    }
    let window = args.window;
    let needed = lens
        .iter()
        .map(|&len| {
            let visible = if window > 0 { len.min(window) } else { len };
            let per = visible.div_ceil(DEC_SPLITS as u32);
            let split = args.split_min.max(per.div_ceil(args.split_min) * args.split_min);
            visible.div_ceil(split)
        })
        .max()
        .unwrap_or(1);
    class.min(needed).max(1)
}

/// Whether the split-KV decode kernel takes the batch: one query row per sequence, head
/// dims of a power-of-two number of 8-element vectors, groups of at most 8 query heads, a
/// merge ticket for every (sequence, KV head).
fn decode_applies(cu: &[u32], h: usize, hkv: usize, d: usize) -> bool {
    let vectors = d / 8;
    (cu.len() - 1) * hkv <= DECODE_COUNTERS
        && cu.iter().enumerate().all(|(i, &c)| c as usize == i)
        && d.is_multiple_of(8)
        && vectors.is_power_of_two()
        && d <= MAX_HEAD_DIM
        && h / hkv <= DEC_MAX_GROUP
}

/// A decode kernel and its launch shape: warps per block, dynamic shared memory, blocks per
/// (sequence, KV head).
struct DecodeLaunch {
    kernel: &'static str,
    warps: u32,
    shared: u32,
    z: u32,
}

/// The decode path, either kernel: partial softmax sums per split, merged by the last split
/// of each (sequence, KV head).
fn decode(
    b: &CudaBackend,
    out: &Tensor,
    (q, kc, vc): (&Tensor, &Tensor, &Tensor),
    meta: &AttentionMeta,
    args: AttnArgs,
    launch: DecodeLaunch,
) -> Result<()> {
    let op = "flash_attention";
    let (seqs, h, hkv, d) = (args.num_seqs as usize, args.h as usize, args.h_kv as usize, args.d as usize);
    let part_acc = b.alloc(&[seqs, h, DEC_SPLITS, d], DType::F32)?;
    let part_ml = b.alloc(&[seqs, h, DEC_SPLITS, 2], DType::F32)?;
    let (acc, ml) = (ptr(op, &part_acc)?, ptr(op, &part_ml)?);
    let (lens, tables) = (ptr(op, &meta.seq_lens)?, ptr(op, &meta.block_tables)?);
    let cfg = LaunchConfig {
        grid_dim: (seqs as u32, hkv as u32, launch.z),
        block_dim: (32 * launch.warps, 1, 1),
        shared_mem_bytes: launch.shared,
    };
    let ptrs = (ptr(op, q)?, ptr(op, kc)?, ptr(op, vc)?);
    let (out_ptr, counters) = (ptr(op, out)?, b.decode_counters.ptr());
    launch!(b, launch.kernel, cfg, [acc, ml, ptrs.0, ptrs.1, ptrs.2, lens, tables, args, out_ptr, counters])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hopper's dynamic shared memory a block (227 KiB).
    const HOPPER_SHARED: u32 = 227 << 10;

    #[test]
    fn every_attention_kernel_fits_hoppers_shared_memory() {
        for fp8 in [false, true] {
            for d in [64, 128, 256] {
                for family in [TiledPrefill::Warpgroup, TiledPrefill::MmaSync] {
                    if let Some(t) = prefill_kernel(d, family, fp8) {
                        assert!(t.shared <= HOPPER_SHARED, "{}: {} bytes", t.kernel, t.shared);
                        assert_eq!(t.kernel.contains("e4m3"), fp8, "{}", t.kernel);
                    }
                }
                for shape in FLASH_DECODE_SHAPES {
                    let kernel = shape.kernel(d, fp8).expect("a decode kernel");
                    assert!(shape.shared_bytes(d, fp8) <= HOPPER_SHARED, "{kernel}");
                    assert_eq!(kernel.contains("e4m3"), fp8, "{kernel}");
                }
            }
        }
        // e4m3 pools hold half the bytes, so their rings are no larger than bf16's.
        for shape in FLASH_DECODE_SHAPES {
            assert!(shape.shared_bytes(128, true) < shape.shared_bytes(128, false));
        }
    }

    #[test]
    fn every_named_attention_kernel_is_loaded() {
        let loaded: std::collections::HashSet<&str> = launch::KERNELS.iter().copied().collect();
        let mut names = Vec::new();
        for fp8 in [false, true] {
            for d in [64, 128, 256] {
                for family in [TiledPrefill::Warpgroup, TiledPrefill::MmaSync] {
                    names.extend(prefill_kernel(d, family, fp8).map(|t| t.kernel));
                }
                names.extend(FLASH_DECODE_SHAPES.iter().filter_map(|s| s.kernel(d, fp8)));
            }
            for bucket in [1, 2, 4, 8] {
                names.extend([1, 40].map(|seqs| decode_kernel(bucket, seqs, fp8)));
            }
        }
        for name in names {
            assert!(loaded.contains(name), "{name} is not in the kernels loaded at startup");
        }
    }
}
