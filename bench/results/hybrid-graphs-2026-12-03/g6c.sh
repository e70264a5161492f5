#!/bin/bash
# 256 requests x (128 + 256) on the real hybrid configs with dummy weights, decode graphs on.
set -u
B=gpu-bundle; N=${NAME:-g6c}; L=$OUT/$N; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for model in Qwen3.6-35B-A3B Qwen3.5-27B; do
  timeout 280 $B/met bench throughput --model configs/$model --load-format dummy --num-prompts 256 \
    --input-len 128 --output-len 256 --output $L/throughput-$model.json > $L/throughput-$model.log 2>&1
  echo "$model 256 rc=$?"; grep -iE "graph|tok/s|error|state" $L/throughput-$model.log | tail -6
done
