#!/bin/bash
# Where the hybrid decode step's device time goes: batch-1 latency of Qwen3-30B-A3B (an MoE
# without linear attention) beside Qwen3.6-35B-A3B, then ncu over ~2 eager decode steps of
# the 35B-A3B shape at batch 1 and the steps of a 64-sequence batch.
set -u
B=gpu-bundle; N=${NAME:-g7}; L=$OUT/$N; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
timeout 100 $B/met bench latency --model configs/Qwen3-30B-A3B --load-format dummy --batch-size 1 \
  --input-len 128 --output-len 256 --num-iters 3 --output $L/latency-Qwen3-30B-A3B-b1.json > $L/latency-Qwen3-30B-A3B-b1.log 2>&1
echo "Qwen3-30B-A3B b1 rc=$?"; grep -E "^latency|phases" $L/latency-Qwen3-30B-A3B-b1.log
timeout 240 ncu --clock-control none --cache-control none --launch-skip 6000 --launch-count 1500 --csv --page raw \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  $B/met bench latency --model configs/Qwen3.6-35B-A3B --load-format dummy --batch-size 1 \
  --input-len 128 --output-len 64 --num-iters 1 --num-warmup 0 --enforce-eager > $L/ncu-b1.csv 2> $L/ncu-b1.err
echo "ncu b1 rc=$?"; python3 $B/ncu_summary.py $L/ncu-b1.csv 2 | head -30
timeout 200 ncu --clock-control none --cache-control none --csv --page raw \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  $B/met bench latency --model configs/Qwen3.6-35B-A3B --load-format dummy --batch-size 64 \
  --input-len 128 --output-len 3 --num-iters 1 --num-warmup 0 --enforce-eager > $L/ncu-b64.csv 2> $L/ncu-b64.err
echo "ncu b64 rc=$?"; python3 $B/ncu_summary.py $L/ncu-b64.csv --by-step | head -70
