#!/bin/bash
# Issue 33: where the time of the two slow hybrid cases goes (Qwen3.6-35B-A3B, dummy weights).
# 1. The 16k shared prefix: one cold request, 64 questions at once, one hit alone, with the
#    scheduler's line per step (`MET_LOG=...met_scheduler=debug`): how many steps the 64
#    hits take, how many prompt rows each computes, and where each step's time goes.
# 2. ncu of an eager run at batch 256 (the prefill steps, then 3 decode steps), every kernel
#    but the dummy weights' fills, summarised per step kind (`ncu_summary.py --by-step`).
# Run from the repository root with the bundle carried: bash bench/results/hybrid-profile-2026-12-04/p_run.sh
set -u
B=gpu-bundle; L=$OUT/probe; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
[ -x $B/met ] || bash $B/unpack.sh
python3 scripts/dummy_tokenizer.py configs/Qwen3.6-35B-A3B /tmp/q36 > /dev/null
MET_LOG=warn,met=info,met_server=info,met_scheduler=debug \
  $B/met serve --model /tmp/q36 --load-format dummy --port 8911 > $L/serve.log 2>&1 &
SP=$!
for i in $(seq 1 150); do curl -sf http://127.0.0.1:8911/v1/models > /dev/null && break; sleep 1; done
common="--base-url http://127.0.0.1:8911 --prefix-len 16384 --input-len 32 --output-len 16 --num-warmup 0 --seed 7"
mark() { echo "=== $1 at line $(wc -l < $L/serve.log)"; }
mark cold
timeout 60 $B/met bench serve $common --num-prompts 1 --concurrency 1 --output $L/ttft-cold.json > $L/ttft-cold.log 2>&1; echo "cold rc=$?"
mark hits
timeout 60 $B/met bench serve $common --num-prompts 64 --concurrency 64 --output $L/ttft-hit.json > $L/ttft-hit.log 2>&1; echo "hit rc=$?"
mark alone
timeout 60 $B/met bench serve $common --num-prompts 1 --concurrency 1 --output $L/ttft-alone.json > $L/ttft-alone.log 2>&1; echo "alone rc=$?"
mark end
grep -iE "ttft|first token" $L/ttft-cold.log $L/ttft-hit.log $L/ttft-alone.log | head -12
grep -E "step .* prompt" $L/serve.log | grep -v " 0 prompt" | sed 's/.*step /step /' | head -40
kill $SP; wait $SP 2>/dev/null
timeout 300 ncu --clock-control none --cache-control none --kernel-name 'regex:^([^r]|r[^a])' --csv --page raw \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  $B/met bench latency --model configs/Qwen3.6-35B-A3B --load-format dummy --batch-size 256 --input-len 128 \
  --output-len 4 --num-iters 1 --num-warmup 0 --enforce-eager > $L/ncu-q36-b256.csv 2> $L/ncu-q36-b256.err
echo "ncu rc=$?"; tail -3 $L/ncu-q36-b256.err
python3 scripts/ncu_summary.py $L/ncu-q36-b256.csv --by-step | tee $L/ncu-q36-b256.txt | head -80
gzip -f $L/ncu-q36-b256.csv
