#!/bin/bash
# Device call 2: prefill kernel variants (pingpong, proxy fence, loads), its ncu sections, the
# attention checks on the pingpong kernel, and the steady-state batch-256 decode step of the 8B.
set -u
B=gpu-bundle; L=$OUT/c2; mkdir -p $L
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
for v in "" "-DFW_EXP_NO_PINGPONG" "-DFW_EXP_NO_PROXY_FENCE" "-DFW_EXP_NO_LOAD" "-DFW_EXP_NO_PINGPONG -DFW_EXP_NO_LOAD"; do
  echo "== variant [$v]"
  MET_NVRTC_EXTRA="$v" timeout 90 $B/tests/kernels-bench --bench 'cuda_attention/flash/prefill' --warm-up-time 1 --measurement-time 2 2>&1 | grep -E "time:"
done
ops() { local pass=0 fail=0; for t in $($B/tests/kernels-ops --list 2>/dev/null | grep -E '^cuda::.*attention' | sed 's/: test$//'); do
  if timeout 60 $B/tests/kernels-ops --exact "$t" --test-threads=1 > $L/op.tmp 2>&1; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAILED $t"; tail -5 $L/op.tmp; fi; done; echo "attention checks: $pass passed, $fail failed"; }
ops 2>&1 | tee $L/ops-attn.log | tail -12
timeout 150 ncu --clock-control none --kernel-name regex:flash_prefill_wg --launch-skip 5 --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
  $B/tests/kernels-bench --bench 'cuda_attention/flash/prefill' --warm-up-time 0.2 --measurement-time 0.2 > $L/ncu-prefill.txt 2>&1
grep -E "Duration|Throughput|Issue Slots|No Eligible|Active Warps|Eligible Warps|Registers|Stall|Pipe" $L/ncu-prefill.txt | head -30
timeout 100 $B/met bench latency --model $B/configs/Llama-3.1-8B-Instruct --load-format dummy --batch-size 256 --input-len 128 --output-len 64 --num-iters 2 --output $L/lat-8b-b256.json > $L/lat-8b-b256.log 2>&1
grep -E "^latency" $L/lat-8b-b256.log
timeout 200 ncu --clock-control none --cache-control none --csv --page raw --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  $B/met bench latency --model $B/configs/Llama-3.1-8B-Instruct --load-format dummy --batch-size 256 --input-len 128 --output-len 12 --num-iters 1 --num-warmup 0 --enforce-eager > $L/ncu-8b-b256.csv 2>$L/ncu.err
ls -la $L
