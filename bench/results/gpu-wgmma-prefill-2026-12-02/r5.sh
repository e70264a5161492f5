#!/bin/bash
# Device call 5: the tree with tensor parallelism merged and the f16 CPU scales: every GPU
# check (one rank), the precision gate, and the 8B throughput against call 4.
set -u
B=gpu-bundle; L=$OUT/c5; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
timeout 200 $B/run.sh $L/run lib fixtures graphs gate > $L/run.log 2>&1; echo "run.sh rc=$?"; sed -n '/======== met GPU summary/,/^$/p' $L/run.log | tail -6
grep -E "gate: " $L/run/gpu-gate.log | tail -1
timeout 60 $B/met bench throughput --load-format dummy --model $B/configs/Llama-3.1-8B-Instruct --num-prompts 256 --input-len 128 --output-len 256 --output $L/tp-8b.json > $L/tp-8b.log 2>&1; grep -E "^throughput|topology|\[ 4\]" $L/tp-8b.log | head -3
timeout 110 $B/run.sh $L/run2 ops > $L/run2.log 2>&1; echo "ops rc=$?"; sed -n '/======== met GPU summary/,/^$/p' $L/run2.log | tail -3
tar czf $OUT/c5.tgz -C $OUT c5
