#!/bin/bash
# Where Qwen3.6-35B-A3B's device time goes (eager, ncu, dummy weights): one 8,192-token
# prefill step, then a 256-sequence decode step. The dummy weights' init kernels
# (random_uniform, casts) are left unprofiled by name; the decode run skips its 4,096-token
# prefill (256 x 16) by count. Per-kernel tables by ncu_summary.py.
set -uf  # -f: the kernel-name regex holds a `?`
B=gpu-bundle; L=$OUT/ncu; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
NCU="ncu --clock-control none --cache-control none --csv --page raw --kernel-name-base function \
  --kernel-name regex:^(?!random_uniform|cast_) --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum"
M="--model configs/Qwen3.6-35B-A3B --load-format dummy --num-iters 1 --num-warmup 0 --enforce-eager"
timeout 200 $NCU --launch-count 1400 $B/met bench latency $M --batch-size 1 --input-len 8192 --output-len 1 \
  > $L/prefill.csv 2> $L/prefill.err
echo "ncu prefill rc=$?"; python3 $B/ncu_summary.py $L/prefill.csv --by-step | head -40
timeout 250 $NCU --launch-skip 1200 --launch-count 2600 $B/met bench latency $M --batch-size 256 --input-len 16 --output-len 4 \
  > $L/b256.csv 2> $L/b256.err
echo "ncu b256 rc=$?"; python3 $B/ncu_summary.py $L/b256.csv --by-step | head -60
gzip -9 $L/*.csv
