#!/bin/bash
# Calls g2 and g3: speed of the base binary (dabd25a, `met-base`) against the final one (`met`),
# alternating, random weights: Llama-3.1-8B batch 1 (128 + 256) and 256 x (128 + 256);
# g3 adds Qwen3-0.6B 256 x (128 + 256). ROUND names the call.
set -u
B=${B:-gpu-bundle}; R=${ROUND:-g2}; L=$OUT/$R; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
lat() { local name=$1 bin=$2; shift 2; timeout 90 $B/$bin bench latency --load-format dummy "$@" --output $L/$name.json > $L/$name.log 2>&1; echo "$name: $(grep -E '^latency' $L/$name.log)"; }
tp() { local name=$1 bin=$2; shift 2; timeout 90 $B/$bin bench throughput --load-format dummy "$@" --output $L/$name.json > $L/$name.log 2>&1; echo "$name: $(grep -E '^throughput' $L/$name.log)"; }
M8="--model $B/configs/Llama-3.1-8B-Instruct --input-len 128 --output-len 256"
for b in met-base met; do lat lat8b-$b $b $M8 --batch-size 1 --num-iters 3; done
for b in met-base met; do tp tp8b-$b $b $M8 --num-prompts 256; done
if [ "$R" = g3 ]; then
  M06="--model $B/configs/Qwen3-0.6B --input-len 128 --output-len 256 --num-prompts 256"
  for b in met-base met; do tp tp06b-$b $b $M06; done
fi
tar czf $OUT/$R.tgz -C $OUT $R
