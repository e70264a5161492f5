#!/bin/bash
# One call on the H200 for the bundle of branch `next` (the kernels written on 2026-12-04 after
# the device time ran out: state-slot jobs, the blocked solve, the delta rule's 128 x 128
# builds, head dim 256 on wgmma; `bi_run.sh` covers its `--batch-invariant`):
# 1. the kernels' lib tests, timed (the NVRTC compile with the blocked solve);
# 2. the CUDA op checks of attention, the delta rule and state slots, with head dim 256's
#    prefill on the warpgroup kernel (default) and on the mma.sync tiles (MET_D256_PREFILL=mma);
# 3. the kernel benches of the delta rule and of head dim 256's prefill, each way;
# 4. the HF fixtures and graphs = eager through the engine;
# 5. the 16k shared prefix through `met serve` (Qwen3.6-35B-A3B, dummy weights), each way:
#    cold, 64 hits at once, 64 one after another, one alone.
# Run from the repository root with the bundle carried; results go to $OUT/v.tgz.
set -u
B=gpu-bundle; L=/tmp/v; rm -rf $L; mkdir -p $L
bash $B/unpack.sh
export MET_HOME=/tmp/met-home LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}; mkdir -p $MET_HOME
export MET_HF_FIXTURES=crates/model-layers/tests/fixtures/hf
s=$SECONDS; timeout 200 $B/tests/kernels-lib --test-threads=4 > $L/lib.log 2>&1
echo "lib rc=$? in $((SECONDS - s)) s: $(grep -E '^test result' $L/lib.log)"
for way in wg mma; do
  env=$([ $way = mma ] && echo MET_D256_PREFILL=mma || echo MET_D256_PREFILL=wg)
  pass=0; fail=0
  for t in $($B/tests/kernels-ops --list 2>/dev/null | grep -E '^cuda(_only)?::.*(attention|flash|delta_rule|state_slots|prefill)' | sed 's/: test$//'); do
    if env $env timeout 90 $B/tests/kernels-ops --exact "$t" --test-threads=1 --nocapture > $L/op.tmp 2>&1; then
      pass=$((pass + 1))
    else
      fail=$((fail + 1)); echo "FAILED $way $t"; tail -12 $L/op.tmp; cp $L/op.tmp "$L/failed-$way-${t#*::}.log"
    fi
  done
  echo "ops $way: $pass passed, $fail failed"
done
for way in wg mma; do
  env=$([ $way = mma ] && echo MET_D256_PREFILL=mma || echo MET_D256_PREFILL=wg)
  env $env timeout 240 $B/tests/kernels-bench --bench 'cuda_delta_rule|cuda_attention_d256' > $L/kbench-$way.log 2>&1
  echo "== kbench $way rc=$?"; grep -E "^cuda_|time:|thrpt:" $L/kbench-$way.log | grep -v "change" | paste - - - | awk '{print $1, $3, $4, $5, $6, $13, $14}'
done
timeout 150 $B/tests/scheduler-gpu-hf-fixtures --nocapture --test-threads=1 > $L/fixtures.log 2>&1
echo "fixtures rc=$?: $(grep -E '^test result' $L/fixtures.log)"
timeout 90 $B/tests/model-layers-gpu-graphs --nocapture --test-threads=1 > $L/graphs.log 2>&1
echo "graphs rc=$?: $(grep -E '^test result' $L/graphs.log)"
python3 scripts/dummy_tokenizer.py configs/Qwen3.6-35B-A3B /tmp/q36 > /dev/null
c="--prefix-len 16384 --input-len 32 --output-len 16 --num-warmup 0 --seed 7"
for way in wg mma; do
  env=$([ $way = mma ] && echo MET_D256_PREFILL=mma || echo MET_D256_PREFILL=wg)
  env $env MET_LOG=warn,met=info,met_server=info,met_scheduler=debug \
    $B/met serve --model /tmp/q36 --load-format dummy --port 8911 > $L/serve-$way.log 2>&1 &
  SP=$!
  for i in $(seq 1 120); do curl -sf http://127.0.0.1:8911/v1/models > /dev/null && break; sleep 1; done
  for x in cold:1:1 burst:64:64 seq:64:1 alone:1:1; do
    IFS=: read n m cc <<< "$x"
    timeout 90 $B/met bench serve --base-url http://127.0.0.1:8911 $c --num-prompts $m --concurrency $cc \
      --output $L/ttft-$way-$n.json > $L/ttft-$way-$n.log 2>&1
    echo "$way $n: $(grep -E '^c=' $L/ttft-$way-$n.log)"
  done
  kill $SP; wait $SP 2> /dev/null
  gzip $L/serve-$way.log
done
tar czf $OUT/v.tgz -C /tmp v
