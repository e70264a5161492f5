//! cuBLASLt's FP8 GEMM for [`super`]'s products of larger batches: one handle on the
//! device's stream with its workspace, a plan (descriptors and the heuristic's algorithm)
//! per shape, and the GEMV's split counters, which exist wherever e4m3 weights do.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublaslt::{result as lt, sys};
use parking_lot::Mutex;

use super::COUNTERS;
use crate::cuda::device::{Device, DeviceBuffer};
use crate::error::{Error, Result, ensure};

/// cuBLASLt's workspace.
const WORKSPACE: usize = 32 << 20;

/// One FP8 GEMM through cuBLASLt: `out [m, n] = (x · sx) · (w · sw)ᵀ (+ bias)`.
pub(super) struct LtGemm {
    pub(super) w: u64,
    pub(super) w_scales: u64,
    pub(super) x: u64,
    pub(super) x_scales: u64,
    pub(super) out: u64,
    pub(super) bias: u64,
    pub(super) n: usize,
    pub(super) m: usize,
    pub(super) k: usize,
    /// Block scales (128 x 128 weights, 128-element activation vectors) rather than outer
    /// vectors (one scale a weight row and a token).
    pub(super) block: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PlanKey {
    n: usize,
    m: usize,
    k: usize,
    block: bool,
    bias: bool,
}

/// A shape's descriptors and the algorithm cuBLASLt's heuristic chose for it.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created by `Lt::plan` and is destroyed once, here.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.d);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

/// A cuBLASLt handle with its workspace and the plans of the shapes seen, and the GEMV's
/// split counters (e4m3 weights exist only where there is an `Lt`).
pub(in crate::cuda) struct Lt {
    handle: sys::cublasLtHandle_t,
    /// `u32 [COUNTERS]`, zero between products: the GEMV's split counters.
    pub(super) counters: DeviceBuffer,
    _workspace: DeviceBuffer,
    workspace: u64,
    stream: sys::cudaStream_t,
    plans: Mutex<HashMap<PlanKey, Plan>>,
}

// SAFETY: the handle and the plans' descriptors are used under the `plans` mutex only
// (`Lt::gemm`), one thread at a time, as cuBLASLt allows.
unsafe impl Send for Lt {}
// SAFETY: as above.
unsafe impl Sync for Lt {}

impl Drop for Lt {
    fn drop(&mut self) {
        self.plans.lock().clear();
        // SAFETY: created in `Lt::new`, destroyed once, after its plans.
        unsafe {
            let _ = lt::destroy_handle(self.handle);
        }
    }
}

fn lt_err(what: &str) -> impl Fn(cudarc::cublaslt::result::CublasError) -> Error + '_ {
    move |e| Error::Device(format!("cuBLASLt {what}: {e:?}"))
}

/// Sets one attribute of a matmul descriptor from a plain value.
///
/// # Safety
/// `desc` is a live descriptor and `T` the attribute's type.
unsafe fn set<T>(desc: sys::cublasLtMatmulDesc_t, attr: sys::cublasLtMatmulDescAttributes_t, value: T) -> Result<()> {
    // SAFETY: per the function's contract; the value lives across the call.
    unsafe { lt::set_matmul_desc_attribute(desc, attr, (&raw const value).cast::<c_void>(), size_of::<T>()) }
        .map_err(lt_err("attribute"))
}

/// Sets `g`'s scale and bias pointers on `desc`.
///
/// # Safety
/// `desc` is a live descriptor.
unsafe fn set_pointers(desc: sys::cublasLtMatmulDesc_t, g: &LtGemm) -> Result<()> {
    use sys::cublasLtMatmulDescAttributes_t as A;
    // SAFETY: per the function's contract; pointer attributes take a pointer value.
    unsafe {
        set(desc, A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, g.w_scales as *const c_void)?;
        set(desc, A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, g.x_scales as *const c_void)?;
        if g.bias != 0 {
            set(desc, A::CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias as *const c_void)?;
        }
    }
    Ok(())
}

impl Lt {
    /// A handle on `device`'s stream, or `None` where cuBLASLt cannot run FP8 block-scaled
    /// products (no library, a version before 12.9, a GPU before Hopper): e4m3 weights are
    /// then widened at upload.
    pub(in crate::cuda) fn new(device: &Arc<Device>) -> Result<Option<Self>> {
        // SAFETY: only tries to open the shared library.
        if device.capability.0 < 9 || !unsafe { sys::is_culib_present() } {
            return Ok(None);
        }
        // SAFETY: a query without arguments.
        if unsafe { sys::cublasLtGetVersion() } < 120_900 {
            return Ok(None);
        }
        device.bind()?;
        let handle = lt::create_handle().map_err(lt_err("handle"))?;
        let workspace_buf = device.alloc(WORKSPACE)?;
        let counters = device.alloc(COUNTERS * 4)?;
        device.zero(&counters, COUNTERS * 4)?;
        Ok(Some(Self {
            handle,
            counters,
            workspace: workspace_buf.ptr(),
            _workspace: workspace_buf,
            stream: device.stream().cu_stream() as sys::cudaStream_t,
            plans: Mutex::new(HashMap::new()),
        }))
    }

