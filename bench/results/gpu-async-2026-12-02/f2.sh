#!/bin/bash
# Call f2: the served ladder on the 8B (dummy weights), 128 + 256 tokens, asynchronous scheduling
# off and on (the default) alternating, one server per round; then 8B throughput off/on once more.
set -u
B=gpu-bundle; L=$OUT/f2; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used,driver_version --format=csv,noheader | tee $L/gpu.txt
python3 .dev/dummy_tokenizer.py $B/configs/Llama-3.1-8B-Instruct /tmp/llama-dummy > $L/tok.log 2>&1
r=0
for mode in off on off on; do
  r=$((r+1))
  $B/met serve --model /tmp/llama-dummy --load-format dummy --port 8899 --async-scheduling $mode > $L/serve-r$r-$mode.log 2>&1 &
  SP=$!
  for i in $(seq 1 90); do curl -sf http://127.0.0.1:8899/v1/models >/dev/null 2>&1 && break; sleep 1; done
  for cn in 1:8 16:64 64:128 256:256; do
    c=${cn%%:*}; n=${cn##*:}
    timeout 45 $B/met bench serve --base-url http://127.0.0.1:8899 --dataset random --input-len 128 --output-len 256 --num-prompts $n --concurrency $c --num-warmup 2 --output $L/r$r-$mode-c$c.json > $L/r$r-$mode-c$c.log 2>&1
    echo "r$r $mode c=$c: $(tail -1 $L/r$r-$mode-c$c.log | cut -c1-220)"
  done
  kill $SP 2>/dev/null; wait $SP 2>/dev/null
done
tar czf $OUT/f2.tgz -C $OUT f2
