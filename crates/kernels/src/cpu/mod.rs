//! `CpuBackend`: the numerical reference and the small-model serving backend.
//!
//! Floats are stored and computed in f32 (f16/bf16 weights are widened at upload);
//! block-quantised weights stay in their blocks and matmuls read them directly
//! (`qmatmul`), so a GGUF model keeps its memory footprint and exact values. Matmuls compute
//! each (activation row, weight row) pair by a function of those two rows alone and only
//! schedule the pairs by the row count (`rows.rs`), and attention takes one task per (query
//! row, KV head) whatever the op (`attention.rs`, `flash.rs`), so a row's output never
//! depends on the rows that share its step (batch invariance: a sequence's logits are the
//! same alone, batched, chunked or recomputed). Everything else is a loop over rows: shared
//! over the spinning pool (`pool.rs`) when the output is large, on the calling thread when
//! it is small (a decode step's norms and activations; `ops::for_each_row` says why). The
//! reference attention's tasks are shared over the pool unless the step sees only a few
//! thousand key elements. The Gated DeltaNet ops update state pools in place
//! (`recurrent.rs`); the delta rule runs every row by itself, in tasks of (sequence, value
//! head, value columns), so a hybrid model's outputs do not depend on its prompt chunking
//! either. Storage sits behind a lock because some ops write into an
//! existing tensor (`write_kv` into the KV pools, the recurrent ops into their state
//! pools); every other op only reads its operands and allocates its result.

pub(crate) mod attention;
mod flash;
mod lora;
mod matmul;
mod moe;
mod ops;
mod pool;
mod qmatmul;
mod recurrent;
mod rows;
pub(crate) mod sample;

