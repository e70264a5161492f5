//! A CPU backend that records how close each token's expert choice was.
//!
//! For every `topk_routing` call it keeps, per token, the gap between the k-th and the
//! (k+1)-th largest router logit (the smallest gap over the model's MoE layers). A gap
//! within bf16's rounding of the router logits means a bf16 backend may pick another
//! expert for that token, which changes everything downstream by more than any logit
//! tolerance, so the GPU fixture test does not hold greedy steps after such a token to the
//! reference. Every other op is the CPU backend's.

use met_kernels::{
    AttentionMeta, AttentionParams, CpuBackend, DType, DeltaRule, DeviceKind, GpuBackend, HostTensor, KvScales,
    MemoryInfo, RecurrentBatch, Result, Routing, SampleRow, Sampled, Tensor,
};
use parking_lot::Mutex;

/// [`CpuBackend`] plus the router gaps of the tokens it routed.
#[derive(Debug, Default)]
pub struct RouterSpy {
    cpu: CpuBackend,
    gaps: Mutex<Vec<f32>>,
}

impl RouterSpy {
    /// Per token of the forward passes so far (rows in batch order), the smallest gap over
    /// layers; empty for a model without experts.
    pub fn gaps(&self) -> Vec<f32> {
        self.gaps.lock().clone()
    }
}

impl GpuBackend for RouterSpy {
    fn device(&self) -> DeviceKind {
        self.cpu.device()
    }
    fn float_dtype(&self) -> DType {
        self.cpu.float_dtype()
    }
    fn zeros(&self, dims: &[usize], dtype: DType) -> Result<Tensor> {
        self.cpu.zeros(dims, dtype)
    }
    fn upload(&self, host: &HostTensor<'_>, dtype: DType) -> Result<Tensor> {
        self.cpu.upload(host, dtype)
    }
    fn cast(&self, t: &Tensor, dtype: DType) -> Result<Tensor> {
        self.cpu.cast(t, dtype)
    }
    fn memory_info(&self) -> Option<MemoryInfo> {
        self.cpu.memory_info()
    }
    fn download_f32(&self, t: &Tensor) -> Result<Vec<f32>> {
        self.cpu.download_f32(t)
    }
    fn download_u32(&self, t: &Tensor) -> Result<Vec<u32>> {
        self.cpu.download_u32(t)
    }
    fn synchronize(&self) -> Result<()> {
        self.cpu.synchronize()
    }
    fn matmul(&self, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        self.cpu.matmul(x, w, bias)
    }
    fn rms_norm(&self, x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
        self.cpu.rms_norm(x, weight, eps)
    }
    fn add_rms_norm(&self, x: &Tensor, residual: &Tensor, weight: &Tensor, eps: f32) -> Result<(Tensor, Tensor)> {
        self.cpu.add_rms_norm(x, residual, weight, eps)
    }
    fn rotary(&self, x: &Tensor, positions: &Tensor, inv_freq: &Tensor) -> Result<Tensor> {
        self.cpu.rotary(x, positions, inv_freq)
    }
    fn silu_mul(&self, x: &Tensor) -> Result<Tensor> {
        self.cpu.silu_mul(x)
    }
    fn gelu_tanh_mul(&self, x: &Tensor) -> Result<Tensor> {
        self.cpu.gelu_tanh_mul(x)
    }
    fn scale(&self, x: &Tensor, factor: f32) -> Result<Tensor> {
        self.cpu.scale(x, factor)
    }
    fn softcap(&self, x: &Tensor, cap: f32) -> Result<Tensor> {
        self.cpu.softcap(x, cap)
    }
    fn embedding(&self, ids: &Tensor, table: &Tensor) -> Result<Tensor> {
        self.cpu.embedding(ids, table)
    }
    fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.cpu.add(a, b)
    }
    fn split_columns(&self, x: &Tensor, widths: &[usize]) -> Result<Vec<Tensor>> {
        self.cpu.split_columns(x, widths)
    }
    fn gather_rows(&self, x: &Tensor, rows: &Tensor) -> Result<Tensor> {
        self.cpu.gather_rows(x, rows)
    }
    fn topk_routing(&self, logits: &Tensor, k: usize, renormalize: bool) -> Result<Routing> {
        let e = logits.dims()[1];
        let rows: Vec<f32> = self
            .cpu
            .download_f32(logits)?
            .chunks_exact(e)
            .map(|row| {
                let mut sorted = row.to_vec();
                sorted.sort_by(|a, b| b.total_cmp(a));
                if k < e { sorted[k - 1] - sorted[k] } else { f32::INFINITY }
            })
            .collect();
        let mut gaps = self.gaps.lock();
        if gaps.len() == rows.len() {
            gaps.iter_mut().zip(&rows).for_each(|(g, r)| *g = g.min(*r));
        } else {
            // The first MoE layer of a new forward pass.
            *gaps = rows;
        }
        drop(gaps);
        self.cpu.topk_routing(logits, k, renormalize)
    }
    fn moe_experts(&self, x: &Tensor, routing: &Routing, gate_up: &Tensor, down: &Tensor) -> Result<Tensor> {
        self.cpu.moe_experts(x, routing, gate_up, down)
    }
    fn sample(&self, logits: &Tensor, rows: &[SampleRow<'_>]) -> Result<Vec<Sampled>> {
        self.cpu.sample(logits, rows)
    }
    fn supports_recurrent(&self) -> bool {
        self.cpu.supports_recurrent()
    }
    fn zero_state_slots(&self, pools: &[&Tensor], slots: &[u32]) -> Result<()> {
        self.cpu.zero_state_slots(pools, slots)
    }
    fn copy_state_slots(&self, pools: &[&Tensor], pairs: &[(u32, u32)]) -> Result<()> {
        self.cpu.copy_state_slots(pools, pairs)
    }
    fn causal_conv1d(&self, x: &Tensor, weight: &Tensor, state: &Tensor, batch: &RecurrentBatch<'_>) -> Result<Tensor> {
        self.cpu.causal_conv1d(x, weight, state, batch)
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
        self.cpu.gated_delta_rule(qkv, a, b, rule, state, batch)
    }
    fn rms_norm_gated(&self, x: &Tensor, z: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
        self.cpu.rms_norm_gated(x, z, weight, eps)
    }
    fn sigmoid_mul(&self, x: &Tensor, gate: &Tensor) -> Result<Tensor> {
        self.cpu.sigmoid_mul(x, gate)
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
        self.cpu.write_kv(k, v, k_cache, v_cache, slots, scales)
    }
    fn paged_attention(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        meta: &AttentionMeta,
        params: &AttentionParams,
    ) -> Result<Tensor> {
        self.cpu.paged_attention(q, k_cache, v_cache, meta, params)
    }
}
