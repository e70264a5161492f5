#!/usr/bin/env bash
# Run 1a (2026-12-02): attention kernels timed and profiled; MoE batch-1 latency and profile.
set -u
B=gpu-bundle; S=gpu-bundle-stage
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
echo "== attention bench"
timeout 150 $B/tests/kernels-bench --bench cuda_attention --warm-up-time 1 --measurement-time 3 > $OUT/attn.log 2>&1
grep -E "^cuda_attention|time:|thrpt:" $OUT/attn.log
echo "== ncu detail: prefill and decode attention kernels"
SECT="--section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section SchedulerStats --section LaunchStats"
timeout 60 ncu $SECT -k regex:flash_prefill -c 1 $B/tests/kernels-bench --bench 'cuda_attention/flash/prefill' --warm-up-time 0.2 --measurement-time 0.5 > $OUT/ncu-prefill.txt 2>&1
timeout 60 ncu $SECT -k regex:flash_decode -c 1 $B/tests/kernels-bench --bench 'cuda_attention/flash/decode_64' --warm-up-time 0.2 --measurement-time 0.5 > $OUT/ncu-decode64.txt 2>&1
for f in prefill decode64; do echo "-- $f"; grep -E "Duration|Memory Throughput|DRAM Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|No Eligible|Registers Per" $OUT/ncu-$f.txt | head -14; done
echo "== 30B-A3B b1 latency (graphs)"
timeout 120 $B/met bench latency --model $S/configs/Qwen3-30B-A3B --load-format dummy --batch-size 1 --input-len 128 --output-len 64 --num-iters 2 --output $OUT/lat-30b-b1.json > $OUT/lat-30b.log 2>&1
grep -E "^latency|decode|step" $OUT/lat-30b.log | head -6
echo "== 30B-A3B b1 ncu"
timeout 200 ncu --clock-control none --cache-control none --kernel-name regex:'^(?!random_uniform)' --csv --page raw \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  $B/met bench latency --model $S/configs/Qwen3-30B-A3B --load-format dummy --batch-size 1 \
  --input-len 128 --output-len 3 --num-iters 1 --num-warmup 0 --enforce-eager > $OUT/ncu-30b-b1.csv 2>$OUT/ncu-30b.err
python3 $B/ncu_summary.py $OUT/ncu-30b-b1.csv --by-step 2>&1 | head -45
tail -2 $OUT/ncu-30b.err
