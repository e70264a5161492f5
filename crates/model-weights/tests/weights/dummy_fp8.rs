//! Seeded random weights under a quantized config: float8 e4m3 weights beside their
//! scales, read through `Fp8View` as a real FP8 checkpoint is.

use std::path::Path;

use met_config::{QuantConfig, ScaleLayout};
use met_kernels::quant::QuantFormat;
use met_kernels::{CpuBackend, DType, GpuBackend};
use met_model_weights::{DummyStore, Fp8View, TensorSpec, WeightError, WeightStore, load, load_concat, preflight};

const Q: &str = "model.layers.0.self_attn.q_proj.weight";
const K: &str = "model.layers.0.self_attn.k_proj.weight";
const DOWN: &str = "model.layers.0.mlp.down_proj.weight";
const EXPERT: &str = "model.layers.1.mlp.experts.0.up_proj.weight";
const ROUTER: &str = "model.layers.1.mlp.gate.weight";
const EMBED: &str = "model.embed_tokens.weight";
const HEAD: &str = "lm_head.weight";
/// Every weight of [`specs`] a checkpoint stores as float8 (with no unquantized list).
const QUANTIZED: [&str; 4] = [Q, K, DOWN, EXPERT];

fn specs() -> Vec<TensorSpec> {
    vec![
        TensorSpec::new(EMBED, &[32, 64]),
        TensorSpec::new(HEAD, &[32, 64]),
        TensorSpec::new("model.norm.weight", &[64]),
        TensorSpec::new("model.layers.0.input_layernorm.weight", &[64]),
        TensorSpec::new("model.layers.0.self_attn.q_proj.bias", &[64]),
        TensorSpec::new(Q, &[64, 64]),
        TensorSpec::new(K, &[32, 64]),
        TensorSpec::new(DOWN, &[64, 160]),
        TensorSpec::new(EXPERT, &[40, 64]),
        TensorSpec::new(ROUTER, &[4, 64]),
    ]
}

fn config(method: &str, scales: Option<ScaleLayout>, static_activations: bool) -> QuantConfig {
    QuantConfig { method: method.into(), scales, static_activations, unquantized: Vec::new() }
}

