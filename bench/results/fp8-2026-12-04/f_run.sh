#!/bin/bash
# One call on the H200 for FP8 weights on CUDA (issue 34, item 2), bundle of branch `fp8`:
# 1. the op checks of e4m3 matrices (decode GEMV, cuBLASLt GEMM against narrowed
#    activations, --batch-invariant rows) and of the other matmuls and quantised weights;
# 2. kernel benches: the e4m3 GEMV's weight bandwidth against bf16's and the copy, the
#    FP8 GEMMs against bf16, e4m3 MoE experts against bf16 (`cuda_fp8`, `cuda_fp8_moe`, `cuda_gemv`);
# 3. end to end, dummy weights: the Llama-3.1-8B shape in bf16, FP8 per tensor
#    (Meta-Llama-3-8B-Instruct-FP8's config) and FP8 in 128 x 128 blocks (Llama-3.1-8B with
#    Qwen's block quantization_config), and Qwen3-30B-A3B in bf16 and block FP8 (e4m3
#    experts), batch 1 (128 + 256) and 256 x (128 + 256) (`MODELS` picks a subset);
# 4. `compare` of the main bundle in gpu-bundle/main, if present (the step cut last time).
# Run from the repository root with the bundle carried; results go to $OUT/f.tgz.
set -u
B=gpu-bundle; L=/tmp/f; rm -rf $L; mkdir -p $L
bash $B/unpack.sh
export MET_HOME=/tmp/met-home LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}; mkdir -p $MET_HOME
export MET_HF_FIXTURES=crates/model-layers/tests/fixtures/hf
pass=0; fail=0
for t in $($B/tests/kernels-ops --list 2>/dev/null | grep -E '^cuda(_only|_invariant)?::.*(fp8|quant|matmul)' | sed 's/: test$//'); do
  if timeout 120 $B/tests/kernels-ops --exact "$t" --test-threads=1 --nocapture > $L/op.tmp 2>&1; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1)); echo "FAILED $t"; tail -8 $L/op.tmp; cp $L/op.tmp "$L/failed-${t//:/_}.log"
  fi
done
echo "ops: $pass passed, $fail failed"
timeout ${KBENCH_S:-240} $B/tests/kernels-bench --bench "${KBENCH:-cuda_fp8|cuda_gemv/(copy|qkv|o/|gate_up|down)}" > $L/kbench.log 2>&1
echo "== kbench rc=$?"; awk '/^cuda_/{name=$1} /thrpt:/{print name, $4, $5}' $L/kbench.log
python3 - <<'PY'
import json, os
src = json.load(open("configs/Llama-3.1-8B-Instruct/config.json"))
src["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
os.makedirs("/tmp/l8-block", exist_ok=True)
json.dump(src, open("/tmp/l8-block/config.json", "w"))
PY
for model in ${MODELS:-configs/Llama-3.1-8B-Instruct configs/Meta-Llama-3-8B-Instruct-FP8 /tmp/l8-block configs/Qwen3-30B-A3B configs/Qwen3-30B-A3B-FP8}; do
  tag=$(basename $model)
  m="--model $model --load-format dummy --input-len 128 --output-len 256"
  timeout 150 $B/met bench latency $m --batch-size 1 --num-iters 3 --output $L/b1-$tag.json > $L/b1-$tag.log 2>&1
  echo "$tag b1 rc=$?: $(grep -E '^latency' $L/b1-$tag.log)"
  [ $fail = 0 ] || continue
  timeout 150 $B/met bench throughput $m --num-prompts 256 --output $L/t256-$tag.json > $L/t256-$tag.log 2>&1
  echo "$tag 256 rc=$?: $(grep -E '^throughput' $L/t256-$tag.log)"
done
grep -h -iE "e4m3|weights|error" $L/b1-*.log | head -8
if [ -d $B/main ] && [ -z "${SKIP_MAIN:-}" ]; then
  bash $B/main/unpack.sh
  timeout 200 bash $B/main/run.sh $L/main compare 2>&1 | grep -E "^== " | head
fi
tar czf $OUT/f.tgz -C /tmp f
