#!/bin/bash
# Session 22, call 4: the 16k shared prefix + 64 questions without kernel timing, two rounds.
set -u
B=gpu-bundle-next; bash $B/unpack.sh > /dev/null
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} MET_HOME=/tmp/met-home-shared
O=$OUT/kd; mkdir -p $O
python3 scripts/dummy_tokenizer.py configs/Qwen3.6-35B-A3B /tmp/q36 > /dev/null
MET_LOG=warn,met=info,met_server=info $B/met serve --model /tmp/q36 --load-format dummy --port 8912 > $O/serve.log 2>&1 &
SP=$!
for i in $(seq 1 200); do curl -sf http://127.0.0.1:8912/v1/models > /dev/null && break; sleep 1; done
echo "up after $i s"
for r in 1 2 3; do
  c="--prefix-len 16384 --input-len 32 --output-len 16 --num-warmup 0 --seed $((7 + r))"
  for x in cold:1 burst:64; do
    n=${x%:*}; m=${x#*:}
    timeout 90 $B/met bench serve --base-url http://127.0.0.1:8912 $c --num-prompts $m --concurrency $m \
      --output $O/ttft-$n-$r.json > $O/ttft-$n-$r.log 2>&1
    echo "$n $r: $(grep -E '^c=' $O/ttft-$n-$r.log)"
  done
done
kill $SP; wait $SP 2> /dev/null
gzip $O/serve.log; tar czf $OUT/kd.tgz -C $OUT kd && rm -rf $OUT/kd
