#!/bin/bash
# vLLM 0.26 (staged by ../../../.peer install.sh into /tmp/site) on one hybrid config: batch-1
# latency and 256 x (128 + 256) throughput from one engine (v_bench.py). Usage: v_run.sh MODEL
set -u
M=$1; L=$OUT/vllm-$M; mkdir -p $L
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1
D=$(dirname "$0")
timeout 560 python3 $D/v_bench.py /tmp/peer-model/$M $L/result.json > $L/run.log 2>&1
echo "$M rc=$?"; grep -E "^latency|^throughput|Error|error:" $L/run.log | tail -6
grep -iE "backend|cuda graph|mamba|prefix" $L/run.log | head -8
