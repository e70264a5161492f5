#!/bin/bash
# A first look at hybrid speed on the H200 (eager, row-by-row delta rule, no decode
# graphs): batch 1 and batch 32 latency of the Qwen3.5-35B-A3B shape with
# dummy weights. Not a comparison with vLLM: a baseline for the kernel work to come.
set -u
B=gpu-bundle; N=${NAME:-g5}; L=$OUT/$N; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
for model in Qwen3.5-35B-A3B; do
  for batch in 1 32; do
    timeout 240 $B/met bench latency --model configs/$model --load-format dummy --batch-size $batch \
      --input-len 128 --output-len 128 --num-iters 2 --output $L/latency-$model-b$batch.json > $L/latency-$model-b$batch.log 2>&1
    echo "$model b$batch rc=$?"; grep -iE "tok/s|latency|median|error" $L/latency-$model-b$batch.log | tail -4
  done
done
