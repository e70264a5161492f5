#!/bin/bash
# After the state sizing, head-dim-256 attention and narrow delta-rule kernels: the CUDA op
# checks of attention and the recurrent ops, graphs = eager, the HF fixtures (one thread),
# and the precision gate's hybrid shapes with the lost-conv-state fault.
set -u
B=gpu-bundle; N=${NAME:-g8a}; L=$OUT/$N; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
pass=0; fail=0
for t in $($B/tests/kernels-ops --list 2>/dev/null | grep -E '^cuda' | grep -E 'attention|conv|delta|recurrent|state_slots|rms_norm_gated|sigmoid_mul' | sed 's/: test$//'); do
  if timeout 90 $B/tests/kernels-ops --exact "$t" --test-threads=1 > $L/op.tmp 2>&1; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAILED $t"; tail -5 $L/op.tmp; cat $L/op.tmp >> $L/ops-failed.log; fi
done
echo "attention + recurrent cuda op checks: $pass passed, $fail failed" | tee $L/ops.txt
timeout 200 $B/run.sh $L/run graphs fixtures > $L/run.log 2>&1; echo "run.sh rc=$?"
sed -n '/======== met GPU summary/,/^$/p' $L/run.log | tail -4
grep -h "GPU-GRAPHS qwen3_\(5\|next\)\|FAILED\|panicked" $L/run/gpu-graphs.log $L/run/gpu-hf-fixtures.log | head
timeout 280 python3 $B/gpu_gate.py --met $B/met --work /tmp/gate-h --out $L/gate.json --broken drop-conv-state \
  --shapes qwen3-next,qwen3.5-dense,qwen3.5-moe > $L/gate.log 2>&1; echo "gate rc=$?"
sed -n '/^met vs transformers/,$p' $L/gate.log; grep -h "prefix cache was not hit\|Error" $L/gate.log | head -3
