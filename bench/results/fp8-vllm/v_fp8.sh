#!/bin/bash
# vLLM 0.26 (staged into /tmp/site by .peer's install.sh) quantizing the Llama-3.1-8B shape
# to FP8 (v_fp8.py), for issue 34's side-by-side; then met's FP8 checkpoint shape, batch 1
# and 256 requests, in the same call. Results in $OUT/vllm-fp8.
set -u
L=$OUT/vllm-fp8; mkdir -p $L
D=$(dirname "$0"); M=/tmp/peer-model/Llama-3.1-8B-Instruct
(export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1
 timeout 400 python3 $D/v_fp8.py $M $L/result.json > $L/run.log 2>&1; echo "vllm rc=$?")
grep -E "^fp8:|Error|error:" $L/run.log | tail -4
B=gpu-bundle; bash $B/unpack.sh > /dev/null
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} MET_HOME=/tmp/met-home-shared
fp8=configs/Meta-Llama-3-8B-Instruct-FP8
timeout 100 $B/met bench latency --model $fp8 --load-format dummy --batch-size 1 --input-len 128 --output-len 256 \
  --num-iters 5 --output $L/met-lat.json > $L/met-lat.log 2>&1; grep ^latency $L/met-lat.log
timeout 100 $B/met bench throughput --model $fp8 --load-format dummy --num-prompts 256 --input-len 128 \
  --output-len 256 --output $L/met-tput.json > $L/met-tput.log 2>&1; grep ^throughput $L/met-tput.log | tail -1
