#!/bin/bash
# The HF fixtures on the GPU with the three hybrids added (bf16 logits within transformers'
# own bf16 noise, greedy under the margin rule, chunks of 5, preemption, async = sync).
set -u
B=gpu-bundle; N=${NAME:-g4}; L=$OUT/$N; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
timeout 400 $B/run.sh $L/run fixtures > $L/run.log 2>&1; echo "run.sh rc=$?"
sed -n '/======== met GPU summary/,/^$/p' $L/run.log | tail -6
grep -h "GPU-FIXTURE qwen3_\|GPU-ASYNC qwen3_" $L/run/gpu-hf-fixtures.log | head -40
grep -h "FAILED\|panicked\|failures" $L/run/gpu-hf-fixtures.log | head -10
