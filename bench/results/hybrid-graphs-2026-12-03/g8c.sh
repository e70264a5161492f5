#!/bin/bash
# g8b's prefix test again, its tables printed: a 16k-token shared prefix through `met serve`
# (Qwen3.6-35B-A3B, dummy weights): the first request cold, then 64 questions at once.
set -u
B=gpu-bundle; N=${NAME:-g8c}; L=$OUT/$N; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
python3 scripts/dummy_tokenizer.py configs/Qwen3.6-35B-A3B /tmp/q36 > /dev/null
$B/met serve --model /tmp/q36 --load-format dummy --port 8911 > $L/serve.log 2>&1 &
SP=$!
for i in $(seq 1 120); do curl -sf http://127.0.0.1:8911/v1/models > /dev/null && break; sleep 1; done
common="--base-url http://127.0.0.1:8911 --prefix-len 16384 --input-len 32 --output-len 16 --num-warmup 0 --seed 7"
for run in "cold 1 1" "hit 64 64"; do
  set -- $run
  timeout 120 $B/met bench serve $common --num-prompts $2 --concurrency $3 --output $L/ttft-$1.json > $L/ttft-$1.log 2>&1; echo "$1 rc=$?"
  cat $L/ttft-$1.log | tail -4
done
curl -s http://127.0.0.1:8911/metrics | grep -E "^met_(prefix|cached|state_snap)" | head -8
kill $SP; wait $SP 2>/dev/null
