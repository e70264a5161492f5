//! Fusing tensors along dim 0 with `load_concat`.

use met_kernels::{CpuBackend, GpuBackend};
use met_model_weights::{SafetensorsStore, WeightError, load, load_concat};

use crate::common::{Fixture, write};

fn seq(start: f32, n: usize) -> Vec<f32> {
    (0..n).map(|i| start + i as f32).collect()
}

fn store() -> (tempfile::TempDir, SafetensorsStore) {
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("model.safetensors"),
        &[
            Fixture::bf16("q", &[4, 3], &seq(0.0, 12)),
            Fixture::bf16("k", &[2, 3], &seq(100.0, 6)),
            Fixture::bf16("v", &[2, 3], &seq(200.0, 6)),
            Fixture::f32("gate", &[2, 3], &seq(-10.0, 6)),
            Fixture::f16("up", &[1, 3], &seq(50.0, 3)),
            Fixture::bf16("wide", &[2, 4], &seq(0.0, 8)),
            Fixture::f32("experts.0", &[2, 2], &seq(0.0, 4)),
            Fixture::f32("experts.1", &[2, 2], &seq(4.0, 4)),
        ],
    );
    let store = SafetensorsStore::open(dir.path()).unwrap();
    (dir, store)
}

#[test]
fn equal_dtypes_concatenate_in_order() {
    let (_dir, store) = store();
    let cpu = CpuBackend::new();
    let qkv = load_concat(&store, &["q", "k", "v"], &cpu).unwrap();
    assert_eq!(qkv.dims(), [8, 3]);
    let want = [seq(0.0, 12), seq(100.0, 6), seq(200.0, 6)].concat();
    assert_eq!(cpu.download_f32(&qkv).unwrap(), want);
}

#[test]
fn mixed_dtypes_are_widened_to_f32() {
    let (_dir, store) = store();
    let cpu = CpuBackend::new();
    let gate_up = load_concat(&store, &["gate", "up"], &cpu).unwrap();
    assert_eq!(gate_up.dims(), [3, 3]);
    assert_eq!(cpu.download_f32(&gate_up).unwrap(), [seq(-10.0, 6), seq(50.0, 3)].concat());
}

#[test]
fn stacked_experts_reshape_to_three_dims() {
    let (_dir, store) = store();
    let cpu = CpuBackend::new();
    let stacked = load_concat(&store, &["experts.0", "experts.1"], &cpu).unwrap();
    let stacked = stacked.reshape(&[2, 2, 2]).unwrap();
    assert_eq!(cpu.download_f32(&stacked).unwrap(), seq(0.0, 8));
}

#[test]
fn one_name_is_the_same_as_load() {
    let (_dir, store) = store();
    let cpu = CpuBackend::new();
    let a = load_concat(&store, &["q"], &cpu).unwrap();
    let b = load(&store, "q", &cpu).unwrap();
    assert_eq!(a.dims(), b.dims());
    assert_eq!(cpu.download_f32(&a).unwrap(), cpu.download_f32(&b).unwrap());
}

#[test]
fn mismatched_trailing_dims_name_the_tensors() {
    let (_dir, store) = store();
    let err = load_concat(&store, &["q", "wide"], &CpuBackend::new()).unwrap_err();
    assert!(matches!(err, WeightError::Concat { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("`wide`") && msg.contains("\"q\""), "{msg}");
}

#[test]
fn empty_list_and_missing_names_are_errors() {
    let (_dir, store) = store();
    let cpu = CpuBackend::new();
    let err = load_concat(&store, &[], &cpu).unwrap_err();
    assert!(matches!(err, WeightError::Concat { .. }), "{err}");
    let err = load_concat(&store, &["q", "nope"], &cpu).unwrap_err();
    assert!(matches!(err, WeightError::Missing { ref name, .. } if name == "nope"), "{err}");
}
