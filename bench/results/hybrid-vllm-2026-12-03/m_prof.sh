#!/bin/bash
# Where a graphed batch-1 decode step of Qwen3.6-35B-A3B spends its time: nsys with graph
# nodes traced (if the machine has nsys), the kernel summary kept, the report dropped.
set -u
B=gpu-bundle; L=$OUT/prof; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
echo "nsys: ${NSYS:-none}"; [ -n "$NSYS" ] || exit 0
timeout 200 $NSYS profile --cuda-graph-trace=node --trace=cuda -o /tmp/prof -f true \
  $B/met bench latency --model configs/Qwen3.6-35B-A3B --load-format dummy --batch-size 1 \
  --input-len 128 --output-len 256 --num-iters 1 > $L/run.log 2>&1; echo "profile rc=$?"
timeout 120 $NSYS stats --report cuda_gpu_kern_sum --format csv -o $L/kern /tmp/prof.nsys-rep > $L/stats.log 2>&1
echo "stats rc=$?"; ls $L; head -25 $L/kern*.csv | cut -c1-220
