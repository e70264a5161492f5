#!/bin/bash
# Issue 34 item 3, GGUF blocks kept on CUDA: the op checks that exercise them (every format
# against its decoded values, a matrix of mixed formats, GGUF experts under
# --batch-invariant), then Llama-3.1-8B shape batch-1 decode (128 + 256) and 256 x (128 +
# 256) in Q4_K_M blocks (`--load-format dummy-q4_k_m`) against bf16 dummy weights,
# alternating, with the device memory each load took (the weights phase line).
# Run from the repository root with the bundle carried; results in $OUT/g.
set -u
B=gpu-bundle; O=${OUT:-/tmp/out}/g; mkdir -p $O
bash $B/unpack.sh >/dev/null
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} MET_HOME=/tmp/met-home MET_LOG=info
mkdir -p $MET_HOME
$B/tests/kernels-ops gguf quant --test-threads=1 > $O/ops.log 2>&1
echo "ops rc=$?"; grep -E "^test |test result|panicked" $O/ops.log | head -20
m=$B/configs/Llama-3.1-8B-Instruct
for fmt in dummy dummy-q4_k_m dummy dummy-q4_k_m; do
  tag=$fmt-$SECONDS
  timeout 150 $B/met bench latency --model $m --load-format $fmt --batch-size 1 --input-len 128 --output-len 256 \
    --num-iters 3 --output $O/lat-$tag.json > $O/lat-$tag.log 2>&1
  echo "latency $fmt rc=$?: $(grep -E '^latency' $O/lat-$tag.log | head -1)"
  grep -h "weights (" $O/lat-$tag.log | head -1
done
for fmt in dummy dummy-q4_k_m; do
  timeout 150 $B/met bench throughput --model $m --load-format $fmt --num-prompts 256 --input-len 128 \
    --output-len 256 --output $O/tput-$fmt.json > $O/tput-$fmt.log 2>&1
  echo "throughput $fmt rc=$?: $(grep -E 'output tok/s|tok/s' $O/tput-$fmt.log | tail -1)"
done
