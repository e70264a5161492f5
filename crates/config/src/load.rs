//! `LoadConfig`: which model startup loads, from where, onto which devices and kernels
//! (startup phases 1 to 5), and the closed sets it chooses from.

use crate::engine::InvalidSetting;
use crate::named::named_enum;

named_enum! {
    /// Which device to run on.
    pub enum DeviceKind ("device", default Auto) {
        /// CUDA when it was compiled in and a GPU opens, else the CPU.
        Auto = "auto",
        /// The multithreaded CPU backend.
        Cpu = "cpu",
        /// An NVIDIA GPU through CUDA (needs the `cuda` feature at build time).
        Cuda = "cuda",
    }
}

named_enum! {
    /// How products with quantised weights take their activations: the CPU's packed GGUF
    /// blocks, and CUDA's Q4_K and Q6_K GEMV (decode steps of up to 8 rows).
    pub enum QuantDots ("quantized dot products", default Exact) {
        /// f32 products of the exact weights and activations: the reference the equivalence
        /// tests use.
        Exact = "exact",
        /// Integer products with activations quantised to 8 bits per 32-element block, as
        /// llama.cpp's q8 dots (on its CPU and CUDA alike): faster decode; a greedy pick can
        /// change where the top two tokens are within the quantisation noise.
        Int8 = "int8",
    }
}

impl QuantDots {
    /// What `--quant-dots` runs with unless told otherwise: the integer dots, which decode
    /// faster. Tests of what users get (batch invariance among them) read it from here, so
    /// they follow the command line if it ever changes. On the CPU both settings give every
    /// row the same bits whatever rows share its step (on CUDA only `--batch-invariant`
    /// promises that, and it takes no GEMV).
    pub const CLI_DEFAULT: Self = Self::Int8;
}

named_enum! {
    /// Which attention kernels a model runs.
    pub enum AttentionBackendKind ("attention backend", default Flash) {
        /// The device's fastest kernels.
        Flash = "flash",
        /// The reference paged-attention kernels.
        Paged = "paged",
    }
}

named_enum! {
    /// The KV cache's element type.
    pub enum KvCacheDtype ("KV cache dtype", default Auto) {
        /// The model's float type (f32 on the CPU, bf16 on CUDA).
        Auto = "auto",
        /// float8 e4m3, each layer's keys and values under the checkpoint's scales (1.0 where
        /// it has none): a quarter of the CPU's f32 bytes, half of bf16's.
        Fp8 = "fp8",
        /// The same as `fp8`.
        Fp8E4m3 = "fp8_e4m3",
    }
}

impl KvCacheDtype {
    /// Whether the cache holds e4m3 bytes.
    pub const fn is_fp8(self) -> bool {
        matches!(self, Self::Fp8 | Self::Fp8E4m3)
    }
}

named_enum! {
    /// Where weights come from.
    pub enum LoadFormat ("load format", default Auto) {
        /// The checkpoint's files (safetensors, or the GGUF file).
        Auto = "auto",
        /// Seeded random weights shaped by `config.json` alone (for benchmarks): under a
        /// `quantization_config`, float8 with their scales where a checkpoint has them.
        Dummy = "dummy",
        /// Seeded random weights in the blocks a Q4_K_M GGUF file holds (Q4_K, with half
        /// the attention v and MLP down projections and the head in Q6_K).
        DummyQ4KM = "dummy-q4_k_m",
        /// Seeded random weights in the blocks of a Q8_0 GGUF file.
        DummyQ80 = "dummy-q8_0",
    }
}

/// Which model to load and how (startup phases 1 to 5).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LoadConfig {
    /// A Hugging Face directory, a `.gguf` file or a hub id in the local Hugging Face cache;
    /// `None` for the embedded default model.
    pub model: Option<String>,
    /// Where the weights come from.
    pub format: LoadFormat,
    /// Seed of [`LoadFormat::Dummy`] weights.
    pub dummy_seed: u64,
    /// A JSON object whose fields replace those of the model's configuration.
    pub hf_overrides: Option<String>,
    /// The device to run on.
    pub device: DeviceKind,
    /// The CPU's few-row quantised products.
    pub quant_dots: QuantDots,
    /// The attention kernels.
    pub attention: AttentionBackendKind,
    /// The KV cache's element type.
    pub kv_cache_dtype: KvCacheDtype,
    /// Devices the model is split across (tensor parallelism); 1 for none.
    pub tensor_parallel_size: usize,
    /// Kernels whose result for a row never depends on the rest of its step (the CPU's
    /// always are; on CUDA, slower ones than the default).
    pub batch_invariant: bool,
}

impl LoadConfig {
    /// The model at `model` (or the default one) with every other setting at its default.
    pub fn for_model(model: Option<String>) -> Self {
        Self { model, tensor_parallel_size: 1, ..Self::default() }
    }

    /// Checks the settings that cannot work for any model.
    ///
    /// # Errors
    /// A tensor-parallel size of zero.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        crate::engine::positive(&[("tensor-parallel-size", self.tensor_parallel_size)])
    }
}
