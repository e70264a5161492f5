#!/bin/bash
# Device call 1 (session 2026-12-02b): decode-attention shapes (warps, ring stages) at large
# batches of short contexts: correctness of each, kernel bench, ncu, and the 8B engine.
set -u
B=gpu-bundle; L=$OUT/d1; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used,driver_version --format=csv,noheader | tee $L/gpu.txt
for v in 4,3 4,2 2,3 2,4; do
  MET_FD=$v timeout 90 $B/tests/kernels-ops cuda::paged_attention cuda::attention --test-threads=1 > $L/ops-$v.log 2>&1
  echo "ops MET_FD=$v rc=$? $(grep -E '^test result' $L/ops-$v.log)"
done
for v in 4,3 4,2 2,3 2,4; do
  MET_FD=$v timeout 60 $B/tests/kernels-bench --bench 'cuda_attention/flash/decode' --warm-up-time 0.3 --measurement-time 1 > $L/kb-$v.log 2>&1
  echo "== MET_FD=$v"; grep -E "^cuda_attention|thrpt:" $L/kb-$v.log | paste - - | awk '{print $1, $(NF-3), $(NF-2)}'
done
for v in 4,3 2,3; do
  MET_FD=$v timeout 60 ncu --clock-control none --kernel-name regex:flash_decode --launch-skip 5 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section Occupancy --section MemoryWorkloadAnalysis --section LaunchStats \
    $B/tests/kernels-bench --bench 'cuda_attention/flash/decode_256x136' --warm-up-time 0.1 --measurement-time 0.1 > $L/ncu-$v.txt 2>&1
  echo "ncu $v rc=$?"; grep -E "Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Block Limit|No Eligible|Warp Cycles Per Issued|Stall" $L/ncu-$v.txt | head -14
done
tp() { local name=$1; shift; timeout 60 $B/met bench throughput --load-format dummy --model $B/configs/Llama-3.1-8B-Instruct --num-prompts 256 --input-len 128 --output-len 256 --output $L/$name.json > $L/$name.log 2>&1; echo "$name: $(grep -E '^throughput' $L/$name.log)"; }
MET_FD=4,3 MET_FD_ZBIG=2 tp tp8b-w4s3-z2
MET_FD=4,3 MET_FD_ZBIG=1 tp tp8b-w4s3-z1
MET_FD=2,3 MET_FD_ZBIG=1 tp tp8b-w2s3-z1
MET_FD=4,2 MET_FD_ZBIG=1 tp tp8b-w4s2-z1
MET_FD=2,4 MET_FD_ZBIG=1 tp tp8b-w2s4-z1
MET_FD=4,3 MET_FD_ZBIG=2 tp tp8b-w4s3-z2-r2
tar czf $OUT/d1.tgz -C $OUT d1
