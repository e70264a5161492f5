//! The `GpuBackend` trait: one device, its memory, and the op set of a decoder-only
//! transformer.
//!
//! Ops take tensors on this backend and return new ones (backends pool their memory, so
//! allocation per op is cheap); only [`GpuBackend::write_kv`], the state-slot ops and the
//! LoRA ops write into an existing tensor. Shapes use `t` for tokens of the flat batch, `h` for heads, `d` for head dim.

pub(crate) mod lora;
mod operands;
mod recurrent;

use std::fmt::Debug;

pub use self::lora::{
    ExpertAdapter, ExpertDelta, ExpertTables, LORA_MAX_PARTS, LoraSlots, LoraStack, MoeLora, NO_LORA_SLOT,
    lora_row_groups,
};
pub use self::operands::{
    AttentionMeta, AttentionParams, DraftToken, KvScales, LaterSample, MemoryInfo, QkvPrologue, Routing, SampleRow,
    Sampled, UniformRun,
};
pub use self::recurrent::{DeltaRule, NO_STATE_SLOT, RecurrentBatch, StateSnapshot};
use crate::{DType, DeviceKind, HostTensor, Result, Tensor};

/// A recorded sequence of ops, replayed by [`Graph::replay`] on the backend that captured it.
///
/// A replay runs the captured ops on the tensors they were recorded with: inputs change by
/// writing new contents into those tensors ([`GpuBackend::write_u32`]) before the replay,
/// results are read from the tensors the recording wrote ([`GpuBackend::copy_into`]).
pub trait Graph: Send + Sync {
    /// Queues one run of the graph, in order with the backend's other work.
    ///
    /// # Errors
    /// When the device rejects the launch.
    fn replay(&self) -> Result<()>;
}

/// A compute device for transformer inference.
///
/// Implementations hold their own memory pool and stream; calls on one backend are
/// ordered. Each op validates shapes and dtypes and returns an error rather than
/// panicking on a bad operand.
pub trait GpuBackend: Send + Sync + Debug {
    /// The kind of device it is (`Cpu` or `Cuda`, never `Auto`), for choices that depend on
    /// the device.
    fn device(&self) -> DeviceKind;

