//! Checking a store against a model's expected tensors.

use met_kernels::DType;
use met_model_weights::{DummyStore, SafetensorsStore, TensorSpec, WeightError, preflight};
use safetensors::tensor::Dtype;

use crate::common::{Fixture, write};

fn specs(list: &[(&str, &[usize])]) -> Vec<TensorSpec> {
    list.iter().map(|(n, s)| TensorSpec::new(*n, s)).collect()
}

fn stored() -> DummyStore {
    let specs = specs(&[
        ("embed", &[10, 4]),
        ("norm.weight", &[4]),
        ("q_proj", &[4, 4]),
        ("extra", &[2]),
        ("lm_head.weight", &[10, 4]),
        ("layers.0.rotary_emb.inv_freq", &[2]),
        ("layers.1.rotary_emb.inv_freq", &[2]),
    ]);
    DummyStore::new(specs, 0, DType::F32)
}

const IGNORED: &[&str] = &["lm_head.weight", "*.rotary_emb.inv_freq"];

#[test]
fn a_matching_store_passes() {
    let expected = specs(&[("embed", &[10, 4]), ("norm.weight", &[4]), ("q_proj", &[4, 4]), ("extra", &[2])]);
    preflight(&stored(), &expected, IGNORED).unwrap();
}

#[test]
fn every_problem_is_reported_in_one_error() {
    let expected = specs(&[("embed", &[10, 4]), ("norm.weight", &[4]), ("q_proj", &[4, 8]), ("k_proj", &[2, 4])]);
    let err = preflight(&stored(), &expected, IGNORED).unwrap_err();
    let msg = err.to_string();
    let WeightError::Preflight(report) = err else { panic!("expected a preflight error: {msg}") };
    assert_eq!(report.missing, specs(&[("k_proj", &[2, 4])]));
    assert_eq!(report.unexpected, ["extra"]);
    assert_eq!(report.misshaped, [("q_proj".to_string(), vec![4, 8], vec![4, 4])]);
    assert!(report.unloadable.is_empty());
    for needle in ["k_proj", "extra", "q_proj", "[4, 8]", "dummy f32 weights"] {
        assert!(msg.contains(needle), "`{needle}` not in: {msg}");
    }
    for quiet in ["lm_head", "inv_freq", "embed", "norm.weight"] {
        assert!(!msg.contains(quiet), "`{quiet}` should not be reported: {msg}");
    }
}

#[test]
fn without_ignore_patterns_the_extras_are_unexpected() {
    let expected = specs(&[("embed", &[10, 4]), ("norm.weight", &[4]), ("q_proj", &[4, 4]), ("extra", &[2])]);
    let Err(WeightError::Preflight(report)) = preflight(&stored(), &expected, &[]) else {
        panic!("expected a preflight error");
    };
    assert_eq!(report.unexpected, ["layers.0.rotary_emb.inv_freq", "layers.1.rotary_emb.inv_freq", "lm_head.weight"]);
}

#[test]
fn long_lists_are_capped() {
    let expected: Vec<TensorSpec> = (0..25).map(|i| TensorSpec::new(format!("m{i:02}"), &[1])).collect();
    let err = preflight(&DummyStore::new(vec![], 0, DType::F32), &expected, &[]).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("25 missing"), "{msg}");
    assert!(msg.contains("m19") && !msg.contains("m20"), "{msg}");
    assert!(msg.contains("... and 5 more missing"), "{msg}");
}

#[test]
fn unsupported_dtypes_are_unloadable_when_expected_and_unexpected_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = vec![0u8; 16];
    write(
        &dir.path().join("model.safetensors"),
        &[
            Fixture::raw("ids", Dtype::I64, &[2], bytes.clone()),
            Fixture::raw("scales", Dtype::F64, &[2], bytes),
            Fixture::f32("w", &[1], &[1.0]),
        ],
    );
    let store = SafetensorsStore::open(dir.path()).unwrap();
    let expected = specs(&[("w", &[1]), ("scales", &[2])]);
    let Err(WeightError::Preflight(report)) = preflight(&store, &expected, &[]) else {
        panic!("expected a preflight error");
    };
    assert_eq!(report.unexpected, ["ids"]);
    assert_eq!(report.unloadable.len(), 1);
    assert_eq!(report.unloadable[0].0, "scales");
    assert!(report.unloadable[0].1.contains("F64"), "{}", report.unloadable[0].1);
}
