#!/bin/bash
# Where a 256-sequence decode step of Qwen3.6-35B-A3B spends its device time (eager, ncu).
# The dummy weights' init kernels (random_uniform, casts) are left unprofiled by name, and
# the 4,096-token prefill (256 x 16) by count, so ncu times about two decode steps.
set -u
B=gpu-bundle; L=$OUT/ncu; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
timeout 280 ncu --clock-control none --cache-control none --csv --page raw \
  --kernel-name-base function --kernel-name 'regex:^(?!random_uniform|cast_)' --launch-skip 1200 --launch-count 2600 \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  $B/met bench latency --model configs/Qwen3.6-35B-A3B --load-format dummy --batch-size 256 \
  --input-len 16 --output-len 4 --num-iters 1 --num-warmup 0 --enforce-eager > $L/ncu-b256.csv 2> $L/ncu-b256.err
echo "ncu b256 rc=$?"; python3 $B/ncu_summary.py $L/ncu-b256.csv --by-step | head -60
gzip -9 $L/ncu-b256.csv
