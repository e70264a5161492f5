//! Reading GGUF headers: every metadata value type, tensor infos, and malformed files,
//! each an error naming the file (and key or tensor), never a panic.

use std::path::Path;

use met_model_weights::gguf::dequantize;
use met_model_weights::{GgmlType, GgufFile, GgufValue, WeightError};
use proptest::prelude::*;

use crate::gguf_common::{Gguf, T_ARRAY, T_STRING, fixture, string_bytes, temp_file};

#[test]
fn reads_every_value_type_written_by_gguf_py() {
    let file = GgufFile::open(&fixture("quants.gguf")).unwrap();
    assert_eq!(file.version(), 3);
    assert_eq!(file.alignment(), 64);
    assert_eq!(file.data_start() % 64, 0);
    let get = |k: &str| file.get(k).unwrap_or_else(|| panic!("{k} missing")).clone();
    assert_eq!(get("test.u8"), GgufValue::U8(200));
    assert_eq!(get("test.i8"), GgufValue::I8(-100));
    assert_eq!(get("test.u16"), GgufValue::U16(60000));
    assert_eq!(get("test.i16"), GgufValue::I16(-30000));
    assert_eq!(get("test.u32"), GgufValue::U32(4_000_000_000));
    assert_eq!(get("test.i32"), GgufValue::I32(-2_000_000_000));
    assert_eq!(get("test.u64"), GgufValue::U64((1 << 63) + 5));
    assert_eq!(get("test.i64"), GgufValue::I64(-(1 << 62)));
    assert_eq!(get("test.f32"), GgufValue::F32(0.25));
    assert_eq!(get("test.f64"), GgufValue::F64(-1.0e300));
    assert_eq!(get("test.true"), GgufValue::Bool(true));
    assert_eq!(get("test.false"), GgufValue::Bool(false));
    assert_eq!(file.get_str("test.string").unwrap(), "héllo GGUF");
    let strings: Vec<&str> = file.get_array("test.strings").unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(strings, ["a", "", "ünï"]);
    assert_eq!(get("test.u8s"), GgufValue::Array(vec![GgufValue::U8(1), GgufValue::U8(2), GgufValue::U8(3)]));
    let nested = get("test.nested");
    let inner: Vec<Vec<i64>> = nested
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect())
        .collect();
    assert_eq!(inner, [vec![1, 2], vec![3]]);
    assert_eq!(file.get_u64("test.u32").unwrap(), 4_000_000_000);
    assert_eq!(file.get_f64("test.f32").unwrap(), 0.25);
    assert!(file.get_bool("test.true").unwrap());
    assert_eq!(file.architecture().unwrap(), "test");
}

#[test]
fn reads_tensor_infos() {
    let file = GgufFile::open(&fixture("quants.gguf")).unwrap();
    assert_eq!(file.tensors().len(), 11);
    let q4k = file.tensor("Q4_K").unwrap();
    assert_eq!((q4k.dims.as_slice(), q4k.ggml_type), (&[512, 2][..], GgmlType::Q4_K));
    assert_eq!(q4k.shape(), [2, 512]);
    assert_eq!(q4k.elements(), 1024);
    assert_eq!(q4k.byte_len(), 4 * 144);
    assert_eq!(file.tensor_data("Q4_K").unwrap().len(), 4 * 144);
    for t in file.tensors() {
        assert_eq!(t.offset % 64, 0, "{}", t.name);
    }
    assert!(file.tensor("nope").is_none());
}

#[test]
fn typed_getters_name_the_file_and_key() {
    let path = fixture("quants.gguf");
    let file = GgufFile::open(&path).unwrap();
    for err in [
        file.get_u64("test.string").unwrap_err(),
        file.get_str("test.u8").unwrap_err(),
        file.get_u64("test.i8").unwrap_err(),
        file.get_bool("no.such.key").unwrap_err(),
    ] {
        let msg = err.to_string();
        assert!(matches!(err, WeightError::Metadata { .. }), "{msg}");
        assert!(msg.contains(&path.display().to_string()), "{msg}");
    }
    let msg = file.get_u64("test.string").unwrap_err().to_string();
    assert!(msg.contains("`test.string`") && msg.contains("string"), "{msg}");
    assert!(file.get_bool("no.such.key").unwrap_err().to_string().contains("missing"));
    assert_eq!(file.opt_u64("no.such.key").unwrap(), None);
    assert!(file.opt_u64("test.string").is_err());
}

