#!/bin/bash
# vLLM 0.26 (staged into /tmp/site by .peer's install.sh) with 8 random rank-16 adapters on
# the Llama-3.1-8B shape: base and adapters alternated in one engine (v_lora.py).
set -u
L=$OUT/vllm-lora; mkdir -p $L
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1
D=$(dirname "$0"); M=/tmp/peer-model/Llama-3.1-8B-Instruct
python3 $D/make_adapters.py $M /tmp/vllm-loras 8 16 > $L/adapters.log 2>&1 || { cat $L/adapters.log; exit 1; }
timeout 540 python3 $D/v_lora.py $M /tmp/vllm-loras 8 16 $L/result.json > $L/run.log 2>&1
echo "rc=$?"; grep -E "^base:|^lora:|Error|error:" $L/run.log | tail -8
grep -iE "lora|cuda graph" $L/run.log | head -6
