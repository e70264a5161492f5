#!/bin/bash
# Call g1: the full GPU proof of main after this session's CPU changes (kernels crate).
set -u
B=gpu-bundle; L=$OUT/g1; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used,driver_version --format=csv,noheader | tee $L/gpu.txt
timeout 420 $B/run.sh $L/run ops fixtures graphs gate > $L/run.log 2>&1; echo "run.sh rc=$?"
sed -n '/======== met GPU summary/,/^$/p' $L/run.log | tail -8; grep -h "FAILED\|panicked" $L/run/*.log | head
grep -h "test result" $L/run/*.log | head -12
grep -ch "GPU-ASYNC" $L/run/gpu-hf-fixtures.log
tar czf $OUT/g1.tgz -C $OUT g1
