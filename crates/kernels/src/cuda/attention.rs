//! KV writes and paged attention on the GPU.
//!
//! The checks are the CPU backend's (`cpu::attention::check_meta`), run on the host copies
//! of the metadata, so a bad slot, block or length is an error before any launch. The
//! kernel is a correctness baseline (see `cuda/attention.cu`); its inputs — the paged pools
//! `[blocks, block_size, h_kv, d]` and the varlen metadata — are FlashAttention's, so a
//! faster kernel replaces it behind the same call.

use cudarc::driver::{DeviceRepr, LaunchConfig};

use super::{CudaBackend, expect_dtype, launch, ptr};
use crate::backend::{AttentionMeta, AttentionParams};
use crate::cpu::attention::{MetaView, check_meta};
use crate::error::{Error, Result};
use crate::{DType, Tensor};

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
}

// SAFETY: `AttnArgs` is `repr(C)` plain data with the field order and types of the CUDA
// struct of the same name (seven u32 then two f32, no padding).
unsafe impl DeviceRepr for AttnArgs {}

pub(super) fn write_kv(
    b: &CudaBackend,
    k: &Tensor,
    v: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    slots: &Tensor,
) -> Result<()> {
    let crate::check::WriteKv { row, capacity } = crate::check::write_kv(k, v, k_cache, v_cache, slots)?;
    let t = slots.elem_count();
    for x in [k, v, k_cache, v_cache] {
        expect_dtype("write_kv", x, &[DType::BF16])?;
    }
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
    launch!(b, "write_kv_bf16", cfg, [args.0, args.1, args.2, args.3, args.4, row as u32, capacity as u64])
}

pub(super) fn paged_attention(
    b: &CudaBackend,
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &AttentionMeta,
    p: &AttentionParams,
) -> Result<Tensor> {
    let (h, hkv, d) = (p.num_heads, p.num_kv_heads, p.head_dim);
    let (t, block_size, blocks) = crate::check::attention(q, k_cache, v_cache, p)?;
    if d > MAX_HEAD_DIM {
        return Err(Error::InvalidArgument(format!("paged_attention: head dim {d} exceeds {MAX_HEAD_DIM}")));
    }
    for x in [q, k_cache, v_cache] {
        expect_dtype("paged_attention", x, &[DType::BF16])?;
    }
    let op = "paged_attention";
    let (cu, lens, tables) =
        (b.host_u32(op, &meta.cu_seqlens_q)?, b.host_u32(op, &meta.seq_lens)?, b.host_u32(op, &meta.block_tables)?);
    let max_blocks = meta.block_tables.dims().get(1).copied().unwrap_or(0);
    check_meta(MetaView { cu: &cu, lens: &lens, tables: &tables, max_blocks }, t, block_size, blocks)?;
    let out = b.alloc(&[t, h, d], DType::BF16)?;
    if t == 0 || h == 0 || d == 0 {
        return Ok(out);
    }
    let args = AttnArgs {
        num_seqs: lens.len() as u32,
        max_blocks: max_blocks as u32,
        block_size: block_size as u32,
        h: h as u32,
        h_kv: hkv as u32,
        d: d as u32,
        window: p.sliding_window.map_or(0, |w| w.min(u32::MAX as usize) as u32),
        scale: p.scale,
        softcap: p.softcap.unwrap_or(0.0),
    };
    let cfg = LaunchConfig { grid_dim: (t as u32, h as u32, 1), block_dim: (ATTN_THREADS, 1, 1), shared_mem_bytes: 0 };
    let ptrs = (ptr(op, &out)?, ptr(op, q)?, ptr(op, k_cache)?, ptr(op, v_cache)?);
    let meta_ptrs = (ptr(op, &meta.cu_seqlens_q)?, ptr(op, &meta.seq_lens)?, ptr(op, &meta.block_tables)?);
    launch!(
        b,
        "paged_attention_bf16",
        cfg,
        [ptrs.0, ptrs.1, ptrs.2, ptrs.3, meta_ptrs.0, meta_ptrs.1, meta_ptrs.2, args]
    )?;
    Ok(out)
}
