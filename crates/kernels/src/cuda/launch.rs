//! Kernel launches: the kernels the module loads at startup, their lookup by name, the
//! `launch!` macro that binds each argument before it is pointed at, and the launch itself,
//! which lets a kernel start while the one before it finishes (programmatic dependent
//! launch) where the GPU supports it.
//!
//! Every kernel call in `cuda/` goes through `launch!`, so the one `unsafe` launch and its
//! safety argument live here.

use cudarc::driver::{CudaFunction, LaunchConfig};

use super::{CudaBackend, drv};
use crate::error::{Error, Result};

/// Every kernel of the module, looked up once at startup.
pub(super) const KERNELS: &[&str] = &[
    "cast_bf16_f32",
    "cast_f32_bf16",
    "add_bf16",
    "random_uniform_bf16",
    "rms_norm_bf16",
    "rms_norm_bf16_wf32",
    "add_rms_norm_bf16",
    "add_rms_norm_bf16_wf32",
    "rms_norm_v_bf16",
    "rms_norm_v_bf16_wf32",
    "add_rms_norm_v_bf16",
    "add_rms_norm_v_bf16_wf32",
    "rms_norm_v_q8_bf16",
    "rms_norm_v_q8_bf16_wf32",
    "add_rms_norm_v_q8_bf16",
    "add_rms_norm_v_q8_bf16_wf32",
    "rms_norm_v_e4m3r_bf16",
    "rms_norm_v_e4m3r_bf16_wf32",
    "add_rms_norm_v_e4m3r_bf16",
    "add_rms_norm_v_e4m3r_bf16_wf32",
    "rms_norm_v_e4m3v_bf16",
    "rms_norm_v_e4m3v_bf16_wf32",
    "add_rms_norm_v_e4m3v_bf16",
    "add_rms_norm_v_e4m3v_bf16_wf32",
    "rotary_bf16",
    "silu_mul_bf16",
    "gelu_tanh_mul_bf16",
    "silu_mul_v_bf16",
    "silu_mul_e4m3r_bf16",
    "silu_mul_e4m3v_bf16",
    "gelu_tanh_mul_v_bf16",
    "scale_bf16",
    "scale_f32",
    "softcap_bf16",
    "softcap_f32",
    "gather_rows_bf16",
    "gather_rows_f32",
    "gather_u32",
    "copy_cols_bf16",
    "fill_rows_bf16",
    "add_rows_bf16",
    "write_kv_bf16",
    "write_kv_e4m3",
    "qkv_rotary_write_bf16",
    "qkv_rotary_write_bf16_nf32",
    "qkv_rotary_write_e4m3",
    "qkv_rotary_write_e4m3_nf32",
    "paged_attention_bf16",
    "paged_attention_e4m3",
    "flash_prefill_bf16_d64",
    "flash_prefill_bf16_d128",
    "flash_prefill_e4m3_d64",
    "flash_prefill_e4m3_d128",
    "flash_prefill_wg_bf16_d64",
    "flash_prefill_wg_bf16_d128",
    "flash_prefill_wg_bf16_d256",
    "flash_prefill_wg_e4m3_d64",
    "flash_prefill_wg_e4m3_d128",
    "flash_prefill_wg_e4m3_d256",
    "flash_decode_bf16_d64_w4",
    "flash_decode_bf16_d128_w4",
    "flash_decode_bf16_d64_w2",
    "flash_decode_bf16_d128_w2",
    "flash_decode_bf16_d256_w4",
    "flash_decode_bf16_d256_w2",
    "flash_decode_e4m3_d64_w4",
    "flash_decode_e4m3_d128_w4",
    "flash_decode_e4m3_d64_w2",
    "flash_decode_e4m3_d128_w2",
    "flash_decode_e4m3_d256_w4",
    "flash_decode_e4m3_d256_w2",
    "decode_attention_bf16_g1_w4",
    "decode_attention_bf16_g2_w4",
    "decode_attention_bf16_g4_w4",
    "decode_attention_bf16_g8_w4",
    "decode_attention_bf16_g1_w8",
    "decode_attention_bf16_g2_w8",
    "decode_attention_bf16_g4_w8",
    "decode_attention_e4m3_g1_w4",
    "decode_attention_e4m3_g2_w4",
    "decode_attention_e4m3_g4_w4",
    "decode_attention_e4m3_g8_w4",
    "decode_attention_e4m3_g1_w8",
    "decode_attention_e4m3_g2_w8",
    "decode_attention_e4m3_g4_w8",
    "topk_routing_bf16",
    "topk_routing_f32",
    "moe_combine_f32",
    "moe_combine_bf16",
    "moe_align",
    "moe_gemv_silu_bf16",
    "moe_gemv_bf16",
    "moe_lora_delta",
    "moe_gemm_bf16_m16",
    "moe_gemm_bf16_m16_deep",
    "moe_gemm_bf16_m32",
    "moe_gemm_bf16_m64",
    "moe_gemm_bf16_m16_unaligned",
    "sample_rows_f32",
    "sample_rows_bf16",
    "argmax_parts_f32",
    "argmax_parts_bf16",
    "argmax_merge",
    "mask_logits_f32",
    "mask_logits_bf16",
];

impl CudaBackend {
    pub(super) fn kernel(&self, name: &'static str) -> Result<&CudaFunction> {
        self.kernels.get(name).ok_or_else(|| Error::Device(format!("kernel `{name}` was not loaded")))
    }
}

