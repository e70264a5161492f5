#!/bin/bash
# Device call 6: the fixed column writes: their op check, HF fixtures, graphs = eager, the
# precision gate; the 8B throughput.
set -u
B=gpu-bundle; L=$OUT/d6; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
timeout 30 $B/tests/kernels-ops --exact cuda_only::write_u32_columns_keeps_the_other_columns --test-threads=1 > $L/op-columns.log 2>&1; echo "op columns rc=$? $(grep '^test result' $L/op-columns.log)"
timeout 160 $B/run.sh $L/run fixtures graphs gate > $L/run.log 2>&1; echo "run.sh rc=$?"
sed -n '/======== met GPU summary/,/^$/p' $L/run.log | tail -5; grep -h "^gate:" $L/run/gpu-gate.log | tail -1
tp() { local name=$1; shift; timeout 45 $B/met bench throughput --load-format dummy "$@" --output $L/$name.json > $L/$name.log 2>&1; echo "$name: $(grep -E '^throughput' $L/$name.log)"; }
tp tp-8b-r1 --model $B/configs/Llama-3.1-8B-Instruct --num-prompts 256 --input-len 128 --output-len 256
tar czf $OUT/d6.tgz -C $OUT d6