use parking_lot::{MappedRwLockReadGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::backend::{
    AttentionMeta, AttentionParams, DeltaRule, GpuBackend, KvScales, LoraSlots, MoeLora, RecurrentBatch, Routing,
    SampleRow, Sampled,
};
use crate::error::{Error, Result};
use crate::quant::{PackedQuant, QuantFormat};
use crate::{DType, DeviceKind, HostTensor, Shape, Storage, Tensor};

pub use matmul::matmul_xwt;
pub use qmatmul::{QuantDots, matmul_packed, matmul_quant};

/// Host memory of one CPU tensor.
pub struct CpuStorage(RwLock<CpuData>);

enum CpuData {
    F32(Vec<f32>),
    U32(Vec<u32>),
    /// e4m3 bytes: FP8 KV pools.
    F8(Vec<u8>),
    /// Rows of whole blocks of the tensor's quantised dtype.
    Quant(Vec<u8>),
    /// Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and Q6_K matrices, repacked for the matmul kernels: one
    /// matrix, or the row blocks of a fused one whose parts come in different formats
    /// (each part keeps its own; the tensor's dtype names the first part's).
    Packed(Vec<PackedQuant>),
}

/// The multithreaded f32 CPU backend, on the process's spinning pool (sized like rayon's
/// global pool, whose threads sample and run f32-weight GEMMs).
#[derive(Debug, Default, Clone)]
pub struct CpuBackend {
    /// How products with packed quantised weights are computed.
    dots: QuantDots,
}

impl CpuBackend {
    /// A CPU backend with exact dots: the numerical
    /// reference that tests compare against.
    pub fn new() -> Self {
        Self::default()
    }

    /// A CPU backend whose packed quantised matmuls use `dots` (`met --quant-dots int8`
    /// picks [`QuantDots::Int8`] for speed).
    pub fn with_dots(dots: QuantDots) -> Self {
        Self { dots }
    }

    /// How this backend's packed quantised matmuls are computed.
    pub fn dots(&self) -> QuantDots {
        self.dots
    }
}

pub(crate) const NAME: &str = DeviceKind::Cpu.name();

fn storage<'a>(op: &'static str, t: &'a Tensor) -> Result<&'a CpuStorage> {
    match t.storage() {
        Storage::Cpu(s) => Ok(s),
        #[allow(unreachable_patterns)]
        other => Err(Error::WrongDevice { op, found: other.device_name(), backend: NAME }),
    }
}

/// Read access to the f32 elements of a CPU tensor.
pub(crate) fn read_f32<'a>(op: &'static str, t: &'a Tensor) -> Result<MappedRwLockReadGuard<'a, [f32]>> {
    let guard = storage(op, t)?.0.read();
    RwLockReadGuard::try_map(guard, |d| match d {
        CpuData::F32(v) => Some(&v[..]),
        _ => None,
    })
    .map_err(|_| Error::DType { op, expected: DType::F32, got: t.dtype() })
}

/// A weight as an op reads it: plain f32, quantised blocks, or a packed matrix.
pub(crate) enum WeightView<'a> {
    F32(MappedRwLockReadGuard<'a, [f32]>),
    Quant(QuantFormat, MappedRwLockReadGuard<'a, [u8]>),
    Packed(MappedRwLockReadGuard<'a, [PackedQuant]>),
}

/// Read access to a weight tensor, f32 or quantised.
pub(crate) fn read_weight<'a>(op: &'static str, t: &'a Tensor) -> Result<WeightView<'a>> {
    let DType::Quant(q) = t.dtype() else { return read_f32(op, t).map(WeightView::F32) };
    let guard = storage(op, t)?.0.read();
    if matches!(*guard, CpuData::Packed(_)) {
        return Ok(WeightView::Packed(RwLockReadGuard::map(guard, |d| match d {
            CpuData::Packed(p) => &p[..],
            _ => unreachable!("matched above"),
        })));
    }
    RwLockReadGuard::try_map(guard, |d| match d {
        CpuData::Quant(b) => Some(&b[..]),
        _ => None,
    })
    .map(|b| WeightView::Quant(q, b))
    .map_err(|_| Error::DType { op, expected: t.dtype(), got: t.dtype() })
}

impl WeightView<'_> {
    /// Rows `rows` of a `[.., k]` weight as f32, dequantised when needed.
    pub(crate) fn rows_f32(&self, rows: std::ops::Range<usize>, k: usize) -> std::borrow::Cow<'_, [f32]> {
        match self {
            Self::F32(v) => std::borrow::Cow::Borrowed(&v[rows.start * k..rows.end * k]),
            Self::Quant(q, b) => {
                let row_bytes = q.bytes_for(k).expect("rows are whole blocks");
                let mut out = vec![0f32; rows.len() * k];
                crate::quant::dequantize_row(*q, &b[rows.start * row_bytes..rows.end * row_bytes], &mut out);
                std::borrow::Cow::Owned(out)
            }
            Self::Packed(parts) => {
                let mut out = vec![0f32; rows.len() * k];
                let mut first = 0;
                for p in parts.iter() {
                    let own = rows.start.max(first)..rows.end.min(first + p.rows());
                    if !own.is_empty() {
                        let at = (own.start - rows.start) * k..(own.end - rows.start) * k;
                        p.dequantize_rows(own.start - first..own.end - first, &mut out[at]);
                    }
                    first += p.rows();
                }
                std::borrow::Cow::Owned(out)
            }
        }
    }
}

/// Read access to the u32 elements of a CPU tensor.
pub(crate) fn read_u32<'a>(op: &'static str, t: &'a Tensor) -> Result<MappedRwLockReadGuard<'a, [u32]>> {
    let guard = storage(op, t)?.0.read();
    RwLockReadGuard::try_map(guard, |d| match d {
        CpuData::U32(v) => Some(&v[..]),
        _ => None,
    })
    .map_err(|_| Error::DType { op, expected: DType::U32, got: t.dtype() })
}

/// Read access to the e4m3 bytes of a CPU tensor.
pub(crate) fn read_f8<'a>(op: &'static str, t: &'a Tensor) -> Result<MappedRwLockReadGuard<'a, [u8]>> {
    let guard = storage(op, t)?.0.read();
    RwLockReadGuard::try_map(guard, |d| match d {
        CpuData::F8(v) => Some(&v[..]),
        _ => None,
    })
    .map_err(|_| Error::DType { op, expected: DType::F8E4M3, got: t.dtype() })
}

/// Write access to the e4m3 bytes of a CPU tensor (FP8 KV pools).
pub(crate) fn write_f8<'a>(op: &'static str, t: &'a Tensor) -> Result<parking_lot::MappedRwLockWriteGuard<'a, [u8]>> {
    let guard = storage(op, t)?.0.write();
    RwLockWriteGuard::try_map(guard, |d| match d {
        CpuData::F8(v) => Some(&mut v[..]),
        _ => None,
    })
    .map_err(|_| Error::DType { op, expected: DType::F8E4M3, got: t.dtype() })
}

/// Write access to the f32 elements of a CPU tensor (KV pools only).
pub(crate) fn write_f32<'a>(op: &'static str, t: &'a Tensor) -> Result<parking_lot::MappedRwLockWriteGuard<'a, [f32]>> {
    let guard = storage(op, t)?.0.write();
    RwLockWriteGuard::try_map(guard, |d| match d {
        CpuData::F32(v) => Some(&mut v[..]),
        _ => None,
    })
    .map_err(|_| Error::DType { op, expected: DType::F32, got: t.dtype() })
}

/// An output buffer that the tasks of one pool job write through, each to its own part
/// (tiles of columns, or (row, head) vectors); the buffer outlives the job, which `run`
/// waits for.
struct Disjoint(*mut f32);

// SAFETY: the tasks sharing a `Disjoint` write disjoint elements of a buffer that outlives
// them (each user says which).
unsafe impl Send for Disjoint {}
// SAFETY: as for `Send`: no two tasks touch the same element.
unsafe impl Sync for Disjoint {}

/// Wraps f32 results as a CPU tensor.
pub(crate) fn f32_tensor(data: Vec<f32>, dims: &[usize]) -> Tensor {
    debug_assert_eq!(data.len(), dims.iter().product::<usize>());
    Tensor::from_storage(Storage::Cpu(CpuStorage(RwLock::new(CpuData::F32(data)))), DType::F32, Shape::new(dims))
}

/// Wraps e4m3 bytes as a CPU tensor.
fn f8_tensor(data: Vec<u8>, dims: &[usize]) -> Tensor {
    debug_assert_eq!(data.len(), dims.iter().product::<usize>());
    Tensor::from_storage(Storage::Cpu(CpuStorage(RwLock::new(CpuData::F8(data)))), DType::F8E4M3, Shape::new(dims))
}

/// Wraps u32 results as a CPU tensor.
pub(crate) fn u32_tensor(data: Vec<u32>, dims: &[usize]) -> Tensor {
    debug_assert_eq!(data.len(), dims.iter().product::<usize>());
    Tensor::from_storage(Storage::Cpu(CpuStorage(RwLock::new(CpuData::U32(data)))), DType::U32, Shape::new(dims))
}

impl GpuBackend for CpuBackend {
    fn batch_invariant(&self) -> bool {
        true
    }

    fn device(&self) -> DeviceKind {
        DeviceKind::Cpu
    }

    fn float_dtype(&self) -> DType {
        DType::F32
    }

    fn zeros(&self, dims: &[usize], dtype: DType) -> Result<Tensor> {
        let n = dims.iter().product();
        match dtype {
            DType::U32 => Ok(u32_tensor(vec![0; n], dims)),
            DType::F8E4M3 => Ok(f8_tensor(vec![0; n], dims)),
            DType::Quant(q) => Err(Error::InvalidArgument(format!("zeros: cannot make a {q} tensor"))),
            _ => Ok(f32_tensor(vec![0.0; n], dims)),
        }
    }

    fn upload(&self, host: &HostTensor<'_>, dtype: DType) -> Result<Tensor> {
        if dtype == DType::F8E4M3 && host.dtype() != DType::U32 {
            let bytes = host.to_f32_vec()?.into_iter().map(crate::fp8::e4m3_from_f32).collect();
            return Ok(f8_tensor(bytes, host.shape()));
        }
        let expected = if host.dtype() == DType::U32 { DType::U32 } else { DType::F32 };
        if dtype != expected {
            return Err(Error::DType { op: "upload", expected, got: dtype });
        }
        Ok(match host.dtype() {
            DType::U32 => u32_tensor(host.to_u32_vec()?, host.shape()),
            // Matrices keep their blocks (repacked where the kernels have a layout for
            // them); anything else quantised is widened.
            DType::Quant(q) if host.shape().len() == 2 => {
                let data = match PackedQuant::from_blocks(q, host.bytes(), host.shape()[1]) {
                    Some(p) => CpuData::Packed(vec![p]),
                    None => CpuData::Quant(host.bytes().to_vec()),
                };
                Tensor::from_storage(
                    Storage::Cpu(CpuStorage(RwLock::new(data))),
                    DType::Quant(q),
                    Shape::new(host.shape()),
                )
            }
            _ => f32_tensor(host.to_f32_vec()?, host.shape()),
        })
    }

    /// Matrices of packed formats keep each part's blocks, even where the parts' formats
    /// differ (a Q4_K_M file's q and k in Q4_K beside a Q6_K v): a product runs each part's
    /// kernel on its rows. Anything else is joined as the default does.
    fn upload_rows(&self, parts: Vec<HostTensor<'_>>, dtype: DType) -> Result<Tensor> {
        let k = match parts.first().map(HostTensor::shape) {
            Some(&[_, k]) => k,
            _ => 0,
        };
        let matrices = k > 0 && parts.iter().all(|p| matches!(p.shape(), &[_, pk] if pk == k));
        let mixed = parts.iter().any(|p| p.dtype() != parts[0].dtype());
        if dtype != DType::F32 || !mixed || !matrices {
            return self.upload(&HostTensor::concat_rows(parts)?, dtype);
        }
        let rows: usize = parts.iter().map(|p| p.shape()[0]).sum();
        let packed = parts.iter().map(|p| match p.dtype() {
            DType::Quant(q) => PackedQuant::from_blocks(q, p.bytes(), k),
            _ => None,
        });
        // A part without a packed layout (f32, Q5_0, a Q4_0 scale past f16's range once
        // negated) widens the whole matrix, as before there were row blocks.
        let Some(packed) = packed.collect::<Option<Vec<_>>>() else {
            return self.upload(&HostTensor::concat_rows(parts)?, dtype);
        };
        let dtype = parts[0].dtype();
        Ok(Tensor::from_storage(
            Storage::Cpu(CpuStorage(RwLock::new(CpuData::Packed(packed)))),
            dtype,
            Shape::new(&[rows, k]),
        ))
    }

    fn cast(&self, t: &Tensor, dtype: DType) -> Result<Tensor> {
        if dtype != DType::F32 {
            return Err(Error::DType { op: "cast", expected: DType::F32, got: dtype });
        }
        Ok(f32_tensor(read_f32("cast", t)?.to_vec(), t.dims()))
    }

    fn download_f32(&self, t: &Tensor) -> Result<Vec<f32>> {
        if t.dtype() == DType::F8E4M3 {
            return Ok(read_f8("download_f32", t)?.iter().map(|&b| crate::fp8::e4m3_to_f32_fast(b)).collect());
        }
        let k = t.shape().last();
        Ok(read_weight("download_f32", t)?.rows_f32(0..t.elem_count() / k.max(1), k).into_owned())
    }

    fn download_u32(&self, t: &Tensor) -> Result<Vec<u32>> {
        Ok(read_u32("download_u32", t)?.to_vec())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn matmul(&self, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        matmul::matmul(x, w, bias, self.dots)
    }

    fn rms_norm(&self, x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
        ops::rms_norm(x, weight, eps)
    }

    fn add_rms_norm(&self, x: &Tensor, residual: &Tensor, weight: &Tensor, eps: f32) -> Result<(Tensor, Tensor)> {
        let sum = ops::add(x, residual)?;
        Ok((ops::rms_norm(&sum, weight, eps)?, sum))
    }

    fn rotary(&self, x: &Tensor, positions: &Tensor, inv_freq: &Tensor) -> Result<Tensor> {
        ops::rotary(x, positions, inv_freq)
    }

    fn silu_mul(&self, x: &Tensor) -> Result<Tensor> {
        ops::silu_mul(x)
    }

    fn gelu_tanh_mul(&self, x: &Tensor) -> Result<Tensor> {
        ops::gelu_tanh_mul(x)
    }

    fn scale(&self, x: &Tensor, factor: f32) -> Result<Tensor> {
        ops::map(x, "scale", |v| v * factor)
    }

    fn softcap(&self, x: &Tensor, cap: f32) -> Result<Tensor> {
        crate::check::softcap(cap)?;
        ops::map(x, "softcap", |v| cap * (v / cap).tanh())
    }

    fn embedding(&self, ids: &Tensor, table: &Tensor) -> Result<Tensor> {
        ops::embedding(ids, table)
    }

    fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        ops::add(a, b)
    }

    fn split_columns(&self, x: &Tensor, widths: &[usize]) -> Result<Vec<Tensor>> {
        ops::split_columns(x, widths)
    }

    fn gather_rows(&self, x: &Tensor, rows: &Tensor) -> Result<Tensor> {
        ops::gather_rows(x, rows)
    }

    fn topk_routing(&self, logits: &Tensor, k: usize, renormalize: bool) -> Result<Routing> {
        moe::topk_routing(logits, k, renormalize)
    }

    fn moe_experts(&self, x: &Tensor, routing: &Routing, gate_up: &Tensor, down: &Tensor) -> Result<Tensor> {
        moe::moe_experts(x, routing, gate_up, down, self.dots, None)
    }

    fn supports_expert_lora(&self) -> bool {
        true
    }

    fn moe_experts_lora(
        &self,
        x: &Tensor,
        routing: &Routing,
        gate_up: &Tensor,
        down: &Tensor,
        lora: &MoeLora<'_>,
    ) -> Result<Tensor> {
        moe::moe_experts(x, routing, gate_up, down, self.dots, Some(lora))
    }

    fn sample(&self, logits: &Tensor, rows: &[SampleRow<'_>]) -> Result<Vec<Sampled>> {
        sample::sample(logits, rows)
    }

    fn mask_logits(&self, logits: &Tensor, rows: &Tensor, masks: &Tensor) -> Result<Tensor> {
        sample::mask_logits(logits, rows, masks)
    }

    /// f32 pools, and FP8 pools widened per run of keys.
    fn supports_kv_dtype(&self, dtype: DType) -> bool {
        matches!(dtype, DType::F32 | DType::F8E4M3)
    }

    fn write_kv(
        &self,
        k: &Tensor,
        v: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        slots: &Tensor,
        scales: KvScales,
    ) -> Result<()> {
        attention::write_kv(k, v, k_cache, v_cache, slots, scales)
    }

    fn paged_attention(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        meta: &AttentionMeta,
        params: &AttentionParams,
    ) -> Result<Tensor> {
        attention::paged_attention(q, k_cache, v_cache, meta, params)
    }

    fn flash_attention(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        meta: &AttentionMeta,
        params: &AttentionParams,
    ) -> Result<Tensor> {
        flash::flash_attention(q, k_cache, v_cache, meta, params)
    }

    fn supports_recurrent(&self) -> bool {
        true
    }

    fn zero_state_slots(&self, pools: &[&Tensor], slots: &[u32]) -> Result<()> {
        recurrent::zero_state_slots(pools, slots)
    }

    fn copy_state_slots(&self, pools: &[&Tensor], pairs: &[(u32, u32)]) -> Result<()> {
        recurrent::copy_state_slots(pools, pairs)
    }

    fn causal_conv1d(&self, x: &Tensor, weight: &Tensor, state: &Tensor, batch: &RecurrentBatch<'_>) -> Result<Tensor> {
        recurrent::causal_conv1d(x, weight, state, batch)
    }

    fn gated_delta_rule(
        &self,
        qkv: &Tensor,
        a: &Tensor,
        b: &Tensor,
        rule: &DeltaRule<'_>,
        state: &Tensor,
        batch: &RecurrentBatch<'_>,
    ) -> Result<Tensor> {
        recurrent::gated_delta_rule(qkv, a, b, rule, state, batch)
    }

    fn rms_norm_gated(&self, x: &Tensor, z: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
        recurrent::rms_norm_gated(x, z, weight, eps)
    }

    fn sigmoid_mul(&self, x: &Tensor, gate: &Tensor) -> Result<Tensor> {
        recurrent::sigmoid_mul(x, gate)
    }

    fn supports_lora(&self) -> bool {
        true
    }

    fn lora_shrink(&self, x: &Tensor, lora: &LoraSlots<'_>) -> Result<Tensor> {
        lora::lora_shrink(x, lora)
    }

    fn lora_expand(&self, shrunk: &Tensor, out: Tensor, lora: &LoraSlots<'_>) -> Result<Tensor> {
        lora::lora_expand(shrunk, &out, lora)
    }

    fn lora_write_slot(&self, stack: &Tensor, slot: usize, src: &Tensor) -> Result<()> {
        lora::lora_write_slot(stack, slot, src)
    }
}
