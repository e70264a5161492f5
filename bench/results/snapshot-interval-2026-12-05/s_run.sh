#!/bin/bash
# One H200 call for issue 33 item 3's measured default of `--state-snapshot-interval` (N, in
# blocks of 16 tokens; 16 until measured). Qwen3.6-35B-A3B, dummy weights, through
# `met serve` once per N: a cold 16,000-token prompt + 32 (the snapshots' cost rides on it),
# then 32 questions one after another sharing those 16,000 tokens (each hit resumes at the
# last snapshot at or before token 16,000, a whole interval's tail recomputed at most:
# 128 tokens at N = 16, 640 at N = 64), and the snapshot slots the run held (`/metrics`).
# The default is the N whose hits are within noise of the smallest N's at the least memory.
# Run from the repository root with the bundle carried; results in $OUT/s.
set -u
B=gpu-bundle; O=${OUT:-/tmp/out}/s; mkdir -p $O
bash $B/unpack.sh >/dev/null
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} MET_HOME=/tmp/met-home
mkdir -p $MET_HOME
python3 scripts/dummy_tokenizer.py configs/Qwen3.6-35B-A3B /tmp/q36 > /dev/null
c="--prefix-len 16000 --input-len 32 --output-len 8 --num-warmup 0 --seed 11"
for n in 4 16 64; do
  $B/met serve --model /tmp/q36 --load-format dummy --port 8912 --state-snapshot-interval $n \
    > $O/serve-n$n.log 2>&1 &
  SP=$!
  for i in $(seq 1 150); do curl -sf http://127.0.0.1:8912/v1/models > /dev/null && break; sleep 1; done
  for x in cold:1 hits:32; do
    IFS=: read name m <<< "$x"
    timeout 100 $B/met bench serve --base-url http://127.0.0.1:8912 $c --num-prompts $m --concurrency 1 \
      --output $O/n$n-$name.json > $O/n$n-$name.log 2>&1
    echo "N=$n $name: $(grep -E '^c=' $O/n$n-$name.log)"
  done
  curl -s http://127.0.0.1:8912/metrics | grep -E "snapshot|state_slots|prefix_cache_hit" > $O/n$n-metrics.txt
  grep -h "recurrent state" $O/serve-n$n.log | head -1
  kill $SP; wait $SP 2> /dev/null
done
