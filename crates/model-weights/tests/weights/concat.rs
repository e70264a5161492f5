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

/// A tensor-parallel rank's share: rows of some parts, columns of others, zero padding.
#[test]
fn slices_take_rows_columns_and_padding() {
    use met_model_weights::{Slice, load_slices};
    let (_dir, store) = store();
    let cpu = CpuBackend::new();
    // Rank 1 of 2 of a fused q/k projection: q rows 2..4 and k row 1.
    let qk = load_slices(&store, &[("q", Slice::rows(2..4)), ("k", Slice::rows(1..2))], &cpu).unwrap();
    assert_eq!(qk.dims(), [3, 3]);
    assert_eq!(cpu.download_f32(&qk).unwrap(), [seq(6.0, 6), seq(103.0, 3)].concat());
    let cols = load_slices(&store, &[("wide", Slice::Columns(2..4))], &cpu).unwrap();
    assert_eq!(cpu.download_f32(&cols).unwrap(), [2.0, 3.0, 6.0, 7.0]);
    let padded = load_slices(&store, &[("k", Slice::Rows { range: 1..2, len: 3 })], &cpu).unwrap();
    assert_eq!(cpu.download_f32(&padded).unwrap(), [seq(103.0, 3), vec![0.0; 6]].concat());
    let whole = load_slices(&store, &[("q", Slice::Whole), ("k", Slice::Whole)], &cpu).unwrap();
    assert_eq!(
        cpu.download_f32(&whole).unwrap(),
        cpu.download_f32(&load_concat(&store, &["q", "k"], &cpu).unwrap()).unwrap()
    );
    let err = load_slices(&store, &[("k", Slice::rows(1..3))], &cpu).unwrap_err().to_string();
    assert!(err.contains("`k`") && err.contains("rows 1..3"), "{err}");
}
