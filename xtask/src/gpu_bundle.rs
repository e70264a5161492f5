//! `cargo xtask gpu-bundle`: everything the GPU machine needs, in one folder that travels.
//!
//! The GPU machine has no Rust toolchain and no network, so the CUDA build happens here
//! (cudarc loads the driver, NVRTC and cuBLAS at run time, so no toolkit is needed) and
//! `gpu-bundle/` (ignored by git) receives:
//!
//! - `met`: the release binary with `--features cuda`;
//! - `tests/`: the GPU test binaries (the op conformance suite, the kernels' unit tests
//!   with the NVRTC compile, the Hugging Face fixtures through the engine), release, with
//!   stable names;
//! - `configs/`: the real `config.json` files of the transformers comparison;
//!   `gpu_compare.py`: that comparison;
//!   `gpu_gate.py`: the precision gate (sharp random weights of every architecture, prompts
//!   to 4,096 tokens, met against transformers-float32 within 1.5x transformers-bf16's own
//!   distance), with its test of the test (a deliberately wrong kernel must fail it), and
//!   `gpu_gate_fp8.py`, its FP8 checkpoints and references (block-wise and per-tensor e4m3
//!   weights, judged against transformers' FP8 linear);
//! - `run.sh`: run from inside the repository it was built from (a device run carries the
//!   working tree, and the fixtures the tests read are its own
//!   `crates/model-layers/tests/fixtures/hf`, not a copy: the tree and the bundle together
//!   must stay under a run's 64 MiB); it runs every test binary, the gate and the comparison, then prints a pass/fail
//!   summary, the gate's per-length table and the comparison's numbers; logs go to the
//!   folder given as its first argument, and further arguments pick steps by name
//!   (`run.sh logs ops gate`).
//!
//! Binaries are stripped and gzipped (`met.gz`, `tests/*.gz`) so the folder stays well
//! under the 64 MiB a device call carries beside the working tree; the task fails if it
//! does not. `unpack.sh` (which `run.sh` runs first; a hand-written command runs it before
//! calling a binary) restores them next to their archives, on the GPU machine.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::{cargo, root, run};

/// The most the bundle may weigh (the device call carries 64 MiB with the working tree).
const MAX_BYTES: u64 = 48 << 20;

/// Test binaries to bundle: (cargo arguments selecting them, name in the bundle).
const TESTS: [(&[&str], &str); 6] = [
    (&["-p", "met-kernels", "--test", "ops"], "kernels-ops"),
    (&["-p", "met-kernels", "--lib"], "kernels-lib"),
    (&["-p", "met-scheduler", "--test", "gpu_hf_fixtures"], "scheduler-gpu-hf-fixtures"),
    (&["-p", "met-scheduler", "--test", "batch_invariance"], "scheduler-batch-invariance"),
    (&["-p", "met-model-layers", "--test", "gpu_graphs"], "model-layers-gpu-graphs"),
    (&["-p", "met-model-layers", "--test", "gpu_lora_graphs"], "model-layers-gpu-lora-graphs"),
];

