#!/usr/bin/env bash
# After the AVX2 exact Q4 pair was written out again: decode-step latency held to AVX2 with
# `--cpu-dots exact` (the one path the generic body had slowed), and natively with the
# default int8 dots, base (dabd25a) against FINAL, alternating, nine rounds.
set -euo pipefail
OUT="$(dirname "$0")"
G="${G:-$HOME/.cache/met/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
for round in 1 2 3 4 5 6 7 8 9; do
  for cfg in "avx2 exact" "native int8"; do
    set -- $cfg; simd=$1; dots=$2; s=""; [ $simd = avx2 ] && s=avx2
    for b in BASE FINAL; do
      name="$b-$simd-$dots-r$round"
      MET_CPU_SIMD=$s "${!b}" bench latency --model "$G" --device cpu --cpu-dots $dots --batch-size 1 \
        --input-len 128 --output-len 32 --num-iters 10 --output "$OUT/$name.json" > "$OUT/$name.log" 2>&1
      echo "$name: $(grep -oE 'prefill p50 [0-9.]+ ms|decode step p50 [0-9.]+ ms' "$OUT/$name.log" | tr '\n' ' ')"
    done
  done
done
