//! The load generator (`met bench serve`) and the plotter against an in-process fake OpenAI server: an axum
//! router on 127.0.0.1:0 that streams SSE with set delays, and fails on purpose by request
//! index (status 500, a dropped connection, a stream that stops short, malformed data, an
//! error event, a hang). Only loopback is used; every test finishes in well under a second
//! or two of wall time.
//!
//! Timing checks are one-sided where the fake fixes a floor (a first token after 30 ms
//! cannot arrive sooner) and generous above it, so a loaded CI machine does not flake them.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use met_bench::ServeArgs;
use met_bench::metrics::{Summary, percentile};
use met_bench::report::BenchResult;
use serde_json::{Value, json};

/// What the fake does with one request.
#[derive(Debug, Clone, Copy)]
enum Reply {
    /// `max_tokens` content chunks: the first after `first_ms`, then one every `gap_ms`;
    /// usage (if `usage`) and `[DONE]`.
    Stream { first_ms: u64, gap_ms: u64, usage: bool },
    /// This status, no stream.
    Status(u16),
    /// Two chunks, then the connection is dropped.
    Drop,
    /// Two chunks, then a clean end with no finish reason or `[DONE]`.
    Close,
    /// A chunk that is not JSON.
    Malformed,
    /// An error object in the stream.
    ErrorEvent,
    /// Nothing for ten seconds.
    Hang,
    /// As [`FAST`], but the stream stays open for ten seconds after `[DONE]`.
    Linger,
}

const FAST: Reply = Reply::Stream { first_ms: 30, gap_ms: 10, usage: true };

struct Shared {
    behaviour: Box<dyn Fn(usize) -> Reply + Send + Sync>,
    served: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    bodies: Mutex<Vec<Value>>,
}

/// A running fake server.
struct Fake {
    base: String,
    shared: Arc<Shared>,
}

impl Fake {
    /// Serves on 127.0.0.1:0; request `i` (in arrival order) gets `behaviour(i)`.
    async fn start(behaviour: impl Fn(usize) -> Reply + Send + Sync + 'static) -> Self {
        let shared = Arc::new(Shared {
            behaviour: Box::new(behaviour),
            served: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            bodies: Mutex::new(Vec::new()),
        });
        let app = Router::new()
            .route(
                "/v1/models",
                get(|| async { axum::Json(json!({"object": "list", "data": [{"id": "fake-model"}]})) }),
            )
            .route("/v1/completions", post(complete))
            .route("/v1/chat/completions", post(complete))
            .with_state(Arc::clone(&shared));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        // As `met serve` does: no Nagle delay between small chunks.
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        tokio::spawn(axum::serve(listener, app).into_future());
        Self { base, shared }
    }

    fn bodies(&self) -> Vec<Value> {
        self.shared.bodies.lock().unwrap().clone()
    }
}

/// Counts a request in flight until its response stream is dropped.
struct InFlight(Arc<Shared>);

