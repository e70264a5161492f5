#!/bin/bash
# Device call 3: the tree with the narrow decode blocks and bf16 logits: op checks, HF
# fixtures, graphs = eager, kernels lib; the 8B and 0.6B throughput; decode and sample benches.
set -u
B=gpu-bundle; L=$OUT/d3; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used,driver_version --format=csv,noheader | tee $L/gpu.txt
timeout 330 $B/run.sh $L/run lib ops fixtures graphs > $L/run.log 2>&1; echo "run.sh rc=$?"
sed -n '/======== met GPU summary/,/^$/p' $L/run.log | tail -6; grep -h "FAILED" $L/run/kernels-ops.log | head
tp() { local name=$1; shift; timeout 60 $B/met bench throughput --load-format dummy "$@" --output $L/$name.json > $L/$name.log 2>&1; echo "$name: $(grep -E '^throughput' $L/$name.log)"; }
tp tp-8b-r1 --model $B/configs/Llama-3.1-8B-Instruct --num-prompts 256 --input-len 128 --output-len 256
tp tp-06b --model $B/configs/Qwen3-0.6B --num-prompts 256 --input-len 128 --output-len 256
tp tp-8b-r2 --model $B/configs/Llama-3.1-8B-Instruct --num-prompts 256 --input-len 128 --output-len 256
timeout 60 $B/tests/kernels-bench --bench 'cuda_attention/flash/decode|cuda_sample/greedy' --warm-up-time 0.3 --measurement-time 1 > $L/kb.log 2>&1
grep -E "^cuda_|time:" $L/kb.log | paste - - | awk '{print $1, $5, $6}'
tar czf $OUT/d3.tgz -C $OUT d3