/// The three layouts met loads, each with the scale tensor it stores beside `Q`.
fn layouts() -> [(QuantConfig, &'static str, Vec<usize>); 3] {
    [
        (config("fp8", Some(ScaleLayout::Block(128, 128)), false), "weight_scale_inv", vec![1, 1]),
        (config("fp8", None, true), "weight_scale", vec![]),
        (config("compressed-tensors", Some(ScaleLayout::Channel), false), "weight_scale", vec![64, 1]),
    ]
}

fn quantized(seed: u64, quant: &QuantConfig) -> DummyStore {
    DummyStore::new(specs(), seed, DType::F32).quantized(quant, None)
}

fn values(store: &dyn WeightStore, name: &str) -> Vec<f32> {
    store.host(name).unwrap().to_f32_vec().unwrap()
}

#[test]
fn quantized_weights_read_as_e4m3_blocks_and_the_rest_as_floats() {
    for (quant, scale, scale_shape) in layouts() {
        let store = quantized(1, &quant);
        let view = Fp8View::new(&store, quant.scales);
        for name in QUANTIZED {
            let info = view.info(name).unwrap_or_else(|| panic!("{name}"));
            assert_eq!(info.dtype, DType::Quant(QuantFormat::F8_E4M3), "{name} {quant:?}");
            assert_eq!(view.host(name).unwrap().dtype(), info.dtype, "{name} {quant:?}");
        }
        for name in [EMBED, HEAD, ROUTER, "model.norm.weight", "model.layers.0.self_attn.q_proj.bias"] {
            assert_eq!(view.info(name).unwrap().dtype, DType::F32, "{name} {quant:?}");
            assert_eq!(store.float8_shape(name), None, "{name} {quant:?}");
        }
        let scale = format!("model.layers.0.self_attn.q_proj.{scale}");
        assert_eq!(store.info(&scale).unwrap().shape, scale_shape, "{quant:?}");
        let input = store.info("model.layers.0.self_attn.q_proj.input_scale");
        assert_eq!(input.map(|i| i.shape), quant.static_activations.then(Vec::new), "{quant:?}");
    }
}

/// The view lists exactly the model's tensors: the scales are the checkpoint's, not the
/// model's, and a preflight against the specs passes.
#[test]
fn the_view_hides_the_scales() {
    for (quant, scale, _) in layouts() {
        let store = quantized(1, &quant);
        let scales = QUANTIZED.len() * if quant.static_activations { 2 } else { 1 };
        assert_eq!(store.names().len(), specs().len() + scales, "{quant:?}");
        assert!(store.names().iter().any(|n| n.ends_with(scale)), "{quant:?}");
        let view = Fp8View::new(&store, quant.scales);
        let mut want: Vec<String> = specs().into_iter().map(|s| s.name).collect();
        want.sort();
        assert_eq!(view.names(), want, "{quant:?}");
        preflight(&view, &specs(), &[]).unwrap();
    }
}

/// As in a real checkpoint, a float8 weight is listed but not loadable without the view,
/// and neither it nor its scales are generated on a device.
#[test]
fn float8_weights_go_through_the_host_and_the_view() {
    let (quant, scale, _) = &layouts()[0];
    let store = quantized(1, quant);
    assert!(store.info(Q).is_none());
    assert!(matches!(store.host(Q), Err(WeightError::UnsupportedDtype { .. })));
    assert_eq!(store.float8(Q).unwrap().len(), 64 * 64);
    assert!(store.uniform_run(Q).is_none());
    assert!(store.uniform_run(&format!("model.layers.0.self_attn.q_proj.{scale}")).is_none());
    assert!(store.uniform_run(EMBED).is_some() && store.uniform_run(ROUTER).is_some());
    assert!(store.describe().contains("4 float8 e4m3"), "{}", store.describe());
}

#[test]
fn float8_weights_are_deterministic_in_the_seed() {
    let quant = &layouts()[0].0;
    let (a, b, c) = (quantized(7, quant), quantized(7, quant), quantized(8, quant));
    for name in QUANTIZED {
        assert_eq!(a.float8(name), b.float8(name), "{name}");
        assert_ne!(a.float8(name), c.float8(name), "{name}");
    }
    // Names have streams of their own: k is not the first rows of q.
    assert_ne!(a.float8(Q).unwrap()[..32 * 64], a.float8(K).unwrap()[..]);
}

/// Dequantized, a weight is the float store's draw rounded to e4m3 (three mantissa bits:
/// within 1/16 of it, and a hair more near zero), so it keeps the bound ±sqrt(3 / fan_in)
/// and spreads over it. Tensors that stay float are today's, bit for bit.
#[test]
fn dequantized_weights_are_the_float_weights_rounded_to_e4m3() {
    let float = DummyStore::new(specs(), 5, DType::F32);
    for (quant, ..) in layouts() {
        let store = quantized(5, &quant);
        let view = Fp8View::new(&store, quant.scales);
        for name in QUANTIZED {
            let fan_in = view.info(name).unwrap().shape[1];
            let bound = (3.0 / fan_in as f32).sqrt();
            let (got, want) = (values(&view, name), values(&float, name));
            let max = got.iter().fold(0f32, |m, x| m.max(x.abs()));
            assert!(max <= bound * (1.0 + 1e-6) && max > 0.8 * bound, "{name}: max {max}, bound {bound}");
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() <= w.abs() / 16.0 + bound * 1e-5, "{name} {quant:?}: {g} for {w}");
            }
        }
        for name in [EMBED, HEAD, ROUTER, "model.norm.weight", "model.layers.0.self_attn.q_proj.bias"] {
            assert_eq!(store.host(name).unwrap().bytes(), float.host(name).unwrap().bytes(), "{name}");
        }
    }
}

/// The CPU loads the view's blocks, alone and fused (q with k), to the host's values.
#[test]
fn the_cpu_loads_the_float8_weights() {
    let backend = CpuBackend::new();
    let quant = &layouts()[0].0;
    let store = quantized(2, quant);
    let view = Fp8View::new(&store, quant.scales);
    let q = backend.download_f32(&load(&view, Q, &backend).unwrap()).unwrap();
    assert_eq!(q, values(&view, Q));
    let qk = backend.download_f32(&load_concat(&view, &[Q, K], &backend).unwrap()).unwrap();
    assert_eq!(qk, [values(&view, Q), values(&view, K)].concat());
}

/// Modules the config leaves unquantized stay float, matched as transformers matches
/// `modules_to_not_convert`.
#[test]
fn unquantized_modules_stay_float() {
    let mut quant = config("fp8", Some(ScaleLayout::Block(128, 128)), false);
    quant.unquantized = vec!["model.layers.0.mlp.down_proj".into(), "k_proj".into()];
    let store = quantized(1, &quant);
    let view = Fp8View::new(&store, quant.scales);
    for name in [DOWN, K] {
        assert_eq!(view.info(name).unwrap().dtype, DType::F32, "{name}");
        assert!(store.info(&format!("{}_scale_inv", name)).is_none(), "{name}");
    }
    assert_eq!(view.info(Q).unwrap().dtype, DType::Quant(QuantFormat::F8_E4M3));
}

