//! `GgufStore` on small synthetic `qwen35` files: the Gated DeltaNet transformations where
//! the committed converter-made fixtures (met-model-layers' `hybrid_gguf` test) do not
//! reach (value heads tiled in a block-quantised `ssm_out`, a stored `-exp` that is not
//! negative, shapes that disagree with the head layout), and metadata errors that name
//! their GGUF key.

use met_kernels::DType;
use met_model_weights::{GgmlType, WeightError, WeightStore};

use crate::gguf_common::{Gguf, T_ARRAY, T_BOOL, q8_0};
use crate::gguf_store::{assert_metadata_error, int_matrix, metadata, open};

const K_HEADS: usize = 2;
const V_HEADS: usize = 4;
const K_DIM: usize = 16;
/// One Q8_0 block per value head.
const V_DIM: usize = 32;
const HIDDEN: usize = 64;

/// A one-layer `qwen35` header with the Gated DeltaNet keys (and one tensor, so that the
/// layer count is believed).
fn qwen35() -> Gguf {
    metadata("qwen35", 1)
        .u32("qwen35.vocab_size", 8)
        .u32("qwen35.ssm.conv_kernel", 4)
        .u32("qwen35.ssm.state_size", K_DIM as u32)
        .u32("qwen35.ssm.group_count", K_HEADS as u32)
        .u32("qwen35.ssm.time_step_rank", V_HEADS as u32)
        .u32("qwen35.ssm.inner_size", (V_HEADS * V_DIM) as u32)
        .f32_tensor("output_norm.weight", &[2], &[1.0, 1.0])
}

/// The converter's value-head reorder: grouped head `g · r + v` is stored at `v · k + g`.
fn tile<T: Clone>(heads: &[T]) -> Vec<T> {
    let r = heads.len() / K_HEADS;
    (0..r).flat_map(|v| (0..K_HEADS).map(move |g| heads[g * r + v].clone())).collect()
}

#[test]
fn tiled_columns_of_a_quantised_out_proj_come_back_grouped_in_f32() {
    let hf = int_matrix(HIDDEN, V_HEADS * V_DIM, 3);
    let stored: Vec<u8> = hf
        .iter()
        .flat_map(|row| {
            tile(&row.chunks(V_DIM).collect::<Vec<_>>())
                .concat()
                .chunks(32)
                .flat_map(|b| q8_0(1.0, b))
                .collect::<Vec<_>>()
        })
        .collect();
    let gguf = qwen35().tensor("blk.0.ssm_out.weight", &[HIDDEN, V_HEADS * V_DIM], GgmlType::Q8_0, stored);
    let (_d, _path, store) = open(&gguf);
    let store = store.unwrap();
    let name = "model.layers.0.linear_attn.out_proj.weight";
    assert_eq!(store.info(name).unwrap().dtype, DType::F32, "reordered blocks are served dequantised");
    let want: Vec<f32> = hf.iter().flatten().map(|&q| f32::from(q)).collect();
    assert_eq!(store.host(name).unwrap().to_f32_vec().unwrap(), want);
}

#[test]
fn a_log_comes_back_from_minus_exp_untiled() {
    let a_log = [-1.5f32, 0.0, 0.25, 2.0];
    let stored: Vec<f32> = tile(&a_log).iter().map(|&x| -x.exp()).collect();
    let (_d, _path, store) = open(&qwen35().f32_tensor("blk.0.ssm_a", &[V_HEADS], &stored));
    let got = store.unwrap().host("model.layers.0.linear_attn.A_log").unwrap().to_f32_vec().unwrap();
    for (g, w) in got.iter().zip(a_log) {
        assert!((g - w).abs() <= 1e-6, "{got:?} vs {a_log:?}");
    }

    let positive = qwen35().f32_tensor("blk.0.ssm_a", &[V_HEADS], &[-1.0, 0.5, -1.0, -1.0]);
    let (_d, _path, store) = open(&positive);
    let err = store.unwrap().host("model.layers.0.linear_attn.A_log").unwrap_err();
    assert!(matches!(err, WeightError::Format { .. }) && err.to_string().contains("holds 0.5"), "{err}");
}

#[test]
fn shapes_that_disagree_with_the_heads_fail_at_open() {
    let conv_rows = 2 * K_HEADS * K_DIM + V_HEADS * V_DIM;
    let conv = qwen35().f32_tensor("blk.0.ssm_conv1d.weight", &[conv_rows, 4], &vec![0.0; conv_rows * 4]);
    let (_d, _path, store) = open(&conv);
    let shape = store.unwrap().info("model.layers.0.linear_attn.conv1d.weight").unwrap().shape;
    assert_eq!(shape, [conv_rows, 1, 4], "the squeezed dimension comes back");

    let short = qwen35().f32_tensor("blk.0.ssm_conv1d.weight", &[conv_rows - 1, 4], &vec![0.0; (conv_rows - 1) * 4]);
    let (_d, _path, store) = open(&short);
    let err = store.unwrap_err().to_string();
    assert!(err.contains("blk.0.ssm_conv1d.weight") && err.contains(&format!("need {conv_rows} rows")), "{err}");
}

/// A GGUF array of booleans.
fn bools(items: &[bool]) -> Vec<u8> {
    let mut out = T_BOOL.to_le_bytes().to_vec();
    out.extend((items.len() as u64).to_le_bytes());
    out.extend(items.iter().map(|&b| u8::from(b)));
    out
}

#[test]
fn gated_delta_metadata_errors_name_the_key() {
    let k = |s: &str| format!("qwen35.ssm.{s}");
    let at_open = [
        (qwen35().without(&k("group_count")), k("group_count"), "missing"),
        (qwen35().without(&k("time_step_rank")).u32(&k("time_step_rank"), 3), k("time_step_rank"), "do not split"),
        (qwen35().without(&k("inner_size")).u32(&k("inner_size"), 130), k("inner_size"), "does not split"),
        (qwen35().without(&k("state_size")).u32(&k("state_size"), 0), k("state_size"), "positive"),
    ];
    for (gguf, key, needle) in at_open {
        let (_d, path, store) = open(&gguf);
        let err = store.map(|_| ()).expect_err(&key);
        assert_metadata_error(err, &path, &key, needle);
    }

    let key = "qwen35.attention.recurrent_layers";
    let (_d, path, store) = open(&qwen35().kv_raw(key, T_ARRAY, bools(&[])));
    assert_metadata_error(store.unwrap().config_json().unwrap_err(), &path, key, "0 entries for 1 layers");
    let (_d, path, store) = open(&qwen35().without(&k("conv_kernel")));
    assert_metadata_error(store.unwrap().config_json().unwrap_err(), &path, &k("conv_kernel"), "missing");
    let (_d, _path, store) = open(&qwen35().kv_raw(key, T_ARRAY, bools(&[true])));
    let config = store.unwrap().config_json().unwrap();
    assert_eq!(config["layer_types"], serde_json::json!(["linear_attention"]));
    assert_eq!(config["linear_value_head_dim"], V_DIM);
}
