#!/bin/bash
# Ran once at 900b539 plus the step split with a MET_GDR_CHUNKED_FROM switch (2026-12-04, `q/`);
# the switch is gone since: the crossover is CHUNKED_FROM in src/cuda/chunked_delta.rs.
# The fused kernel against the chunked form for short sequences, one bundle, one call: the
# delta-rule op checks with the default crossover and with MET_GDR_CHUNKED_FROM=48 (steps
# split between the two), the delta-rule kernel bench with every sequence chunked (16) and
# none (1000000), then the 16k shared prefix through `met serve` for each crossover in $FROMS:
# cold, 64 hits at once, 64 hits one after another, one hit alone.
# Run from the repository root with the bundle carried; results go to $OUT/q.tgz.
set -u
B=gpu-bundle; L=/tmp/q; rm -rf $L; mkdir -p $L
[ -x $B/met ] || bash $B/unpack.sh
export MET_HOME=/tmp/met-home LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}; mkdir -p $MET_HOME
for f in 16 48; do
  for t in $($B/tests/kernels-ops --list 2>/dev/null | grep -E '^cuda::delta_rule' | sed 's/: test$//'); do
    if MET_GDR_CHUNKED_FROM=$f timeout 60 $B/tests/kernels-ops --exact "$t" --test-threads=1 --nocapture > $L/op.tmp 2>&1; then
      echo "ok $f $t"
    else
      echo "FAILED $f $t"; tail -15 $L/op.tmp; cp $L/op.tmp "$L/failed-$f-${t#cuda::}.log"
    fi
  done
done
for f in 16 1000000; do
  MET_GDR_CHUNKED_FROM=$f timeout 200 $B/tests/kernels-bench --bench delta_rule > $L/kbench-$f.log 2>&1
  echo "== kbench from=$f rc=$?"; grep -E "^cuda_delta_rule|time:" $L/kbench-$f.log | paste - - | awk '{print $1, $4, $5}'
done
timeout 150 $B/tests/scheduler-gpu-hf-fixtures --nocapture --test-threads=1 > $L/fixtures.log 2>&1
echo "fixtures rc=$?"; grep -E "^test result|FAILED|panicked" $L/fixtures.log | head -5
python3 scripts/dummy_tokenizer.py configs/Qwen3.6-35B-A3B /tmp/q36 > /dev/null
c="--prefix-len 16384 --input-len 32 --output-len 16 --num-warmup 0 --seed 7"
for f in ${FROMS:-16 64}; do
  MET_GDR_CHUNKED_FROM=$f MET_LOG=warn,met=info,met_server=info,met_scheduler=debug \
    $B/met serve --model /tmp/q36 --load-format dummy --port 8911 > $L/serve-$f.log 2>&1 &
  SP=$!
  for i in $(seq 1 120); do curl -sf http://127.0.0.1:8911/v1/models > /dev/null && break; sleep 1; done
  for x in cold:1:1 burst:64:64 seq:64:1 alone:1:1; do
    IFS=: read n m cc <<< "$x"
    timeout 90 $B/met bench serve --base-url http://127.0.0.1:8911 $c --num-prompts $m --concurrency $cc \
      --output $L/ttft-$f-$n.json > $L/ttft-$f-$n.log 2>&1
    echo "from=$f $n: $(grep -E '^c=' $L/ttft-$f-$n.log)"
  done
  kill $SP; wait $SP 2> /dev/null
done
tar czf $OUT/q.tgz -C /tmp q
