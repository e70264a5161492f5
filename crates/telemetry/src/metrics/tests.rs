//! Checks the rendered exposition, which is what the server sends and Prometheus parses.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use super::*;

/// Every metric with its Prometheus type. `every_metric_is_rendered_with_its_type` fails if a
/// metric is registered without being listed here.
const ALL: [(&str, &str); 29] = [
    (REQUESTS_WAITING, "gauge"),
    (REQUESTS_RUNNING, "gauge"),
    (KV_BLOCKS_USED, "gauge"),
    (KV_BLOCKS_CAPACITY, "gauge"),
    (STATE_SLOTS_USED, "gauge"),
    (STATE_SLOTS_CAPACITY, "gauge"),
    (STATE_SNAPSHOTS_CACHED, "gauge"),
    (STATE_SNAPSHOTS_CAPACITY, "gauge"),
    (STATE_BYTES, "gauge"),
    (LORA_ADAPTERS_LOADED, "gauge"),
    (BATCH_INVARIANT, "gauge"),
    (PREFIX_CACHE_HIT_TOKENS, "counter"),
    (PROMPT_TOKENS_COMPUTED, "counter"),
    (GENERATED_TOKENS, "counter"),
    (PREEMPTIONS, "counter"),
    (SPEC_DRAFTS, "counter"),
    (SPEC_DRAFT_TOKENS, "counter"),
    (SPEC_ACCEPTED_TOKENS, "counter"),
    (SPEC_ACCEPTANCE_RATE, "gauge"),
    (SPEC_TOKENS_PER_STEP, "gauge"),
    (REQUESTS_FINISHED, "counter"),
    (HTTP_REQUESTS, "counter"),
    (STEP_DURATION, "histogram"),
    (STEP_TOKENS, "histogram"),
    (TIME_TO_FIRST_TOKEN, "histogram"),
    (INTER_TOKEN_LATENCY, "histogram"),
    (REQUEST_DURATION, "histogram"),
    (REQUEST_PROMPT_TOKENS, "histogram"),
    (REQUEST_GENERATION_TOKENS, "histogram"),
];

/// The value of the sample whose series (name and labels) is exactly `series`.
fn sample<'a>(text: &'a str, series: &str) -> Option<&'a str> {
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
}

#[test]
fn every_metric_is_rendered_with_its_type() {
    let text = Metrics::new().render();
    for (name, kind) in ALL {
        assert!(text.contains(&format!("# HELP {name} ")), "no HELP for {name} in:\n{text}");
        assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "no TYPE {kind} for {name} in:\n{text}");
    }
    assert_eq!(text.matches("# TYPE ").count(), ALL.len(), "a registered metric is missing from ALL:\n{text}");
}

#[test]
fn names_are_unique_and_conventional() {
    let names: HashSet<&str> = ALL.iter().map(|&(name, _)| name).collect();
    assert_eq!(names.len(), ALL.len(), "duplicate metric name");
    for (name, kind) in ALL {
        assert!(name.starts_with("met_"), "{name} lacks the met_ prefix");
        assert!(name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'), "{name}");
        assert_eq!(name.ends_with("_total"), kind == "counter", "only counters end in _total: {name}");
        assert!(!name.contains("_ms") && !name.contains("millis"), "{name} is not in base units");
        // A histogram's derived series must not collide with another metric's name.
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                assert!(!names.contains(format!("{name}{suffix}").as_str()), "{name}{suffix} collides");
            }
        }
    }
}

