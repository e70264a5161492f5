#!/bin/bash
# One H200 call for the quantized decode paths of branch `gpu-next`, after the bundle's
# checks pass (`run.sh lib ops fixtures graphs generate`):
# 1. kernel bench: the e4m3 GEMV at m = 1, 4 (the streaming kernel), 8, 16 (the tensor-core
#    one) on the Llama-3.1-8B matrices, GiB/s of weights against the copy, and the bf16 GEMV;
# 2. Llama-3.1-8B shape, dummy weights, batch-1 decode (128 + 256) in bf16, FP8 per tensor
#    (Meta-Llama-3-8B-Instruct-FP8's config) and Q4_K_M GGUF blocks (`dummy-q4_k_m`), in two
#    alternating rounds, with the device memory each load took (the weights phase line);
# 3. 256 x (128 + 256) for the same three;
# Targets (issue 34): FP8 batch 1 >= 1.7x bf16, 256 requests >= 1.3x; Q4_K_M batch 1 >= 2x
# bf16 and <= 0.35x its memory. Run from the repository root with the bundle carried;
# results in $OUT/p.
set -u
B=gpu-bundle; O=${OUT:-/tmp/out}/p; mkdir -p $O
bash $B/unpack.sh >/dev/null
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} MET_HOME=/tmp/met-home MET_LOG=info
mkdir -p $MET_HOME
timeout 150 $B/tests/kernels-bench --bench 'cuda_fp8/(qkv|o|gate_up|down|gate_up_silu)/m(1|4|8|16)_|cuda_gemv/(copy|qkv|o/|gate_up|down)' \
  > $O/kbench.log 2>&1
echo "kbench rc=$?"; awk '/^cuda_/{name=$1} /thrpt:/{print name, $4, $5}' $O/kbench.log
bf16=configs/Llama-3.1-8B-Instruct fp8=configs/Meta-Llama-3-8B-Instruct-FP8
run() {  # run TAG MODEL FORMAT KIND
  local tag=$1 model=$2 fmt=$3 kind=$4
  if [ $kind = latency ]; then
    timeout 150 $B/met bench latency --model $model --load-format $fmt --batch-size 1 --input-len 128 \
      --output-len 256 --num-iters 3 --output $O/lat-$tag.json > $O/lat-$tag.log 2>&1
    echo "latency $tag rc=$?: $(grep -E '^latency' $O/lat-$tag.log | head -1)"
    grep -h "weights (" $O/lat-$tag.log | head -1
  else
    timeout 150 $B/met bench throughput --model $model --load-format $fmt --num-prompts 256 --input-len 128 \
      --output-len 256 --output $O/tput-$tag.json > $O/tput-$tag.log 2>&1
    echo "throughput $tag rc=$?: $(grep -E '^throughput' $O/tput-$tag.log | tail -1)"
  fi
}
for round in 1 2; do
  run bf16-$round $bf16 dummy latency
  run fp8-$round $fp8 dummy latency
  run q4km-$round $bf16 dummy-q4_k_m latency
done
run bf16 $bf16 dummy throughput
run fp8 $fp8 dummy throughput
run q4km $bf16 dummy-q4_k_m throughput
# 4. The streaming e4m3 GEMV's settings side by side (`MET_FP8_SMALL=ROWS:MAX_M`, default
#    2:4): 4 rows a block (the bytes a bf16 GEMV block streams) up to 2 batch rows, and the
#    tensor-core GEMV from 2 batch rows. The fp8 op checks under 4:2 first (4 rows a block
#    sum each row in the same order as 2, so the same bits), then the GEMV bench at m = 1 and
#    4 and batch-1 decode on the FP8 shape.
MET_FP8_SMALL=4:2 timeout 120 $B/tests/kernels-ops fp8 --test-threads=4 > $O/ops-r4.log 2>&1
echo "ops 4:2 rc=$?"; grep -E "^test result" $O/ops-r4.log
for v in 4:2 2:1; do
  MET_FP8_SMALL=$v timeout 100 $B/tests/kernels-bench --bench 'cuda_fp8/(qkv|o|gate_up|down|gate_up_silu)/m(1|4)_' \
    > $O/kbench-$v.log 2>&1
  echo "kbench $v rc=$?"; awk -v v=$v '/^cuda_/{name=$1} /thrpt:/{print v, name, $4, $5}' $O/kbench-$v.log
done
MET_FP8_SMALL=4:2 run fp8-r4 $fp8 dummy latency
# 5. Q4_K's GEMV over int8 activations (`MET_GGUF_DOTS=int8`, branch `gguf-int8`): the quant
#    op checks under it (x rounded to 8 bits a block of 32 must stay within the bf16
#    tolerance of the decoded values' product), then batch-1 decode of the Q4_K_M shape.
MET_GGUF_DOTS=int8 timeout 120 $B/tests/kernels-ops gguf quantized --test-threads=4 > $O/ops-gguf-int8.log 2>&1
echo "ops gguf int8 rc=$?"; grep -E "^test result|panicked" $O/ops-gguf-int8.log | head -6
MET_GGUF_DOTS=int8 run q4km-int8 $bf16 dummy-q4_k_m latency
