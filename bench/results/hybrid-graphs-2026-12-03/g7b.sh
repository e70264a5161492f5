#!/bin/bash
# ncu over eager decode steps of Qwen3.6-35B-A3B at batch 1, the dummy-weight fill kernels
# filtered out (they number tens of thousands), after skipping the warm-up and prefill.
set -u
B=gpu-bundle; N=${NAME:-g7b}; L=$OUT/$N; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for model in Qwen3.6-35B-A3B Qwen3-30B-A3B; do
timeout 200 ncu --clock-control none --cache-control none --kernel-name regex:'^(?!random_).*' --launch-skip 3000 --launch-count 1200 --csv --page raw \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  $B/met bench latency --model configs/$model --load-format dummy --batch-size 1 \
  --input-len 128 --output-len 64 --num-iters 1 --num-warmup 0 --enforce-eager > $L/ncu-$model-b1.csv 2> $L/ncu-$model-b1.err
echo "== ncu $model b1 rc=$?"; python3 $B/ncu_summary.py $L/ncu-$model-b1.csv 2 | head -24
done
