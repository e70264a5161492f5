#!/bin/bash
# Hybrid decode graphs, checked: the recurrent op checks on CUDA (slotless padding rows, the
# graph replay of a recurrent decode step), CUDA graphs = eager for every fixture (the
# hybrids with snapshots every block), the HF fixtures on the GPU (the hybrids now through
# graphs too), and transformers' own bf16 noise on the hybrid fixtures measured on the H200.
set -u
B=gpu-bundle; N=${NAME:-g6a}; L=$OUT/$N; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,clocks.sm,memory.used,driver_version --format=csv,noheader | tee $L/gpu.txt
pass=0; fail=0
for t in $($B/tests/kernels-ops --list 2>/dev/null | grep -E '^cuda' | grep -E 'conv|delta|recurrent|state_slots|rms_norm_gated|sigmoid_mul' | sed 's/: test$//'); do
  if timeout 60 $B/tests/kernels-ops --exact "$t" --test-threads=1 > $L/op.tmp 2>&1; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAILED $t"; cat $L/op.tmp >> $L/ops-failed.log; fi
done
echo "recurrent cuda op checks: $pass passed, $fail failed" | tee $L/ops.txt
timeout 100 python3 scripts/hf_bf16_noise.py --device cuda --root $B/fixtures/hf qwen3_next qwen3_5 qwen3_5_moe 2>&1 | grep "bf16 vs f32" | tee $L/bf16-noise-cuda.txt
timeout 300 $B/run.sh $L/run graphs fixtures > $L/run.log 2>&1; echo "run.sh rc=$?"
sed -n '/======== met GPU summary/,/^$/p' $L/run.log | tail -8
grep -h "GPU-GRAPHS\|FAILED\|panicked" $L/run/gpu-graphs.log | head -20
grep -hE "qwen3_5|qwen3_next|FAILED|panicked|test result" $L/run/gpu-hf-fixtures.log | head -30
