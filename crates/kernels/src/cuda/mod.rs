//! `CudaBackend`: bf16 storage, f32 accumulation, bf16 logits sampled in f32, on one NVIDIA
//! GPU.
//!
//! Built on cudarc with the driver, NVRTC and cuBLAS loaded at run time, so building needs
//! no CUDA toolkit and a binary built without a GPU runs wherever CUDA is installed.
//! Device memory comes from the driver's stream-ordered pool ([`device`]); every op runs on
//! one compute stream, so ops are ordered without events and the host waits only when it
//! downloads (the one exception, a LoRA shrink beside its base product on a side stream,
//! forks and joins with two events: [`lora`]). Kernels are CUDA C (`crates/kernels/cuda/`) compiled at startup by NVRTC
//! and cached on disk ([`compile`]); GEMMs go through cuBLAS ([`gemm`]). The Gated DeltaNet
//! ops ([`recurrent`]) keep the convolution windows in bf16 and the delta-rule states in
//! f32 pools, updated in place by one block per (sequence, value head) walking its rows.
//!
//! Index tensors uploaded from the host keep a host copy (`CudaStorage::host_u32`), so ops
//! validate ids, slots and attention metadata without reading the device; an index tensor
//! the device produced is downloaded when it must be checked.

mod arena;
mod attention;
mod chunked_delta;
mod compile;
mod device;
mod fp8;
mod gemm;
mod gemv;
mod gguf;
mod graph;
mod launch;
mod lora;
mod moe;
pub(crate) mod nccl;
mod ops;
mod recurrent;
mod sample;
mod storage;
mod timing;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};

use cudarc::driver::CudaFunction;
use half::bf16;
use parking_lot::Mutex;
use rayon::prelude::*;

use self::compile::Origin;
use self::device::{Device, DeviceBuffer};
use self::gemm::Blas;
use self::launch::{KERNELS, elementwise, launch, per_row};
use self::storage::{HOST_COPY_MAX, expect_dtype, ptr, storage};
use crate::backend::{
    AttentionMeta, AttentionParams, DeltaRule, GpuBackend, Graph, KvScales, MemoryInfo, QkvPrologue, RecurrentBatch,
    Routing, SampleRow, Sampled,
};
use crate::error::{Error, Result};
use crate::{DType, DeviceKind, HostTensor, QuantDots, Tensor};

/// Device memory of one CUDA tensor.
pub struct CudaStorage {
    buf: DeviceBuffer,
    /// For `U32` tensors uploaded from the host: the same values, for validation (dropped
    /// when the device copy is overwritten).
    host_u32: Mutex<Option<Arc<[u32]>>>,
    /// Whether the values are tokens the sampler drew on the device (or gathered from such):
    /// ids of the vocabulary, or `NO_TOKEN` for a row that could not be drawn, whose wait
    /// reports it. Ops that index with them check nothing on the host, so a step fed from
    /// the draws before it does not wait for them (cleared when the tensor is overwritten).
    drawn: AtomicBool,
    /// For an e4m3 matrix ([`fp8`]): its scales.
    fp8: Option<fp8::Fp8Scales>,
    /// For a matrix kept in GGUF blocks ([`gguf`]): its parts (`buf` is then empty).
    gguf: Option<Arc<gguf::GgufMatrix>>,
    /// For a bf16 matrix a norm wrote for a GGUF GEMV over int8 activations: its rows as
    /// int8 blocks of 32 and each block's `(d, d · Σq)`, as `gguf_quantize_q8` gives them.
    q8: Option<Box<(DeviceBuffer, DeviceBuffer)>>,
    /// For a bf16 matrix a norm wrote for cuBLASLt's FP8 products: its rows in e4m3.
    e4m3: Option<Box<fp8::E4m3Rows>>,
}

