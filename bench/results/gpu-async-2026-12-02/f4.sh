#!/bin/bash
# Call f4: where an 8B prefill step's time goes (ncu, eager, 256 x 128-token prompts, steps of 8192 tokens).
set -u
B=gpu-bundle; L=$OUT/f4; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
timeout 400 ncu --clock-control none --cache-control none --csv --page raw \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  $B/met bench latency --model $B/configs/Llama-3.1-8B-Instruct --load-format dummy --batch-size 256 \
  --input-len 128 --output-len 2 --num-iters 1 --num-warmup 0 --enforce-eager > $L/ncu-8b-b256.csv 2> $L/ncu.err
echo "ncu rc=$?"
python3 $B/ncu_summary.py $L/ncu-8b-b256.csv --by-step > $L/prof.txt 2>&1; head -60 $L/prof.txt
gzip -f $L/ncu-8b-b256.csv
tar czf $OUT/f4.tgz -C $OUT f4
