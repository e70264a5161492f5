#!/usr/bin/env bash
# Prompt lookup (`--speculative ngram`) against speculation off, on this CPU, measured by
# `met bench serve` at concurrency 1 on an input-grounded workload
# (bench/datasets/input_grounded.jsonl: edit-this-code and copy-this-paragraph chat prompts,
# greedy, natural lengths). ROUNDS rounds alternate which mode goes first, one server up at
# a time. After each measurement the same prompts are sent once more without streaming and
# the answers saved, so the two modes' outputs can be compared token for token.
#
# Usage: [MET=/path/to/met] [ROUNDS=3] [K=8] [SERVE_FLAGS="--cpu-dots int8"] bench/speculative_cpu.sh [OUT_DIR]
# (SERVE_FLAGS go to both servers.)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-bench/results/speculative-cpu}"
ROUNDS="${ROUNDS:-3}"
K="${K:-8}"
DATA=bench/datasets/input_grounded.jsonl
NUM_PROMPTS="$(wc -l <"$DATA")"
THREADS=2
PORT=8932

if [ -z "${MET:-}" ]; then  # MET=path uses an existing met binary instead
  cargo build --release -p met-server --quiet
  MET=target/release/met
fi
GGUF="${MET_HOME:-$HOME/.cache/met}/models/SmolLM2-135M-Instruct.Q4_1.gguf"
mkdir -p "$OUT_DIR"

wait_ready() {  # wait_ready URL: until /health answers 200, at most 120 s
  for _ in $(seq 240); do
    curl -sf -o /dev/null "$1/health" && return 0
    sleep 0.5
  done
  echo "server at $1 never became ready" >&2
  return 1
}

run_one() {  # run_one MODE ROUND
  local mode="$1" round="$2" pid flags=()
  read -r -a flags <<<"${SERVE_FLAGS:-}"
  [ "$mode" = ngram ] && flags+=(--speculative ngram --num-speculative-tokens "$K")
  RAYON_NUM_THREADS=$THREADS "$MET" serve --device cpu --model "$GGUF" --port $PORT "${flags[@]}" \
    >"$OUT_DIR/$mode-$round.log" 2>&1 &
  pid=$!
  wait_ready "http://127.0.0.1:$PORT"
  echo "round $round, $mode: load average $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT_DIR/load.txt"
  "$MET" bench serve --base-url "http://127.0.0.1:$PORT" --endpoint chat --dataset jsonl \
    --dataset-path "$DATA" --num-prompts "$NUM_PROMPTS" --num-warmup 1 --concurrency 1 \
    --timeout-s 600 --max-duration-s 1800 --label "$mode" --quiet --output "$OUT_DIR/$mode-$round.json"
  python3 bench/speculative_outputs.py "http://127.0.0.1:$PORT" "$DATA" >"$OUT_DIR/$mode-$round.outputs.json"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}

for round in $(seq "$ROUNDS"); do
  if [ $((round % 2)) = 1 ]; then order=(off ngram); else order=(ngram off); fi
  for mode in "${order[@]}"; do
    run_one "$mode" "$round"
  done
done
python3 bench/speculative_summary.py "$OUT_DIR" "$ROUNDS" | tee "$OUT_DIR/summary.md"