/// The CUDA backend on one GPU.
pub struct CudaBackend {
    dev: Arc<Device>,
    blas: Blas,
    /// cuBLASLt for FP8 products, where it can run them (else e4m3 weights are widened).
    lt: Option<fp8::Lt>,
    kernels: HashMap<&'static str, CudaFunction>,
    origin: Origin,
    arch: String,
    /// The deliberately wrong variant compiled in (`MET_TEST_FAULT`), if any.
    fault: Option<&'static str>,
    /// `u32 [attention::DECODE_COUNTERS]`, zeroed: the decode attention's merge tickets.
    decode_counters: DeviceBuffer,
    /// Whether launches allow programmatic dependent launch ([`Self::launch_raw`]).
    pdl: bool,
    /// The tiled kernels the `flash` op runs prefill steps on.
    tiled_prefill: attention::TiledPrefill,
    /// Whether a matrix was kept in GGUF blocks here: the norms of decode steps then write
    /// their rows' int8 form too, when GGUF GEMVs read activations as int8.
    packs_gguf: AtomicBool,
    /// The scale grids of the e4m3 matrices kept here ([`fp8::GRID_ROW`] | [`fp8::GRID_BLOCK`]):
    /// with one grid, the norms of larger batches write their rows' e4m3 form too.
    fp8_grids: AtomicU8,
    /// Rows from which a sequence takes the delta rule's chunked form
    /// ([`chunked_delta::chunked_from_env`], [`Self::with_chunked_delta_from`]).
    chunked_from: usize,
    /// The floats of the chunked form's largest scratch taken from the pool so far
    /// (`chunked_delta::hold_full_wave`).
    chunked_held: AtomicUsize,
    /// Whether every op computes a row in an order of its own, whatever its batch
    /// ([`Self::with_batch_invariance`]).
    batch_invariant: bool,
    /// Sequences a block of the fused delta rule walks ([`recurrent::seqs_per_block_from_env`]).
    gdr_seqs: Option<u32>,
    /// The kernel of one-row e4m3 products ([`fp8::OneRow::from_env`]).
    fp8_one: fp8::OneRow,
    /// Whether the GGUF GEMV of Q4_K and Q6_K parts dots int8 activations ([`Self::with_quant_dots`]).
    gguf_int8: bool,
    /// Device time by kernel, when `MET_KERNEL_TIMES=1` ([`timing::KernelTimes`]).
    kernel_times: Option<timing::KernelTimes>,
}

impl fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaBackend({})", self.describe())
    }
}

/// A driver, cuBLAS or NVRTC failure as a kernels error.
pub(crate) fn drv(e: impl fmt::Debug) -> Error {
    Error::Device(format!("CUDA: {e:?}"))
}

