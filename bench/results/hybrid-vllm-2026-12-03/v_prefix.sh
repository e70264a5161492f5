#!/bin/bash
# vLLM 0.26 serving Qwen3.6-35B-A3B (dummy weights), the 16k shared-prefix test of g8c.sh:
# the first request cold, then 64 questions at once, measured by met bench serve.
set -u
L=$OUT/vllm-prefix; mkdir -p $L
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1
M=/tmp/peer-model/Qwen3.6-35B-A3B
python3 -m vllm.entrypoints.cli.main serve $M --load-format dummy --dtype bfloat16 --language-model-only --gdn-prefill-backend triton \
  --port 8912 --max-model-len 20000 --enable-prefix-caching > $L/serve.log 2>&1 &
SP=$!
for i in $(seq 1 300); do curl -sf http://127.0.0.1:8912/v1/models > /dev/null && break; sleep 1; done
common="--base-url http://127.0.0.1:8912 --prefix-len 16384 --input-len 32 --output-len 16 --num-warmup 0 --seed 7"
for run in "cold 1 1" "hit 64 64"; do
  set -- $run
  timeout 200 gpu-bundle/met bench serve $common --num-prompts $2 --concurrency $3 --output $L/ttft-$1.json > $L/ttft-$1.log 2>&1
  echo "$1 rc=$?"; tail -3 $L/ttft-$1.log
done
grep -iE "prefix cache hit|hit rate" $L/serve.log | tail -3
kill $SP; wait $SP 2>/dev/null