impl InFlight {
    fn new(shared: &Arc<Shared>) -> Self {
        let now = shared.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        shared.max_in_flight.fetch_max(now, Ordering::SeqCst);
        Self(Arc::clone(shared))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn complete(State(shared): State<Arc<Shared>>, axum::Json(body): axum::Json<Value>) -> Response {
    let index = shared.served.fetch_add(1, Ordering::SeqCst);
    shared.bodies.lock().unwrap().push(body.clone());
    let reply = (shared.behaviour)(index);
    if let Reply::Status(code) = reply {
        return (StatusCode::from_u16(code).unwrap(), "injected failure").into_response();
    }
    let script = script(reply, &body);
    let guard = Some(InFlight::new(&shared));
    let stream =
        futures_util::stream::unfold((script.into_iter().peekable(), guard), |(mut events, mut guard)| async move {
            let (delay_ms, event) = events.next()?;
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            if events.peek().is_none() {
                // The request leaves the count before its last bytes go out, so a client that
                // sends its next request on `[DONE]` never sees one too many in flight.
                guard = None;
            }
            let item = event.map(Bytes::from).ok_or_else(|| std::io::Error::other("dropped on purpose"));
            Some((item, (events, guard)))
        });
    Response::builder().header(header::CONTENT_TYPE, "text/event-stream").body(Body::from_stream(stream)).unwrap()
}

/// The events of a reply: a delay before each, and its bytes (`None`: fail the body).
fn script(reply: Reply, body: &Value) -> Vec<(u64, Option<String>)> {
    let tokens = body["max_tokens"].as_u64().unwrap() as usize;
    let chat = body.get("messages").is_some();
    let prompt_tokens = body["prompt"].as_array().map_or(0, Vec::len);
    let chunk = |i: usize, finish: bool| {
        let finish = if finish { json!("length") } else { Value::Null };
        let choice = if chat {
            json!({"index": 0, "delta": {"content": format!("t{i}")}, "finish_reason": finish})
        } else {
            json!({"index": 0, "text": format!("t{i}"), "finish_reason": finish})
        };
        Some(format!("data: {}\n\n", json!({"id": "x", "choices": [choice]})))
    };
    let done = Some("data: [DONE]\n\n".to_owned());
    match reply {
        Reply::Stream { first_ms, gap_ms, usage } => {
            let mut events: Vec<_> =
                (0..tokens).map(|i| (if i == 0 { first_ms } else { gap_ms }, chunk(i, i + 1 == tokens))).collect();
            if usage {
                let usage = json!({"prompt_tokens": prompt_tokens, "completion_tokens": tokens});
                events.push((0, Some(format!("data: {}\n\n", json!({"id": "x", "choices": [], "usage": usage})))));
            }
            events.push((0, done));
            events
        }
        Reply::Drop => vec![(5, chunk(0, false)), (5, chunk(1, false)), (5, None)],
        Reply::Close => vec![(5, chunk(0, false)), (5, chunk(1, false))],
        Reply::Malformed => vec![(5, chunk(0, false)), (5, Some("data: {\"choices\": [\n\n".into()))],
        Reply::ErrorEvent => vec![(5, Some("data: {\"error\": {\"message\": \"boom\"}}\n\n".into())), (0, done)],
        Reply::Hang => vec![(10_000, chunk(0, false))],
        Reply::Linger => {
            let mut events = script(FAST, body);
            events.push((10_000, chunk(99, false)));
            events
        }
        Reply::Status(_) => unreachable!("answered before streaming"),
    }
}

/// The flags of `met bench serve`, as a command of their own.
#[derive(Debug, clap::Parser)]
struct Cli {
    #[command(flatten)]
    args: ServeArgs,
}

/// `met bench serve --base-url BASE --quiet EXTRA...`, parsed as the binary parses it.
fn args(base: &str, extra: &[&str]) -> ServeArgs {
    let argv = ["serve", "--base-url", base, "--quiet"].into_iter().chain(extra.iter().copied());
    <Cli as clap::Parser>::try_parse_from(argv).unwrap().args
}

async fn bench(base: &str, extra: &[&str]) -> BenchResult {
    met_bench::serve(&args(base, extra)).await.unwrap()
}

async fn bench_err(base: &str, extra: &[&str]) -> String {
    format!("{:#}", met_bench::serve(&args(base, extra)).await.unwrap_err())
}

fn summary(s: &Option<Summary>) -> Summary {
    s.expect("a summary")
}

#[test]
fn percentiles_match_numpy_on_known_inputs() {
    let ms: Vec<f64> = (1..=100).map(f64::from).collect();
    // numpy.percentile(range(1, 101), [50, 90, 99]) = [50.5, 90.1, 99.01]
    for (q, want) in [(50.0, 50.5), (90.0, 90.1), (99.0, 99.01)] {
        assert!((percentile(&ms, q) - want).abs() < 1e-9, "p{q}");
    }
    let s = Summary::of_seconds(&[0.010, 0.030, 0.020, 0.040]).unwrap();
    assert!((s.mean - 25.0).abs() < 1e-9 && (s.p50 - 25.0).abs() < 1e-9 && (s.p99 - 39.7).abs() < 1e-9, "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_and_timings_follow_the_servers_delays() {
    let fake = Fake::start(|_| FAST).await;
    let started = Instant::now();
    let result =
        bench(&fake.base, &["--concurrency", "1,4", "--num-prompts", "8", "--input-len", "16", "--output-len", "6"])
            .await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(result.model, "fake-model", "the first id of GET /v1/models");
    assert_eq!(result.runs.len(), 2);
    for (run, concurrency) in result.runs.iter().zip([1, 4]) {
        let f = &run.figures;
        assert_eq!((run.concurrency, run.stopped_early, run.warmup_failed), (Some(concurrency), false, 0));
        assert_eq!((f.completed, f.failed, f.cancelled, f.errors.len()), (8, 0, 0, 0));
        assert_eq!((f.input_tokens, f.output_tokens), (8 * 16, 8 * 6), "from the server's usage");
        let (ttft, itl, tpot, e2e) = (summary(&f.ttft_ms), summary(&f.itl_ms), summary(&f.tpot_ms), summary(&f.e2e_ms));
        assert!(ttft.p50 >= 30.0 && ttft.p50 < 200.0, "TTFT {ttft:?}");
        assert!(itl.p50 >= 8.0 && itl.p50 < 60.0, "ITL {itl:?}");
        assert!(tpot.mean >= 8.0 && tpot.mean < 60.0, "TPOT {tpot:?}");
        assert!(e2e.p50 >= 30.0 + 5.0 * 10.0, "E2E {e2e:?}");
        assert!(ttft.p50 <= ttft.p90 && ttft.p90 <= ttft.p99);
        let expected = f.completed as f64 / f.duration_s;
        assert!((f.request_throughput - expected).abs() < 1e-9);
        assert!((f.output_throughput - 6.0 * expected).abs() < 1e-6);
        assert!((f.total_token_throughput - 22.0 * expected).abs() < 1e-6);
        assert_eq!(f.goodput, None, "no SLO given");
    }
    let (c1, c4) = (result.runs[0].figures.duration_s, result.runs[1].figures.duration_s);
    assert!(c4 < c1 * 0.6, "four at a time is faster: {c4} s vs {c1} s");

    let bodies = fake.bodies();
    assert_eq!(bodies.len(), 2 * (8 + 1), "eight measured and one warm-up per point");
    for body in &bodies {
        assert_eq!(body["prompt"].as_array().unwrap().len(), 16);
        assert_eq!(
            (&body["max_tokens"], &body["min_tokens"], &body["ignore_eos"]),
            (&json!(6), &json!(6), &json!(true))
        );
        assert_eq!((&body["stream"], &body["stream_options"]["include_usage"]), (&json!(true), &json!(true)));
        assert_eq!(body["model"], "fake-model");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_is_held_exactly_and_prefixes_are_shared() {
    let fake = Fake::start(|_| FAST).await;
    let extra = ["--concurrency", "3", "--num-prompts", "9", "--num-warmup", "0", "--model", "m"];
    let result =
        bench(&fake.base, &[&extra[..], &["--prefix-len", "8", "--input-len", "4", "--output-len", "3"][..]].concat())
            .await;
    assert_eq!(result.runs[0].figures.completed, 9);
    assert_eq!(fake.shared.max_in_flight.load(Ordering::SeqCst), 3);
    let prompts: Vec<Vec<u64>> = fake
        .bodies()
        .iter()
        .map(|b| b["prompt"].as_array().unwrap().iter().map(|id| id.as_u64().unwrap()).collect())
        .collect();
    assert!(prompts.iter().all(|p| p.len() == 12 && p[..8] == prompts[0][..8]), "one shared prefix");
    assert!(prompts.iter().all(|p| p.iter().all(|id| (1000..30000).contains(id))));
    assert_ne!(prompts[0][8..], prompts[1][8..], "distinct tails");
    assert_eq!(fake.bodies()[0]["model"], "m", "--model is sent as given");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_without_usage_counts_content_chunks() {
    let fake = Fake::start(|_| Reply::Stream { first_ms: 5, gap_ms: 2, usage: false }).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("prompts.jsonl");
    std::fs::write(&path, "{\"prompt\": \"hello\", \"max_tokens\": 3}\n{\"prompt\": \"world\"}\n").unwrap();
    let path = path.to_str().unwrap();
    let extra = ["--endpoint", "chat", "--dataset", "jsonl", "--dataset-path", path, "--output-len", "5"];
    let result = bench(
        &fake.base,
        &[&extra[..], &["--num-prompts", "4", "--num-warmup", "0", "--concurrency", "2"][..]].concat(),
    )
    .await;
    let f = &result.runs[0].figures;
    assert_eq!((f.completed, f.output_tokens, f.input_tokens), (4, 3 + 5 + 3 + 5, 0), "chunks; no prompt count known");
    assert!(summary(&f.itl_ms).p50 >= 1.5);
    let bodies = fake.bodies();
    let messages: Vec<&str> = bodies.iter().map(|b| b["messages"][0]["content"].as_str().unwrap()).collect();
    assert_eq!(messages.iter().filter(|m| **m == "hello").count(), 2, "the file is cycled");
    assert!(bodies.iter().all(|b| b.get("ignore_eos").is_none() && b["messages"][0]["role"] == "user"));
    assert_eq!((result.dataset.name.as_str(), result.endpoint.as_str()), ("jsonl", "chat"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_failure_is_counted_by_kind() {
    let kinds = [
        Reply::Status(500),
        Reply::Drop,
        Reply::Close,
        Reply::Malformed,
        Reply::ErrorEvent,
        Reply::Hang,
        FAST,
        Reply::Linger,
    ];
    let fake = Fake::start(move |i| kinds[i % kinds.len()]).await;
    let started = Instant::now();
    let extra =
        ["--concurrency", "8", "--num-prompts", "16", "--num-warmup", "0", "--timeout-s", "0.5", "--output-len", "4"];
    let result = bench(&fake.base, &extra).await;
    assert!(started.elapsed() < Duration::from_secs(5), "timeouts bound the run");
    let f = &result.runs[0].figures;
    let errors: Vec<(&str, usize)> = f.errors.iter().map(|(k, n)| (k.as_str(), *n)).collect();
    assert_eq!(
        errors,
        [("error event", 2), ("http 500", 2), ("malformed sse", 2), ("stream ended early", 4), ("timeout", 2)]
    );
    assert_eq!((f.completed, f.failed, f.output_tokens), (4, 12, 16), "a stream left open after [DONE] completed");
    assert!(summary(&f.ttft_ms).p50 >= 30.0, "only completed requests are timed");
    assert!(summary(&f.e2e_ms).p99 < 400.0, "the end is [DONE], not the body's end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_a_connect_error() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let err = bench_err(&closed, &["--model", "m", "--num-prompts", "2"]).await;
    assert!(err.contains("cannot connect") && err.contains(&closed), "{err}");
    let result = bench(&closed, &["--model", "m", "--num-prompts", "2", "--num-warmup", "0"]).await;
    assert_eq!(result.runs[0].figures.errors.get("connect"), Some(&2));
    let err = bench_err(&closed, &["--num-prompts", "2"]).await;
    assert!(err.contains("--model") && err.contains("/v1/models"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goodput_counts_requests_within_the_slo() {
    let slow = Reply::Stream { first_ms: 150, gap_ms: 5, usage: true };
    let fake = Fake::start(move |i| if i % 2 == 0 { FAST } else { slow }).await;
    let extra = ["--concurrency", "4", "--num-prompts", "8", "--num-warmup", "0", "--output-len", "3"];
    let result =
        bench(&fake.base, &[&extra[..], &["--slo-ttft-ms", "100", "--slo-tpot-ms", "1000"][..]].concat()).await;
    let f = &result.runs[0].figures;
    let good = f.goodput.unwrap() * f.duration_s;
    assert!((good - 4.0).abs() < 1e-6, "the four fast ones: {good}");
    assert_eq!((result.slo.ttft_ms, result.slo.tpot_ms), (Some(100.0), Some(1000.0)));
    let fake = Fake::start(|_| FAST).await;
    let result = bench(&fake.base, &[&extra[..], &["--slo-tpot-ms", "1"][..]].concat()).await;
    assert_eq!(result.runs[0].figures.goodput, Some(0.0), "10 ms per token misses a 1 ms TPOT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_rates_and_the_total_deadline_bound_the_run() {
    let fake = Fake::start(|_| Reply::Stream { first_ms: 2, gap_ms: 1, usage: true }).await;
    let extra = ["--request-rate", "100,200", "--burstiness", "0.5", "--num-prompts", "10", "--output-len", "2"];
    let result = bench(&fake.base, &extra).await;
    let rates: Vec<_> = result.runs.iter().map(|r| (r.request_rate, r.burstiness, r.figures.completed)).collect();
    assert_eq!(rates, [(Some(100.0), Some(0.5), 10), (Some(200.0), Some(0.5), 10)]);

    let fake = Fake::start(|_| Reply::Hang).await;
    let started = Instant::now();
    let extra = ["--concurrency", "2,4", "--num-prompts", "4", "--num-warmup", "0", "--max-duration-s", "0.3"];
    let result = bench(&fake.base, &extra).await;
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    assert_eq!(result.runs.len(), 1, "the second point is skipped");
    let run = &result.runs[0];
    assert!(run.stopped_early);
    assert_eq!((run.figures.completed, run.figures.failed, run.figures.cancelled), (0, 0, 4));
    assert_eq!(run.figures.ttft_ms, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_json_result_has_every_field() {
    let fake = Fake::start(|_| FAST).await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("r.json");
    let extra = ["--concurrency", "2", "--num-prompts", "4", "--output-len", "3", "--seed", "9", "--label", "met"];
    let result = bench(&fake.base, &[&extra[..], &["--output", out.to_str().unwrap()][..]].concat()).await;
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert!(json["command_line"].as_array().is_some_and(|a| !a.is_empty()));
    assert_eq!((json["base_url"].as_str(), json["model"].as_str()), (Some(fake.base.as_str()), Some("fake-model")));
    assert_eq!(json["label"], "met");
    assert_eq!(json["met_version"], env!("CARGO_PKG_VERSION"));
    assert!(json["git_commit"].is_null() || json["git_commit"].as_str().unwrap().len() == 40);
    assert!(json["date"].as_str().unwrap().parse::<jiff::Timestamp>().is_ok(), "{}", json["date"]);
    assert!(json["machine"]["cores"].as_u64().unwrap() >= 1);
    assert!(json["machine"].get("hostname").is_some() && json["machine"].get("cpu").is_some());
    let dataset = &json["dataset"];
    assert_eq!(
        (&dataset["name"], &dataset["input_len"], &dataset["output_len"], &dataset["prefix_len"], &dataset["seed"]),
        (&json!("random"), &json!(128), &json!(3), &json!(0), &json!(9))
    );
    assert_eq!((&dataset["num_prompts"], &dataset["random_ids"]), (&json!(4), &json!([1000, 30000])));
    let run = &json["runs"][0];
    assert_eq!((&run["concurrency"], &run["completed"], &run["failed"]), (&json!(2), &json!(4), &json!(0)));
    for key in ["request_throughput", "output_throughput", "total_token_throughput", "duration_s"] {
        assert!(run[key].as_f64().unwrap() > 0.0, "{key}");
    }
    for key in ["ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"] {
        for stat in ["mean", "p50", "p90", "p99"] {
            assert!(run[key][stat].as_f64().unwrap() > 0.0, "{key}.{stat}");
        }
    }
    assert!(run["goodput"].is_null() && run["errors"] == json!({}));
    let read = BenchResult::read_json(&out).unwrap();
    assert_eq!(
        (&read.model, &read.dataset, read.runs.len()),
        (&result.model, &result.dataset, 1),
        "the file reads back"
    );
    let (a, b) = (read.runs[0].figures.e2e_ms.unwrap(), result.runs[0].figures.e2e_ms.unwrap());
    assert!((a.p99 - b.p99).abs() < 1e-9 && read.runs[0].figures.completed == 4);
}

/// Lines through a whole ladder in the SVG, counted by stroke colour: polylines of exactly
/// `points` points that span more than 100 px across (dashes and legend samples are short).
fn lines_by_colour(svg: &str, points: usize) -> std::collections::BTreeMap<String, usize> {
    let doc = roxmltree::Document::parse(svg).expect("well-formed XML");
    let mut lines = std::collections::BTreeMap::new();
    for node in doc.descendants().filter(|n| n.has_tag_name("polyline")) {
        let xs: Vec<f64> = node
            .attribute("points")
            .unwrap()
            .split_whitespace()
            .map(|p| p.split_once(',').unwrap().0.parse().unwrap())
            .collect();
        let span = xs.iter().copied().fold(f64::MIN, f64::max) - xs.iter().copied().fold(f64::MAX, f64::min);
        if xs.len() == points && span > 100.0 {
            *lines.entry(node.attribute("stroke").unwrap().to_owned()).or_insert(0) += 1;
        }
    }
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plots_are_well_formed_svg_with_one_line_per_result_file() {
    let fake = Fake::start(|_| Reply::Stream { first_ms: 3, gap_ms: 1, usage: true }).await;
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    let ladder = ["--concurrency", "1,2,4", "--num-prompts", "4", "--output-len", "3", "--num-warmup", "0"];
    for label in ["met", "peer"] {
        let files =
            ["--label", label, "--output", &path(&format!("{label}.json")), "--plot", &path(&format!("{label}.svg"))];
        bench(&fake.base, &[&ladder[..], &files[..]].concat()).await;
    }
    let single = std::fs::read_to_string(path("met.svg")).unwrap();
    let lines = lines_by_colour(&single, 3);
    assert_eq!(lines.values().copied().collect::<Vec<_>>(), [3], "one result, one colour: {lines:?}");
    assert!(single.contains(">met<") || single.contains("met p50"), "the label is drawn");

    met_bench::plot::plot_files(&[path("met.json").into(), path("peer.json").into()], Path::new(&path("cmp.svg")))
        .unwrap();
    let svg = std::fs::read_to_string(path("cmp.svg")).unwrap();
    let lines = lines_by_colour(&svg, 3);
    // One line per file in each panel: throughput, TTFT p50, TPOT p50 (the dashed p99s are
    // drawn as short segments).
    assert_eq!(lines.values().copied().collect::<Vec<_>>(), [3, 3], "{lines:?}");
    assert!(svg.contains("peer p50") && svg.contains("met p50"));

    let rate = ["--request-rate", "100", "--num-prompts", "2", "--output-len", "2", "--output", &path("rate.json")];
    bench(&fake.base, &rate).await;
    let err =
        met_bench::plot::plot_files(&[path("met.json").into(), path("rate.json").into()], Path::new(&path("x.svg")))
            .unwrap_err();
    assert!(err.to_string().contains("cannot overlay"), "{err}");
    let err = met_bench::plot::plot_files(&[path("nope.json").into()], Path::new(&path("x.svg"))).unwrap_err();
    assert!(format!("{err:#}").contains("nope.json"), "{err:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_an_error_naming_the_flag_or_file() {
    let base = "http://127.0.0.1:9";
    let cases: &[(&[&str], &str)] = &[
        (&["--dataset", "jsonl"], "--dataset-path"),
        (&["--dataset", "sharegpt", "--dataset-path", "/nonexistent/share.json"], "/nonexistent/share.json"),
        (&["--concurrency", "0"], "--concurrency"),
        (&["--request-rate", "0"], "--request-rate"),
        (&["--request-rate", "inf"], "--request-rate"),
        (&["--request-rate", "1", "--burstiness", "0"], "--burstiness"),
        (&["--num-prompts", "0"], "--num-prompts"),
        (&["--timeout-s=-1"], "--timeout-s"),
        (&["--slo-ttft-ms", "0"], "--slo-ttft-ms"),
        (&["--endpoint", "chat"], "--endpoint completions"),
        (&["--output-len", "0"], "--output-len"),
    ];
    for (extra, says) in cases {
        let err = bench_err(base, &[&["--model", "m"][..], *extra].concat()).await;
        assert!(err.contains(says), "{extra:?}: {err}");
    }
    for url in ["localhost:8000", "https://example.com", "http://"] {
        let err = bench_err(url, &["--model", "m"]).await;
        assert!(err.contains("--base-url"), "{url}: {err}");
    }
    for (extra, says) in [(&["--dataset", "imagenet"][..], "--dataset"), (&["--concurrency", ""][..], "--concurrency")]
    {
        let argv = ["serve", "--base-url", base].into_iter().chain(extra.iter().copied());
        let err = <Cli as clap::Parser>::try_parse_from(argv).unwrap_err().to_string();
        assert!(err.contains(says), "{extra:?}: {err}");
    }
}
