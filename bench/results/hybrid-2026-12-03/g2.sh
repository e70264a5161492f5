#!/bin/bash
# The GPU bundle after the CUDA recurrent ops landed: the op suite (which now checks them
# on CUDA), the HF fixtures, graphs and the precision gate, then the hybrid fixtures through
# `met generate` on CUDA (scripts/gpu_hybrid_check.py).
set -u
B=gpu-bundle; N=${NAME:-g2}; L=$OUT/$N; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used,driver_version --format=csv,noheader | tee $L/gpu.txt
timeout 150 python3 scripts/gpu_hybrid_check.py --met $B/met --fixtures $B/fixtures/hf --out $L/hybrid.json > $L/hybrid.log 2>&1
echo "hybrid rc=$?"; grep HYBRID $L/hybrid.log; tail -5 $L/hybrid.log | grep -v HYBRID
timeout 420 $B/run.sh $L/run ops fixtures graphs gate > $L/run.log 2>&1; echo "run.sh rc=$?"
sed -n '/======== met GPU summary/,/^$/p' $L/run.log | tail -12; grep -h "FAILED\|panicked" $L/run/*.log | head
grep -h "recurrent\|delta_rule\|conv_\|rms_norm_gated\|sigmoid_mul\|state_slots" $L/run/kernels-ops.log | grep -i "cuda" | head -20
tar czf $OUT/$N.tgz -C $OUT $N