/// Whether the CUDA driver library can be loaded on this machine.
fn driver_present() -> bool {
    // SAFETY: only tries to open the shared library.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

impl CudaBackend {
    /// Opens GPU 0: context, stream, memory pool, cuBLAS, and the kernels (compiled by
    /// NVRTC or read from the cache under the met home).
    ///
    /// # Errors
    /// [`Error::Device`] when no CUDA driver or GPU is present, NVRTC or cuBLAS cannot be
    /// loaded, or the kernels fail to compile (with NVRTC's log).
    pub fn new() -> Result<Self> {
        Self::on_device(0)
    }

    /// [`Self::new`] on GPU `ordinal`.
    ///
    /// # Errors
    /// As [`Self::new`].
    pub fn on_device(ordinal: usize) -> Result<Self> {
        if !driver_present() {
            return Err(Error::Device("the CUDA driver (libcuda) is not installed".into()));
        }
        // SAFETY: only tries to open the shared libraries.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(Error::Device(
                "NVRTC (libnvrtc) is not installed; add the CUDA lib64 dir to the loader path".into(),
            ));
        }
        // SAFETY: as above.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(Error::Device("cuBLAS (libcublas) is not installed".into()));
        }
        let dev = Device::open(ordinal)?;
        let arch = compile::arch_for(dev.capability.0, dev.capability.1);
        let cache = met_config::met_home().map(|h| h.join("kernels"));
        let fault = compile::requested_fault()?;
        let (image, origin) = compile::kernel_image(&arch, fault, cache.as_deref())?;
        dev.bind()?;
        let module = dev.context().load_module(cudarc::nvrtc::Ptx::from_binary(image)).map_err(drv)?;
        let kernels = KERNELS
            .iter()
            .chain(&gemv::KERNELS)
            .chain(&recurrent::KERNELS)
            .chain(&chunked_delta::KERNELS)
            .chain(&lora::KERNELS)
            .chain(&fp8::KERNELS)
            .chain(&gguf::KERNELS)
            .map(|&name| Ok((name, module.load_function(name).map_err(drv)?)))
            .collect::<Result<HashMap<_, _>>>()?;
        attention::raise_shared_memory(&kernels, dev.capability)?;
        moe::raise_shared_memory(&kernels)?;
        chunked_delta::raise_shared_memory(&kernels, dev.capability)?;
        let blas = Blas::new(&dev)?;
        let lt = fp8::Lt::new(&dev)?;
        let decode_counters = dev.alloc(attention::DECODE_COUNTERS * 4)?;
        dev.zero(&decode_counters, attention::DECODE_COUNTERS * 4)?;
        // `MET_CUDA_PDL=0` launches every kernel fully serialised, to measure what the
        // overlap is worth or to rule it out when chasing a race.
        let pdl = dev.capability.0 >= 9 && std::env::var_os("MET_CUDA_PDL").is_none_or(|v| v != "0");
        let tiled_prefill = attention::TiledPrefill::for_device(dev.capability);
        Ok(Self {
            dev,
            blas,
            lt,
            kernels,
            origin,
            arch,
            fault,
            decode_counters,
            pdl,
            tiled_prefill,
            packs_gguf: AtomicBool::new(false),
            fp8_grids: AtomicU8::new(0),
            chunked_from: chunked_delta::chunked_from_env()?,
            chunked_held: AtomicUsize::new(0),
            batch_invariant: false,
            gguf_int8: false,
            fp8_one: fp8::OneRow::from_env()?,
            gdr_seqs: recurrent::seqs_per_block_from_env()?,
            kernel_times: timing::KernelTimes::from_env()?,
        })
    }

    /// Whether attention reads e4m3 KV pools here: on sm_90, whose e4m3 conversions the
    /// kernels use.
    pub(crate) fn fp8_kv(&self) -> bool {
        self.dev.capability.0 >= 9
    }

    /// This backend with sequences of `rows` rows or more on the delta rule's chunked form
    /// and shorter ones on the fused kernel (`usize::MAX`: every one fused), whatever the
    /// default: for measuring where one form overtakes the other (`cuda_delta_rule_forms`).
    #[must_use]
    pub fn with_chunked_delta_from(mut self, rows: usize) -> Self {
        self.chunked_from = rows.max(1);
        self
    }

    /// This backend with the `flash` op's prefill steps on the `mma.sync` tiles, the kernels
    /// GPUs before Hopper run, whatever the device: for testing and measuring them on Hopper.
    #[must_use]
    pub fn with_mma_sync_prefill(mut self) -> Self {
        self.tiled_prefill = attention::TiledPrefill::MmaSync;
        self
    }

    /// This backend with its quantised products' activations as `dots` says
    /// (`--quant-dots`): under [`QuantDots::Int8`] the GEMV of Q4_K and Q6_K parts (decode steps of
    /// up to 8 rows) rounds x to 8 bits a block of 32 and dots the nibbles as integers
    /// (`dp4a`), 1.7x the f32 form on a Q4_K_M 8B shape (`bench/results/device-2026-12-05b/`).
    /// [`Self::new`] keeps the exact form, the reference the op checks compare with.
    #[must_use]
    pub fn with_quant_dots(mut self, dots: QuantDots) -> Self {
        self.gguf_int8 = dots == QuantDots::Int8;
        self
    }

    /// This backend with the fused delta rule at 128 x 128 heads walking `n` sequences a
    /// block (as `MET_GDR_SEQS=n` asks; the same bits as a block a sequence), whatever the
    /// environment: for checking that walk against the other.
    #[must_use]
    pub fn with_delta_seqs_per_block(mut self, n: u32) -> Self {
        self.gdr_seqs = Some(n.max(1));
        self
    }

    /// This backend with `--batch-invariant`'s kernels: a row's products, attention and
    /// adapter deltas take the same kernels and the same order of sums whatever the other
    /// rows of its step, the step's size, its chunking or whether the row is a decode row,
    /// so a sequence's logits do not depend on its batch. Products go through the grouped
    /// GEMM's tiles at every size (no cuBLAS, no split-K, no decode GEMVs), attention
    /// through the tiled prefill kernel for decode rows too (no split-KV), LoRA through the
    /// per-row kernels. Slower: the cost is measured in `bench/results/`.
    #[must_use]
    pub fn with_batch_invariance(mut self) -> Self {
        self.batch_invariant = true;
        self
    }
}

impl GpuBackend for CudaBackend {
    fn batch_invariant(&self) -> bool {
        self.batch_invariant
    }

    fn device(&self) -> DeviceKind {
        DeviceKind::Cuda
    }

