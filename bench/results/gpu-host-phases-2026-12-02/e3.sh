#!/bin/bash
# Call e3: the final tree (mimalloc in the binary; CUDA code as in e2): HF fixtures, graphs = eager,
# the precision gate; 8B throughput twice and 0.6B once, with phases.
set -u
B=gpu-bundle; L=$OUT/e3; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used,driver_version --format=csv,noheader | tee $L/gpu.txt
timeout 300 $B/run.sh $L/run fixtures graphs gate > $L/run.log 2>&1; echo "run.sh rc=$?"
sed -n '/======== met GPU summary/,/^$/p' $L/run.log | tail -5; grep -h "FAILED\|panicked" $L/run/*.log | head
tp() { local name=$1; shift; timeout 70 $B/met bench throughput --load-format dummy "$@" --output $L/$name.json > $L/$name.log 2>&1; echo "$name: $(grep -E '^throughput|^decode step' $L/$name.log | tr '\n' ' ')"; }
M8="--model $B/configs/Llama-3.1-8B-Instruct --num-prompts 256 --input-len 128 --output-len 256"
tp tp8b-r1 $M8
tp tp8b-r2 $M8
tp tp06b --model $B/configs/Qwen3-0.6B --num-prompts 256 --input-len 128 --output-len 256
tar czf $OUT/e3.tgz -C $OUT e3
