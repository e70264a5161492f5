#!/usr/bin/env bash
# Run 3 (2026-12-02): the whole tree checked (lib, ops, fixtures, graphs, precision gate) and
# the kernels and engine timed. Everything lands in $OUT/r3.tgz.
set -u
B=gpu-bundle
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export MET_HOME=/tmp/met-home; mkdir -p $MET_HOME
L=$OUT/r3; mkdir -p $L
$B/run.sh $L/logs lib ops fixtures graphs gate > $L/run.log 2>&1
grep -E "^== |^(kernels|hf|cuda|precision).*(PASS|FAIL)" $L/run.log | head -12
grep -E "test result" $L/logs/kernels-ops.log $L/logs/gpu-graphs.log $L/logs/gpu-hf-fixtures.log | tail -4
grep -E "^FAILED|panicked" -A10 $L/logs/kernels-ops.log | head -40
sed -n '/^attention sharpness/,/^$/p' $L/logs/gpu-gate.log | head -60
grep -E "^gate:" $L/logs/gpu-gate.log
timeout 150 $B/tests/kernels-bench --bench cuda_attention --warm-up-time 1 --measurement-time 3 > $L/attn.log 2>&1
grep -E "^cuda_attention|time:|thrpt:" $L/attn.log
for m in Llama-3.1-8B-Instruct Qwen3-0.6B Qwen3-30B-A3B; do
  timeout 100 $B/met bench throughput --model $B/configs/$m --load-format dummy --num-prompts 256 --input-len 128 --output-len 256 --output $L/tp-$m.json 2>&1 | grep -E "^throughput"
  timeout 100 $B/met bench latency --model $B/configs/$m --load-format dummy --batch-size 1 --input-len 128 --output-len 256 --num-iters 3 --output $L/lat-$m-b1.json 2>&1 | grep -E "^latency"
done
timeout 100 $B/met bench latency --model $B/configs/Qwen3-30B-A3B --load-format dummy --batch-size 64 --input-len 128 --output-len 64 --num-iters 2 --output $L/lat-30b-b64.json 2>&1 | grep -E "^latency"
timeout 100 $B/met bench throughput --model $B/configs/Llama-3.1-8B-Instruct --load-format dummy --num-prompts 32 --input-len 4096 --output-len 256 --output $L/tp4k-8b.json 2>&1 | grep -E "^throughput"
for mns in 256 512; do
  timeout 100 $B/met bench throughput --model $B/configs/Llama-3.1-8B-Instruct --load-format dummy --num-prompts 512 --input-len 128 --output-len 256 --max-num-seqs $mns --output $L/tp512-8b-mns$mns.json 2>&1 | grep -E "^throughput"
done
tar czf $OUT/r3.tgz -C $OUT r3