    fn float_dtype(&self) -> DType {
        DType::BF16
    }

    fn zeros(&self, dims: &[usize], dtype: DType) -> Result<Tensor> {
        if !matches!(dtype, DType::F32 | DType::BF16 | DType::U32 | DType::F8E4M3) {
            return Err(Error::DType { op: "zeros", expected: DType::BF16, got: dtype });
        }
        let n: usize = dims.iter().product();
        if dtype == DType::U32 && n <= HOST_COPY_MAX {
            return self.upload_u32(&vec![0; n], dims);
        }
        let t = self.alloc(dims, dtype)?;
        self.dev.zero(&storage("zeros", &t)?.buf, n * dtype.size_in_bytes())?;
        Ok(t)
    }

    fn upload(&self, host: &HostTensor<'_>, dtype: DType) -> Result<Tensor> {
        let dims = host.shape();
        if (host.dtype(), dtype) == (fp8::FP8, DType::BF16)
            && let Some(t) = fp8::upload(self, host)?
        {
            return Ok(t);
        }
        if dtype == DType::BF16
            && let Some(t) = gguf::upload(self, host)?
        {
            return Ok(t);
        }
        match (host.dtype(), dtype) {
            (DType::U32, DType::U32) => self.upload_u32(&host.to_u32_vec()?, dims),
            (DType::U32, _) => Err(Error::DType { op: "upload", expected: DType::U32, got: dtype }),
            (_, DType::U32) => Err(Error::DType { op: "upload", expected: DType::BF16, got: dtype }),
            (DType::BF16, DType::BF16) => {
                let t = self.alloc(dims, DType::BF16)?;
                self.dev.upload(&storage("upload", &t)?.buf, host.bytes())?;
                Ok(t)
            }
            (_, DType::BF16) => {
                let bits: Vec<u16> = host.to_f32_vec()?.par_iter().map(|&x| bf16::from_f32(x).to_bits()).collect();
                let t = self.alloc(dims, DType::BF16)?;
                self.dev.upload(&storage("upload", &t)?.buf, &bits)?;
                Ok(t)
            }
            (_, DType::F32) => {
                let t = self.alloc(dims, DType::F32)?;
                self.dev.upload(&storage("upload", &t)?.buf, &host.to_f32_vec()?)?;
                Ok(t)
            }
            (_, other) => Err(Error::DType { op: "upload", expected: DType::BF16, got: other }),
        }
    }

    fn upload_rows(&self, parts: Vec<HostTensor<'_>>, dtype: DType) -> Result<Tensor> {
        // A fused projection (q/k/v, gate/up) stays in its parts' GGUF blocks; a join of more
        // parts is a stack of experts, which the grouped GEMM reads widened (as GGUF files'
        // own 3-D expert tensors are at upload).
        if dtype == DType::BF16
            && (2..=gguf::FUSED_PARTS).contains(&parts.len())
            && let Some(t) = gguf::upload_rows(self, &parts)?
        {
            return Ok(t);
        }
        self.upload(&HostTensor::concat_rows(parts)?, dtype)
    }

    fn cast(&self, t: &Tensor, dtype: DType) -> Result<Tensor> {
        ops::cast(self, t, dtype)
    }

    fn memory_info(&self) -> Option<MemoryInfo> {
        self.dev.memory_info().ok()
    }

    fn describe(&self) -> String {
        let gib = |b: usize| b as f64 / f64::from(1 << 30);
        let memory = self
            .memory_info()
            .map(|m| format!("{:.1} GiB, {:.1} GiB free", gib(m.total), gib(m.free)))
            .unwrap_or_else(|| "memory unknown".into());
        let fault = self
            .fault
            .map(|f| format!("; DELIBERATELY WRONG KERNELS ({}={f}), for testing tests only", compile::FAULT_VAR))
            .unwrap_or_default();
        let serial = if self.pdl { "" } else { "; launches serialised" };
        let serial =
            if self.batch_invariant { format!("{serial}; batch-invariant kernels") } else { serial.to_string() };
        format!(
            "cuda:{} {} ({}, {} SMs, {memory}); {}{serial}{fault}",
            self.dev.ordinal, self.dev.name, self.arch, self.dev.multiprocessors, self.origin
        )
    }

