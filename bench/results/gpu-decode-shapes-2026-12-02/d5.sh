#!/bin/bash
# Device call 5: the tree with narrow block-table writes at replay: every GPU check and the
# precision gate; the 8B and 0.6B throughput, the 8B batch-256 latency.
set -u
B=gpu-bundle; L=$OUT/d5; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used,driver_version --format=csv,noheader | tee $L/gpu.txt
tp() { local name=$1; shift; timeout 60 $B/met bench throughput --load-format dummy "$@" --output $L/$name.json > $L/$name.log 2>&1; echo "$name: $(grep -E '^throughput' $L/$name.log)"; }
tp tp-8b-r1 --model $B/configs/Llama-3.1-8B-Instruct --num-prompts 256 --input-len 128 --output-len 256
tp tp-06b --model $B/configs/Qwen3-0.6B --num-prompts 256 --input-len 128 --output-len 256
tp tp-8b-r2 --model $B/configs/Llama-3.1-8B-Instruct --num-prompts 256 --input-len 128 --output-len 256
timeout 50 $B/met bench latency --load-format dummy --model $B/configs/Llama-3.1-8B-Instruct --batch-size 256 --input-len 128 --output-len 64 --num-iters 2 --output $L/lat-8b-b256.json > $L/lat-8b-b256.log 2>&1; grep -E '^latency' $L/lat-8b-b256.log
timeout 420 $B/run.sh $L/run lib ops fixtures graphs gate > $L/run.log 2>&1; echo "run.sh rc=$?"
sed -n '/======== met GPU summary/,/^$/p' $L/run.log | tail -7; grep -h "FAILED" $L/run/kernels-ops.log | head; grep -h "^gate:" $L/run/gpu-gate.log | tail -1
tar czf $OUT/d5.tgz -C $OUT d5
