#!/bin/bash
# Issue 34 on gpu-bundle-x (branch next2): the e4m3 GEMV of 8 rows a block on the tensor
# cores (MET_FP8_SMALL=8:16) against the default, and Q4_K over int8 activations
# (MET_GGUF_DOTS=int8). Results in $OUT/p.
set -u
B=gpu-bundle-x; O=${OUT:-/tmp/out}/p; mkdir -p $O
bash $B/unpack.sh >/dev/null
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} MET_HOME=/tmp/met-home-shared MET_LOG=info
mkdir -p $MET_HOME
MET_FP8_SMALL=8:16 timeout 120 $B/tests/kernels-ops fp8 --test-threads=4 > $O/ops-r8.log 2>&1
echo "ops 8:16 rc=$?"; grep -E "^test result|panicked" $O/ops-r8.log | head -6
timeout 60 $B/tests/kernels-bench --bench 'cuda_fp8/(qkv|o|gate_up|down|gate_up_silu)/m1_|cuda_gemv/copy' > $O/kbench-def.log 2>&1
echo "kbench default rc=$?"; awk '/^cuda_/{name=$1} /thrpt:/{print "def", name, $4, $5}' $O/kbench-def.log
MET_FP8_SMALL=8:16 timeout 100 $B/tests/kernels-bench --bench 'cuda_fp8/(qkv|o|gate_up|down|gate_up_silu)/m(1|4|16)_' > $O/kbench-r8.log 2>&1
echo "kbench 8:16 rc=$?"; awk '/^cuda_/{name=$1} /thrpt:/{print "r8", name, $4, $5}' $O/kbench-r8.log
bf16=configs/Llama-3.1-8B-Instruct fp8=configs/Meta-Llama-3-8B-Instruct-FP8
run() {  # run TAG MODEL FORMAT KIND
  local tag=$1 model=$2 fmt=$3 kind=$4
  if [ $kind = latency ]; then
    timeout 150 $B/met bench latency --model $model --load-format $fmt --batch-size 1 --input-len 128 \
      --output-len 256 --num-iters 3 --output $O/lat-$tag.json > $O/lat-$tag.log 2>&1
    echo "latency $tag rc=$?: $(grep -E '^latency' $O/lat-$tag.log | head -1)"
  else
    timeout 150 $B/met bench throughput --model $model --load-format $fmt --num-prompts 256 --input-len 128 \
      --output-len 256 --output $O/tput-$tag.json > $O/tput-$tag.log 2>&1
    echo "throughput $tag rc=$?: $(grep -E '^throughput' $O/tput-$tag.log | tail -1)"
  fi
}
run bf16 $bf16 dummy latency
run fp8 $fp8 dummy latency
MET_FP8_SMALL=8:16 run fp8-r8 $fp8 dummy latency
run q4km $bf16 dummy-q4_k_m latency
MET_GGUF_DOTS=int8 timeout 120 $B/tests/kernels-ops gguf quantized --test-threads=4 > $O/ops-gguf-int8.log 2>&1
echo "ops gguf int8 rc=$?"; grep -E "^test result|panicked" $O/ops-gguf-int8.log | head -6
MET_GGUF_DOTS=int8 run q4km-int8 $bf16 dummy-q4_k_m latency
run bf16 $bf16 dummy throughput
MET_FP8_SMALL=8:16 run fp8-r8 $fp8 dummy throughput
