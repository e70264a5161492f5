#!/usr/bin/env bash
# Call D: the precision gate, Qwen3-30B-A3B's baseline, and speculation's verification overhead.
# (This folder keeps the speculation part; the gate passed, the Qwen3-30B-A3B figures are in gpu-moe-2026-12-01/.)
set -u
B=gpu-bundle; S=gpu-bundle-stage; L=/tmp/logs2; mkdir -p $L
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
bash $B/run.sh $L gate > $L/run.out 2>&1
M=$S/configs/Qwen3-30B-A3B
timeout 150 $B/met bench throughput --model $M --load-format dummy --num-prompts 256 --input-len 128 --output-len 256 --output $L/tp-30b-a3b.json > $L/tp-30b-a3b.log 2>&1
timeout 90 $B/met bench latency --model $M --load-format dummy --batch-size 1 --input-len 128 --output-len 128 --num-iters 2 --output $L/lat-30b-a3b-b1.json > $L/lat-30b-a3b-b1.log 2>&1
M8=$B/configs/Llama-3.1-8B-Instruct
for bs in 1 64; do
  for mode in off ngram self; do
    case $mode in
      off) extra="";;
      ngram) extra="--speculative ngram --num-speculative-tokens 4 --speculative-max-batch 256";;
      self) extra="--speculative self --self-spec-layers 1 --num-speculative-tokens 4 --speculative-fixed-k --speculative-max-batch 256";;
    esac
    timeout 60 $B/met bench latency --model $M8 --load-format dummy --batch-size $bs --input-len 128 --output-len 128 --num-iters 2 $extra --output $L/spec-$mode-b$bs.json > $L/spec-$mode-b$bs.log 2>&1
  done
done
tar czf $OUT/logs2.tgz -C /tmp logs2
grep -A4 "met GPU summary" $L/run.out; grep -E "FAILED|panicked" $L/*.log | head
tail -n 25 $L/run.out | grep -v "^$" | head -30
for f in $L/tp-30b-a3b.log $L/lat-30b-a3b-b1.log $L/spec-*.log; do echo "== $f"; tail -n 4 $f | cut -c1-250; done
