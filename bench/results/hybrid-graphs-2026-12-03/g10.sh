#!/bin/bash
# The slot-by-slot MoE path for decode steps of up to 4 tokens: the MoE op checks on CUDA,
# graphs = eager (padded MoE replays), the HF fixtures, the gate's MoE shapes, and batch-1
# latency of Qwen3.6-35B-A3B and Qwen3-30B-A3B against g8b / g7.
set -u
B=gpu-bundle; N=${NAME:-g10}; L=$OUT/$N; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
pass=0; fail=0
for t in $($B/tests/kernels-ops --list 2>/dev/null | grep -E '^cuda' | grep -E 'moe|topk' | sed 's/: test$//'); do
  if timeout 60 $B/tests/kernels-ops --exact "$t" --test-threads=1 > $L/op.tmp 2>&1; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAILED $t"; tail -5 $L/op.tmp; fi
done
rm -f $L/op.tmp; echo "moe cuda op checks: $pass passed, $fail failed" | tee $L/ops.txt
timeout 150 $B/run.sh $L/run graphs fixtures > $L/run.log 2>&1; echo "run.sh rc=$?"
sed -n '/======== met GPU summary/,/^$/p' $L/run.log | tail -3; grep -h "FAILED\|panicked" $L/run/*.log | head -5
for model in Qwen3.6-35B-A3B Qwen3-30B-A3B; do
  timeout 80 $B/met bench latency --model configs/$model --load-format dummy --batch-size 1 \
    --input-len 128 --output-len 256 --num-iters 3 --output $L/latency-$model-b1.json > $L/latency-$model-b1.log 2>&1
  echo "$model b1 rc=$?"; grep -E "^latency" $L/latency-$model-b1.log
done
timeout 150 python3 $B/gpu_gate.py --met $B/met --work /tmp/gate-m --out $L/gate.json --shapes qwen3-moe-16e,qwen3.5-moe > $L/gate.log 2>&1
echo "gate rc=$?"; grep -E "FAIL|gate:" $L/gate.log | tail -4