    /// Short device name: `cpu`, `cuda`.
    fn name(&self) -> &'static str {
        self.device().name()
    }

    /// The element type this backend stores float tensors in (weights, activations, KV).
    /// Logits and routing weights are always f32.
    fn float_dtype(&self) -> DType;

    /// Whether a row's results never depend on the other rows of its step (their number,
    /// the step's chunking, decode or prefill): the CPU's kernels always are; CUDA's under
    /// `--batch-invariant` (`CudaBackend::with_batch_invariance`).
    fn batch_invariant(&self) -> bool {
        false
    }

    // --- memory -------------------------------------------------------------------------

    /// A tensor of zeros.
    ///
    /// # Errors
    /// When the device is out of memory.
    fn zeros(&self, dims: &[usize], dtype: DType) -> Result<Tensor>;

    /// Copies a host tensor to the device, stored as `dtype`: `U32` for index data, and
    /// for float or quantised data either `F32` or [`Self::float_dtype`] (weights take the
    /// latter, values that need full precision such as rotary frequencies the former). A
    /// backend that computes with quantised blocks directly may keep a quantised matrix in
    /// its blocks (the tensor's dtype then says so); otherwise it is dequantised.
    ///
    /// # Errors
    /// [`crate::Error::DType`] for a dtype the backend cannot store this data as; when the
    /// device is out of memory.
    fn upload(&self, host: &HostTensor<'_>, dtype: DType) -> Result<Tensor>;

    /// `parts` joined along dim 0 as one tensor (a fused q/k/v or gate/up projection, or
    /// stacked experts), uploaded as [`Self::upload`] would upload their join
    /// ([`HostTensor::concat_rows`]: parts of different dtypes widened to f32). A backend
    /// that keeps quantised matrices may keep each part's format instead, so a fusion of
    /// parts in different formats costs no more than the parts.
    ///
    /// # Errors
    /// As [`HostTensor::concat_rows`] and [`Self::upload`].
    fn upload_rows(&self, parts: Vec<HostTensor<'_>>, dtype: DType) -> Result<Tensor> {
        self.upload(&HostTensor::concat_rows(parts)?, dtype)
    }

    /// A float tensor of `dims` ([`Self::float_dtype`]) made of `runs` back to back, each
    /// rounded once to the float dtype: random weights without a host round trip (dummy
    /// checkpoints). The default generates on the host and uploads; a device backend
    /// generates in place.
    ///
    /// # Errors
    /// When the runs' lengths do not add up to the element count; out of memory.
    fn random_uniform(&self, dims: &[usize], runs: &[UniformRun]) -> Result<Tensor> {
        crate::check::uniform_runs(dims, runs)?;
        let mut data = Vec::with_capacity(dims.iter().product());
        for run in runs {
            data.extend(run.host_values());
        }
        self.upload(&HostTensor::from_f32(&data, dims), self.float_dtype())
    }

    /// A copy of the float tensor `t` in `dtype` (`F32` or [`Self::float_dtype`]).
    ///
    /// # Errors
    /// For a non-float source or target.
    fn cast(&self, t: &Tensor, dtype: DType) -> Result<Tensor>;

    /// Free and total device memory in bytes, for devices with memory of their own.
    fn memory_info(&self) -> Option<MemoryInfo> {
        None
    }

    /// A line describing the device for startup logs (name, capability, memory).
    fn describe(&self) -> String {
        self.name().to_string()
    }

    /// Copies a float tensor to the host as f32.
    ///
    /// # Errors
    /// For a `U32` tensor or a tensor of another device.
    fn download_f32(&self, t: &Tensor) -> Result<Vec<f32>>;

    /// Copies a `U32` tensor to the host.
    ///
    /// # Errors
    /// For a float tensor or a tensor of another device.
    fn download_u32(&self, t: &Tensor) -> Result<Vec<u32>>;

    /// Waits until every op issued so far has finished.
    ///
    /// # Errors
    /// When an earlier asynchronous op failed.
    fn synchronize(&self) -> Result<()>;

    /// How long the host has waited for this device so far (in downloads and
    /// synchronisations), for devices that run asynchronously: what a step spent beyond
    /// it is host time the device may have sat idle through.
    fn device_wait(&self) -> Option<std::time::Duration> {
        None
    }

    /// Where the device time of the work queued since the last call went, by kernel, as one
    /// line, for devices that time their kernels on request (CUDA under
    /// `MET_KERNEL_TIMES=1`); waits for that work. `None` when not timing.
    fn kernel_times(&self) -> Option<String> {
        None
    }

    /// Whether ops return before the device has run them, so that the host's work can
    /// overlap the device's: the engine then queues each decode step before reading the
    /// tokens of the one before ([`Self::sample_later`]).
    fn queues_work(&self) -> bool {
        false
    }

    // --- graphs -------------------------------------------------------------------------

    /// Whether [`Self::capture`] records graphs on this backend.
    fn supports_graphs(&self) -> bool {
        false
    }

    /// Runs `record` with the backend recording its ops into a [`Graph`] instead of running
    /// them. Inside, ops must not wait for the device (no download, no synchronise) and must
    /// not upload from the host; memory they allocate and free is the graph's own.
    ///
    /// # Errors
    /// [`crate::Error::Device`] on a backend without graphs, when `record` fails (the
    /// recording is discarded) or when the device rejects the graph.
    fn capture(&self, record: &mut dyn FnMut() -> Result<()>) -> Result<Box<dyn Graph>> {
        let _ = record;
        Err(crate::Error::Device(format!("the {} backend does not record graphs", self.name())))
    }

    /// Overwrites the first `data.len()` elements of the `U32` tensor `dst`, in order with
    /// the backend's other work (graph inputs).
    ///
    /// # Errors
    /// For a non-`U32` tensor or one shorter than `data`; on a backend without graphs.
    fn write_u32(&self, dst: &Tensor, data: &[u32]) -> Result<()> {
        let _ = (dst, data);
        Err(crate::Error::Device(format!("the {} backend does not write into tensors", self.name())))
    }

    /// Overwrites the first `width` columns of the `U32` matrix `dst [rows, cols]` with
    /// `data [rows, width]`, leaving the other columns as they are, in order with the
    /// backend's other work (a graph's block tables, as wide as its longest context, of
    /// which a step fills only the first columns).
    ///
    /// # Errors
    /// For a non-`U32` or non-matrix `dst`, `width > cols`, or `data` not `rows` rows of
    /// `width`; on a backend without graphs.
    fn write_u32_columns(&self, dst: &Tensor, data: &[u32], width: usize) -> Result<()> {
        let _ = (dst, data, width);
        Err(crate::Error::Device(format!("the {} backend does not write into tensors", self.name())))
    }

    /// Copies `src` into `dst`, of the same dtype and element count (graph outputs).
    ///
    /// # Errors
    /// On mismatched tensors; on a backend without graphs.
    fn copy_into(&self, src: &Tensor, dst: &Tensor) -> Result<()> {
        let _ = (src, dst);
        Err(crate::Error::Device(format!("the {} backend does not copy into tensors", self.name())))
    }

    /// A copy of the first `rows` rows of `x [m, n]`: `[rows, n]`.
    ///
    /// # Errors
    /// When `rows > m` or `x` is not 2-D.
    fn copy_rows(&self, x: &Tensor, rows: usize) -> Result<Tensor> {
        let m = x.dims().first().copied().unwrap_or(0);
        if x.dims().len() != 2 || rows > m {
            return Err(crate::Error::Shape { op: "copy_rows", msg: format!("{rows} rows of {:?}", x.dims()) });
        }
        let ids: Vec<u32> = (0..rows as u32).collect();
        self.gather_rows(x, &self.upload(&HostTensor::from_u32(&ids, &[rows]), DType::U32)?)
    }

    // --- dense ops ----------------------------------------------------------------------

    /// `x [m, k] · wᵀ` with `w [n, k]`, plus `bias [n]` when given: `[m, n]`.
    ///
    /// # Errors
    /// On mismatched inner dimensions or dtypes.
    fn matmul(&self, x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<Tensor>;

    /// RMSNorm over the last dimension: `x / sqrt(mean(x²) + eps) * weight`.
    ///
    /// `weight` is in [`Self::float_dtype`] or in `F32`. In the float dtype the normalised
    /// value is rounded to it before the weight multiplies it (transformers'
    /// `LlamaRMSNorm`); an `F32` weight multiplies the f32 normalised value and the product
    /// is rounded once (`GemmaRMSNorm`, whose `1 + w` a model folds into an f32 weight).
    /// On an f32 backend the two are the same.
    ///
    /// # Errors
    /// When `weight` does not match the last dimension of `x`.
    fn rms_norm(&self, x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor>;

    /// The residual add fused with the next RMSNorm: returns `(rms_norm(x + residual),
    /// x + residual)`, with `weight` as in [`Self::rms_norm`].
    ///
    /// # Errors
    /// On mismatched shapes.
    fn add_rms_norm(&self, x: &Tensor, residual: &Tensor, weight: &Tensor, eps: f32) -> Result<(Tensor, Tensor)>;

    /// Rotary embedding, rotate-half (GPT-NeoX) layout, on `x [t, h, d]`: the first
    /// `2 · len(inv_freq)` dims of each head rotate by `positions[t] · inv_freq[i]` (pairs
    /// `i` and `i + len(inv_freq)`); any remaining dims pass through.
    ///
    /// # Errors
    /// On mismatched lengths or a rotary width past the head dim.
    fn rotary(&self, x: &Tensor, positions: &Tensor, inv_freq: &Tensor) -> Result<Tensor>;

    /// `silu(x[:, :n]) * x[:, n:]` for `x [t, 2n]`: `[t, n]`.
    ///
    /// # Errors
    /// When the last dimension is odd.
    fn silu_mul(&self, x: &Tensor) -> Result<Tensor>;

    /// `gelu_tanh(x[:, :n]) * x[:, n:]` for `x [t, 2n]`: `[t, n]`, with PyTorch's tanh
    /// approximation `0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³)))` (`gelu_pytorch_tanh`).
    ///
    /// # Errors
    /// When the last dimension is odd.
    fn gelu_tanh_mul(&self, x: &Tensor) -> Result<Tensor>;

    /// Elementwise `x · factor`, with `factor` first rounded to the dtype of `x` (as
    /// transformers casts Gemma's embedding normaliser to the hidden dtype).
    ///
    /// # Errors
    /// For a non-float tensor.
    fn scale(&self, x: &Tensor, factor: f32) -> Result<Tensor>;

    /// Elementwise soft-capping `cap · tanh(x / cap)` of a float tensor (Gemma's final
    /// logits), computed in f32.
    ///
    /// # Errors
    /// For a non-float tensor or a cap that is not positive.
    fn softcap(&self, x: &Tensor, cap: f32) -> Result<Tensor>;

    /// `silu_mul(matmul(x, w))` for a fused gate/up weight `w [2i, k]` (gate rows first):
    /// `[m, i]`. A backend may fuse the activation into the product.
    ///
    /// # Errors
    /// As [`Self::matmul`] and [`Self::silu_mul`].
    fn matmul_silu_mul(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        self.silu_mul(&self.matmul(x, w, None)?)
    }

    /// The attention prologue of a layer: splits `qkv [t, (h + 2·h_kv)·d]` into query, key
    /// and value heads, applies the per-head RMSNorm (when `p.qk_norm` is set) and rotary to
    /// queries and keys, writes keys and values into the pools at `slots` (as
    /// [`Self::write_kv`]) and returns the queries `[t, h, d]`. A backend may fuse it into
    /// one kernel; the result is that of the separate ops.
    ///
    /// # Errors
    /// As the separate ops.
    fn qkv_rotary_write(
        &self,
        qkv: &Tensor,
        p: &QkvPrologue<'_>,
        k_cache: &Tensor,
        v_cache: &Tensor,
        slots: &Tensor,
    ) -> Result<Tensor> {
        let (h, hkv, d) = (p.num_heads, p.num_kv_heads, p.head_dim);
        let t = qkv.dims().first().copied().unwrap_or(0);
        let [q, k, v]: [Tensor; 3] = self
            .split_columns(qkv, &[h * d, hkv * d, hkv * d])?
            .try_into()
            .expect("split_columns returns one tensor per width");
        let (mut q, mut k, v) = (q.reshape(&[t, h, d])?, k.reshape(&[t, hkv, d])?, v.reshape(&[t, hkv, d])?);
        if let Some((qn, kn)) = p.qk_norm {
            q = self.rms_norm(&q, qn, p.eps)?;
            k = self.rms_norm(&k, kn, p.eps)?;
        }
        let q = self.rotary(&q, p.positions, p.inv_freq)?;
        let k = self.rotary(&k, p.positions, p.inv_freq)?;
        self.write_kv(&k, &v, k_cache, v_cache, slots, p.kv_scales)?;
        Ok(q)
    }

    /// Rows of `table [v, h]` selected by `ids u32 [t]`: `[t, h]`.
    ///
    /// # Errors
    /// [`crate::Error::InvalidArgument`] for an id `>= v`, except in ids a device backend
    /// drew itself ([`Self::sample_later`]), which are not brought back to be checked.
    fn embedding(&self, ids: &Tensor, table: &Tensor) -> Result<Tensor>;

    /// Elementwise `a + b` of equal shapes.
    ///
    /// # Errors
    /// On mismatched shapes.
    fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor>;

    /// Splits `x [m, n]` into column blocks of the given widths (summing to `n`). A part may
    /// share `x`'s memory (a one-row `x` splits into views on CUDA): ops only read their
    /// inputs, so that is the same as a copy.
    ///
    /// # Errors
    /// When the widths do not sum to `n`.
    fn split_columns(&self, x: &Tensor, widths: &[usize]) -> Result<Vec<Tensor>>;

    /// Rows of `x [m, n]` selected by `rows u32 [r]`: `[r, n]`.
    ///
    /// # Errors
    /// For a row index `>= m`.
    fn gather_rows(&self, x: &Tensor, rows: &Tensor) -> Result<Tensor>;

    // --- mixture of experts -------------------------------------------------------------

    /// Softmax over `logits [t, e]` (in f32), then the `k` largest per row; with
    /// `renormalize`, the chosen weights are divided by their sum.
    ///
    /// # Errors
    /// When `k` is 0 or exceeds `e`.
    fn topk_routing(&self, logits: &Tensor, k: usize, renormalize: bool) -> Result<Routing>;

    /// The routed expert MLPs: for each token `t` and choice `j`,
    /// `Σ_j w[t,j] · down[e] · (silu_mul(gate_up[e] · x[t]))` with `e = experts[t,j]`.
    /// `gate_up` is `[e, 2i, h]` (gate rows first), `down` is `[e, h, i]`.
    ///
    /// # Errors
    /// On mismatched shapes or an expert index past `e`.
    fn moe_experts(&self, x: &Tensor, routing: &Routing, gate_up: &Tensor, down: &Tensor) -> Result<Tensor>;

    // --- sampling -----------------------------------------------------------------------

    /// Draws one token per row from `logits [rows, vocab]`, f32 or the backend's float
    /// type, read as f32. Per row, in order: add
    /// `logit_bias`; apply the repetition (prompt and output), frequency and presence
    /// (output) penalties; ban `banned`; then greedy argmax if `temperature == 0`, else
    /// divide by the temperature, softmax, keep tokens within `min_p` of the best, the
    /// `top_k` best, and the smallest prefix reaching `top_p`, renormalise and draw with
    /// the uniform `rng(seed, step)`; a row with a [`DraftToken`] verifies it instead (the
    /// CPU backend; others may draw plainly, as its docs allow). Logprobs come from the raw
    /// logits.
    ///
    /// # Errors
    /// For a logits row out of range or logits of another dtype.
    fn sample(&self, logits: &Tensor, rows: &[SampleRow<'_>]) -> Result<Vec<Sampled>>;

    /// [`Self::sample`] without waiting for the draws: the tokens stay on the device as
    /// `u32 [rows]`, where later ops may read them (the next decode step's ids, through
    /// [`Self::gather_u32`]), while they travel to the host. A backend that runs each op as
    /// it is called draws at once, as this default does. Ids in the vocabulary, or
    /// `u32::MAX` for a row that could not be drawn (its wait reports why), so a device
    /// backend's [`Self::embedding`] of them checks nothing on the host (that would wait
    /// for the draws) and reads zeros for such a row.
    ///
    /// # Errors
    /// As [`Self::sample`], for what can be checked before the draw.
    fn sample_later(&self, logits: &Tensor, rows: &[SampleRow<'_>]) -> Result<LaterSample> {
        let sampled = self.sample(logits, rows)?;
        let ids: Vec<u32> = sampled.iter().map(|s| s.token).collect();
        let tokens = self.upload(&HostTensor::from_u32(&ids, &[ids.len()]), DType::U32)?;
        Ok(LaterSample::new(tokens, move || Ok(sampled)))
    }

    /// `u32 [r]`: element `rows[i]` of the `U32` vector `src` at `i`, read where `src` is,
    /// without a wait on a device backend (a decode step's ids from the tokens drawn by the
    /// step before, [`Self::sample_later`]). The default goes through the host.
    ///
    /// # Errors
    /// For a `src` that is not a `U32` vector, or an index past it.
    fn gather_u32(&self, src: &Tensor, rows: &[u32]) -> Result<Tensor> {
        crate::check::gather_u32(src, rows)?;
        let values = self.download_u32(src)?;
        let picked: Vec<u32> = rows.iter().map(|&r| values[r as usize]).collect();
        self.upload(&HostTensor::from_u32(&picked, &[picked.len()]), DType::U32)
    }

    /// Rows `rows u32 [r]` of `logits [n, v]` (f32, or bf16 where the backend samples bf16),
    /// each with the tokens its mask does not
    /// allow set to `-inf`: `[r, v]` f32. `masks u32 [r, ceil(v / 32)]` packs one bit per
    /// token, bit `t % 32` of word `t / 32` of row `i` allowing token `t` in result row `i`
    /// (llguidance's and the grammar engines' layout); bits past `v` are ignored. Sampling
    /// the result draws only allowed tokens (structured output), and its logprobs are those
    /// of the masked row. The default goes through the host; device backends override it.
    ///
    /// # Errors
    /// For logits of another dtype, a row index `>= n`, or masks of another shape or dtype.
    fn mask_logits(&self, logits: &Tensor, rows: &Tensor, masks: &Tensor) -> Result<Tensor> {
        let (n, v) = crate::check::token_masks(logits, rows, masks)?;
        let (rows, masks) = (self.download_u32(rows)?, self.download_u32(masks)?);
        let out = crate::check::masked_rows(&self.download_f32(logits)?, n, v, &rows, &masks)?;
        self.upload(&HostTensor::from_f32(&out, &[rows.len(), v]), DType::F32)
    }

    // --- attention ----------------------------------------------------------------------

    /// Whether this backend's attention ops read and write KV pools of `dtype`: its float
    /// dtype, and what else it has kernels for. A model refuses at load a cache dtype its
    /// backend lacks.
    fn supports_kv_dtype(&self, dtype: DType) -> bool {
        dtype == self.float_dtype()
    }

    /// Writes `k, v [t, h_kv, d]` into the paged pools `k_cache, v_cache [blocks,
    /// block_size, h_kv, d]` at the flat slots `slots u32 [t]` (`block · block_size +
    /// offset`). The only op that writes into an existing tensor. Pools of
    /// [`DType::F8E4M3`] (where the backend has them) store `k / scales.k` and
    /// `v / scales.v`, rounded to e4m3 and saturated at ±448.
    ///
    /// # Errors
    /// On mismatched shapes, a pool dtype the backend cannot write, or a slot past the pool.
    fn write_kv(
        &self,
        k: &Tensor,
        v: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        slots: &Tensor,
        scales: KvScales,
    ) -> Result<()>;

    /// Causal attention of `q [t, h, d]` over the paged cache for the varlen batch in
    /// `meta`: `[t, h, d]`. Query head `i` reads KV head `i / (h / h_kv)`.
    ///
    /// # Errors
    /// On mismatched shapes or metadata.
    fn paged_attention(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        meta: &AttentionMeta,
        params: &AttentionParams,
    ) -> Result<Tensor>;

    /// [`GpuBackend::paged_attention`]'s result by the device's fastest kernels (the
    /// `flash` attention backend): on CUDA, tensor-core tiles for prefill and split-KV
    /// passes for decode. A backend with one attention kernel keeps this default.
    ///
    /// # Errors
    /// On mismatched shapes or metadata.
    fn flash_attention(
        &self,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        meta: &AttentionMeta,
        params: &AttentionParams,
    ) -> Result<Tensor> {
        self.paged_attention(q, k_cache, v_cache, meta, params)
    }

    // --- recurrent layers ----------------------------------------------------------------

    /// Whether this backend runs the recurrent ops below (Gated DeltaNet layers). A
    /// backend without them keeps the defaults, which refuse, and hybrid models refuse to
    /// load on it.
    fn supports_recurrent(&self) -> bool {
        false
    }

    /// Zeroes slots `slots` of every state pool in `pools` (each `[slots, ...]`), so that
    /// sequences starting there begin from the zero state.
    ///
    /// # Errors
    /// On a slot past a pool; [`Error::InvalidArgument`](crate::Error::InvalidArgument)
    /// where the backend has no recurrent ops.
    fn zero_state_slots(&self, pools: &[&Tensor], slots: &[u32]) -> Result<()> {
        let _ = (pools, slots);
        Err(self.no_recurrent_ops())
    }

    /// Copies slot `from` to slot `to` in every state pool in `pools`, for each pair: a
    /// prefix-cache snapshot restored into a sequence's slot, or a fork's state.
    ///
    /// # Errors
    /// As [`Self::zero_state_slots`].
    fn copy_state_slots(&self, pools: &[&Tensor], pairs: &[(u32, u32)]) -> Result<()> {
        let _ = (pools, pairs);
        Err(self.no_recurrent_ops())
    }

    /// The causal depthwise convolution of a Gated DeltaNet layer, SiLU applied:
    /// `x [t, c]` with `weight [c, w]` (no bias) over each sequence's rows, the sequence's
    /// previous `w - 1` inputs read from `state [slots, c, w - 1]` at its slot (oldest
    /// first) and replaced by its last `w - 1` inputs. Returns `[t, c]`. Snapshots take the
    /// `w - 1` inputs up to their row.
    ///
    /// # Errors
    /// On mismatched shapes or a slot past the pool; as [`Self::zero_state_slots`].
    fn causal_conv1d(&self, x: &Tensor, weight: &Tensor, state: &Tensor, batch: &RecurrentBatch<'_>) -> Result<Tensor> {
        let _ = (x, weight, state, batch);
        Err(self.no_recurrent_ops())
    }

    /// The gated delta rule of a Gated DeltaNet layer over each sequence's rows.
    /// `qkv [t, 2·h_k·d_k + h_v·d_v]` holds queries, keys and values (the convolution's
    /// output, in that order, head-major); `a, b [t, h_v]` are the gate projections. Per
    /// row and value head `j` (key head `i = j / (h_v / h_k)`):
    /// `q, k` L2-normalised (`x · rsqrt(Σx² + 1e-6)`), `q` scaled by `d_k^-½`,
    /// `g = -exp(A_log) · softplus(a + dt_bias)`, `β = sigmoid(b)`, and with the state
    /// `S [d_k, d_v]` (f32, at the sequence's slot of `state [slots, h_v, d_k, d_v]`):
    /// `S ← e^g S;  S ← S + k ⊗ β (v − Sᵀk);  o = Sᵀq`. Returns `o [t, h_v, d_v]` in
    /// `qkv`'s dtype and leaves each sequence's final `S` in its slot. A backend may
    /// evaluate a long run of rows in the chunked (WY) form; the result is the recurrence's
    /// within rounding.
    ///
    /// # Errors
    /// On mismatched shapes or a slot past the pool; as [`Self::zero_state_slots`].
    fn gated_delta_rule(
        &self,
        qkv: &Tensor,
        a: &Tensor,
        b: &Tensor,
        rule: &DeltaRule<'_>,
        state: &Tensor,
        batch: &RecurrentBatch<'_>,
    ) -> Result<Tensor> {
        let _ = (qkv, a, b, rule, state, batch);
        Err(self.no_recurrent_ops())
    }

    /// The gated RMSNorm closing a Gated DeltaNet layer: per row of `x, z [n, d]`,
    /// `w · x / √(mean(x²) + eps) · silu(z)`, with `weight [d]` applied as is (not `1 + w`).
    ///
    /// # Errors
    /// On mismatched shapes; as [`Self::zero_state_slots`].
    fn rms_norm_gated(&self, x: &Tensor, z: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
        let _ = (x, z, weight, eps);
        Err(self.no_recurrent_ops())
    }

    /// `x · sigmoid(gate)` elementwise, for equal shapes (the output gate of gated
    /// attention), or with one gate per row, `x [t, n]` and `gate [t, 1]` (a shared
    /// expert's gate).
    ///
    /// # Errors
    /// On mismatched shapes; as [`Self::zero_state_slots`].
    fn sigmoid_mul(&self, x: &Tensor, gate: &Tensor) -> Result<Tensor> {
        let _ = (x, gate);
        Err(self.no_recurrent_ops())
    }

    /// `y + x · sigmoid(gate)`, each rounded as [`Self::sigmoid_mul`] then [`Self::add`]
    /// round (a shared expert's gated output added to the routed experts'). A backend may
    /// fuse the two; the result is theirs.
    ///
    /// # Errors
    /// As the two ops.
    fn sigmoid_mul_add(&self, x: &Tensor, gate: &Tensor, y: &Tensor) -> Result<Tensor> {
        self.add(y, &self.sigmoid_mul(x, gate)?)
    }

    // --- adapters (LoRA) ---------------------------------------------------------------

    /// Whether this backend runs [`Self::lora_shrink`], [`Self::lora_expand`] and
    /// [`Self::lora_write_slot`]. Serving with adapters is refused at startup on a backend
    /// without them.
    fn supports_lora(&self) -> bool {
        false
    }

    /// The first half of the adapters' deltas of one projection over a mixed batch:
    /// `shrunk [t, parts, r]` (f32), for each row whose slot `s = lora.rows[row]` is an
    /// adapter's and each module `p` of `lora.stacks`, `x[row] · a[s]ᵀ` with `x [t, in]`,
    /// `a [slots, r, in]`; the rows of no adapter hold anything. Call it before the
    /// projection's base product, then [`Self::lora_expand`] on that product: a backend may
    /// run the shrink beside the base product (it reads only `x`), so `x` and the stacks
    /// must stay alive and unchanged until the expansion is issued. A row's result depends
    /// on that row and its slot alone.
    ///
    /// # Errors
    /// On mismatched shapes or dtypes, more than [`LORA_MAX_PARTS`] modules, a host-known
    /// row slot past the stacks; [`Error::InvalidArgument`](crate::Error::InvalidArgument)
    /// where the backend has no LoRA ops ([`Self::supports_lora`]).
    fn lora_shrink(&self, x: &Tensor, lora: &LoraSlots<'_>) -> Result<Tensor> {
        let _ = (x, lora);
        Err(self.no_lora_ops())
    }

    /// The second half: `out [t, N]` plus, for each adapted row (slot `s`) and each module
    /// of `lora.stacks`, `scales[s] · shrunk[row, p] · b[s]ᵀ` added into
    /// `out[row, column .. column + n]`, with `b [slots, n, r]` and `shrunk` what
    /// [`Self::lora_shrink`] made for the same `lora`. Rows at [`NO_LORA_SLOT`] (or at a
    /// slot past the stacks, which a device-written slot tensor may hold) keep `out`'s
    /// values bit for bit. `out` is consumed: a backend may add into its storage and
    /// return it.
    ///
    /// # Errors
    /// As [`Self::lora_shrink`], and on columns past `N`.
    fn lora_expand(&self, shrunk: &Tensor, out: Tensor, lora: &LoraSlots<'_>) -> Result<Tensor> {
        let _ = (shrunk, out, lora);
        Err(self.no_lora_ops())
    }

    /// Both halves at once: `out` plus the adapters' deltas of `x` ([`Self::lora_shrink`],
    /// then [`Self::lora_expand`]).
    ///
    /// # Errors
    /// As the two halves.
    fn lora_shrink_expand(&self, x: &Tensor, out: Tensor, lora: &LoraSlots<'_>) -> Result<Tensor> {
        let shrunk = self.lora_shrink(x, lora)?;
        self.lora_expand(&shrunk, out, lora)
    }

    /// Overwrites slot `slot` of `stack [slots, ..]` with `src` (as many elements as a slot
    /// holds, in `stack`'s dtype), in order with the backend's other work: how an adapter's
    /// padded weights and its scale become resident.
    ///
    /// # Errors
    /// A slot past the stack or a `src` of another size or dtype; as
    /// [`Self::lora_shrink`] where the backend has no LoRA ops.
    fn lora_write_slot(&self, stack: &Tensor, slot: usize, src: &Tensor) -> Result<()> {
        let _ = (stack, slot, src);
        Err(self.no_lora_ops())
    }

    /// Whether this backend runs [`Self::moe_experts_lora`]. Adapters that change routed
    /// experts are refused when they load on a backend without it.
    fn supports_expert_lora(&self) -> bool {
        false
    }

    /// [`Self::moe_experts`] with `lora`'s adapters on the experts: a (token, choice) row of
    /// a token in slot `s` adds `scale · (x·aᵀ)·bᵀ` of its expert's `gate_up` delta to the
    /// gate/up product before the activation, and its `down` delta of the activated row to
    /// the down product before the router's weighting. A row's result depends on that row,
    /// its expert and its slot alone; rows without a delta keep the base result bit for
    /// bit.
    ///
    /// # Errors
    /// As [`Self::moe_experts`]; on deltas of the wrong shapes or dtype, a token slot past
    /// `lora.slots`; [`Error::InvalidArgument`](crate::Error::InvalidArgument) where the
    /// backend has no such op ([`Self::supports_expert_lora`]).
    fn moe_experts_lora(
        &self,
        x: &Tensor,
        routing: &Routing,
        gate_up: &Tensor,
        down: &Tensor,
        lora: &MoeLora<'_>,
    ) -> Result<Tensor> {
        let _ = (x, routing, gate_up, down, lora);
        Err(crate::Error::InvalidArgument(format!("the {} backend applies no adapters to experts yet", self.name())))
    }

    /// [`Self::moe_experts`] (or [`Self::moe_experts_lora`] with `lora`) plus a shared
    /// expert's output gated per token: `routed + shared · sigmoid(gate)`, `shared [t, h]`,
    /// `gate [t, 1]`, rounded as [`Self::sigmoid_mul_add`] rounds. A backend may add the
    /// shared expert where it combines the routed ones; the result is that of the ops apart.
    ///
    /// # Errors
    /// As the ops it stands for.
    fn moe_experts_shared(
        &self,
        x: &Tensor,
        routing: &Routing,
        (gate_up, down): (&Tensor, &Tensor),
        lora: Option<&MoeLora<'_>>,
        (shared, gate): (&Tensor, &Tensor),
    ) -> Result<Tensor> {
        let routed = match lora {
            Some(lora) => self.moe_experts_lora(x, routing, gate_up, down, lora)?,
            None => self.moe_experts(x, routing, gate_up, down)?,
        };
        self.sigmoid_mul_add(shared, gate, &routed)
    }

    /// [`Self::moe_experts_shared`] with the shared expert's gates given as the gate's weight
    /// `[1, h]`: `gate = x · weightᵀ` as [`Self::matmul`] computes it. A backend may take that
    /// product where it combines the experts; the result is that of the ops apart.
    ///
    /// # Errors
    /// As the ops it stands for.
    fn moe_experts_shared_gate_weight(
        &self,
        x: &Tensor,
        routing: &Routing,
        experts: (&Tensor, &Tensor),
        lora: Option<&MoeLora<'_>>,
        (shared, gate_weight): (&Tensor, &Tensor),
    ) -> Result<Tensor> {
        let gate = self.matmul(x, gate_weight, None)?;
        self.moe_experts_shared(x, routing, experts, lora, (shared, &gate))
    }

    /// A device table of `slots` adapters' deltas on one expert stack, all empty, for
    /// [`MoeLora::tables`]; `None` on a backend that reads [`MoeLora::slots`] alone.
    ///
    /// # Errors
    /// On device failure.
    fn expert_lora_table(&self, slots: usize) -> Result<Option<Tensor>> {
        let _ = slots;
        Ok(None)
    }

    /// Writes slot `slot` of a table [`Self::expert_lora_table`] made: `delta`, or empty.
    /// Queued behind every step already issued, as slot writes are.
    ///
    /// # Errors
    /// A slot past the table; device failures.
    fn write_expert_lora_table(&self, table: &Tensor, slot: usize, delta: Option<&ExpertDelta<'_>>) -> Result<()> {
        let _ = (table, slot, delta);
        Err(crate::Error::InvalidArgument(format!("the {} backend keeps no expert tables", self.name())))
    }

    /// The error of a LoRA op on a backend without them.
    #[doc(hidden)]
    fn no_lora_ops(&self) -> crate::Error {
        crate::Error::InvalidArgument(format!("the {} backend cannot apply LoRA adapters yet", self.name()))
    }

    /// The error of a recurrent op on a backend without them.
    #[doc(hidden)]
    fn no_recurrent_ops(&self) -> crate::Error {
        crate::Error::InvalidArgument(format!("the {} backend has no recurrent (linear-attention) ops", self.name()))
    }
}
