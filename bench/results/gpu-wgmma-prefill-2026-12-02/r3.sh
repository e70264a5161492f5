#!/bin/bash
# Device call 3: every GPU check of the tree (lib, ops, fixtures, graphs, precision gate),
# the attention kernels, and the engine figures of issue 12.
set -u
B=gpu-bundle; L=$OUT/c3; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used,driver_version --format=csv,noheader | tee $L/gpu.txt
timeout 330 $B/run.sh $L/run lib ops fixtures graphs gate > $L/run.log 2>&1; echo "run.sh rc=$?"
sed -n '/======== met GPU summary/,/^$/p' $L/run.log | tail -8; grep -h "FAILED" $L/run/kernels-ops.log | head
grep -E "PASS|FAIL" $L/run/gpu-gate.log | tail -3
timeout 100 $B/tests/kernels-bench --bench cuda_attention --warm-up-time 1 --measurement-time 3 > $L/attn.log 2>&1
grep -E "^cuda_attention|time:" $L/attn.log
tp() { local name=$1; shift; timeout 120 $B/met bench throughput --load-format dummy "$@" --output $L/$name.json > $L/$name.log 2>&1; echo "$name: $(grep -E '^throughput' $L/$name.log)"; }
tp tp-8b --model $B/configs/Llama-3.1-8B-Instruct --num-prompts 256 --input-len 128 --output-len 256
tp tp-06b --model $B/configs/Qwen3-0.6B --num-prompts 256 --input-len 128 --output-len 256
tp tp4k-8b --model $B/configs/Llama-3.1-8B-Instruct --num-prompts 32 --input-len 4096 --output-len 256
tp tp-30b --model $B/configs/Qwen3-30B-A3B --num-prompts 256 --input-len 128 --output-len 256
tp tp-8b-r2 --model $B/configs/Llama-3.1-8B-Instruct --num-prompts 256 --input-len 128 --output-len 256
timeout 60 $B/met bench latency --model $B/configs/Llama-3.1-8B-Instruct --load-format dummy --batch-size 256 --input-len 128 --output-len 64 --num-iters 2 --output $L/lat-8b-b256.json > $L/lat-8b-b256.log 2>&1; grep -E "^latency" $L/lat-8b-b256.log
timeout 60 $B/met bench latency --model $B/configs/Llama-3.1-8B-Instruct --load-format dummy --batch-size 1 --input-len 128 --output-len 256 --num-iters 3 --output $L/lat-8b-b1.json > $L/lat-8b-b1.log 2>&1; grep -E "^latency" $L/lat-8b-b1.log
