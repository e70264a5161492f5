#!/bin/bash
# End-to-end CPU latency of a synthetic hybrid (qwen3_5-synthetic/config.json: Qwen3.5's
# linear-attention layer shape, 3 Gated DeltaNet layers and 1 attention layer, dummy f32
# weights) before and after the row-by-row delta rule, in alternating rounds.
# Usage: e2e.sh BEFORE_BIN AFTER_BIN ROUNDS OUTDIR
set -u
before=$1; after=$2; rounds=$3; out=$4; mkdir -p "$out"
dir=$(dirname "$0")
for round in $(seq 1 "$rounds"); do
  for variant in before after; do
    bin=$before; [ $variant = after ] && bin=$after
    for shape in ${SHAPES:-"1 512 16" "8 64 16"}; do
      set -- $shape
      name=$variant-r$round-b$1-in$2
      "$bin" bench latency --model "$dir/qwen3_5-synthetic" --load-format dummy --device cpu \
        --batch-size $1 --input-len $2 --output-len $3 --num-iters 2 --num-warmup 1 \
        --output "$out/$name.json" > "$out/$name.log" 2>&1
      echo "$name rc=$? $(grep '^latency' "$out/$name.log")"
    done
  done
done