/// Builds and fills `gpu-bundle/`.
pub fn gpu_bundle(args: &[String]) -> Result<()> {
    if !args.is_empty() {
        bail!("usage: cargo xtask gpu-bundle");
    }
    let out = root().join("gpu-bundle");
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("clearing {}", out.display()))?;
    }
    std::fs::create_dir_all(out.join("tests"))?;

    run(cargo().args(["build", "--release", "-p", "met-server", "--features", "cuda"]))?;
    pack(&root().join("target/release/met"), &out.join("met"))?;
    for (select, name) in TESTS {
        let exe = build_test(select)?;
        pack(&exe, &out.join("tests").join(name))?;
    }
    let bench = build_artifact(&["bench", "-p", "met-kernels", "--bench", "cuda"], "bench")?;
    pack(&bench, &out.join("tests").join("kernels-bench"))?;
    for config in ["Qwen3-0.6B", "Llama-3.1-8B-Instruct", "Qwen3-30B-A3B"] {
        copy_dir(&root().join("configs").join(config), &out.join("configs").join(config))?;
    }
    for script in ["gpu_compare.py", "gpu_gate.py", "gpu_gate_fp8.py", "ncu_summary.py"] {
        std::fs::copy(root().join("scripts").join(script), out.join(script))?;
    }
    write_executable(&out.join("run.sh"), RUNNER)?;
    write_executable(&out.join("unpack.sh"), UNPACK)?;

    let bytes = dir_bytes(&out)?;
    eprintln!("xtask: gpu-bundle: {:.1} MiB in {}", bytes as f64 / f64::from(1 << 20), out.display());
    if bytes > MAX_BYTES {
        bail!("the bundle is {bytes} bytes, over the {MAX_BYTES} it may carry");
    }
    Ok(())
}

/// Builds one GPU test binary in release mode and returns its path, read from cargo's
/// JSON messages.
fn build_test(select: &[&str]) -> Result<PathBuf> {
    let mut args = vec!["test", "--release"];
    args.extend(select);
    build_artifact(&args, "test")
}

/// Runs `cargo ARGS --features cuda --no-run` and returns the executable of the last
/// artifact whose target is of `kind` (`test`: a test harness, `bench`: a bench target).
fn build_artifact(args: &[&str], kind: &str) -> Result<PathBuf> {
    let mut cmd = cargo();
    cmd.args(args).args(["--features", "cuda", "--no-run", "--message-format=json"]);
    eprintln!("xtask: {cmd:?}");
    let output = cmd.current_dir(root()).stderr(Stdio::inherit()).output().context("running cargo test --no-run")?;
    if !output.status.success() {
        bail!("{cmd:?} failed with {}", output.status);
    }
    let mut found = None;
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let is_kind = match kind {
            "bench" => msg["target"]["kind"].as_array().is_some_and(|k| k.iter().any(|v| v == "bench")),
            _ => msg["profile"]["test"].as_bool() == Some(true),
        };
        if msg["reason"] == "compiler-artifact"
            && is_kind
            && let Some(exe) = msg["executable"].as_str()
        {
            found = Some(PathBuf::from(exe));
        }
    }
    found.with_context(|| format!("cargo built no {kind} executable for {args:?}"))
}

/// `from` stripped and gzipped into `to.gz`.
fn pack(from: &Path, to: &Path) -> Result<()> {
    strip_into(from, to)?;
    let status = Command::new("gzip").args(["-9", "-f"]).arg(to).status().context("running gzip")?;
    if !status.success() {
        bail!("gzip {} failed with {status}", to.display());
    }
    Ok(())
}

/// Copies `from` to `to` without debug info and symbols (`strip`, or a plain copy where
/// the machine has none).
fn strip_into(from: &Path, to: &Path) -> Result<()> {
    let stripped = Command::new("strip").arg("-o").arg(to).arg(from).status();
    if !matches!(stripped, Ok(s) if s.success()) {
        eprintln!("xtask: strip unavailable or failed; copying {} unstripped", from.display());
        std::fs::copy(from, to).with_context(|| format!("copying {}", from.display()))?;
    }
    Ok(())
}

/// Copies the files of `from` into `to`, recursively.
fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

fn dir_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        total += if entry.file_type()?.is_dir() { dir_bytes(&entry.path())? } else { entry.metadata()?.len() };
    }
    Ok(total)
}

