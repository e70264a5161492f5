#!/bin/bash
# The GPU bundle at the hybrid session's head: op suite, HF fixtures through the engine (with the
# async = sync equalities), CUDA graphs = eager, precision gate and its broken variant.
set -u
B=gpu-bundle; N=${NAME:-g1}; L=$OUT/$N; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used,driver_version --format=csv,noheader | tee $L/gpu.txt
timeout 560 $B/run.sh $L/run ops fixtures graphs gate > $L/run.log 2>&1; echo "run.sh rc=$?"
sed -n '/======== met GPU summary/,/^$/p' $L/run.log | tail -12; grep -h "FAILED\|panicked" $L/run/*.log | head
tar czf $OUT/$N.tgz -C $OUT $N
