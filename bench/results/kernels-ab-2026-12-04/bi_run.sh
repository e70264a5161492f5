#!/bin/bash
# One call on the H200 for `--batch-invariant` (issue 36), bundle of branch `next`:
# 1. the op checks under the flag (`cuda_invariant::`) and the census of the default kernels
#    (`cuda_only::batch_invariance_census`: rows that differ from the row alone, printed);
# 2. `run.sh invariance`: the engine's checks on the attention fixtures with the flag (alone =
#    one batch = chunks of 7 = preempted = prefix hit, bit for bit), then the census of the
#    default kernels;
# 3. the cost: Llama-3.1-8B shape (dummy weights), batch 1 (128 + 256) and 256 x (128 + 256),
#    without and with the flag, alternating, two rounds.
# Run from the repository root with the bundle carried; results go to $OUT/bi.tgz.
set -u
B=gpu-bundle; L=/tmp/bi; rm -rf $L; mkdir -p $L
bash $B/unpack.sh
export MET_HOME=/tmp/met-home LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}; mkdir -p $MET_HOME
export MET_HF_FIXTURES=crates/model-layers/tests/fixtures/hf
pass=0; fail=0
for t in $($B/tests/kernels-ops --list 2>/dev/null | grep -E '^cuda_invariant::|^cuda_only::batch_invariance_census' | sed 's/: test$//'); do
  if timeout 120 $B/tests/kernels-ops --exact "$t" --test-threads=1 --nocapture > $L/op.tmp 2>&1; then
    pass=$((pass + 1)); grep -h "BATCH-INVARIANCE" $L/op.tmp
  else
    fail=$((fail + 1)); echo "FAILED $t"; tail -12 $L/op.tmp; cp $L/op.tmp "$L/failed-${t#*::}.log"
  fi
done
echo "ops under the flag: $pass passed, $fail failed"
bash $B/run.sh $L/run invariance 2>&1 | grep -E "^== |BATCH-INVARIANCE|FAIL|panicked" | head -20
m="--model $B/configs/Llama-3.1-8B-Instruct --load-format dummy --input-len 128 --output-len 256"
for round in 1 2; do
  for flag in "" "--batch-invariant"; do
    tag=$([ -n "$flag" ] && echo on || echo off)
    timeout 150 $B/met bench latency $m --batch-size 1 --num-iters 3 $flag --output $L/b1-$tag-$round.json > $L/b1-$tag-$round.log 2>&1
    timeout 200 $B/met bench throughput $m --num-prompts 256 $flag --output $L/t256-$tag-$round.json > $L/t256-$tag-$round.log 2>&1
    echo "round $round flag $tag: $(grep -E '^latency' $L/b1-$tag-$round.log) | $(grep -E '^throughput' $L/t256-$tag-$round.log)"
  done
done
tar czf $OUT/bi.tgz -C /tmp bi
