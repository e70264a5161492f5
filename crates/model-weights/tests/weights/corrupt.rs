//! Malformed checkpoints: each is an error naming the file, never a panic.

use std::fs;
use std::path::{Path, PathBuf};

use met_model_weights::{SafetensorsStore, WeightError, WeightStore};
use proptest::prelude::*;

use crate::common::{Fixture, exact_values, raw_file, write};

/// A valid two-tensor file's bytes.
fn valid_bytes() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    write(&path, &[Fixture::f32("a", &[2, 2], &exact_values(4)), Fixture::bf16("b", &[3], &exact_values(3))]);
    fs::read(path).unwrap()
}

/// Writes `bytes` as `model.safetensors` in a fresh dir and opens it.
fn open_bytes(bytes: &[u8]) -> (tempfile::TempDir, PathBuf, Result<SafetensorsStore, WeightError>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    fs::write(&path, bytes).unwrap();
    let result = SafetensorsStore::open(dir.path());
    (dir, path, result)
}

/// Asserts a format error about `path` whose message contains `needle`.
fn assert_format_error(result: Result<SafetensorsStore, WeightError>, path: &Path, needle: &str) {
    let err = result.expect_err("a malformed file must not open");
    let msg = err.to_string();
    assert!(matches!(&err, WeightError::Format { path: p, .. } if p == path), "{msg}");
    assert!(msg.contains(&path.display().to_string()), "file not named: {msg}");
    assert!(msg.contains(needle), "`{needle}` not in: {msg}");
}

#[test]
fn truncated_file() {
    let bytes = valid_bytes();
    let (_d, path, result) = open_bytes(&bytes[..bytes.len() - 3]);
    assert_format_error(result, &path, "does not end where the file ends");
}

#[test]
fn shorter_than_the_length_prefix() {
    let (_d, path, result) = open_bytes(&[1, 2, 3]);
    assert_format_error(result, &path, "too short");
    let (_d, path, result) = open_bytes(&[]);
    assert_format_error(result, &path, "too short");
}

#[test]
fn header_length_past_the_end() {
    let mut bytes = valid_bytes();
    bytes[..8].copy_from_slice(&10_000u64.to_le_bytes());
    let (_d, path, result) = open_bytes(&bytes);
    assert_format_error(result, &path, "runs past the end of the file");
    bytes[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    let (_d, path, result) = open_bytes(&bytes);
    assert_format_error(result, &path, "runs past the end of the file");
}

#[test]
fn garbage_header() {
    let (_d, path, result) = open_bytes(&raw_file("this is not json at all", &[]));
    assert_format_error(result, &path, "JSON");
    let (_d, path, result) = open_bytes(&raw_file(r#"{"a": 5}"#, &[]));
    assert_format_error(result, &path, "JSON");
}

#[test]
fn data_range_past_the_end() {
    let header = r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
    let (_d, path, result) = open_bytes(&raw_file(header, &[0; 8]));
    assert_format_error(result, &path, "does not end where the file ends");
}

#[test]
fn byte_length_disagreeing_with_the_shape() {
    let header = r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#;
    let (_d, path, result) = open_bytes(&raw_file(header, &[0; 8]));
    assert_format_error(result, &path, "does not match its shape");
}

#[test]
fn overlapping_ranges() {
    let header = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
        "b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    let (_d, path, result) = open_bytes(&raw_file(header, &[0; 12]));
    assert_format_error(result, &path, "overlap");
}

#[test]
fn missing_shard_is_named() {
    let dir = tempfile::tempdir().unwrap();
    write(&dir.path().join("model-00001-of-00002.safetensors"), &[Fixture::f32("a", &[1], &[1.0])]);
    let index = r#"{"weight_map": {"a": "model-00001-of-00002.safetensors",
        "b": "model-00002-of-00002.safetensors"}}"#;
    fs::write(dir.path().join("model.safetensors.index.json"), index).unwrap();
    let err = SafetensorsStore::open(dir.path()).unwrap_err();
    assert!(matches!(err, WeightError::Index { .. }), "{err}");
    assert!(err.to_string().contains("model-00002-of-00002.safetensors"), "{err}");
}

#[test]
fn bad_index_json_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let index = dir.path().join("model.safetensors.index.json");
    for text in ["{not json", r#"{"metadata": {}}"#, r#"{"weight_map": {}}"#] {
        fs::write(&index, text).unwrap();
        let err = SafetensorsStore::open(dir.path()).unwrap_err();
        assert!(matches!(&err, WeightError::Index { path, .. } if *path == index), "{err}");
    }
}

/// Opening must never panic; whatever opens must serve every listed tensor or refuse it.
fn open_and_read_all(bytes: &[u8]) -> bool {
    let (_d, _path, result) = open_bytes(bytes);
    if let Ok(store) = &result {
        for name in store.names() {
            let _ = store.host(&name).map(|h| h.to_f32_vec());
        }
    }
    result.is_ok()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        open_and_read_all(&bytes);
    }

    #[test]
    fn random_headers_never_panic(header in "[{}\\[\\]\":,0-9a-zA-Z_ ]{0,120}", data in proptest::collection::vec(any::<u8>(), 0..64)) {
        open_and_read_all(&raw_file(&header, &data));
    }

    #[test]
    fn truncations_of_a_valid_file_fail(cut in 0usize..1000) {
        let bytes = valid_bytes();
        let len = cut % bytes.len();
        prop_assert!(!open_and_read_all(&bytes[..len]));
    }

    #[test]
    fn flipped_bytes_never_panic(at in 0usize..1000, xor in 1u8..=255) {
        let mut bytes = valid_bytes();
        let at = at % bytes.len();
        bytes[at] ^= xor;
        open_and_read_all(&bytes);
    }
}
