//! Opening safetensors checkpoints and reading tensors back.

use std::fs;

use met_kernels::{CpuBackend, DType, GpuBackend};
use met_model_weights::{SafetensorsStore, WeightError, WeightStore, load};
use safetensors::tensor::Dtype;

use crate::common::{Fixture, exact_values, write};

fn three_dtypes() -> Vec<Fixture> {
    vec![
        Fixture::f32("a.weight", &[2, 3], &exact_values(6)),
        Fixture::f16("b.weight", &[4], &exact_values(4)),
        Fixture::bf16("c.weight", &[3, 1, 2], &exact_values(6)),
    ]
}

#[test]
fn host_round_trips_f32_f16_bf16() {
    let dir = tempfile::tempdir().unwrap();
    let fixtures = three_dtypes();
    write(&dir.path().join("model.safetensors"), &fixtures);
    let store = SafetensorsStore::open(dir.path()).unwrap();

    assert_eq!(store.names(), ["a.weight", "b.weight", "c.weight"]);
    for (f, dtype) in fixtures.iter().zip([DType::F32, DType::F16, DType::BF16]) {
        let info = store.info(&f.name).unwrap();
        assert_eq!((info.dtype, info.shape.as_slice()), (dtype, f.shape.as_slice()));
        let host = store.host(&f.name).unwrap();
        assert_eq!(host.dtype(), dtype);
        assert_eq!(host.shape(), f.shape.as_slice());
        assert_eq!(host.bytes(), f.bytes.as_slice(), "{}", f.name);
        let n = host.elem_count();
        assert_eq!(host.to_f32_vec().unwrap(), exact_values(n), "{}", f.name);
    }
}

#[test]
fn load_gives_the_stored_values_on_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("model.safetensors"), &three_dtypes());
    let store = SafetensorsStore::open(dir.path()).unwrap();
    let cpu = CpuBackend::new();
    for (name, n) in [("a.weight", 6), ("b.weight", 4), ("c.weight", 6)] {
        let t = load(&store, name, &cpu).unwrap();
        assert_eq!(t.dims(), store.info(name).unwrap().shape.as_slice());
        assert_eq!(cpu.download_f32(&t).unwrap(), exact_values(n), "{name}");
    }
}

#[test]
fn open_accepts_a_file_path_and_a_lone_file_of_another_name() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("weights.safetensors");
    write(&file, &three_dtypes());
    for path in [dir.path(), file.as_path()] {
        let store = SafetensorsStore::open(path).unwrap();
        assert_eq!(store.names().len(), 3);
        assert!(store.describe().contains("weights.safetensors"), "{}", store.describe());
    }
}

#[test]
fn open_refuses_ambiguous_empty_and_absent_paths() {
    let dir = tempfile::tempdir().unwrap();
    let err = SafetensorsStore::open(dir.path()).unwrap_err();
    assert!(matches!(err, WeightError::NoCheckpoint { .. }), "{err}");

    write(&dir.path().join("x.safetensors"), &three_dtypes());
    write(&dir.path().join("y.safetensors"), &three_dtypes());
    let err = SafetensorsStore::open(dir.path()).unwrap_err();
    assert!(err.to_string().contains("found 2 *.safetensors files"), "{err}");

    let absent = dir.path().join("nope");
    let err = SafetensorsStore::open(&absent).unwrap_err();
    assert!(matches!(&err, WeightError::Io { path, .. } if *path == absent), "{err}");
}

#[test]
fn missing_tensor_names_itself_and_the_store() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("model.safetensors"), &three_dtypes());
    let store = SafetensorsStore::open(dir.path()).unwrap();
    assert!(store.info("zzz").is_none());
    let err = store.host("zzz").unwrap_err();
    assert!(matches!(err, WeightError::Missing { ref name, .. } if name == "zzz"), "{err}");
    assert!(err.to_string().contains("model.safetensors"), "{err}");
}

#[test]
fn unsupported_dtypes_are_listed_but_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<u8> = [1i64, 2, 3].iter().flat_map(|v| v.to_le_bytes()).collect();
    write(
        &dir.path().join("model.safetensors"),
        &[Fixture::raw("position_ids", Dtype::I64, &[3], ids), Fixture::f32("w", &[2], &[1.0, 2.0])],
    );
    let store = SafetensorsStore::open(dir.path()).unwrap();
    assert_eq!(store.names(), ["position_ids", "w"]);
    assert!(store.info("position_ids").is_none());
    let err = store.host("position_ids").unwrap_err();
    match &err {
        WeightError::UnsupportedDtype { name, dtype } => {
            assert_eq!((name.as_str(), dtype.as_str()), ("position_ids", "I64"));
        }
        other => panic!("expected UnsupportedDtype, got {other}"),
    }
    assert_eq!(store.host("w").unwrap().to_f32_vec().unwrap(), [1.0, 2.0]);
}

/// Two shards and the index transformers writes for them.
fn write_sharded(dir: &std::path::Path, weight_map: &str) {
    write(
        &dir.join("model-00001-of-00002.safetensors"),
        &[Fixture::f32("embed", &[2, 2], &exact_values(4)), Fixture::bf16("l0", &[3], &exact_values(3))],
    );
    write(&dir.join("model-00002-of-00002.safetensors"), &[Fixture::f16("l1", &[1, 2], &exact_values(2))]);
    let index = format!(r#"{{"metadata": {{"total_size": 26}}, "weight_map": {weight_map}}}"#);
    fs::write(dir.join("model.safetensors.index.json"), index).unwrap();
}

const GOOD_MAP: &str = r#"{"embed": "model-00001-of-00002.safetensors",
    "l0": "model-00001-of-00002.safetensors", "l1": "model-00002-of-00002.safetensors"}"#;

#[test]
fn sharded_index_loads_from_every_shard() {
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), GOOD_MAP);
    let store = SafetensorsStore::open(dir.path()).unwrap();
    assert!(store.describe().contains("(2 shards)"), "{}", store.describe());
    assert_eq!(store.files().len(), 2);
    assert_eq!(store.names(), ["embed", "l0", "l1"]);
    let cpu = CpuBackend::new();
    for (name, n) in [("embed", 4), ("l0", 3), ("l1", 2)] {
        let t = load(&store, name, &cpu).unwrap();
        assert_eq!(cpu.download_f32(&t).unwrap(), exact_values(n), "{name}");
    }
    // The index file itself is also a valid path.
    let by_index = SafetensorsStore::open(&dir.path().join("model.safetensors.index.json")).unwrap();
    assert_eq!(by_index.names(), store.names());
}

#[test]
fn index_pointing_at_the_wrong_shard_is_an_error_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let map = r#"{"embed": "model-00001-of-00002.safetensors",
        "l0": "model-00002-of-00002.safetensors", "l1": "model-00002-of-00002.safetensors"}"#;
    write_sharded(dir.path(), map);
    let err = SafetensorsStore::open(dir.path()).unwrap_err();
    assert!(matches!(err, WeightError::Index { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("`l0`") && msg.contains("model-00002-of-00002"), "{msg}");
}

#[test]
fn shard_tensors_absent_from_the_index_are_still_listed() {
    let dir = tempfile::tempdir().unwrap();
    let map = r#"{"embed": "model-00001-of-00002.safetensors", "l1": "model-00002-of-00002.safetensors"}"#;
    write_sharded(dir.path(), map);
    let store = SafetensorsStore::open(dir.path()).unwrap();
    assert_eq!(store.names(), ["embed", "l0", "l1"]);
}
