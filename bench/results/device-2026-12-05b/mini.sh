#!/bin/bash
# The int8 Q4_K op check (fills the kernel cache), then the bundle's invariance step; logs in $OUT/m.tgz.
set -u
B=gpu-bundle; O=/tmp/m; rm -rf $O; mkdir -p $O
bash $B/unpack.sh > /dev/null
export MET_HOME=/tmp/met-home-m LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}; mkdir -p $MET_HOME
start=$SECONDS
timeout 150 $B/tests/kernels-ops cuda_gguf_int8 --test-threads=1 > $O/ops-int8.log 2>&1
echo "ops cuda_gguf_int8 rc=$? in $((SECONDS - start)) s"; grep -E "^test |test result|panicked" $O/ops-int8.log | head -5
start=$SECONDS
bash $B/run.sh $O/inv invariance > $O/inv.out 2>&1
echo "invariance rc=$? in $((SECONDS - start)) s"; sed -n '/======== met GPU summary/,/^$/p' $O/inv.out; grep -h "BATCH-INVARIANCE\|census\|differ" $O/inv/gpu-invariance.log | tail -6
tar czf $OUT/m.tgz -C $O .
