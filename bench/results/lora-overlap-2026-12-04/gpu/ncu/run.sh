#!/bin/bash
# Where the adapters' time goes in a 256-row decode step (issue 35: adapters reach 74.5 % of
# the base's throughput at 256 requests, target 75 %): Llama-3.1-8B shape, dummy weights,
# eager, 256 x (16 + 3) under ncu (kernel times and DRAM bytes, every kernel but the dummy
# weights' fills), base and with 8 random rank-16 adapters on all seven projections,
# summarised per step kind. Short prompts: one prefill step, so ncu reaches the decode steps
# soon (with 128-token prompts one run did not finish in 140 s). Run from the repository root with the bundle carried; results go
# to $OUT/l.tgz.
set -u
B=gpu-bundle; L=/tmp/l; rm -rf $L; mkdir -p $L
[ -x $B/met ] || bash $B/unpack.sh
export MET_HOME=/tmp/met-home LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}; mkdir -p $MET_HOME
m="--model $B/configs/Llama-3.1-8B-Instruct --load-format dummy --batch-size 256 --input-len 16 --output-len 3"
for tag in base lora; do
  lora=$([ $tag = lora ] && echo "--lora-dummy 8:16")
  timeout 200 ncu --clock-control none --cache-control none --kernel-name 'regex:^([^r]|r[^a])' --csv --page raw \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    $B/met bench latency $m --num-iters 1 --num-warmup 0 --enforce-eager $lora > $L/ncu-$tag.csv 2> $L/ncu-$tag.err
  echo "== $tag rc=$?"
  python3 scripts/ncu_summary.py $L/ncu-$tag.csv --by-step | tee $L/ncu-$tag.txt | head -40
  gzip $L/ncu-$tag.csv
done
tar czf $OUT/l.tgz -C /tmp l