/// A small valid file.
fn valid() -> Gguf {
    Gguf::new()
        .str("general.architecture", "llama")
        .strs("tokenizer.ggml.tokens", &["a", "b"])
        .f32_tensor("a", &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
        .f32_tensor("b", &[4], &[0.5; 4])
}

/// Opens `bytes` and asserts a format error naming the file and containing `needles`.
fn assert_format_error(bytes: &[u8], needles: &[&str]) {
    let (_dir, path) = temp_file(bytes);
    let err = GgufFile::open(&path).expect_err("a malformed file must not open");
    let msg = err.to_string();
    assert!(matches!(&err, WeightError::Format { path: p, .. } if p == &path), "{msg}");
    assert!(msg.contains(&path.display().to_string()), "file not named: {msg}");
    for needle in needles {
        assert!(msg.contains(needle), "`{needle}` not in: {msg}");
    }
}

#[test]
fn the_valid_file_opens() {
    let (_dir, path) = temp_file(&valid().bytes());
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.tensors().len(), 2);
    assert_eq!((file.alignment(), file.data_start() % 32), (32, 0));
    let (_dir, path) = temp_file(&valid().aligned(256).bool("flag", true).bytes());
    let file = GgufFile::open(&path).unwrap();
    assert_eq!((file.alignment(), file.data_start() % 256, file.get_bool("flag").unwrap()), (256, 0, true));
    assert!(file.tensors().iter().all(|t| t.offset % 256 == 0));
    assert_eq!(file.tensor_data("b").unwrap(), 0.5f32.to_le_bytes().repeat(4));
    let a: Vec<f32> =
        file.tensor_data("a").unwrap().chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(a, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
}

#[test]
fn wrong_magic() {
    let mut bytes = valid().bytes();
    bytes[..4].copy_from_slice(b"GGML");
    assert_format_error(&bytes, &["not a GGUF file"]);
    assert_format_error(b"GG", &["too short"]);
}

#[test]
fn version_1_and_unknown_versions() {
    let mut v1 = valid();
    v1.version = 1;
    assert_format_error(&v1.bytes(), &["version 1 is not supported"]);
    let mut v9 = valid();
    v9.version = 9;
    assert_format_error(&v9.bytes(), &["unsupported GGUF version 9"]);
    let mut big_endian = valid();
    big_endian.version = 3u32.swap_bytes();
    assert_format_error(&big_endian.bytes(), &["big-endian"]);
    let mut v2 = valid();
    v2.version = 2;
    let (_dir, path) = temp_file(&v2.bytes());
    assert_eq!(GgufFile::open(&path).unwrap().version(), 2);
}

#[test]
fn truncated_header() {
    let bytes = valid().bytes();
    assert_format_error(&bytes[..10], &["truncated"]);
    assert_format_error(&bytes[..30], &["truncated"]);
    // Cut inside the tensor infos: the tensor count promises more than the bytes hold.
    let file_end = bytes.len();
    assert_format_error(&bytes[..file_end - 40], &[]);
}

#[test]
fn absurd_counts_are_refused_before_allocating() {
    let mut bytes = valid().bytes();
    bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_format_error(&bytes, &["tensor count", "cannot fit"]);
    let mut bytes = valid().bytes();
    bytes[16..24].copy_from_slice(&(1u64 << 60).to_le_bytes());
    assert_format_error(&bytes, &["metadata count", "cannot fit"]);
    let mut array = T_STRING.to_le_bytes().to_vec();
    array.extend(u64::MAX.to_le_bytes());
    assert_format_error(&valid().kv_raw("big", T_ARRAY, array).bytes(), &["`big`", "cannot fit"]);
}

#[test]
fn string_length_past_eof() {
    let mut value = (1u64 << 40).to_le_bytes().to_vec();
    value.extend(b"abc");
    let bytes = Gguf::new().kv_raw("general.name", T_STRING, value).bytes();
    assert_format_error(&bytes, &["`general.name`", "runs past the end"]);
    // A key whose length runs past the end.
    let mut bytes = b"GGUF".to_vec();
    bytes.extend(3u32.to_le_bytes());
    bytes.extend(0u64.to_le_bytes());
    bytes.extend(1u64.to_le_bytes());
    bytes.extend(u64::MAX.to_le_bytes());
    bytes.extend([0; 16]);
    assert_format_error(&bytes, &["key of metadata entry 0", "runs past the end"]);
}

#[test]
fn tensor_past_eof() {
    let bytes = valid().tensor_raw("far", &[4], 0, Some(1 << 20), vec![]).bytes();
    assert_format_error(&bytes, &["tensor `far`", "runs past the end of the file"]);
    let bytes = valid().tensor_raw("huge", &[u64::MAX / 2, 4], 0, None, vec![]).bytes();
    assert_format_error(&bytes, &["tensor `huge`"]);
    // The data of the last tensor cut short.
    let bytes = valid().bytes();
    assert_format_error(&bytes[..bytes.len() - 2], &["tensor `b`", "runs past the end"]);
}

#[test]
fn unknown_ggml_type() {
    let bytes = valid().tensor_raw("odd", &[32], 99, None, vec![0; 64]).bytes();
    assert_format_error(&bytes, &["tensor `odd`", "unknown ggml type id 99"]);
}

#[test]
fn other_corruptions() {
    assert_format_error(&valid().kv_raw("x", 77, vec![0; 8]).bytes(), &["`x`", "unknown value type 77"]);
    assert_format_error(&valid().kv_raw("x", 7, vec![2]).bytes(), &["`x`", "bool"]);
    assert_format_error(&valid().str("general.architecture", "again").bytes(), &["appears twice"]);
    assert_format_error(&valid().f32_tensor("a", &[1], &[0.0]).bytes(), &["tensor `a` appears twice"]);
    assert_format_error(&valid().tensor_raw("c", &[4], 0, Some(0), vec![0; 16]).bytes(), &["overlap"]);
    assert_format_error(&valid().tensor_raw("c", &[4], 0, Some(100), vec![0; 16]).bytes(), &["alignment"]);
    assert_format_error(&valid().tensor_raw("c", &[1, 1, 1, 1, 1], 0, None, vec![0; 4]).bytes(), &["dimensions"]);
    assert_format_error(&valid().tensor_raw("q", &[48], GgmlType::Q8_0.id(), None, vec![0; 51]).bytes(), &["blocks"]);
    assert_format_error(&valid().u32("general.alignment", 48).bytes(), &["general.alignment", "power of two"]);
    let mut bad_key = b"GGUF".to_vec();
    bad_key.extend(3u32.to_le_bytes());
    bad_key.extend(0u64.to_le_bytes()); // tensors
    bad_key.extend(1u64.to_le_bytes()); // metadata entries
    bad_key.extend(2u64.to_le_bytes());
    bad_key.extend([0xff, 0xfe]);
    bad_key.extend(T_STRING.to_le_bytes());
    bad_key.extend(string_bytes("v"));
    assert_format_error(&bad_key, &["key of metadata entry 0", "UTF-8"]);
    let mut nest = Vec::new();
    for _ in 0..20 {
        nest.extend(T_ARRAY.to_le_bytes());
        nest.extend(1u64.to_le_bytes());
    }
    assert_format_error(&valid().kv_raw("deep", T_ARRAY, nest).bytes(), &["`deep`", "nest"]);
}

#[test]
fn io_errors_name_the_path() {
    let missing = Path::new("/nonexistent/model.gguf");
    let err = GgufFile::open(missing).unwrap_err();
    assert!(matches!(err, WeightError::Io { .. }));
    assert!(err.to_string().contains("/nonexistent/model.gguf"), "{err}");
}

/// Opening must return, never panic; what opens must be readable end to end.
fn open_and_read(bytes: &[u8]) -> Result<(), WeightError> {
    let (_dir, path) = temp_file(bytes);
    let file = GgufFile::open(&path)?;
    for t in file.tensors() {
        let data = file.tensor_data(&t.name).unwrap();
        assert_eq!(data.len(), t.byte_len());
        if t.ggml_type.is_dequantizable() {
            let mut out = vec![0f32; t.elements()];
            dequantize(t.ggml_type, data, &mut out);
        }
    }
    for key in file.metadata().keys() {
        let _ = (file.get_u64(key), file.get_f64(key), file.get_str(key), file.get(key).map(ToString::to_string));
    }
    Ok(())
}

/// The end of the last tensor's data: cutting anywhere before it must fail.
fn needed_len(bytes: &[u8]) -> usize {
    let (_dir, path) = temp_file(bytes);
    let file = GgufFile::open(&path).unwrap();
    let data = |t: &met_model_weights::GgufTensorInfo| file.data_start() + t.offset as usize + t.byte_len();
    file.tensors().iter().map(data).max().unwrap_or(file.data_start())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn random_bytes_never_panic(magic in any::<bool>(), version in 0u32..5, rest in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut bytes = if magic { b"GGUF".to_vec() } else { Vec::new() };
        if magic {
            bytes.extend(version.to_le_bytes());
        }
        bytes.extend(rest);
        let _ = open_and_read(&bytes);
    }

    #[test]
    fn truncations_of_a_valid_file_fail_cleanly(cut in 0.0f64..1.0) {
        let bytes = std::fs::read(fixture("quants.gguf")).unwrap();
        let needed = needed_len(&bytes);
        let len = (cut * bytes.len() as f64) as usize;
        let result = open_and_read(&bytes[..len]);
        prop_assert_eq!(result.is_ok(), len >= needed, "cut at {} of {} (data ends at {})", len, bytes.len(), needed);
    }

    #[test]
    fn corruptions_of_a_valid_file_never_panic(edits in proptest::collection::vec((0.0f64..1.0, any::<u8>()), 1..6), header_only in any::<bool>()) {
        let mut bytes = std::fs::read(fixture("quants.gguf")).unwrap();
        // Half the cases hit the header (where the structure is), half anywhere.
        let span = if header_only { 1100.min(bytes.len()) } else { bytes.len() };
        for (at, value) in edits {
            let i = (at * span as f64) as usize;
            bytes[i] = value;
        }
        let _ = open_and_read(&bytes);
    }
}
