#!/usr/bin/env bash
# CPU prefill and decode-step latency on the default model, the base binary (dabd25a) against
# the final tree's, alternating, three rounds: native (AVX-512) and held to AVX2 at run time
# (MET_CPU_SIMD=avx2, which lowers the quantised dots); the default `--cpu-dots int8` and
# `exact`. BASE and FINAL are the two `met` binaries.
set -euo pipefail
OUT="$(dirname "$0")"
G="${G:-$HOME/.cache/met/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
run() { # name bin simd dots len iters
  local name=$1 bin=$2 simd=$3 dots=$4 len=$5 iters=$6
  MET_CPU_SIMD=$simd "$bin" bench latency --model "$G" --device cpu --cpu-dots "$dots" --batch-size 1 \
    --input-len "$len" --output-len 32 --num-iters "$iters" --output "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  echo "$name: $(grep -oE 'prefill p50 [0-9.]+ ms|decode step p50 [0-9.]+ ms' "$OUT/$name.log" | tr '\n' ' ')"
}
for round in ${ROUNDS:-1 2 3}; do
  for simd in native avx2; do
    s=""; [ $simd = avx2 ] && s=avx2
    for dots in int8 exact; do
      for b in BASE FINAL; do run "$b-$simd-$dots-128-r$round" "${!b}" "$s" $dots 128 10; done
    done
  done
  for b in BASE FINAL; do run "$b-native-int8-1024-r$round" "${!b}" "" int8 1024 3; done
done
