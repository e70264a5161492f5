#!/bin/bash
# met beside vLLM (v_run.sh, v_prefix.sh) in the same session: batch-1 latency and 256 x (128 + 256)
# of the two hybrid configs (dummy weights, decode graphs), then the 16k shared-prefix test
# through `met serve`: the first request cold, then 64 questions at once.
set -u
B=gpu-bundle; N=${NAME:-met}; L=$OUT/$N; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
for model in Qwen3.6-35B-A3B Qwen3.5-27B; do
  timeout 100 $B/met bench latency --model configs/$model --load-format dummy --batch-size 1 \
    --input-len 128 --output-len 256 --num-iters 3 --output $L/latency-$model-b1.json > $L/latency-$model-b1.log 2>&1
  echo "$model b1 rc=$?"; grep -E "^latency" $L/latency-$model-b1.log
  timeout 150 $B/met bench throughput --model configs/$model --load-format dummy --num-prompts 256 \
    --input-len 128 --output-len 256 --output $L/throughput-$model.json > $L/throughput-$model.log 2>&1
  echo "$model 256 rc=$?"; grep -E "^throughput|kv cache|error" $L/throughput-$model.log | tail -3
done
python3 scripts/dummy_tokenizer.py configs/Qwen3.6-35B-A3B /tmp/q36 > /dev/null
$B/met serve --model /tmp/q36 --load-format dummy --port 8911 > $L/serve.log 2>&1 &
SP=$!
for i in $(seq 1 120); do curl -sf http://127.0.0.1:8911/v1/models > /dev/null && break; sleep 1; done
grep -E "kv cache|recurrent|\[ 7\]" $L/serve.log | tail -3
common="--base-url http://127.0.0.1:8911 --prefix-len 16384 --input-len 32 --output-len 16 --num-warmup 0 --seed 7"
timeout 120 $B/met bench serve $common --num-prompts 1 --concurrency 1 --output $L/ttft-cold.json > $L/ttft-cold.log 2>&1; echo "cold rc=$?"
timeout 120 $B/met bench serve $common --num-prompts 64 --concurrency 64 --output $L/ttft-hit.json > $L/ttft-hit.log 2>&1; echo "hit rc=$?"
grep -iE "ttft|first token" $L/ttft-cold.log $L/ttft-hit.log | head -8
curl -s http://127.0.0.1:8911/metrics | grep -E "cached|prefix|met_state" | head -12
kill $SP; wait $SP 2>/dev/null