    /// The plan of `key`, its descriptor holding `g`'s pointers: cuBLASLt's heuristic
    /// refuses vector and block scale modes without their scale pointers.
    fn plan(&self, key: PlanKey, g: &LtGemm) -> Result<Plan> {
        use sys::cublasLtMatmulDescAttributes_t as A;
        use sys::cublasLtMatmulMatrixScale_t as S;
        let e4m3 = sys::cudaDataType::CUDA_R_8F_E4M3;
        let desc = lt::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType::CUDA_R_32F)
            .map_err(lt_err("matmul descriptor"))?;
        // Owned from here: dropping the plan destroys what was created (a null layout's
        // destruction fails harmlessly).
        let mut plan = Plan {
            desc,
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
            algo: sys::cublasLtMatmulAlgo_t { data: [0; 8] },
        };
        let layout = |ty, rows: usize, cols: usize, ld: usize| {
            lt::create_matrix_layout(ty, rows as u64, cols as u64, ld as i64).map_err(lt_err("layout"))
        };
        let (a_mode, b_mode) = if key.block {
            (S::CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, S::CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F)
        } else {
            (S::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, S::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F)
        };
        let epilogue = if key.bias {
            sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS
        } else {
            sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT
        };
        // SAFETY: `desc` is live (owned by `plan`); each value has its attribute's type
        // (int32 enums, a uint32 epilogue).
        unsafe {
            set(desc, A::CUBLASLT_MATMUL_DESC_TRANSA, cublasOperation_t::CUBLAS_OP_T as i32)?;
            set(desc, A::CUBLASLT_MATMUL_DESC_TRANSB, cublasOperation_t::CUBLAS_OP_N as i32)?;
            set(desc, A::CUBLASLT_MATMUL_DESC_A_SCALE_MODE, a_mode as i32)?;
            set(desc, A::CUBLASLT_MATMUL_DESC_B_SCALE_MODE, b_mode as i32)?;
            set(desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue as u32)?;
            if key.bias {
                set(desc, A::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, sys::cudaDataType::CUDA_R_16BF as i32)?;
            }
            set_pointers(desc, g)?;
        }
        // Column-major: A = w as [k, n] read transposed, B = x as [k, m], D = out as [n, m].
        plan.a = layout(e4m3, key.k, key.n, key.k)?;
        plan.b = layout(e4m3, key.k, key.m, key.k)?;
        plan.d = layout(sys::cudaDataType::CUDA_R_16BF, key.n, key.m, key.n)?;
        let pref = lt::create_matmul_pref().map_err(lt_err("preference"))?;
        let max = WORKSPACE as u64;
        // SAFETY: `pref` and the plan's descriptors are live; the attribute is a uint64.
        let heuristic = unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&raw const max).cast(),
                size_of::<u64>(),
            )
            .map_err(lt_err("preference"))
            .and_then(|()| {
                lt::get_matmul_algo_heuristic(self.handle, plan.desc, plan.a, plan.b, plan.d, plan.d, pref).map_err(
                    |e| {
                        Error::Device(format!(
                            "cuBLASLt has no FP8 algorithm for [{}, {}] x [{}, {}]^T ({} scales): {e:?}",
                            key.m,
                            key.k,
                            key.n,
                            key.k,
                            if key.block { "block" } else { "row" }
                        ))
                    },
                )
            })
        };
        // SAFETY: created above, destroyed once.
        unsafe {
            let _ = lt::destroy_matmul_pref(pref);
        }
        plan.algo = heuristic?.algo;
        Ok(plan)
    }

    pub(super) fn gemm(&self, device: &Device, g: &LtGemm) -> Result<()> {
        ensure(g.m > 0 && g.m.is_multiple_of(8) && g.n.is_multiple_of(16), "fp8 gemm", || {
            format!("[{}, {}] x [{}, {}]^T: cuBLASLt takes rows in eights", g.m, g.k, g.n, g.k)
        })?;
        let key = PlanKey { n: g.n, m: g.m, k: g.k, block: g.block, bias: g.bias != 0 };
        device.bind()?;
        let mut plans = self.plans.lock();
        let plan = match plans.entry(key) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(self.plan(key, g)?),
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the plan's descriptors are live and used under the lock; every pointer is
        // a live device allocation of the size its layout says (checked by the callers'
        // shapes), the scale pointers 16-byte aligned (pool allocations are 256-aligned).
        unsafe {
            set_pointers(plan.desc, g)?;
            lt::matmul(
                self.handle,
                plan.desc,
                (&raw const alpha).cast(),
                (&raw const beta).cast(),
                g.w as *const c_void,
                plan.a,
                g.x as *const c_void,
                plan.b,
                g.out as *const c_void,
                plan.d,
                g.out as *mut c_void,
                plan.d,
                &raw const plan.algo,
                self.workspace as *mut c_void,
                WORKSPACE,
                self.stream,
            )
        }
        .map_err(lt_err("FP8 matmul"))
    }
}
