#!/bin/bash
# One H200 call for issue 33's delta rule: its fused kernel and chunked form on the same
# steps (`cuda_delta_rule_forms`: bursts of 64 tails of 32 to 256 rows, 16 of 128 and 512,
# 4 of 512 and 2,048, one of 2,048 and 8,192), to place the default crossover
# (`CHUNKED_FROM`, 32 rows since before the fused kernel got 3x faster), then the 16k shared
# prefix + 64 questions burst (`bench/results/kernels-ab-2026-12-04/`'s TTFT probe) as it
# stands, after a 256-row decode's phases. Run from the repository root with the bundle carried; results in $OUT/d.
set -u
B=gpu-bundle-x; O=${OUT:-/tmp/out}/d; mkdir -p $O
bash $B/unpack.sh >/dev/null
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} MET_HOME=/tmp/met-home-shared
mkdir -p $MET_HOME
timeout 300 $B/tests/kernels-bench --bench 'cuda_delta_rule_forms' > $O/kbench.log 2>&1
echo "kbench rc=$?"; awk '/^cuda_/{name=$1} /time:/{print name, $4, $5}' $O/kbench.log
# Where a 256-row decode step of Qwen3.6-35B-A3B goes (graphed; the engine thread's phases,
# as `met bench latency` prints them): the step measured ~39 ms against ~21 ms of kernels.
timeout 200 $B/met bench latency --model configs/Qwen3.6-35B-A3B --load-format dummy --batch-size 256 \
  --input-len 128 --output-len 64 --num-iters 2 --output $O/lat-q36-b256.json > $O/lat-q36-b256.log 2>&1
echo "latency q36 b256 rc=$?"; grep -E "^latency|decode step phases" $O/lat-q36-b256.log | head -4
timeout 200 $B/met bench latency --model configs/Qwen3.6-35B-A3B --load-format dummy --batch-size 256 \
  --input-len 128 --output-len 64 --num-iters 2 --enforce-eager --output $O/lat-q36-b256-eager.json > $O/lat-q36-b256-eager.log 2>&1
echo "latency q36 b256 eager rc=$?"; grep -E "^latency|decode step phases" $O/lat-q36-b256-eager.log | head -4
python3 scripts/dummy_tokenizer.py configs/Qwen3.6-35B-A3B /tmp/q36 > /dev/null
c="--prefix-len 16384 --input-len 32 --output-len 16 --num-warmup 0 --seed 7"
MET_LOG=warn,met=info,met_server=info,met_scheduler=debug \
  $B/met serve --model /tmp/q36 --load-format dummy --port 8911 > $O/serve.log 2>&1 &
SP=$!
for i in $(seq 1 120); do curl -sf http://127.0.0.1:8911/v1/models > /dev/null && break; sleep 1; done
for x in cold:1:1 burst:64:64 seq:64:1 alone:1:1; do
  IFS=: read n m cc <<< "$x"
  timeout 90 $B/met bench serve --base-url http://127.0.0.1:8911 $c --num-prompts $m --concurrency $cc \
    --output $O/ttft-$n.json > $O/ttft-$n.log 2>&1
  echo "$n: $(grep -E '^c=' $O/ttft-$n.log)"
done
kill $SP; wait $SP 2> /dev/null
gzip $O/serve.log
