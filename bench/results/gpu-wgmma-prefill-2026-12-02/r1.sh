#!/bin/bash
# Device call 1: correctness of the wgmma prefill kernel, attention bench (both tiled kernels),
# the 8B 256-request throughput and an ncu profile of its batch-256 decode step.
set -u
B=gpu-bundle; L=$OUT/c1; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used --format=csv,noheader
timeout 60 $B/tests/kernels-lib --test-threads=4 > $L/lib.log 2>&1; echo "lib rc=$?"; grep "test result" $L/lib.log
# The attention op checks first (the new kernel), each in its own process.
ops() { local pass=0 fail=0; for t in $($B/tests/kernels-ops --list 2>/dev/null | grep -E '^cuda(_mma)?::.*attention' | sed 's/: test$//'); do
  if timeout 60 $B/tests/kernels-ops --exact "$t" --test-threads=1 > $L/op.tmp 2>&1; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAILED $t"; tail -5 $L/op.tmp; fi; done; echo "attention checks: $pass passed, $fail failed"; }
ops 2>&1 | tee $L/ops-attn.log | tail -30
timeout 120 $B/tests/kernels-bench --bench cuda_attention --warm-up-time 1 --measurement-time 3 > $L/attn.log 2>&1
grep -E "^cuda_attention|time:|thrpt:" $L/attn.log
for m in Llama-3.1-8B-Instruct; do
  timeout 120 $B/met bench throughput --model $B/configs/$m --load-format dummy --num-prompts 256 --input-len 128 --output-len 256 --output $L/tp-$m.json > $L/tp-$m.log 2>&1
  grep -E "^throughput" $L/tp-$m.log; python3 -c "import json;d=json.load(open('$L/tp-$m.json'));print({k:d[k] for k in ['elapsed_s','output_tokens_per_s','decode_tokens_per_s','decode_host_share','steps']})"
done
timeout 240 $B/run.sh $L/run ops fixtures graphs gate > $L/run.log 2>&1; echo "run.sh rc=$?"; grep -E "PASS|FAIL" $L/run.log | head; sed -n '/^attention sharpness/,$p' $L/run/gpu-gate.log | head -30
# Where the batch-256 decode step goes (eager, ncu per kernel).
timeout 200 ncu --clock-control none --cache-control none --csv --page raw --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  $B/met bench latency --model $B/configs/Llama-3.1-8B-Instruct --load-format dummy --batch-size 256 --input-len 128 --output-len 4 --num-iters 1 --num-warmup 0 --enforce-eager > $L/ncu-8b-b256.csv 2>$L/ncu.err
python3 $B/ncu_summary.py $L/ncu-8b-b256.csv --by-step > $L/prof-8b-b256.txt 2>&1; head -60 $L/prof-8b-b256.txt
