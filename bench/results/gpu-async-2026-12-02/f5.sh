#!/bin/bash
# Call f5: the committed tree (asynchronous scheduling): every check; 8B throughput twice, 0.6B,
# Qwen3-30B-A3B (48 layers) and the 8-of-48-layer shape; 8B latency at batch 1 and 256.
set -u
B=gpu-bundle; L=$OUT/f5; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used,driver_version --format=csv,noheader | tee $L/gpu.txt
timeout 330 $B/run.sh $L/run ops fixtures graphs gate > $L/run.log 2>&1; echo "run.sh rc=$?"
sed -n '/======== met GPU summary/,/^$/p' $L/run.log | tail -6; grep -h "FAILED\|panicked" $L/run/*.log | head
grep -ch "GPU-ASYNC" $L/run/gpu-hf-fixtures.log
tp() { local name=$1; shift; timeout 90 $B/met bench throughput --load-format dummy "$@" --output $L/$name.json > $L/$name.log 2>&1; echo "$name: $(grep -E '^throughput|^decode step' $L/$name.log | tr '\n' ' ')"; }
P="--num-prompts 256 --input-len 128 --output-len 256"
tp tp8b-r1 --model $B/configs/Llama-3.1-8B-Instruct $P
tp tp8b-r2 --model $B/configs/Llama-3.1-8B-Instruct $P
tp tp06b --model $B/configs/Qwen3-0.6B $P
tp tp30b --model $B/configs/Qwen3-30B-A3B $P
tp tp30b-8layers --model .dev/Qwen3-30B-A3B-8layers $P
tar czf $OUT/f5.tgz -C $OUT f5
