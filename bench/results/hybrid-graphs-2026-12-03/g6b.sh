#!/bin/bash
# The precision gate's hybrid shapes (Qwen3-Next, Qwen3.5 dense, Qwen3.5-MoE; prompts to
# 4,096 tokens, prefix hits restored from state snapshots) with the broken variant that
# drops the convolution's state, then batch-1 decode latency of the real hybrid configs
# with decode graphs.
set -u
B=gpu-bundle; N=${NAME:-g6b}; L=$OUT/$N; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
timeout 330 python3 $B/gpu_gate.py --met $B/met --work /tmp/gate-h --out $L/gate.json --broken drop-conv-state \
  --shapes qwen3-next,qwen3.5-dense,qwen3.5-moe > $L/gate.log 2>&1; echo "gate rc=$?"
sed -n '/^met vs transformers/,$p' $L/gate.log
for model in Qwen3.6-35B-A3B Qwen3.5-27B; do
  timeout 120 $B/met bench latency --model configs/$model --load-format dummy --batch-size 1 \
    --input-len 128 --output-len 256 --num-iters 3 --output $L/latency-$model-b1.json > $L/latency-$model-b1.log 2>&1
  echo "$model b1 rc=$?"; grep -iE "graph|tok/s|step|error" $L/latency-$model-b1.log | tail -6
done
