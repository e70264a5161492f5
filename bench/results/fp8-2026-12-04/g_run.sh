#!/bin/bash
# One short H200 call for the FP8 kernels' second form (branch `fp8b`): the GEMV with one
# 16-row tile a block (8 blocks a multiprocessor) and wave-aware splits, and the e4m3 MoE
# grouped GEMM one scale chunk deep with scales applied after each chunk. In order of need,
# each part bounded, results written to $OUT as they come:
# 1. the CUDA op checks of e4m3 matrices and of MoE experts (bf16 and e4m3);
# 2. kernel benches: the GEMV at m 1, 4, 16 on the Llama-3.1-8B projections, the copy,
#    e4m3 against bf16 MoE experts (Qwen3-30B-A3B's);
# 3. `--batch-invariant` through the engine on every fixture (the FP8 ones included);
# 4. end to end, dummy weights, Meta-Llama-3-8B-Instruct-FP8: batch 1 and 256 requests.
# Run from the repository root with the bundle carried.
set -u
B=gpu-bundle; L=$OUT/g; mkdir -p $L
bash $B/unpack.sh > /dev/null
export MET_HOME=/tmp/met-home LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}; mkdir -p $MET_HOME
export MET_HF_FIXTURES=crates/model-layers/tests/fixtures/hf
pass=0; fail=0
for t in $($B/tests/kernels-ops --list 2>/dev/null | grep -E '^cuda(_only|_invariant)?::.*(fp8|moe)' | sed 's/: test$//'); do
  if timeout 60 $B/tests/kernels-ops --exact "$t" --test-threads=1 --nocapture > $L/op.tmp 2>&1; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1)); echo "FAILED $t"; tail -6 $L/op.tmp; cp $L/op.tmp "$L/failed-${t//:/_}.log"
  fi
done
rm -f $L/op.tmp
echo "ops: $pass passed, $fail failed"
timeout 110 $B/tests/kernels-bench --bench 'cuda_gemv/copy|cuda_fp8/(qkv|o|gate_up_silu|down)/m(1|4|16)_|cuda_fp8_moe' > $L/kbench.log 2>&1
echo "== kbench rc=$?"; awk '/^cuda_/{name=$1} /thrpt:/{print name, $4, $5}' $L/kbench.log
MET_TEST_BACKEND=cuda-invariant timeout 100 $B/tests/scheduler-batch-invariance every_fixture --nocapture --test-threads=1 > $L/invariance.log 2>&1
echo "== invariance rc=$? $(grep -E '^test result' $L/invariance.log)"
m="--model configs/Meta-Llama-3-8B-Instruct-FP8 --load-format dummy --input-len 128 --output-len 256"
timeout 70 $B/met bench latency $m --batch-size 1 --num-iters 3 --output $L/b1.json > $L/b1.log 2>&1
echo "b1 rc=$?: $(grep -E '^latency' $L/b1.log)"
timeout 70 $B/met bench throughput $m --num-prompts 256 --output $L/t256.json > $L/t256.log 2>&1
echo "256 rc=$?: $(grep -E '^throughput' $L/t256.log)"