    fn download_f32(&self, t: &Tensor) -> Result<Vec<f32>> {
        if let Some(w) = gguf::of("download_f32", t)? {
            return self.download_f32(&gguf::widen(self, &w, gguf::row_len(t), None)?);
        }
        let buf = &storage("download_f32", t)?.buf;
        if t.dtype() == fp8::FP8 && storage("download_f32", t)?.fp8.is_some() {
            return self.download_f32(&fp8::rows_bf16(self, t, None)?);
        }
        if matches!(t.dtype(), fp8::FP8 | DType::F8E4M3) {
            // An e4m3 KV pool: its bytes as they are (the scales are its layer's, not its own).
            let mut bytes = vec![0u8; t.elem_count()];
            self.dev.download(buf, &mut bytes)?;
            return Ok(bytes.into_iter().map(crate::fp8::e4m3_to_f32).collect());
        }
        let n = t.elem_count();
        match t.dtype() {
            DType::F32 => {
                let mut out = vec![0f32; n];
                self.dev.download(buf, &mut out)?;
                Ok(out)
            }
            DType::BF16 => {
                let mut bits = vec![0u16; n];
                self.dev.download(buf, &mut bits)?;
                Ok(bits.into_iter().map(|b| bf16::from_bits(b).to_f32()).collect())
            }
            other => Err(Error::DType { op: "download_f32", expected: DType::F32, got: other }),
        }
    }

    fn download_u32(&self, t: &Tensor) -> Result<Vec<u32>> {
        expect_dtype("download_u32", t, &[DType::U32])?;
        let mut out = vec![0u32; t.elem_count()];
        self.dev.download(&storage("download_u32", t)?.buf, &mut out)?;
        Ok(out)
    }

    fn synchronize(&self) -> Result<()> {
        self.dev.synchronize()
    }

    fn device_wait(&self) -> Option<std::time::Duration> {
        Some(self.dev.waited())
    }

    fn kernel_times(&self) -> Option<String> {
        let times = self.kernel_times.as_ref()?;
        times.table().unwrap_or_else(|e| Some(format!("kernel times lost: {e}")))
    }

    fn queues_work(&self) -> bool {
        true
    }

    fn supports_graphs(&self) -> bool {
        true
    }

    fn capture(&self, record: &mut dyn FnMut() -> Result<()>) -> Result<Box<dyn Graph>> {
        graph::capture(self, record)
    }

    fn write_u32(&self, dst: &Tensor, data: &[u32]) -> Result<()> {
        expect_dtype("write_u32", dst, &[DType::U32])?;
        if data.len() > dst.elem_count() {
            return Err(Error::Shape { op: "write_u32", msg: format!("{} values into {:?}", data.len(), dst.dims()) });
        }
        let s = storage("write_u32", dst)?;
        *s.host_u32.lock() = None;
        s.drawn.store(false, Ordering::Relaxed);
        self.dev.upload(&s.buf, data)
    }

    fn write_u32_columns(&self, dst: &Tensor, data: &[u32], width: usize) -> Result<()> {
        const OP: &str = "write_u32_columns";
        expect_dtype(OP, dst, &[DType::U32])?;
        let (rows, cols) = match dst.dims() {
            &[rows, cols] => (rows, cols),
            d => return Err(Error::Shape { op: OP, msg: format!("{d:?} is not a matrix") }),
        };
        if width > cols || data.len() != rows * width {
            let msg = format!("{} values in rows of {width} into {:?}", data.len(), dst.dims());
            return Err(Error::Shape { op: OP, msg });
        }
        let s = storage(OP, dst)?;
        *s.host_u32.lock() = None;
        s.drawn.store(false, Ordering::Relaxed);
        self.dev.upload_columns(&s.buf, cols, data, width)
    }

    fn copy_into(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        if src.dtype() != dst.dtype() || src.elem_count() != dst.elem_count() {
            return Err(Error::Shape { op: "copy_into", msg: format!("{src:?} into {dst:?}") });
        }
        let bytes = src.elem_count() * src.dtype().size_in_bytes();
        let d = storage("copy_into", dst)?;
        *d.host_u32.lock() = None;
        d.drawn.store(false, Ordering::Relaxed);
        self.dev.copy(&storage("copy_into", src)?.buf, &d.buf, bytes)
    }

