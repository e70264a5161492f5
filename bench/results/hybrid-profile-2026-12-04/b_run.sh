#!/bin/bash
# Where a step of prefix hits spends its time: `met serve` (Qwen3.6-35B-A3B, dummy weights,
# eager) under ncu (kernel times only, every kernel but the dummy weights' fills), one cold
# request of a 16k-token prefix + 32, then 64 requests that hit it, 2 new tokens each.
# Run from the repository root with the bundle carried; results go to $OUT/p.tgz (kept here as `b/`).
set -u
B=gpu-bundle; L=/tmp/p; rm -rf $L; mkdir -p $L
[ -x $B/met ] || bash $B/unpack.sh
export MET_HOME=/tmp/met-home LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}; mkdir -p $MET_HOME
python3 scripts/dummy_tokenizer.py configs/Qwen3.6-35B-A3B /tmp/q36 > /dev/null
MET_LOG=warn,met=info,met_server=info,met_scheduler=debug \
  timeout 560 ncu --clock-control none --cache-control none --kernel-name 'regex:^([^r]|r[^a])' --csv --page raw \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  $B/met serve --model /tmp/q36 --load-format dummy --enforce-eager --port 8912 > $L/ncu.csv 2> $L/serve.log &
SP=$!
for i in $(seq 1 300); do curl -sf http://127.0.0.1:8912/v1/models > /dev/null && break; sleep 1; done
echo "up after ${i}s"
c="--prefix-len 16384 --input-len 32 --output-len 2 --num-warmup 0 --seed 7"
for x in cold:1 hit:64; do
  n=${x%:*}; m=${x#*:}
  timeout 200 $B/met bench serve --base-url http://127.0.0.1:8912 $c --num-prompts $m --concurrency $m \
    --output $L/ttft-$n.json > $L/ttft-$n.log 2>&1
  echo "$n: $(grep -E '^c=' $L/ttft-$n.log)"
done
pkill -INT -x met; wait $SP  # met drains and exits; ncu prints its rows only when the app ends by itself
ls -la $L; gzip $L/ncu.csv
tar czf $OUT/p.tgz -C /tmp p
