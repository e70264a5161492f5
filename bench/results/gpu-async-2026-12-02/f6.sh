#!/bin/bash
# Call f6: the final tree: every check; 8B throughput once.
set -u
B=gpu-bundle; L=$OUT/f6; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used,driver_version --format=csv,noheader | tee $L/gpu.txt
timeout 360 $B/run.sh $L/run ops fixtures graphs gate > $L/run.log 2>&1; echo "run.sh rc=$?"
sed -n '/======== met GPU summary/,/^$/p' $L/run.log | tail -6; grep -h "FAILED\|panicked" $L/run/*.log | head
grep -ch "GPU-ASYNC" $L/run/gpu-hf-fixtures.log
timeout 90 $B/met bench throughput --load-format dummy --model $B/configs/Llama-3.1-8B-Instruct --num-prompts 256 --input-len 128 --output-len 256 --output $L/tp8b.json > $L/tp8b.log 2>&1
echo "tp8b: $(grep -E '^throughput|^decode step' $L/tp8b.log | tr '\n' ' ')"
tar czf $OUT/f6.tgz -C $OUT f6
