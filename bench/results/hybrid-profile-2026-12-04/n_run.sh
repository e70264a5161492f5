#!/bin/bash
# Qwen3.6-35B-A3B at 256 sequences with clean decode steps: all 256 prompts in one prefill
# step (--max-batch-tokens 32768), then decode steps of 256 rows only. First the graphed and
# the eager step times (`met bench latency`, 64 new tokens), then ncu of an eager run (three
# decode steps of 256 rows), every kernel but the dummy weights' fills, by step kind.
# Run from the repository root with the bundle carried; results go to $OUT/n.tgz.
set -u
B=gpu-bundle; L=/tmp/n; rm -rf $L; mkdir -p $L
[ -x $B/met ] || bash $B/unpack.sh
export MET_HOME=/tmp/met-home LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}; mkdir -p $MET_HOME
m="--model configs/Qwen3.6-35B-A3B --load-format dummy --batch-size 256 --input-len 128 --max-batch-tokens 32768"
for mode in graphs eager; do
  flag=$([ $mode = eager ] && echo --enforce-eager)
  timeout 150 $B/met bench latency $m --output-len 64 --num-iters 1 $flag --output $L/latency-$mode.json > $L/latency-$mode.log 2>&1
  echo "$mode: $(grep -E '^latency' $L/latency-$mode.log)"
done
# The scheduler's line per step of a graphed 256 x (128 + 256) run: what a step's wall time
# holds besides the forward (schedule, sample, postprocess, waiting on the step before).
MET_LOG=warn,met_scheduler=debug timeout 150 $B/met bench throughput --model configs/Qwen3.6-35B-A3B \
  --load-format dummy --num-prompts 256 --input-len 128 --output-len 256 > $L/throughput-steps.log 2>&1
echo "throughput rc=$?: $(grep -cE 'step [0-9.]+ ms' $L/throughput-steps.log) step lines"
grep -E 'step [0-9.]+ ms' $L/throughput-steps.log | sed -n '20,24p;200,204p' | sed 's/\x1b\[[0-9;]*m//g' | cut -c30-
timeout 300 ncu --clock-control none --cache-control none --kernel-name 'regex:^([^r]|r[^a])' --csv --page raw \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  $B/met bench latency $m --output-len 4 --num-iters 1 --num-warmup 0 --enforce-eager > $L/ncu.csv 2> $L/ncu.err
echo "ncu rc=$?"
python3 scripts/ncu_summary.py $L/ncu.csv --by-step | tee $L/ncu.txt | head -60
gzip $L/ncu.csv
tar czf $OUT/n.tgz -C /tmp n
