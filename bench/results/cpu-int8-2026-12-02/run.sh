#!/usr/bin/env bash
# Exact against integer CPU dots: batch-BATCH decode of the default model on 2 threads, one
# binary, `--cpu-dots exact` and `--cpu-dots int8` interleaved round by round, at each SIMD
# level asked for (`MET_CPU_SIMD`, e.g. "avx512 avx2"). The load average before each run
# goes to load.txt. Usage: run.sh OUT_DIR MET [ROUNDS] [LEVELS] [BATCH] [ITERS]
set -eu
OUT=$1; MET=$2; ROUNDS=${3:-3}; LEVELS=${4:-avx512 avx2}; BATCH=${5:-1}; ITERS=${6:-3}
mkdir -p "$OUT"
export RAYON_NUM_THREADS=2
for r in $(seq 1 "$ROUNDS"); do
  for level in $LEVELS; do
    for dots in exact int8; do
      name="lat-b$BATCH-$level-$dots-r$r"
      echo "$name $(uptime)" >> "$OUT/load.txt"
      MET_CPU_SIMD=$level "$MET" bench latency --device cpu --cpu-dots "$dots" --batch-size "$BATCH" \
        --input-len 128 --output-len 128 --num-iters "$ITERS" --output "$OUT/$name.json" > "$OUT/$name.log" 2>&1
      grep -h "^latency:" "$OUT/$name.log" | sed "s/^/b$BATCH $level $dots r$r: /"
    done
  done
done
