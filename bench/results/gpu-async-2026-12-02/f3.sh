#!/bin/bash
# Call f3: the new op checks (sample_later, gather_u32 through the staging ring) and the served ladder (f2.sh).
set -u
B=gpu-bundle; L=$OUT/f3; mkdir -p $L
for t in cuda::sample_later_equals_sample cuda::gather_u32_picks_elements cuda::greedy_sample_is_argmax cuda::draws_are_reproducible_and_independent_of_the_batch; do
  $B/tests/kernels-ops --exact $t --test-threads=1 > $L/op-${t#cuda::}.log 2>&1 && echo "ok: $t" || { echo "FAILED: $t"; tail -20 $L/op-${t#cuda::}.log; }
done
tar czf $OUT/f3.tgz -C $OUT f3
bash .dev/f2.sh
