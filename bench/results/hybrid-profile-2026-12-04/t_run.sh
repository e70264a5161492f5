#!/bin/bash
# Ran once at 900b539 (2026-12-04, `tc/`); MET_GDR_KERNEL and the first kernels are gone since.
# The chunked delta rule on tensor cores (`tc`, the default) against the first kernels (`v1`,
# MET_GDR_KERNEL=v1), one bundle, one call: the delta-rule op checks on CUDA with each, the
# kernel bench of the delta rule with each, the hybrid HF fixtures through the engine, then
# the 16k shared prefix through `met serve` with each (cold, 64 hits, one hit alone).
# Run from the repository root with the bundle carried; results go to $OUT/tc.tgz.
set -u
B=gpu-bundle; L=/tmp/tc; rm -rf $L; mkdir -p $L
[ -x $B/met ] || bash $B/unpack.sh
export MET_HOME=/tmp/met-home LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}; mkdir -p $MET_HOME
for k in tc v1; do
  for t in $($B/tests/kernels-ops --list 2>/dev/null | grep -E '^cuda::delta_rule' | sed 's/: test$//'); do
    if MET_GDR_KERNEL=$k timeout 60 $B/tests/kernels-ops --exact "$t" --test-threads=1 --nocapture > $L/op.tmp 2>&1; then
      echo "ok $k $t"
    else
      echo "FAILED $k $t"; tail -15 $L/op.tmp; cp $L/op.tmp "$L/failed-$k-${t#cuda::}.log"
    fi
  done
done
for k in tc v1; do
  MET_GDR_KERNEL=$k timeout 150 $B/tests/kernels-bench --bench delta_rule > $L/kbench-$k.log 2>&1
  echo "== kbench $k rc=$?"; grep -E "^cuda_delta_rule|time:|thrpt:" $L/kbench-$k.log
done
timeout 150 $B/tests/scheduler-gpu-hf-fixtures --nocapture --test-threads=1 > $L/fixtures.log 2>&1
echo "fixtures rc=$?"; grep -E "^test result|FAILED|panicked" $L/fixtures.log | head -5
python3 scripts/dummy_tokenizer.py configs/Qwen3.6-35B-A3B /tmp/q36 > /dev/null
c="--prefix-len 16384 --input-len 32 --output-len 16 --num-warmup 0 --seed 7"
for k in tc v1; do
  MET_GDR_KERNEL=$k MET_LOG=warn,met=info,met_server=info,met_scheduler=debug \
    $B/met serve --model /tmp/q36 --load-format dummy --port 8911 > $L/serve-$k.log 2>&1 &
  SP=$!
  for i in $(seq 1 120); do curl -sf http://127.0.0.1:8911/v1/models > /dev/null && break; sleep 1; done
  for x in cold:1 hit:64 alone:1; do
    n=${x%:*}; m=${x#*:}
    timeout 60 $B/met bench serve --base-url http://127.0.0.1:8911 $c --num-prompts $m --concurrency $m \
      --output $L/ttft-$k-$n.json > $L/ttft-$k-$n.log 2>&1
    echo "$k $n: $(grep -E '^c=' $L/ttft-$k-$n.log)"
  done
  kill $SP; wait $SP 2> /dev/null
done
tar czf $OUT/tc.tgz -C /tmp tc
