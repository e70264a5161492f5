#!/bin/bash
# ncu of the e4m3 GEMVs at one row (o shape) and the Q4_K GEMV; results in $OUT/ncu.tgz.
set -u
B=gpu-bundle-x; O=/tmp/ncu; mkdir -p $O
bash $B/unpack.sh >/dev/null
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} MET_HOME=/tmp/met-home-shared
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for v in 2:4 8:16; do
  MET_FP8_SMALL=$v timeout 120 $NCU --kernel-name regex:'fp8_gemv' --launch-skip 20 --launch-count 1 --set full \
    $B/tests/kernels-bench --bench 'cuda_fp8/o/m1_' --profile-time 1 > $O/ncu-fp8-$v.txt 2>&1
  echo "ncu fp8 $v rc=$?"; grep -E "Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible" $O/ncu-fp8-$v.txt | head -12
done
tar czf $OUT/ncu.tgz -C $O .
