#!/bin/bash
# Device call 4: the op checks on the final tree, the engine figures as JSON, and ncu views of
# the batch-256 decode step and of the prefill kernel.
set -u
B=gpu-bundle; L=$OUT/c4; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used,driver_version --format=csv,noheader | tee $L/gpu.txt
timeout 150 $B/run.sh $L/run ops graphs fixtures > $L/run.log 2>&1; echo "run.sh rc=$?"; sed -n '/======== met GPU summary/,/^$/p' $L/run.log | tail -5
tp() { local name=$1; shift; timeout 100 $B/met bench throughput --load-format dummy "$@" --output $L/$name.json > $L/$name.log 2>&1; echo "$name: $(grep -E '^throughput' $L/$name.log)"; }
tp tp-8b-r1 --model $B/configs/Llama-3.1-8B-Instruct --num-prompts 256 --input-len 128 --output-len 256
tp tp-06b --model $B/configs/Qwen3-0.6B --num-prompts 256 --input-len 128 --output-len 256
tp tp-8b-r2 --model $B/configs/Llama-3.1-8B-Instruct --num-prompts 256 --input-len 128 --output-len 256
tp tp4k-8b --model $B/configs/Llama-3.1-8B-Instruct --num-prompts 32 --input-len 4096 --output-len 256
tp tp-30b --model $B/configs/Qwen3-30B-A3B --num-prompts 256 --input-len 128 --output-len 256
lat() { local name=$1; shift; timeout 60 $B/met bench latency --load-format dummy "$@" --output $L/$name.json > $L/$name.log 2>&1; echo "$name: $(grep -E '^latency' $L/$name.log)"; }
lat lat-8b-b1 --model $B/configs/Llama-3.1-8B-Instruct --batch-size 1 --input-len 128 --output-len 256 --num-iters 3
lat lat-8b-b256 --model $B/configs/Llama-3.1-8B-Instruct --batch-size 256 --input-len 128 --output-len 64 --num-iters 2
timeout 120 ncu --clock-control none --cache-control none --csv --page raw --launch-skip 2973 --launch-count 652 \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  $B/met bench latency --model $B/configs/Llama-3.1-8B-Instruct --load-format dummy --batch-size 256 --input-len 128 --output-len 12 --num-iters 1 --num-warmup 0 --enforce-eager > $L/ncu-8b-b256-decode.csv 2>$L/ncu.err
echo "ncu decode rc=$?"; python3 $B/ncu_summary.py $L/ncu-8b-b256-decode.csv > $L/prof-8b-b256-decode.txt 2>&1; head -24 $L/prof-8b-b256-decode.txt
timeout 90 ncu --clock-control none --kernel-name regex:flash_prefill_wg --launch-skip 5 --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section Occupancy \
  $B/tests/kernels-bench --bench 'cuda_attention/flash/prefill' --warm-up-time 0.2 --measurement-time 0.2 > $L/ncu-prefill.txt 2>&1
grep -E "Duration|Compute \(SM\)|Issue Slots|No Eligible|Eligible Warps|highest-utilized" $L/ncu-prefill.txt | head
tar czf $OUT/c4.tgz -C $OUT c4; ls -la $OUT/c4.tgz
