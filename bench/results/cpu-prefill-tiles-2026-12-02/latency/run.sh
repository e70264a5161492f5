#!/usr/bin/env bash
# Prefill and decode-step latency, base (36a9351) against this session's tree, alternating.
# BASE_AVX2/FINAL_AVX2: met built with the workspace's gemm without "x86-v4", run with
# MET_CPU_SIMD=avx2 (everything held to AVX2); BASE/FINAL: the default build (AVX-512 here).
set -euo pipefail
OUT="$(dirname "$0")"
G="${G:-$HOME/.cache/met/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
for round in 1 2 3; do
  for len in 128 1024; do
    for b in BASE_AVX2 FINAL_AVX2 BASE FINAL; do
      simd=""; case $b in *AVX2) simd=avx2;; esac
      iters=10; [ "$len" = 1024 ] && iters=3
      MET_CPU_SIMD=$simd "${!b}" bench latency --model "$G" --device cpu --batch-size 1 --input-len "$len" \
        --output-len 32 --num-iters "$iters" --output "$OUT/$b-$len-r$round.json" > "$OUT/$b-$len-r$round.log" 2>&1
      echo "$b len=$len round=$round: $(grep -oE 'prefill p50 [0-9.]+ ms|decode step p50 [0-9.]+ ms' "$OUT/$b-$len-r$round.log" | tr '\n' ' ')"
    done
  done
done
