#!/bin/bash
# Issue 33's burst on the bundle carried: a 16k-token shared prefix, then 64 questions of 32
# tokens at once (`met serve`, Qwen3.6-35B-A3B dummy weights, defaults), under the default
# delta-rule crossover (a sequence of 32 rows or more chunked) and MET_CHUNKED_FROM=64 (the
# burst's tails on the fused kernel): cold, burst and lone-hit TTFT. Results in $OUT/t.
set -u
B=gpu-bundle; O=${OUT:-/tmp/out}/t; mkdir -p $O
[ -x $B/met ] || bash $B/unpack.sh > /dev/null
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} MET_HOME=/tmp/met-home-shared
mkdir -p $MET_HOME
python3 scripts/dummy_tokenizer.py configs/Qwen3.6-35B-A3B /tmp/q36 > /dev/null
c="--prefix-len 16384 --input-len 32 --output-len 16 --num-warmup 0 --seed 7"
for from in 32 64; do
  MET_CHUNKED_FROM=$from MET_LOG=warn,met=info,met_server=info,met_scheduler=debug \
    $B/met serve --model /tmp/q36 --load-format dummy --port 8911 > $O/serve-$from.log 2>&1 &
  SP=$!
  for i in $(seq 1 150); do curl -sf http://127.0.0.1:8911/v1/models > /dev/null && break; sleep 1; done
  echo "crossover $from: up after ${i}s"
  for x in cold:1:1 burst:64:64 alone:1:1; do
    IFS=: read n m cc <<< "$x"
    timeout 90 $B/met bench serve --base-url http://127.0.0.1:8911 $c --num-prompts $m --concurrency $cc \
      --output $O/ttft-$from-$n.json > $O/ttft-$from-$n.log 2>&1
    echo "  $n: $(grep -E '^c=' $O/ttft-$from-$n.log)"
  done
  kill $SP; wait $SP 2> /dev/null
  gzip $O/serve-$from.log
done
