#!/bin/bash
# Call f1: asynchronous scheduling. Checks (ops for the staging ring and gather_u32, HF fixtures
# with the async = sync equality, graphs, gate); 8B throughput off/on alternating twice; 0.6B on/off;
# served c = 256 and 64, off/on.
set -u
B=gpu-bundle; L=$OUT/f1; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used,driver_version --format=csv,noheader | tee $L/gpu.txt
timeout 330 $B/run.sh $L/run ops fixtures graphs gate > $L/run.log 2>&1; echo "run.sh rc=$?"
sed -n '/======== met GPU summary/,/^$/p' $L/run.log | tail -6; grep -h "FAILED\|panicked" $L/run/*.log | head
grep -h "GPU-ASYNC" $L/run/gpu-hf-fixtures.log | head -20
tp() { local name=$1; shift; timeout 70 $B/met bench throughput --load-format dummy "$@" --output $L/$name.json > $L/$name.log 2>&1; echo "$name: $(grep -E '^throughput|^decode step' $L/$name.log | tr '\n' ' ')"; }
M8="--model $B/configs/Llama-3.1-8B-Instruct --num-prompts 256 --input-len 128 --output-len 256"
tp tp8b-off-r1 $M8 --async-scheduling off
tp tp8b-on-r1 $M8
tp tp8b-off-r2 $M8 --async-scheduling off
tp tp8b-on-r2 $M8
M06="--model $B/configs/Qwen3-0.6B --num-prompts 256 --input-len 128 --output-len 256"
tp tp06b-on $M06
tp tp06b-off $M06 --async-scheduling off
tar czf $OUT/f1.tgz -C $OUT f1
