//! A GGUF of K-quants (Q4_K, Q5_K, Q6_K) on the CPU: packed at load, it gives the logits
//! of the same model with every weight dequantised to f32.
//!
//! The fixture `tests/fixtures/kquant/qwen3_q4_k_m.gguf` is a two-layer Qwen3 of Gaussian
//! weights quantised in llama.cpp's Q4_K_M mix (Q6_K for the tied embedding and the second
//! layer's `attn_v` and `ffn_down`), with Q5_K in the second layer's other matrices
//! (`scripts/synthetic_q4km_gguf.py` says how to regenerate it). With exact dots the
//! packed model computes with exactly the dequantised values through the same f32 row
//! products, so its logits equal the f32 model's bit for bit. With the default integer
//! dots each activation block is rounded to 8 bits, which moves the logits by a measured
//! amount ([`INT8_BOUND`]); and since only packed weights have integer dots, their
//! differing from the exact logits shows the K-quant matrices were packed.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use met_cache::{DEFAULT_BLOCK_SIZE, KvCache, PagedKvCache};
use met_kernels::quant::QuantFormat;
use met_kernels::{CpuBackend, DType, GpuBackend, HostTensor, QuantDots};
use met_model_layers::models::{gguf_config, open_gguf};
use met_model_layers::{ForwardBatch, LoadOptions, LogitRows, load_model};
use met_model_weights::{GgufStore, TensorInfo, WeightError, WeightStore};

/// Largest allowed |int8 − f32| of a logit, relative to the largest |logit| of its row
/// (about 1 here). Measured: 1.62e-2 over the 43 rows (1.43e-2 while the second layer's
/// fused q/k/v, Q5_K beside a Q6_K v, was widened to f32 rather than packed). Rounding
/// each activation block to 8 bits moves a single matmul's outputs by up to 0.3–0.5 % of
/// its largest (measured on this file's matrices), and the two layers and the head
/// compound it; the bound leaves twice the measured room.
const INT8_BOUND: f32 = 3e-2;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kquant/qwen3_q4_k_m.gguf")
}

/// The GGUF with every block-quantised tensor served as f32.
struct Dequantized(GgufStore);

impl WeightStore for Dequantized {
    fn describe(&self) -> String {
        format!("{}, dequantised", self.0.describe())
    }

    fn names(&self) -> Vec<String> {
        self.0.names()
    }

    fn info(&self, name: &str) -> Option<TensorInfo> {
        self.0.info(name).map(|i| TensorInfo { dtype: DType::F32, ..i })
    }

    fn host(&self, name: &str) -> Result<HostTensor<'_>, WeightError> {
        let t = self.0.host(name)?;
        let bytes: Vec<u8> = t.to_f32_vec()?.iter().flat_map(|v| v.to_le_bytes()).collect();
        Ok(HostTensor::from_bytes(DType::F32, t.shape(), Cow::Owned(bytes))?)
    }
}

/// Logits of every position of two prompts, prefilled together, then of one decode step.
fn logits(store: &dyn WeightStore, dots: QuantDots) -> Vec<f32> {
    let backend: Arc<dyn GpuBackend> = Arc::new(CpuBackend::with_dots(dots));
    let cfg = gguf_config(&open_gguf(&fixture()).unwrap()).unwrap();
    let model = load_model(&cfg, store, Arc::clone(&backend), &LoadOptions::default()).unwrap();
    let mut kv = PagedKvCache::new(&*backend, model.kv_layout(), DEFAULT_BLOCK_SIZE, 16, false).unwrap();
    let prompts: [Vec<u32>; 2] = [(0..37).map(|i| (i * 13 + 5) % 512).collect(), vec![7, 300, 2, 511, 64]];
    let mut blocks: Vec<_> = prompts.iter().map(|_| kv.new_sequence()).collect();
    let mut batch = ForwardBatch::new();
    for (p, b) in prompts.iter().zip(&mut blocks) {
        kv.reserve(b, p.len() + 1).unwrap();
    }
    for (p, b) in prompts.iter().zip(&blocks) {
        batch.push(p, 0, b, LogitRows::All);
    }
    let mut out = backend.download_f32(&model.forward(&batch, &mut kv).unwrap()).unwrap();
    let mut step = ForwardBatch::new();
    step.push(&[42], prompts[0].len(), &blocks[0], LogitRows::All);
    out.extend(backend.download_f32(&model.forward(&step, &mut kv).unwrap()).unwrap());
    out
}

#[test]
fn the_fixture_holds_every_k_quant() {
    let store = open_gguf(&fixture()).unwrap();
    let dtype = |n: &str| store.info(n).unwrap().dtype;
    assert_eq!(dtype("model.layers.0.mlp.up_proj.weight"), DType::Quant(QuantFormat::Q4_K));
    assert_eq!(dtype("model.layers.1.mlp.up_proj.weight"), DType::Quant(QuantFormat::Q5_K));
    assert_eq!(dtype("model.layers.1.mlp.down_proj.weight"), DType::Quant(QuantFormat::Q6_K));
    assert_eq!(dtype("model.embed_tokens.weight"), DType::Quant(QuantFormat::Q6_K));
}

#[test]
fn packed_k_quants_give_the_dequantised_models_logits() {
    let want = logits(&Dequantized(open_gguf(&fixture()).unwrap()), QuantDots::Exact);
    let exact = logits(&open_gguf(&fixture()).unwrap(), QuantDots::Exact);
    assert!(exact.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "exact dots: bit for bit");
    let int8 = logits(&open_gguf(&fixture()).unwrap(), QuantDots::Int8);
    assert_ne!(int8, exact, "integer dots ran, so the K-quants were packed");
    let mut worst = 0f32;
    for (g, w) in int8.chunks_exact(512).zip(want.chunks_exact(512)) {
        let scale = w.iter().fold(0f32, |m, v| m.max(v.abs()));
        worst = g.iter().zip(w).map(|(a, b)| (a - b).abs() / scale).fold(worst, f32::max);
    }
    eprintln!("max |int8 − f32| / max |logit| of the row: {worst:.2e}");
    assert!(worst <= INT8_BOUND, "{worst} > {INT8_BOUND}");
}
