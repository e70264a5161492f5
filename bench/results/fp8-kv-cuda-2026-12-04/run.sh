#!/bin/bash
# Issue 34 item 5 on the H200: the FP8 KV cache on CUDA (branch `fp8-kv`). One call:
# 1. every attention op check (the e4m3 forms, and the bf16 ones, whose argument block
#    changed) and the fused prologue's;
# 2. the Hugging Face fixtures with `--kv-cache-dtype fp8` against transformers with an e4m3
#    cache (`gpu_hf_fixtures fp8_kv`);
# 3. kernel bench: decode and prefill attention over e4m3 pools beside bf16 ones (the
#    tensor-core decode and the warpgroup prefill, each with its e4m3 form);
# 4. Llama-3.1-8B shape, dummy weights: the KV blocks that fit with bf16 and fp8 pools (the
#    startup line of phase 6), then 256 x (4,096 + 256) through `met bench
#    throughput` with each, and batch-1 decode (4,096 + 256) with each.
# Run from the repository root with the bundle carried; results in $OUT/k.
set -u
B=gpu-bundle; O=${OUT:-/tmp/out}/k; mkdir -p $O
bash $B/unpack.sh >/dev/null
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} MET_HOME=/tmp/met-home MET_LOG=info
export MET_HF_FIXTURES=crates/model-layers/tests/fixtures/hf
mkdir -p $MET_HOME
timeout 240 $B/tests/kernels-ops attention fp8_pools qkv_rotary decode --test-threads=4 > $O/ops.log 2>&1
echo "ops rc=$?"; grep -E "test result|panicked|FAILED" $O/ops.log | head -12
grep -h "over fp8 pools" $O/ops.log | head -12
timeout 200 $B/tests/scheduler-gpu-hf-fixtures fp8_kv --test-threads=1 --nocapture > $O/fixtures.log 2>&1
echo "fixtures rc=$?"; grep -E "GPU-FIXTURE|test result|panicked" $O/fixtures.log | head -40
timeout 120 $B/tests/kernels-bench --bench 'cuda_attention_fp8|cuda_attention/flash/' > $O/kbench.log 2>&1
echo "kbench rc=$?"; awk '/^cuda_/{name=$1} /thrpt:/{print name, $4, $5}' $O/kbench.log
m=$B/configs/Llama-3.1-8B-Instruct
# The blocks that fit: a batch job whose demand (2,048 x 4,352 tokens) no cache holds is
# sized by memory alone; its phase-6 line is read, then it is stopped.
for kv in auto fp8; do
  $B/met bench throughput --model $m --load-format dummy --kv-cache-dtype $kv --num-prompts 2048 \
    --input-len 4096 --output-len 256 > $O/fit-$kv.log 2>&1 &
  pid=$!
  for i in $(seq 120); do grep -q "blocks of" $O/fit-$kv.log && break; sleep 1; done
  kill $pid; wait $pid 2>/dev/null
  echo "fit $kv: $(grep -h 'blocks of' $O/fit-$kv.log | head -1)"
done
for kv in auto fp8; do
  timeout 280 $B/met bench throughput --model $m --load-format dummy --kv-cache-dtype $kv --num-prompts 256 \
    --input-len 4096 --output-len 256 --output $O/tput-$kv.json > $O/tput-$kv.log 2>&1
  echo "throughput $kv rc=$?: $(grep -E '^throughput' $O/tput-$kv.log | tail -1)"
  grep -h "blocks of" $O/tput-$kv.log | head -1
done
for kv in auto fp8; do
  timeout 120 $B/met bench latency --model $m --load-format dummy --kv-cache-dtype $kv --batch-size 1 \
    --input-len 4096 --output-len 256 --num-iters 3 --output $O/lat-$kv.json > $O/lat-$kv.log 2>&1
  echo "latency $kv rc=$?: $(grep -E '^latency' $O/lat-$kv.log | head -1)"
done
