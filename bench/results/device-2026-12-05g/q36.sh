#!/bin/bash
# Qwen3.6-35B-A3B (dummy weights, bf16) beside vLLM 0.26.0 in one lease, one H200:
# vLLM's batch-1 latency (2 warm-up, 5 timed requests of 128 + 256) and 256 x (128 + 256)
# from one engine (../hybrid-vllm-2026-12-03/v_bench.py), then met's (the gpu-next build in
# gpu-bundle-next; its hybrid and MoE code is main's).
set -u
B=gpu-bundle-next; M=configs/Qwen3.6-35B-A3B
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} MET_HOME=/tmp/met-home-shared
python3 scripts/dummy_tokenizer.py $M /tmp/peer-model/Qwen3.6-35B-A3B > /dev/null
OUT=$OUT/vq bash bench/results/hybrid-vllm-2026-12-03/v_run.sh Qwen3.6-35B-A3B
bash $B/unpack.sh > /dev/null; mkdir -p $OUT/mq
for r in 1 2; do
  $B/met bench latency --model $M --load-format dummy --batch-size 1 --input-len 128 --output-len 256 \
    --num-iters 5 --output $OUT/mq/lat-$r.json > $OUT/mq/lat-$r.log 2>&1
done
$B/met bench throughput --model $M --load-format dummy --num-prompts 256 --input-len 128 --output-len 256 \
  --output $OUT/mq/tp.json > $OUT/mq/tp.log 2>&1
# Where a 256-row decode step's device time goes (eager, events around every kernel):
mkdir -p $OUT/mk
MET_LOG=info MET_KERNEL_TIMES=1 $B/met bench throughput --model $M --load-format dummy --num-prompts 256 \
  --input-len 128 --output-len 32 --enforce-eager > $OUT/mk/kt256-q36.log 2>&1
