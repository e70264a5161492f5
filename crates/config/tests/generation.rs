//! `generation_config.json` parsing: ids as an integer or a list, sampling defaults, and
//! errors that name the field.

use std::path::Path;

use met_config::GenerationConfig;

#[test]
fn generation_config_reads_ids_and_defaults() {
    let g = GenerationConfig::from_json(
        Path::new("generation_config.json"),
        r#"{"eos_token_id": [1, 2], "bos_token_id": 0, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "do_sample": true}"#,
    )
    .unwrap();
    assert_eq!(g.eos_token_ids, [1, 2]);
    assert_eq!((g.bos_token_id, g.temperature, g.top_k, g.do_sample), (Some(0), Some(0.6), Some(20), Some(true)));
    let single = GenerationConfig::from_json(Path::new("g.json"), r#"{"eos_token_id": 7}"#).unwrap();
    assert_eq!(single.eos_token_ids, [7]);
    let bad = GenerationConfig::from_json(Path::new("g.json"), r#"{"top_k": "many"}"#).unwrap_err().to_string();
    assert!(bad.contains("`top_k`"), "{bad}");
}