/// The real configs' checkpoints: which weights each stores as float8, and the view of
/// the dummy store passing the model's preflight. Only names are made; no data.
#[test]
fn real_fp8_configs_quantize_what_their_checkpoints_do() {
    let read = |name: &str| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../configs/{name}/config.json"));
        met_model_layers::models::read_config(&path).unwrap()
    };
    let cases = [
        ("Qwen3-30B-A3B-FP8", "model.layers.47.mlp.experts.127.down_proj.weight", "weight_scale_inv", vec![16, 6]),
        ("Qwen3-32B-FP8", "model.layers.63.self_attn.o_proj.weight", "weight_scale_inv", vec![40, 64]),
        ("Meta-Llama-3-8B-Instruct-FP8", "model.layers.31.mlp.gate_proj.weight", "weight_scale", vec![]),
    ];
    for (name, weight, scale, scale_shape) in cases {
        let cfg = read(name);
        let quant = cfg.quantization.clone().unwrap();
        let specs = met_model_layers::tensor_specs(&cfg).unwrap();
        let store = DummyStore::new(specs.clone(), 0, DType::BF16).quantized(&quant, cfg.text_prefix.as_deref());
        assert!(store.float8_shape(weight).is_some(), "{name}: {weight}");
        let module = weight.strip_suffix(".weight").unwrap();
        assert_eq!(store.info(&format!("{module}.{scale}")).unwrap().shape, scale_shape, "{name}");
        let float8 = specs.iter().filter(|s| store.float8_shape(&s.name).is_some());
        let layer_weights = specs.iter().filter(|s| s.name.starts_with("model.layers.") && s.shape.len() == 2);
        let routers = layer_weights.clone().filter(|s| s.name.ends_with(".mlp.gate.weight")).count();
        assert_eq!(float8.count() + routers, layer_weights.count(), "{name}: every layer's linear but routers");
        for float in [HEAD, EMBED, "model.layers.0.mlp.gate.weight", "model.layers.0.input_layernorm.weight"] {
            assert_eq!(store.float8_shape(float), None, "{name}: {float}");
        }
        let view = Fp8View::new(&store, quant.scales);
        preflight(&view, &specs, &[]).unwrap();
        let input = format!("{module}.input_scale");
        assert_eq!(store.info(&input).is_some(), quant.static_activations, "{name}");
    }
}

/// A vision-language checkpoint names the modules it leaves unquantized under its text
/// prefix; the dummy store, under met's names, leaves the same ones float.
#[test]
fn a_vision_language_configs_unquantized_modules_stay_float() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/Qwen3.5-27B/config.json");
    let overrides = r#"{"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128],
        "modules_to_not_convert": ["lm_head", "model.language_model.layers.0.linear_attn.in_proj_a"]}}"#;
    let cfg = met_model_layers::models::read_config_with_overrides(&path, overrides).unwrap();
    let quant = cfg.quantization.clone().unwrap();
    let specs = met_model_layers::tensor_specs(&cfg).unwrap();
    let store = DummyStore::new(specs.clone(), 0, DType::BF16).quantized(&quant, cfg.text_prefix.as_deref());
    assert_eq!(store.float8_shape("model.layers.0.linear_attn.in_proj_a.weight"), None);
    assert_eq!(store.float8_shape("model.layers.1.linear_attn.in_proj_a.weight"), Some(vec![48, 5120]));
    assert!(store.float8_shape("model.layers.0.linear_attn.in_proj_b.weight").is_some());
    preflight(&Fp8View::new(&store, quant.scales), &specs, &[]).unwrap();
}

/// Scales differ from cell to cell of the layout's grid (blocks of 32 x 32 here, rows per
/// channel), as a checkpoint's do: a kernel that read one block's or row's scale for its
/// neighbour's would compute other values. Each dequantizes the same draws.
#[test]
fn scales_differ_between_the_cells_of_their_grid() {
    for quant in [
        config("fp8", Some(ScaleLayout::Block(32, 32)), false),
        config("compressed-tensors", Some(ScaleLayout::Channel), false),
    ] {
        let store = quantized(3, &quant);
        let scale = match quant.scales {
            Some(ScaleLayout::Block(..)) => "model.layers.0.mlp.down_proj.weight_scale_inv",
            _ => "model.layers.0.mlp.down_proj.weight_scale",
        };
        let mut scales = values(&store, scale);
        let cells = scales.len();
        scales.sort_by(f32::total_cmp);
        scales.dedup();
        assert!(cells > 4 && scales.len() > 2, "{quant:?}: {} distinct scales of {cells}", scales.len());
    }
}