fn write_executable(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

/// Restores the gzipped binaries beside their archives.
const UNPACK: &str = r#"#!/usr/bin/env bash
# Restores met and tests/* from their .gz archives (made by `cargo xtask gpu-bundle`), every
# time: a binary left by an earlier run on the same machine may be older than its archive
# whatever the files' times say. Run it on the GPU machine, not where the bundle is built
# (the folder would then carry both).
set -eu
HERE="$(cd "$(dirname "$0")" && pwd)"
for gz in "$HERE"/met.gz "$HERE"/tests/*.gz; do
  [ -e "$gz" ] || continue
  bin="${gz%.gz}"
  gzip -dc "$gz" >"$bin.tmp" && chmod +x "$bin.tmp" && mv "$bin.tmp" "$bin"
done
"#;

/// The runner. Every step runs even when an earlier one fails; the summary lists each
/// step's status, the GPU fixture lines and the comparison's table.
const RUNNER: &str = r#"#!/usr/bin/env bash
# Runs every GPU test of met and the comparison with transformers, then prints a summary.
# Usage: run.sh [LOG_DIR [STEP...]]   (default: ./logs, every step). A STEP is one of lib,
# ops, fixtures, graphs, invariance, generate, gate, gatestate, gatefp8, gatekv, compare, bench, kbench,
# profile, profilebatch. Made by
# `cargo xtask gpu-bundle`.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
bash "$HERE/unpack.sh" || { echo "unpacking the binaries failed"; exit 1; }
LOGS="${1:-$HERE/logs}"
shift || true
STEPS="${*:-lib ops fixtures graphs invariance generate gate gatestate gatefp8 gatekv compare bench kbench}"
mkdir -p "$LOGS"
CUDA_HOME="${CUDA_HOME:-${CUDA_PATH:-/usr/local/cuda}}"
export LD_LIBRARY_PATH="$CUDA_HOME/lib64:${LD_LIBRARY_PATH:-}"
export MET_HOME="${MET_HOME:-$(mktemp -d /tmp/met-home.XXXX)}"
export MET_HF_FIXTURES="${MET_HF_FIXTURES:-$HERE/../crates/model-layers/tests/fixtures/hf}"
export RUST_BACKTRACE=1 PYTHONUNBUFFERED=1 MET_LOG="${MET_LOG:-info}"
declare -a SUMMARY
FAILED=0

wanted() { case " $STEPS " in *" $1 "*) return 0;; *) return 1;; esac; }

step() {  # step KEY NAME LOG SECONDS COMMAND...: runs COMMAND for at most SECONDS, if KEY is wanted
  wanted "$1" || return 0
  local name="$2" log="$LOGS/$3" limit="$4"; shift 4
  local start=$SECONDS
  timeout --signal=KILL "$limit" "$@" >"$log" 2>&1
  local rc=$?
  local status=PASS; [ $rc -eq 0 ] || { status="FAIL(rc=$rc)"; FAILED=1; }
  local counts; counts=$(grep -E "^test result:" "$log" | tail -1 | sed 's/^test result: //')
  SUMMARY+=("$(printf '%-28s %-10s %4ss  %s' "$name" "$status" $((SECONDS - start)) "$counts")")
  echo "== $name: $status"
  if [ $rc -ne 0 ]; then grep -E "panicked|FAILED|failed|error" "$log" | head -20; fi
}

nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader | tee "$LOGS/gpu.txt"
# 240 s: its NVRTC test compiles every kernel cold (36 s alone on an H100), and with other
# bundle runs beside it on the machine 120 s ran out.
step lib "kernels lib (NVRTC)" kernels-lib.log 240 "$HERE/tests/kernels-lib" --test-threads=4
# The CPU checks in one process, each CUDA check in its own, so a kernel fault (which
# poisons the whole CUDA context) is pinned on the check that caused it; four at a time (the
# GPU has room for them, and each process mostly waits on its own launches), each with its
# own log, printed in full when it fails.
op_one() {  # op_one TEST: runs one CUDA check into $LOGS/ops/TEST.log, prints ok/FAILED
  local out="FAILED: $1" inv
  if "$HERE/tests/kernels-ops" --exact "$1" --test-threads=1 --nocapture >"$LOGS/ops/$1.log" 2>&1; then
    out="ok: $1"
    inv=$(grep -h "BATCH-INVARIANCE" "$LOGS/ops/$1.log")
    [ -n "$inv" ] && out="$out"$'\n'"$inv"
  fi
  printf '%s\n' "$out"  # one write, so parallel checks' lines do not interleave
}
ops_each() {
  local bin="$HERE/tests/kernels-ops" fail=0 pass t
  "$bin" cpu:: --test-threads=8 || fail=$((fail + 1))
  mkdir -p "$LOGS/ops"
  # The first check alone: it fills the kernel cache the others then read.
  local checks; checks=$("$bin" --list 2>/dev/null | grep -E '^cuda(_only|_mma|_invariant|_gguf_int8)?::' | sed 's/: test$//')
  { echo "$checks" | head -1 | xargs -r -I{} bash -c 'op_one "$1"' _ {}
    echo "$checks" | tail -n +2 | xargs -r -P 4 -I{} bash -c 'op_one "$1"' _ {}; } > "$LOGS/ops/results.txt"
  cat "$LOGS/ops/results.txt"
  pass=$(grep -c '^ok: ' "$LOGS/ops/results.txt")
  for t in $(sed -n 's/^FAILED: //p' "$LOGS/ops/results.txt"); do
    fail=$((fail + 1)); echo "== $t"; cat "$LOGS/ops/$t.log"
  done
  echo "test result: cuda checks: $pass passed; $fail failed (cpu checks in one run before)"
  [ $fail -eq 0 ]
}
export -f op_one
export -f ops_each
export HERE LOGS
step ops "kernels ops (cpu + cuda)" kernels-ops.log 360 bash -c ops_each
step fixtures "hf fixtures on gpu" gpu-hf-fixtures.log 120 "$HERE/tests/scheduler-gpu-hf-fixtures" --nocapture --test-threads=1
step graphs "cuda graphs = eager" gpu-graphs.log 90 "$HERE/tests/model-layers-gpu-graphs" --nocapture --test-threads=1
step graphs "cuda graphs with LoRA = eager" gpu-lora-graphs.log 90 "$HERE/tests/model-layers-gpu-lora-graphs" \
  --nocapture --test-threads=1
# `--batch-invariant`'s promise through the engine on the attention fixtures (Llama, Qwen2/3,
# Qwen3-MoE, Mistral, Gemma 2/3; LoRA on Llama): alone = one batch = chunks of 7 =
# preempted = prefix hit, bit for bit; then the census of the default kernels, which do not
# promise it (how many requests differ, printed, never failing).
invariance() {
  MET_TEST_BACKEND=cuda-invariant "$HERE/tests/scheduler-batch-invariance" every_fixture --nocapture --test-threads=1 || return 1
  MET_TEST_BACKEND=cuda MET_TEST_CENSUS=1 "$HERE/tests/scheduler-batch-invariance" every_fixture --nocapture --test-threads=1 \
    | grep -E "census|CENSUS"
}
export -f invariance
step invariance "--batch-invariant: alone = batched (fixtures)" gpu-invariance.log 300 bash -c invariance
# A fresh met home, so this run logs the NVRTC compile (later runs log cache hits).
step generate "met generate (fixture)" met-generate.log 90 env MET_HOME="$(mktemp -d /tmp/met-home.XXXX)" "$HERE/met" generate --device auto --model "$MET_HF_FIXTURES/qwen3" \
  --prompt-ids 1,2,3,4,5 --prompt-ids 7,8,9 --max-tokens 8 --json --timing
# The precision gate, and its test: met with a deliberately wrong attention kernel must fail.
step gate "precision gate (+ broken variant)" gpu-gate.log 540 python3 "$HERE/gpu_gate.py" --met "$HERE/met" \
  --work /tmp/met-gpu-gate --out "$LOGS/gpu_gate.json" --broken drop-last-kv-block
# The hybrid shapes again, with a convolution that forgets its state: that must fail too.
step gatestate "precision gate, lost conv state" gpu-gate-state.log 300 python3 "$HERE/gpu_gate.py" --met "$HERE/met" \
  --work /tmp/met-gpu-gate-state --out "$LOGS/gpu_gate_state.json" --broken drop-conv-state \
  --shapes qwen3-next,qwen3.5-dense,qwen3.5-moe
# The FP8 shapes (block-wise and per-tensor e4m3 weights, kept e4m3 by met), judged against
# transformers' FP8 linear; met with every other weight scale doubled must fail.
step gatefp8 "precision gate, fp8 weights" gpu-gate-fp8.log 420 python3 "$HERE/gpu_gate.py" --met "$HERE/met" \
  --work /tmp/met-gpu-gate-fp8 --out "$LOGS/gpu_gate_fp8.json" --broken fp8-wrong-scale \
  --shapes qwen3-fp8-block,llama-fp8-tensor
# The FP8 KV cache (e4m3 pools under calibrated per-layer scales) on an attention shape of
# each head dim the e4m3 kernels take (32: the reference and decode; 128: the tiles) and a
# hybrid, judged against transformers attending over e4m3 keys and values; met reading the
# values under the keys' scale must fail.
step gatekv "precision gate, fp8 KV cache" gpu-gate-kv.log 420 python3 "$HERE/gpu_gate.py" --met "$HERE/met" \
  --work /tmp/met-gpu-gate-kv --out "$LOGS/gpu_gate_kv.json" --broken fp8-kv-wrong-scale --kv-cache-dtype fp8 \
  --shapes llama-tied-rope3,qwen3-hd128,qwen3-next
step compare "transformers comparison" gpu-compare.log 220 python3 "$HERE/gpu_compare.py" --met "$HERE/met" \
  --configs "$HERE/configs" --work /tmp/met-gpu-compare --out "$LOGS/gpu_compare.json"
# The offline benches on dummy weights of the real configs: decode latency at batch 1, 8
# and 32 and 256 requests at once, 128 prompt tokens and 256 generated, JSON results in the
# log dir.
bench_offline() {
  local model batch
  for model in Llama-3.1-8B-Instruct Qwen3-0.6B; do
    for batch in 1 8 32; do
      "$HERE/met" bench latency --model "$HERE/configs/$model" --load-format dummy --batch-size $batch \
        --input-len 128 --output-len 256 --num-iters 3 --output "$LOGS/bench-latency-$model-b$batch.json" || return 1
    done
    "$HERE/met" bench throughput --model "$HERE/configs/$model" --load-format dummy --num-prompts 256 \
      --input-len 128 --output-len 256 --output "$LOGS/bench-throughput-$model.json" || return 1
  done
}
export -f bench_offline
step bench "offline benches (dummy weights)" bench.log 300 bash -c bench_offline
# Not run by default (`run.sh lorabench`): Llama-3.1-8B shape on dummy weights, base and
# with 8 random rank-16 adapters on all seven projections, side by side: batch 1 latency
# and 256 requests at once, alternating base and adapters.
bench_lora() {
  local m="$HERE/configs/Llama-3.1-8B-Instruct" lora
  for lora in "" "--lora-dummy 8:16" "" "--lora-dummy 8:16"; do
    local tag=base; [ -n "$lora" ] && tag=lora
    "$HERE/met" bench latency --model "$m" --load-format dummy --batch-size 1 --input-len 128 --output-len 256 \
      --num-iters 3 $lora --output "$LOGS/bench-lora-latency-$tag-$((SECONDS)).json" || return 1
    "$HERE/met" bench throughput --model "$m" --load-format dummy --num-prompts 256 --input-len 128 \
      --output-len 256 $lora --output "$LOGS/bench-lora-throughput-$tag-$((SECONDS)).json" || return 1
  done
}
export -f bench_lora
step lorabench "LoRA benches (8B shape, 8 x r16)" bench-lora.log 540 bash -c bench_lora
# Kernel benches (criterion): decode-batch GEMV bandwidth per shape beside a device copy.
step kbench "kernel benches" kernel-bench.log 240 "$HERE/tests/kernels-bench" --bench
# Where a decode step's time goes: ncu times every kernel of a few eager decode steps of
# each model at batch 1 (after loading and prefill), summarised per kernel.
profile_decode() {
  local model skip=2600 count=786
  for model in Llama-3.1-8B-Instruct Qwen3-0.6B; do
    ncu --clock-control none --cache-control none --launch-skip "$skip" --launch-count "$count" --csv --page raw \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
      "$HERE/met" bench latency --model "$HERE/configs/$model" --load-format dummy --batch-size 1 \
      --input-len 128 --output-len 32 --num-iters 1 --num-warmup 0 --enforce-eager >"$LOGS/ncu-$model.csv" || return 1
    echo "== $model"
    python3 "$HERE/ncu_summary.py" "$LOGS/ncu-$model.csv" 3
  done
}
export -f profile_decode
step profile "ncu decode profile" profile.log 400 bash -c profile_decode
# The same at large batches: every kernel of the prefill and the first decode steps of 64
# and 256 sequences, summarised per step kind (prefill, decode).
profile_batch() {
  local model batch
  for model in Llama-3.1-8B-Instruct Qwen3-0.6B; do
    for batch in 64 256; do
      ncu --clock-control none --cache-control none --csv --page raw \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        "$HERE/met" bench latency --model "$HERE/configs/$model" --load-format dummy --batch-size $batch \
        --input-len 128 --output-len 4 --num-iters 1 --num-warmup 0 --enforce-eager >"$LOGS/ncu-$model-b$batch.csv" || return 1
      echo "== $model batch $batch"
      python3 "$HERE/ncu_summary.py" "$LOGS/ncu-$model-b$batch.csv" --by-step
    done
  done
}
export -f profile_batch
step profilebatch "ncu large-batch profile" profile-batch.log 500 bash -c profile_batch

echo
echo "======== met GPU summary ========"
printf '%s\n' "${SUMMARY[@]}"
echo
grep -h "GPU-FIXTURE" "$LOGS/gpu-hf-fixtures.log" 2>/dev/null || true
grep -h -E "device|kv cache|KV" "$LOGS/met-generate.log" "$LOGS/gpu-compare.log" 2>/dev/null | head -9 || true
echo
sed -n '/^attention sharpness/,$p' "$LOGS/gpu-gate.log" 2>/dev/null || true
echo
sed -n '/^attention sharpness/,$p' "$LOGS/gpu-gate-fp8.log" 2>/dev/null || true
echo
sed -n '/^attention sharpness/,$p' "$LOGS/gpu-gate-kv.log" 2>/dev/null || true
echo
sed -n '/^model  /,$p' "$LOGS/gpu-compare.log" 2>/dev/null || true
grep -h -E "^(latency|throughput):|\[ 5\] weights|\[ 7\]" "$LOGS/bench.log" 2>/dev/null || true
grep -h "GPU-GRAPHS" "$LOGS/gpu-graphs.log" 2>/dev/null || true
grep -h "BATCH-INVARIANCE" "$LOGS/gpu-invariance.log" "$LOGS/kernels-ops.log" 2>/dev/null | tail -4 || true
awk '/^cuda_gemv\//{name=$1} /thrpt:/{if (name != "") {$1=$1; print name, $0; name=""}}' "$LOGS/kernel-bench.log" 2>/dev/null || true
cat "$LOGS/profile.log" 2>/dev/null | head -40 || true
cat "$LOGS/profile-batch.log" 2>/dev/null | head -200 || true
exit $FAILED
"#;
