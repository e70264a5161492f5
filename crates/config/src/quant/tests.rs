use std::path::Path;

use super::*;
use crate::ConfigJson;

fn read(q: &str) -> Result<Option<QuantConfig>, ConfigError> {
    let json = ConfigJson::parse(Path::new("config.json"), &format!(r#"{{"quantization_config": {q}}}"#)).unwrap();
    QuantConfig::read(&json.raw())
}

fn err(q: &str) -> String {
    read(q).expect_err("refused").to_string()
}

#[test]
fn qwen_block_wise_fp8_reads_its_blocks_and_skipped_modules() {
    let q = read(
        r#"{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]}"#,
    )
    .unwrap()
    .unwrap();
    assert_eq!(q.scales, Some(ScaleLayout::Block(128, 128)));
    assert!(!q.static_activations);
    assert_eq!(q.unquantized, ["lm_head"]);
}

#[test]
fn per_tensor_fp8_with_static_activations() {
    let q = read(r#"{"quant_method": "fp8", "activation_scheme": "static"}"#).unwrap().unwrap();
    assert_eq!((q.scales, q.static_activations), (None, true));
}

#[test]
fn compressed_tensors_float8_channel_and_block() {
    let group = |w: &str| {
        format!(
            r#"{{"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
                "config_groups": {{"group_0": {{"targets": ["Linear"], "weights": {w},
                "input_activations": {{"num_bits": 8, "type": "float", "strategy": "token", "dynamic": true}}}}}}}}"#
        )
    };
    let channel = read(&group(r#"{"num_bits": 8, "type": "float", "strategy": "channel"}"#)).unwrap().unwrap();
    assert_eq!((channel.scales, channel.static_activations), (Some(ScaleLayout::Channel), false));
    assert_eq!(channel.unquantized, ["lm_head"]);
    let block = group(r#"{"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 64]}"#);
    assert_eq!(read(&block).unwrap().unwrap().scales, Some(ScaleLayout::Block(128, 64)));
    let int4 = err(&group(r#"{"num_bits": 4, "type": "int", "strategy": "group"}"#));
    assert!(int4.contains("4-bit int") && int4.contains("quantization_config.config_groups.group_0.weights"), "{int4}");
}

#[test]
fn methods_and_formats_met_cannot_load_are_named() {
    let gptq = err(r#"{"quant_method": "gptq", "bits": 4}"#);
    assert!(gptq.contains("`gptq`") && gptq.contains("quantization_config.quant_method"), "{gptq}");
    assert!(err(r#"{"quant_method": "fp8", "fmt": "e5m2"}"#).contains("e5m2"));
    assert!(err(r#"{"quant_method": "fp8", "weight_block_size": [128]}"#).contains("weight_block_size"));
    assert!(err(r#"{"quant_method": "compressed-tensors"}"#).contains("config_groups"));
}

#[test]
fn no_quantization_config_is_none() {
    let json = ConfigJson::parse(Path::new("config.json"), "{}").unwrap();
    assert_eq!(QuantConfig::read(&json.raw()).unwrap(), None);
}