/// The parameter list of one kernel launch: pointers to the argument values, in order.
#[derive(Default)]
pub(crate) struct Params {
    ptrs: [*mut std::ffi::c_void; Self::MAX],
    len: usize,
}

impl Params {
    /// More than any met kernel takes.
    const MAX: usize = 16;

    /// Appends `value`, which must stay alive (and unmoved) until the launch.
    pub(crate) fn push<T: cudarc::driver::DeviceRepr>(&mut self, value: &T) {
        assert!(self.len < Self::MAX, "a kernel launch with more than {} arguments", Self::MAX);
        self.ptrs[self.len] = std::ptr::from_ref(value).cast_mut().cast();
        self.len += 1;
    }
}

impl CudaBackend {
    /// Launches `func` on the compute stream. Where the GPU supports it (Hopper on), the
    /// launch allows programmatic dependent launch: the kernel may start while the kernel
    /// before it finishes, and every met kernel waits for its predecessor's results with
    /// `pdl_wait_prev` (see `common.cuh`) before it reads or writes anything they share, so
    /// a kernel's launch and its first weight loads overlap the previous kernel's tail.
    ///
    /// # Safety
    /// `params` must match the kernel's parameters in number, order and type, and every
    /// pointer among them must be a live allocation that holds what the kernel indexes.
    pub(super) unsafe fn launch_raw(
        &self,
        name: &'static str,
        func: &CudaFunction,
        cfg: LaunchConfig,
        params: &mut Params,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.launch_on(self.dev.stream(), name, func, cfg, params) }
    }

    /// As [`Self::launch_raw`], on the side stream ([`Device::fork`](super::device::Device::fork)).
    ///
    /// # Safety
    /// As [`Self::launch_raw`], and the pointers stay live until the side stream is joined.
    pub(super) unsafe fn launch_side_raw(
        &self,
        name: &'static str,
        func: &CudaFunction,
        cfg: LaunchConfig,
        params: &mut Params,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.launch_on(self.dev.side_stream(), name, func, cfg, params) }
    }

    /// Runs `queue` (work it puts on the compute stream), timed as `name` under
    /// `MET_KERNEL_TIMES` ([`super::timing::KernelTimes`]).
    pub(super) fn timed(&self, name: &'static str, queue: impl FnOnce() -> Result<()>) -> Result<()> {
        self.timed_on(self.dev.stream(), name, queue)
    }

    /// As [`Self::timed`], on `stream`.
    fn timed_on(
        &self,
        stream: &cudarc::driver::CudaStream,
        name: &'static str,
        queue: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        match &self.kernel_times {
            Some(times) => times.around(stream, name, queue),
            None => queue(),
        }
    }

    /// # Safety
    /// As [`Self::launch_raw`].
    unsafe fn launch_on(
        &self,
        stream: &cudarc::driver::CudaStream,
        name: &'static str,
        func: &CudaFunction,
        cfg: LaunchConfig,
        params: &mut Params,
    ) -> Result<()> {
        use cudarc::driver::sys;
        self.dev.bind()?;
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value: sys::CUlaunchAttributeValue { programmaticStreamSerializationAllowed: 1 },
        };
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: stream.cu_stream(),
            attrs: &raw mut attr,
            numAttrs: u32::from(self.pdl),
        };
        let ptrs = params.ptrs.as_mut_ptr();
        let launch = || {
            // SAFETY: `config` and `attr` outlive the call; the caller vouches for `params`.
            unsafe { sys::cuLaunchKernelEx(&raw const config, func.cu_function(), ptrs, std::ptr::null_mut()) }
                .result()
                .map_err(drv)
        };
        self.timed_on(stream, name, launch)
    }
}

/// Launch shape of a grid-stride elementwise kernel over `n` elements.
pub(super) fn elementwise(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 65_535) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

/// Launch shape of one block per row, with a multiple of 32 threads up to `max`.
pub(super) fn per_row(rows: usize, cols: usize, max: usize) -> LaunchConfig {
    let threads = (cols.div_ceil(32) * 32).clamp(32, max) as u32;
    LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 }
}

/// Launches kernel `$name` with `$cfg` and the arguments in order. Each argument is bound
/// to a local first, so the parameter list points at values that outlive the launch call.
/// `launch!(side b, ...)` launches on the side stream.
macro_rules! launch {
    (side $be:expr, $name:expr, $cfg:expr, [$($arg:expr),* $(,)?]) => {{
        let (be, name): (_, &'static str) = (&$be, $name);
        let func = be.kernel(name)?;
        let mut params = $crate::cuda::launch::Params::default();
        launch!(@push params; $($arg),*);
        // SAFETY: as below; the caller keeps every pointed-at allocation alive until the
        // side stream is joined.
        unsafe { be.launch_side_raw(name, func, $cfg, &mut params) }
    }};
    ($be:expr, $name:expr, $cfg:expr, [$($arg:expr),* $(,)?]) => {{
        let (be, name): (_, &'static str) = (&$be, $name);
        let func = be.kernel(name)?;
        let mut params = $crate::cuda::launch::Params::default();
        launch!(@push params; $($arg),*);
        // SAFETY: the arguments match the kernel's parameters in number, order and type
        // (see the `.cu` sources); every pointer is a live allocation of this device that
        // holds what the kernel indexes, as the caller's shape checks establish.
        unsafe { be.launch_raw(name, func, $cfg, &mut params) }
    }};
    (@push $p:ident; ) => {};
    (@push $p:ident; $head:expr $(, $tail:expr)*) => {
        let value = $head;
        $p.push(&value);
        launch!(@push $p; $($tail),*);
    };
}
pub(crate) use launch;
