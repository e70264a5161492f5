#!/usr/bin/env bash
# met serve against llama.cpp's llama-server on this CPU, measured by `met bench serve`.
#
# Both serve the default model's GGUF (SmolLM2-135M-Instruct Q4_1) with 2 threads; the same
# random dataset (token-id prompts of exactly INPUT_LEN tokens, OUTPUT_LEN tokens out with
# ignore_eos) at concurrency 1, 4 and 8; ROUNDS rounds that alternate which server goes
# first, one server up at a time, so both see the same machine. Results: one JSON per
# server and round in OUT_DIR, a plot overlaying the medians, and a table of medians.
#
# Usage: LLAMA_SERVER=/path/to/llama-server [MET=/path/to/met] [MET_FLAGS="--cpu-dots int8"] bench/serve_vs_llama_server.sh [OUT_DIR]
# Build llama-server once, outside the repo, from the llama.cpp sources vendored in the
# llama-cpp-python sdist (see bench/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-bench/results/cpu-serve}"
LLAMA_SERVER="${LLAMA_SERVER:?set LLAMA_SERVER to a llama-server binary}"
ROUNDS="${ROUNDS:-3}"
INPUT_LEN="${INPUT_LEN:-128}"
OUTPUT_LEN="${OUTPUT_LEN:-128}"
NUM_PROMPTS="${NUM_PROMPTS:-16}"
CONCURRENCY="${CONCURRENCY:-1,4,8}"
THREADS=2
PORT=8931

if [ -z "${MET:-}" ]; then  # MET=path uses an existing met binary instead
  cargo build --release -p met-server --quiet
  MET=target/release/met
fi
cargo xtask fetch-default-model >/dev/null
GGUF="$("$MET" generate --help >/dev/null && ls "${MET_HOME:-$HOME/.cache/met}"/models/SmolLM2-135M-Instruct.Q4_1.gguf)"
mkdir -p "$OUT_DIR"

wait_ready() {  # wait_ready URL: until /health answers 200, at most 120 s
  for _ in $(seq 240); do
    curl -sf -o /dev/null "$1/health" && return 0
    sleep 0.5
  done
  echo "server at $1 never became ready" >&2
  return 1
}

run_one() {  # run_one NAME ROUND
  local name="$1" round="$2" pid flags=()
  read -r -a flags <<<"${MET_FLAGS:-}"
  case "$name" in
    met) RAYON_NUM_THREADS=$THREADS "$MET" serve --device cpu --model "$GGUF" --port $PORT "${flags[@]}" \
           >"$OUT_DIR/$name-$round.log" 2>&1 & ;;
    llama-server) "$LLAMA_SERVER" -m "$GGUF" -t $THREADS -tb $THREADS --port $PORT -c 8192 -np 8 \
           --no-webui >"$OUT_DIR/$name-$round.log" 2>&1 & ;;
  esac
  pid=$!
  wait_ready "http://127.0.0.1:$PORT"
  "$MET" bench serve --base-url "http://127.0.0.1:$PORT" --dataset random --input-len "$INPUT_LEN" \
    --output-len "$OUTPUT_LEN" --num-prompts "$NUM_PROMPTS" --num-warmup 2 --concurrency "$CONCURRENCY" \
    --seed "$round" --timeout-s 300 --max-duration-s 900 --label "$name" --quiet \
    --output "$OUT_DIR/$name-$round.json"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}

for round in $(seq "$ROUNDS"); do
  if [ $((round % 2)) -eq 1 ]; then order="met llama-server"; else order="llama-server met"; fi
  for name in $order; do
    echo "round $round: $name" >&2
    run_one "$name" "$round"
  done
done

python3 - "$OUT_DIR" "$ROUNDS" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def load(name):
    return [json.load(open(f"{out}/{name}-{r}.json")) for r in range(1, rounds + 1)]
res = {n: load(n) for n in ("met", "llama-server")}
def med(name, c, key):
    vals = []
    for r in res[name]:
        for run in r["runs"]:
            if run["concurrency"] == c:
                v = run
                for k in key.split("."):
                    v = v[k]
                vals.append(v)
    return statistics.median(vals)
cs = [run["concurrency"] for run in res["met"][0]["runs"]]
print(f"| concurrency | met output tok/s | llama-server output tok/s | met / llama-server | met TTFT p50 ms | llama-server TTFT p50 ms | met TPOT p50 ms | llama-server TPOT p50 ms |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|")
for c in cs:
    m, l = med("met", c, "output_throughput"), med("llama-server", c, "output_throughput")
    print(f"| {c} | {m:.1f} | {l:.1f} | {m / l:.2f}x | {med('met', c, 'ttft_ms.p50'):.0f} | "
          f"{med('llama-server', c, 'ttft_ms.p50'):.0f} | {med('met', c, 'tpot_ms.p50'):.1f} | "
          f"{med('llama-server', c, 'tpot_ms.p50'):.1f} |")
EOF
