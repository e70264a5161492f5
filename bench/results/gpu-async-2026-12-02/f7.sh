#!/bin/bash
# Call f7: drawn tokens index without a host check (eager decode steps fed ids without a wait).
# The op checks it touches, HF fixtures, graphs, gate; 8B 1,024 requests at --max-num-seqs 512
# (steps past the largest graph run eagerly) async on/off; 8B 256 once.
set -u
B=gpu-bundle; L=$OUT/f7; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used,driver_version --format=csv,noheader | tee $L/gpu.txt
for t in cuda::embedding_matches_reference cuda::gather_rows_matches_reference cuda::gather_u32_picks_elements cuda::sample_later_equals_sample cuda_only::drawn_tokens_feed_an_embedding_without_a_wait cuda::greedy_sample_is_argmax cuda::dense_ops_reject_bad_shapes cuda::sample_rejects_bad_arguments; do
  $B/tests/kernels-ops --exact $t --test-threads=1 > $L/op.tmp 2>&1 && echo "ok: $t" || { echo "FAILED: $t"; tail -15 $L/op.tmp; }
done | tee $L/ops.log
timeout 200 $B/run.sh $L/run fixtures graphs gate > $L/run.log 2>&1; echo "run.sh rc=$?"
sed -n '/======== met GPU summary/,/^$/p' $L/run.log | tail -5; grep -h "FAILED\|panicked" $L/run/*.log | head -5
grep -ch "GPU-ASYNC" $L/run/gpu-hf-fixtures.log
tp() { local name=$1; shift; timeout 60 $B/met bench throughput --load-format dummy --model $B/configs/Llama-3.1-8B-Instruct --input-len 128 --output-len 256 "$@" --output $L/$name.json > $L/$name.log 2>&1; echo "$name: $(grep -E '^throughput|^decode step' $L/$name.log | tr '\n' ' ')"; }
tp tp512-on --num-prompts 1024 --max-num-seqs 512
tp tp512-off --num-prompts 1024 --max-num-seqs 512 --async-scheduling off
tp tp256 --num-prompts 256
tar czf $OUT/f7.tgz -C $OUT f7
