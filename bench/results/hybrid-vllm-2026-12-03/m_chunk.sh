#!/bin/bash
# The chunked (WY) delta rule for prefill and the column-lane decode kernel on the H200:
# the delta-rule op checks (both decode kernels), the hybrid HF fixtures through the
# engine, 256 x (128 + 256) with the new decode kernel against the old one
# (MET_DELTA_KERNEL=rows), and the 16k shared-prefix test (cold and hit TTFT).
set -u
B=gpu-bundle; L=$OUT/chunk; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export MET_HF_FIXTURES=$PWD/$B/fixtures/hf
timeout 60 $B/tests/kernels-ops delta_rule recurrent > $L/ops.log 2>&1; echo "ops rc=$?"; grep -E "test result|FAILED|panicked" $L/ops.log | head -8
MET_DELTA_KERNEL=rows timeout 40 $B/tests/kernels-ops cuda::delta_rule > $L/ops-rows.log 2>&1; echo "ops rows rc=$?"; grep -E "test result|FAILED" $L/ops-rows.log | head -4
M=configs/Qwen3.6-35B-A3B
for k in cols rows; do
  MET_DELTA_KERNEL=$k timeout 60 $B/met bench throughput --model $M --load-format dummy --num-prompts 256 \
    --input-len 128 --output-len 256 --output $L/throughput-$k.json > $L/throughput-$k.log 2>&1
  echo "throughput $k rc=$?"; grep -E "^throughput" $L/throughput-$k.log
done
python3 scripts/dummy_tokenizer.py $M /tmp/q36 > /dev/null
$B/met serve --model /tmp/q36 --load-format dummy --port 8911 > $L/serve.log 2>&1 &
SP=$!
for i in $(seq 1 90); do curl -sf http://127.0.0.1:8911/v1/models > /dev/null && break; sleep 1; done
common="--base-url http://127.0.0.1:8911 --prefix-len 16384 --input-len 32 --output-len 16 --num-warmup 0 --seed 7"
for run in "cold 1 1" "hit 64 64"; do
  set -- $run
  timeout 60 $B/met bench serve $common --num-prompts $2 --concurrency $3 --output $L/ttft-$1.json > $L/ttft-$1.log 2>&1; echo "$1 rc=$?"
  tail -2 $L/ttft-$1.log
done
kill $SP; wait $SP 2>/dev/null
timeout 60 $B/met bench latency --model $M --load-format dummy --batch-size 1 --input-len 128 --output-len 256 \
  --num-iters 3 --output $L/latency-b1.json > $L/latency-b1.log 2>&1; echo "b1 rc=$?"; grep -E "^latency" $L/latency-b1.log
timeout 100 $B/tests/scheduler-gpu-hf-fixtures --nocapture --test-threads=1 qwen3_next qwen3_5_moe > $L/fixtures.log 2>&1
echo "fixtures rc=$?"; grep -E "GPU-FIXTURE|test result|FAILED" $L/fixtures.log | head -6
