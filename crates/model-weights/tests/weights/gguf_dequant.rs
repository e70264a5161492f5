//! Dequantisation of every supported ggml type against values gguf-py computed
//! (`tests/fixtures/gguf/make_fixtures.py`).

use met_model_weights::gguf::dequantize;
use met_model_weights::{GgmlType, GgufFile};

use crate::gguf_common::{fixture, read_f32s};

const TYPES: [GgmlType; 11] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Asserts `got` equals `want` to within one f32 rounding of the larger magnitude.
fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let tol = 2.0 * f32::EPSILON * g.abs().max(w.abs());
        assert!((g - w).abs() <= tol, "{what}[{i}]: got {g}, gguf-py says {w}");
    }
}

#[test]
fn every_type_matches_gguf_py() {
    let file = GgufFile::open(&fixture("quants.gguf")).unwrap();
    for t in TYPES {
        let info = file.tensor(t.name()).unwrap_or_else(|| panic!("fixture lacks {t}"));
        assert_eq!(info.ggml_type, t);
        assert!(t.is_dequantizable());
        let mut got = vec![0f32; info.elements()];
        dequantize(t, file.tensor_data(t.name()).unwrap(), &mut got);
        let want = read_f32s(&fixture(&format!("quants/{t}.f32")));
        assert!(want.iter().any(|&v| v != 0.0), "{t}: the fixture must not be all zeros");
        assert_close(t.name(), &got, &want);
    }
}

#[test]
fn long_tensors_decode_in_parallel_runs_identically() {
    // Enough blocks for several rayon tasks; each repeat must decode like the original.
    let file = GgufFile::open(&fixture("quants.gguf")).unwrap();
    for t in [GgmlType::Q4_K, GgmlType::Q4_1, GgmlType::F16] {
        let data = file.tensor_data(t.name()).unwrap();
        let want = read_f32s(&fixture(&format!("quants/{t}.f32")));
        let repeats = 3 * (1 << 16) / want.len() + 7;
        let long: Vec<u8> = data.iter().copied().cycle().take(data.len() * repeats).collect();
        let mut got = vec![0f32; want.len() * repeats];
        dequantize(t, &long, &mut got);
        for (r, chunk) in got.chunks(want.len()).enumerate() {
            assert_close(&format!("{t} repeat {r}"), chunk, &want);
        }
    }
}

#[test]
fn types_met_cannot_dequantise_are_known_but_refused() {
    for t in [GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::IQ2_XS, GgmlType::I32, GgmlType::F64, GgmlType::MXFP4] {
        assert!(!t.is_dequantizable(), "{t}");
        let result =
            std::panic::catch_unwind(|| dequantize(t, &vec![0; t.type_size()], &mut vec![0.0; t.block_size()]));
        assert!(result.is_err(), "{t} must be refused");
    }
}
