#!/bin/bash
# A short H200 call for the e4m3 GEMV's third form (branch `fp8b`): two chunks in flight a
# warp from its start (operand sets taken in turns, scales fetched with the weights) and
# split counts that fill whole waves. The CUDA e4m3 op checks, `--batch-invariant` through
# the engine (the FP8 fixtures included), the GEMV kernel benches on the Llama-3.1-8B
# projections at m 1 and 16 with the copy, and Meta-Llama-3-8B-Instruct-FP8 at batch 1
# (dummy weights). Run from the repository root with the bundle carried; results in $OUT/h.
set -u
B=gpu-bundle; L=$OUT/h; mkdir -p $L
bash $B/unpack.sh > /dev/null
export MET_HOME=/tmp/met-home LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}; mkdir -p $MET_HOME
export MET_HF_FIXTURES=crates/model-layers/tests/fixtures/hf
pass=0; fail=0
for t in $($B/tests/kernels-ops --list 2>/dev/null | grep -E '^cuda(_only|_invariant)?::.*fp8' | sed 's/: test$//'); do
  if timeout 60 $B/tests/kernels-ops --exact "$t" --test-threads=1 --nocapture > $L/op.tmp 2>&1; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1)); echo "FAILED $t"; tail -6 $L/op.tmp; cp $L/op.tmp "$L/failed-${t//:/_}.log"
  fi
done
rm -f $L/op.tmp
echo "ops: $pass passed, $fail failed"
MET_TEST_BACKEND=cuda-invariant timeout 60 $B/tests/scheduler-batch-invariance every_fixture --nocapture --test-threads=1 > $L/invariance.log 2>&1
echo "== invariance rc=$? $(grep -E '^test result' $L/invariance.log)"
timeout 60 $B/tests/kernels-bench --bench 'cuda_gemv/copy|cuda_fp8/(qkv|o|gate_up_silu|down)/m(1|16)_' > $L/kbench.log 2>&1
echo "== kbench rc=$?"; awk '/^cuda_/{name=$1} /thrpt:/{print name, $4, $5}' $L/kbench.log
m="--model configs/Meta-Llama-3-8B-Instruct-FP8 --load-format dummy --input-len 128 --output-len 256"
timeout 60 $B/met bench latency $m --batch-size 1 --num-iters 3 --output $L/b1.json > $L/b1.log 2>&1
echo "b1 rc=$?: $(grep -E '^latency' $L/b1.log)"