    fn copy_rows(&self, x: &Tensor, rows: usize) -> Result<Tensor> {
        let d = x.dims();
        if d.len() != 2 || rows > d[0] {
            return Err(Error::Shape { op: "copy_rows", msg: format!("{rows} rows of {d:?}") });
        }
        let out = self.alloc(&[rows, d[1]], x.dtype())?;
        let bytes = rows * d[1] * x.dtype().size_in_bytes();
        self.dev.copy(&storage("copy_rows", x)?.buf, &storage("copy_rows", &out)?.buf, bytes)?;
        Ok(out)
    }

    fn matmul(&self, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        ops::matmul(self, x, w, bias)
    }

    fn rms_norm(&self, x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
        ops::rms_norm(self, x, weight, eps)
    }

    fn add_rms_norm(&self, x: &Tensor, residual: &Tensor, weight: &Tensor, eps: f32) -> Result<(Tensor, Tensor)> {
        ops::add_rms_norm(self, x, residual, weight, eps)
    }

    fn rotary(&self, x: &Tensor, positions: &Tensor, inv_freq: &Tensor) -> Result<Tensor> {
        ops::rotary(self, x, positions, inv_freq)
    }

    fn silu_mul(&self, x: &Tensor) -> Result<Tensor> {
        ops::silu_mul(self, x)
    }

    fn gelu_tanh_mul(&self, x: &Tensor) -> Result<Tensor> {
        ops::gelu_tanh_mul(self, x)
    }

    fn scale(&self, x: &Tensor, factor: f32) -> Result<Tensor> {
        ops::scale(self, x, factor)
    }

    fn softcap(&self, x: &Tensor, cap: f32) -> Result<Tensor> {
        ops::softcap(self, x, cap)
    }

    fn matmul_silu_mul(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        ops::matmul_silu_mul(self, x, w)
    }

    fn qkv_rotary_write(
        &self,
        qkv: &Tensor,
        p: &QkvPrologue<'_>,
        k_cache: &Tensor,
        v_cache: &Tensor,
        slots: &Tensor,
    ) -> Result<Tensor> {
        attention::qkv_rotary_write(self, qkv, p, k_cache, v_cache, slots)
    }

    fn embedding(&self, ids: &Tensor, table: &Tensor) -> Result<Tensor> {
        ops::embedding(self, ids, table)
    }

    fn random_uniform(&self, dims: &[usize], runs: &[crate::UniformRun]) -> Result<Tensor> {
        ops::random_uniform(self, dims, runs)
    }

    fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        ops::add(self, a, b)
    }

    fn split_columns(&self, x: &Tensor, widths: &[usize]) -> Result<Vec<Tensor>> {
        ops::split_columns(self, x, widths)
    }

    fn gather_rows(&self, x: &Tensor, rows: &Tensor) -> Result<Tensor> {
        ops::gather_rows(self, x, rows)
    }

    fn topk_routing(&self, logits: &Tensor, k: usize, renormalize: bool) -> Result<Routing> {
        moe::topk_routing(self, logits, k, renormalize)
    }

    fn moe_experts(&self, x: &Tensor, routing: &Routing, gate_up: &Tensor, down: &Tensor) -> Result<Tensor> {
        moe::moe_experts(self, x, routing, (gate_up, down), None, None)
    }

    fn supports_expert_lora(&self) -> bool {
        true
    }

    fn expert_lora_table(&self, slots: usize) -> Result<Option<Tensor>> {
        Ok(Some(self.zeros(&[slots, moe::TABLE_WORDS], DType::U32)?))
    }

    fn write_expert_lora_table(
        &self,
        table: &Tensor,
        slot: usize,
        delta: Option<&crate::ExpertDelta<'_>>,
    ) -> Result<()> {
        let entry = moe::table_entry(delta)?;
        let src = self.upload(&HostTensor::from_u32(&entry, &[moe::TABLE_WORDS]), DType::U32)?;
        lora::lora_write_slot(self, table, slot, &src)
    }

    fn moe_experts_lora(
        &self,
        x: &Tensor,
        routing: &Routing,
        gate_up: &Tensor,
        down: &Tensor,
        lora: &crate::MoeLora<'_>,
    ) -> Result<Tensor> {
        moe::moe_experts(self, x, routing, (gate_up, down), Some(lora), None)
    }

    fn moe_experts_shared(
        &self,
        x: &Tensor,
        routing: &Routing,
        weights: (&Tensor, &Tensor),
        lora: Option<&crate::MoeLora<'_>>,
        shared: (&Tensor, &Tensor),
    ) -> Result<Tensor> {
        moe::moe_experts(self, x, routing, weights, lora, Some((shared.0, moe::Gate::Values(shared.1))))
    }

    fn moe_experts_shared_gate_weight(
        &self,
        x: &Tensor,
        routing: &Routing,
        weights: (&Tensor, &Tensor),
        lora: Option<&crate::MoeLora<'_>>,
        (shared, gate_weight): (&Tensor, &Tensor),
    ) -> Result<Tensor> {
        crate::check::moe(x, routing, weights.0, weights.1)?;
        if moe::gate_in_combine(self, x, gate_weight) {
            return moe::moe_experts(self, x, routing, weights, lora, Some((shared, moe::Gate::Weight(gate_weight))));
        }
        let gate = ops::matmul(self, x, gate_weight, None)?;
        moe::moe_experts(self, x, routing, weights, lora, Some((shared, moe::Gate::Values(&gate))))
    }

    fn sample(&self, logits: &Tensor, rows: &[SampleRow<'_>]) -> Result<Vec<Sampled>> {
        sample::sample(self, logits, rows)
    }

    fn sample_later(&self, logits: &Tensor, rows: &[SampleRow<'_>]) -> Result<crate::LaterSample> {
        sample::sample_later(self, logits, rows)
    }

    fn gather_u32(&self, src: &Tensor, rows: &[u32]) -> Result<Tensor> {
        ops::gather_u32(self, src, rows)
    }

    fn mask_logits(&self, logits: &Tensor, rows: &Tensor, masks: &Tensor) -> Result<Tensor> {
        sample::mask_logits(self, logits, rows, masks)
    }

    /// bf16 pools, and e4m3 ones on sm_90 ([`CudaBackend::fp8_kv`]).
    fn supports_kv_dtype(&self, dtype: DType) -> bool {
        dtype == DType::BF16 || (dtype == DType::F8E4M3 && self.fp8_kv())
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
        attention::write_kv(self, (k, v), (k_cache, v_cache), slots, scales)
    }

    fn paged_attention(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        meta: &AttentionMeta,
        params: &AttentionParams,
    ) -> Result<Tensor> {
        attention::paged_attention(self, q, k_cache, v_cache, meta, params)
    }

    fn flash_attention(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        meta: &AttentionMeta,
        params: &AttentionParams,
    ) -> Result<Tensor> {
        attention::flash_attention(self, q, k_cache, v_cache, meta, params)
    }

    fn supports_recurrent(&self) -> bool {
        true
    }

    fn zero_state_slots(&self, pools: &[&Tensor], slots: &[u32]) -> Result<()> {
        recurrent::zero_state_slots(self, pools, slots)
    }

    fn copy_state_slots(&self, pools: &[&Tensor], pairs: &[(u32, u32)]) -> Result<()> {
        recurrent::copy_state_slots(self, pools, pairs)
    }

    fn causal_conv1d(&self, x: &Tensor, weight: &Tensor, state: &Tensor, batch: &RecurrentBatch<'_>) -> Result<Tensor> {
        recurrent::causal_conv1d(self, x, weight, state, batch)
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
        recurrent::gated_delta_rule(self, (qkv, a, b), rule, state, batch)
    }

    fn rms_norm_gated(&self, x: &Tensor, z: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
        recurrent::rms_norm_gated(self, x, z, weight, eps)
    }

    fn sigmoid_mul(&self, x: &Tensor, gate: &Tensor) -> Result<Tensor> {
        recurrent::sigmoid_mul(self, x, gate, None)
    }

    fn sigmoid_mul_add(&self, x: &Tensor, gate: &Tensor, y: &Tensor) -> Result<Tensor> {
        recurrent::sigmoid_mul(self, x, gate, Some(y))
    }

    fn supports_lora(&self) -> bool {
        true
    }

    fn lora_shrink(&self, x: &Tensor, lora: &crate::LoraSlots<'_>) -> Result<Tensor> {
        lora::lora_shrink(self, x, lora)
    }

    fn lora_expand(&self, shrunk: &Tensor, out: Tensor, lora: &crate::LoraSlots<'_>) -> Result<Tensor> {
        lora::lora_expand(self, shrunk, out, lora)
    }

    fn lora_write_slot(&self, stack: &Tensor, slot: usize, src: &Tensor) -> Result<()> {
        lora::lora_write_slot(self, stack, slot, src)
    }
}
