#!/bin/bash
# Call e4: the final tree's served ladder on the 8B (dummy weights), 128 + 256 tokens.
set -u
B=gpu-bundle; L=$OUT/e4; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used,driver_version --format=csv,noheader | tee $L/gpu.txt
python3 .dev/dummy_tokenizer.py $B/configs/Llama-3.1-8B-Instruct /tmp/llama-dummy > $L/tok.log 2>&1
$B/met serve --model /tmp/llama-dummy --load-format dummy --port 8899 > $L/serve.log 2>&1 &
SP=$!
for i in $(seq 1 90); do curl -sf http://127.0.0.1:8899/v1/models >/dev/null 2>&1 && break; sleep 1; done
for cn in 1:8 16:64 64:128 256:256; do
  c=${cn%%:*}; n=${cn##*:}
  timeout 45 $B/met bench serve --base-url http://127.0.0.1:8899 --dataset random --input-len 128 --output-len 256 --num-prompts $n --concurrency $c --num-warmup 2 --output $L/serve-c$c.json > $L/serve-c$c.log 2>&1
  echo "serve c=$c: $(grep -iE 'output tok/s|tok/s' $L/serve-c$c.log | tail -1 | cut -c1-240)"
done
kill $SP 2>/dev/null; wait $SP 2>/dev/null
tar czf $OUT/e4.tgz -C $OUT e4