#[test]
fn step_moves_counters_gauges_and_histograms() {
    let metrics = Metrics::new();
    let stats = StepStats {
        duration: Duration::from_millis(3),
        batch_tokens: 300,
        prompt_tokens: 296,
        prefix_cache_hit_tokens: 64,
        generated_tokens: 4,
        preemptions: 1,
        drafts: 2,
        draft_tokens: 8,
        accepted_tokens: 6,
        waiting: 7,
        running: 4,
        kv_blocks_used: 90,
        state: Some((3, 11)),
        ..StepStats::default()
    };
    metrics.step(&stats);
    metrics.step(&stats);
    metrics.set_kv_capacity(1024);
    metrics.set_state_capacity(8, 16, 4096);
    metrics.set_lora_adapters(3);
    let text = metrics.render();

    assert_eq!(sample(&text, "met_prompt_tokens_computed_total"), Some("592"));
    assert_eq!(sample(&text, "met_prefix_cache_hit_tokens_total"), Some("128"));
    assert_eq!(sample(&text, "met_generated_tokens_total"), Some("8"));
    assert_eq!(sample(&text, "met_preemptions_total"), Some("2"));
    assert_eq!(sample(&text, "met_spec_decode_drafts_total"), Some("4"));
    assert_eq!(sample(&text, "met_spec_decode_draft_tokens_total"), Some("16"));
    assert_eq!(sample(&text, "met_spec_decode_accepted_tokens_total"), Some("12"));
    assert_eq!(sample(&text, "met_spec_decode_acceptance_rate"), Some("0.75"));
    assert_eq!(sample(&text, "met_spec_decode_tokens_per_step"), Some("4.0"));
    assert_eq!(sample(&text, "met_requests_waiting"), Some("7"));
    assert_eq!(sample(&text, "met_requests_running"), Some("4"));
    assert_eq!(sample(&text, "met_kv_blocks_used"), Some("90"));
    assert_eq!(sample(&text, "met_kv_blocks_capacity"), Some("1024"));
    assert_eq!(sample(&text, "met_lora_adapters_loaded"), Some("3"));
    assert_eq!(sample(&text, "met_state_slots_used"), Some("3"));
    assert_eq!(sample(&text, "met_state_slots_capacity"), Some("8"));
    assert_eq!(sample(&text, "met_state_snapshots_cached"), Some("11"));
    assert_eq!(sample(&text, "met_state_snapshots_capacity"), Some("16"));
    assert_eq!(sample(&text, "met_state_bytes"), Some("4096"));

    // 3 ms lies above the 2.5 ms bound and at or below the 5 ms one.
    assert_eq!(sample(&text, r#"met_engine_step_duration_seconds_bucket{le="0.0025"}"#), Some("0"));
    assert_eq!(sample(&text, r#"met_engine_step_duration_seconds_bucket{le="0.005"}"#), Some("2"));
    assert_eq!(sample(&text, r#"met_engine_step_duration_seconds_bucket{le="+Inf"}"#), Some("2"));
    assert_eq!(sample(&text, "met_engine_step_duration_seconds_count"), Some("2"));
    assert_eq!(sample(&text, "met_engine_step_duration_seconds_sum"), Some("0.006"));
    // 300 tokens: above 256, at or below 512.
    assert_eq!(sample(&text, r#"met_engine_step_tokens_bucket{le="256"}"#), Some("0"));
    assert_eq!(sample(&text, r#"met_engine_step_tokens_bucket{le="512"}"#), Some("2"));
    assert_eq!(sample(&text, r#"met_engine_step_tokens_bucket{le="16384"}"#), Some("2"));
}

#[test]
fn bucket_ranges_match_their_purpose() {
    let text = Metrics::new().render();
    for (series, first, last) in [
        ("met_engine_step_duration_seconds", "5e-05", "10"),
        ("met_inter_token_latency_seconds", "5e-05", "10"),
        ("met_engine_step_tokens", "1", "16384"),
        ("met_request_prompt_tokens", "1", "131072"),
        ("met_request_generation_tokens", "1", "131072"),
    ] {
        let bounds: Vec<&str> = text
            .lines()
            .filter_map(|line| line.strip_prefix(&format!("{series}_bucket{{le=\""))?.split('"').next())
            .collect();
        assert_eq!(bounds.first(), Some(&first), "{series}: {bounds:?}");
        assert_eq!(bounds[bounds.len() - 2], last, "{series}: {bounds:?}");
        assert_eq!(bounds.last(), Some(&"+Inf"), "{series}: {bounds:?}");
    }
}

#[test]
fn finished_counts_by_reason_and_records_request_histograms() {
    let metrics = Metrics::new();
    let before = metrics.render();
    for reason in FinishLabel::ALL {
        let series = format!("met_requests_finished_total{{reason=\"{}\"}}", reason.as_str());
        assert_eq!(sample(&before, &series), Some("0"), "{series} missing before any finish:\n{before}");
    }

    let request = RequestStats { duration: Duration::from_secs(2), prompt_tokens: 1000, generated_tokens: 3 };
    metrics.finished(FinishLabel::Length, request);
    metrics.finished(FinishLabel::Length, request);
    metrics.finished(FinishLabel::Cancelled, request);
    let text = metrics.render();

    assert_eq!(sample(&text, r#"met_requests_finished_total{reason="length"}"#), Some("2"));
    assert_eq!(sample(&text, r#"met_requests_finished_total{reason="cancelled"}"#), Some("1"));
    assert_eq!(sample(&text, r#"met_requests_finished_total{reason="stop"}"#), Some("0"));
    assert_eq!(sample(&text, "met_request_duration_seconds_count"), Some("3"));
    assert_eq!(sample(&text, r#"met_request_duration_seconds_bucket{le="1"}"#), Some("0"));
    assert_eq!(sample(&text, r#"met_request_duration_seconds_bucket{le="2.5"}"#), Some("3"));
    assert_eq!(sample(&text, r#"met_request_prompt_tokens_bucket{le="512"}"#), Some("0"));
    assert_eq!(sample(&text, r#"met_request_prompt_tokens_bucket{le="1024"}"#), Some("3"));
    assert_eq!(sample(&text, r#"met_request_generation_tokens_bucket{le="2"}"#), Some("0"));
    assert_eq!(sample(&text, r#"met_request_generation_tokens_bucket{le="4"}"#), Some("3"));
}

#[test]
fn token_latencies_are_recorded_in_seconds() {
    let metrics = Metrics::new();
    metrics.first_token(Duration::from_millis(150));
    metrics.inter_token(Duration::from_micros(800));
    metrics.inter_token(Duration::from_millis(20));
    let text = metrics.render();
    assert_eq!(sample(&text, r#"met_time_to_first_token_seconds_bucket{le="0.1"}"#), Some("0"));
    assert_eq!(sample(&text, r#"met_time_to_first_token_seconds_bucket{le="0.25"}"#), Some("1"));
    assert_eq!(sample(&text, r#"met_inter_token_latency_seconds_bucket{le="0.001"}"#), Some("1"));
    assert_eq!(sample(&text, r#"met_inter_token_latency_seconds_bucket{le="0.025"}"#), Some("2"));
}

#[test]
fn http_requests_show_their_labels() {
    let metrics = Metrics::new();
    metrics.http_request("/v1/completions", 200);
    metrics.http_request("/v1/completions", 200);
    metrics.http_request("/v1/chat/completions", 400);
    let text = metrics.render();
    assert_eq!(sample(&text, r#"met_http_requests_total{endpoint="/v1/completions",status="200"}"#), Some("2"));
    assert_eq!(sample(&text, r#"met_http_requests_total{endpoint="/v1/chat/completions",status="400"}"#), Some("1"));
}

#[test]
fn public_handles_are_the_rendered_ones_and_shareable_across_threads() {
    let metrics = Arc::new(Metrics::new());
    let engine = Arc::clone(&metrics);
    std::thread::spawn(move || {
        for _ in 0..1000 {
            engine.generated_tokens.inc();
        }
    })
    .join()
    .unwrap();
    assert_eq!(sample(&metrics.render(), "met_generated_tokens_total"), Some("1000"));
}

#[test]
fn content_type_is_the_prometheus_text_format() {
    assert_eq!(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8");
}
