#!/bin/bash
# Profile of the e4m3 GEMVs inside the FP8 decode graph (batch 1), where the kernel bench's
# gains did not show (README, "h"): ncu on `met bench latency`, graph nodes profiled one by
# one, the four projections of a layer (qkv, o, SwiGLU gate/up, down) after warm-up, with
# the sections that say whether a GEMV waits on memory, on latency or on its launch. Run
# from the repository root with the bundle carried; results in $OUT/p.
set -u
B=gpu-bundle; L=$OUT/p; mkdir -p $L
bash $B/unpack.sh > /dev/null
export MET_HOME=/tmp/met-home LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}; mkdir -p $MET_HOME
N=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 400 $N --graph-profiling node -k regex:fp8_gemv --launch-skip 400 --launch-count 8 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats \
  --section Occupancy --section SchedulerStats \
  $B/met bench latency --model configs/Meta-Llama-3-8B-Instruct-FP8 --load-format dummy --input-len 128 \
  --output-len 32 --batch-size 1 --num-iters 1 > $L/ncu.txt 2>&1
echo "ncu rc=$?"
grep -E "^\s+fp8_gemv|Duration|DRAM Throughput|Waves Per SM|Achieved Occupancy" $L/ncu.txt | head -60
