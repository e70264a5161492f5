//! Seeded random weights.

use met_kernels::{CpuBackend, DType, GpuBackend};
use met_model_weights::{DummyStore, TensorSpec, WeightError, WeightStore, load};

fn specs() -> Vec<TensorSpec> {
    vec![
        TensorSpec::new("model.norm.weight", &[64]),
        TensorSpec::new("model.layers.0.input_layernorm.weight", &[64]),
        TensorSpec::new("model.layers.0.self_attn.q_proj.bias", &[64]),
        TensorSpec::new("model.layers.0.self_attn.q_proj.weight", &[64, 48]),
        TensorSpec::new("model.layers.0.self_attn.k_proj.weight", &[64, 48]),
        TensorSpec::new("model.layers.0.mlp.experts", &[4, 32, 12]),
    ]
}

fn values(store: &DummyStore, name: &str) -> Vec<f32> {
    store.host(name).unwrap().to_f32_vec().unwrap()
}

#[test]
fn equal_seeds_give_equal_weights() {
    let a = DummyStore::new(specs(), 42, DType::BF16);
    let b = DummyStore::new(specs(), 42, DType::BF16);
    for name in a.names() {
        assert_eq!(a.host(&name).unwrap().bytes(), b.host(&name).unwrap().bytes(), "{name}");
    }
}

#[test]
fn seeds_and_names_change_the_weights() {
    let a = DummyStore::new(specs(), 1, DType::F32);
    let b = DummyStore::new(specs(), 2, DType::F32);
    let q = "model.layers.0.self_attn.q_proj.weight";
    let k = "model.layers.0.self_attn.k_proj.weight";
    assert_ne!(values(&a, q), values(&b, q));
    assert_ne!(values(&a, q), values(&a, k));
}

#[test]
fn values_follow_the_documented_ranges() {
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let store = DummyStore::new(specs(), 9, dtype);
        // Rounding to a 2-byte float may move a value past the bound by half an ulp.
        let slack = if dtype == DType::F32 { 1.0 } else { 1.0 + 2f32.powi(-8) };
        for norm in ["model.norm.weight", "model.layers.0.input_layernorm.weight"] {
            assert!(values(&store, norm).iter().all(|&v| v == 1.0), "{norm} {dtype}");
        }
        let cases = [
            ("model.layers.0.self_attn.q_proj.bias", 0.02),
            ("model.layers.0.self_attn.q_proj.weight", (3.0f32 / 48.0).sqrt()),
            ("model.layers.0.mlp.experts", 0.5),
        ];
        for (name, bound) in cases {
            let v = values(&store, name);
            let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
            assert!(max <= bound * slack, "{name} {dtype}: max {max} > {bound}");
            // Uniform draws reach close to the bound and are not all one sign.
            assert!(max > 0.8 * bound, "{name} {dtype}: max {max} far below {bound}");
            assert!(v.iter().any(|&x| x < 0.0) && v.iter().any(|&x| x > 0.0), "{name}");
        }
    }
}

#[test]
fn matrices_have_unit_scale_rows() {
    // Uniform on ±sqrt(3 / fan_in) has variance 1 / fan_in, so a row's squared norm is ~1.
    let store = DummyStore::new(vec![TensorSpec::new("w", &[256, 512])], 3, DType::F32);
    let v = values(&store, "w");
    let mean_sq = v.iter().map(|x| f64::from(x * x)).sum::<f64>() / 256.0;
    assert!((mean_sq - 1.0).abs() < 0.02, "mean squared row norm {mean_sq}");
}

#[test]
fn dtype_is_honoured() {
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let store = DummyStore::new(specs(), 0, dtype);
        let name = "model.layers.0.mlp.experts";
        assert_eq!(store.info(name).unwrap().dtype, dtype);
        let host = store.host(name).unwrap();
        assert_eq!(host.dtype(), dtype);
        assert_eq!(host.shape(), [4, 32, 12]);
        assert_eq!(host.bytes().len(), 4 * 32 * 12 * dtype.size_in_bytes());
    }
    // The same draws, rounded: bf16 values are the f32 values to bf16 precision.
    let f = values(&DummyStore::new(specs(), 5, DType::F32), "model.layers.0.mlp.experts");
    let b = values(&DummyStore::new(specs(), 5, DType::BF16), "model.layers.0.mlp.experts");
    assert!(f.iter().zip(&b).all(|(x, y)| (x - y).abs() <= x.abs() * 2f32.powi(-8)));
}

#[test]
fn names_are_sorted_and_loading_works() {
    let store = DummyStore::new(specs(), 0, DType::BF16);
    let names = store.names();
    assert!(names.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(names.len(), specs().len());
    let cpu = CpuBackend::new();
    let t = load(&store, "model.norm.weight", &cpu).unwrap();
    assert_eq!(cpu.download_f32(&t).unwrap(), vec![1.0; 64]);
    let err = store.host("nope").unwrap_err();
    assert!(matches!(err, WeightError::Missing { .. }), "{err}");
}

#[test]
#[should_panic(expected = "dummy weights are floats")]
fn integer_dtype_is_refused() {
    let _ = DummyStore::new(specs(), 0, DType::U32);
}

/// The store as a checkpoint would be: host bytes only, no uniform runs.
struct HostOnly<'a>(&'a DummyStore);

impl WeightStore for HostOnly<'_> {
    fn describe(&self) -> String {
        self.0.describe()
    }
    fn names(&self) -> Vec<String> {
        self.0.names()
    }
    fn info(&self, name: &str) -> Option<met_model_weights::TensorInfo> {
        self.0.info(name)
    }
    fn host(&self, name: &str) -> Result<met_kernels::HostTensor<'_>, WeightError> {
        self.0.host(name)
    }
}

/// Loading through the backend's generator (`uniform_run`) gives exactly the tensors of
/// the host path, alone and fused, and norms (no run) still load from the host.
#[test]
fn generated_on_the_backend_equals_the_host_path() {
    let backend = CpuBackend::new();
    let store = DummyStore::new(specs(), 9, backend.float_dtype());
    let q = "model.layers.0.self_attn.q_proj.weight";
    let k = "model.layers.0.self_attn.k_proj.weight";
    assert!(store.uniform_run(q).is_some() && store.uniform_run("model.norm.weight").is_none());
    for names in [&[q][..], &[q, k], &["model.layers.0.mlp.experts"], &["model.norm.weight"]] {
        let generated = met_model_weights::load_concat(&store, names, &backend).unwrap();
        let hosted = met_model_weights::load_concat(&HostOnly(&store), names, &backend).unwrap();
        assert_eq!(generated.dims(), hosted.dims(), "{names:?}");
        let (g, h) = (backend.download_f32(&generated).unwrap(), backend.download_f32(&hosted).unwrap());
        assert!(g.iter().zip(&h).all(|(a, b)| a.to_bits() == b.to_bits()), "{names:?}");
    }
    let single = load(&store, q, &backend).unwrap();
    assert_eq!(backend.download_f32(&single).unwrap(), values(&store, q));
}
