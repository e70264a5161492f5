#!/usr/bin/env bash
# Run 2a: correctness of the tree (lib, ops, fixtures, graphs), attention kernels, MoE batch 1.
set -u
B=gpu-bundle
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
$B/run.sh $OUT/logs lib ops fixtures graphs 2>&1 | grep -E "^==|GPU-FIXTURE|GPU-GRAPHS|test result" | head -30
grep -E "^FAILED|panicked" -A10 $OUT/logs/kernels-ops.log | head -50
grep -E "panicked" -A10 $OUT/logs/gpu-graphs.log $OUT/logs/gpu-hf-fixtures.log | head -30
echo "== attention bench"
timeout 150 $B/tests/kernels-bench --bench cuda_attention --warm-up-time 1 --measurement-time 3 > $OUT/attn.log 2>&1
grep -E "^cuda_attention|time:|thrpt:" $OUT/attn.log
echo "== 30B-A3B b1, b64 latency (graphs)"
for bs in 1 64; do
timeout 120 $B/met bench latency --model $B/configs/Qwen3-30B-A3B --load-format dummy --batch-size $bs --input-len 128 --output-len 64 --num-iters 2 --output $OUT/lat-30b-b$bs.json 2>&1 | grep -E "^latency"
done
echo "== 30B-A3B b1 ncu"
timeout 150 ncu --clock-control none --cache-control none --kernel-name regex:'^(?!random_uniform)' --csv --page raw \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  $B/met bench latency --model $B/configs/Qwen3-30B-A3B --load-format dummy --batch-size 1 \
  --input-len 128 --output-len 3 --num-iters 1 --num-warmup 0 --enforce-eager > $OUT/ncu-30b-b1.csv 2>$OUT/ncu-30b.err
python3 $B/ncu_summary.py $OUT/ncu-30b-b1.csv --by-step 2>&1 | sed -n '/-- decode/,$p' | head -20
